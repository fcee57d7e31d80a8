"""An ART regressor for medical regression models: :class:`ARTRegressor`, ART's own ``PyTorchRegressor``.

ART 1.20's ``PyTorchRegressor`` takes a model with ``(N, K)`` value outputs and a loss; ART's gradient attacks
that need nothing but a loss gradient run on it: ``FastGradientMethod`` and ``ProjectedGradientDescent`` (and
``BasicIterativeMethod``, its fixed-step form), each ascending the task's regression loss (MSE / L1 / Huber per
output, :class:`~medadv.tasks.Regression`) away from ``y`` (the true values), or descending it towards target
values when ``targeted=True``. Every other ART attack, trainer and metric assumes class labels (arg-max success
tests, class gradients, one-hot labels) and is refused with
:class:`~medadv.adapters.support.UnsupportedAttackError` when it is constructed, before any work, saying what to
use instead. ART would also turn the predictions into arg-max one-hot labels when ``generate(x)`` gets no ``y``,
and pick random restarts (``num_random_init > 0``) and FGM's ``minimal`` search by an arg-max test: those are
refused as well.

The refusal is read where ART itself checks an estimator (``Attack.is_estimator_valid``, which every ART attack's
constructor calls) and again at every call into the estimator, as :mod:`medadv.adapters.art` does for its
classifiers and segmenters. Inputs and ``clip_values`` are in the data's own units.

Probability outputs do not arise here: a regression model's outputs are values, not class scores, so the task
refuses ``outputs="probabilities"`` when it is built and the outputs reach ART's loss as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import numpy as np
import torch
from art.estimators.regression.pytorch import PyTorchRegressor
from torch import Tensor, nn

from medadv.tasks import Task

from .art import _art_callers, _check_budget, _device_type, _EstimatorMeta, _flag, _float32, _preserved
from .support import UnsupportedAttackError

__all__ = ["ARTRegressor", "REGRESSION_SUPPORT", "RegressionLoss"]

_USE = ("use ART's FastGradientMethod or ProjectedGradientDescent on this estimator, or medadv's PGD, APGD or "
        "auto with the Regression task")


def _no_restarts(get: Callable[[str], Any]) -> str | None:
    n = get("num_random_init")
    if isinstance(n, int | np.integer) and n > 0:
        return (f"num_random_init={n}: ART keeps the restart whose outputs' arg-max changed, which means nothing for "
                "values; use num_random_init=0, or medadv's PGD(restarts=...) which keeps the largest loss")
    return None


def _fgm(get: Callable[[str], Any]) -> str | None:
    if get("minimal"):
        return ("minimal=True: ART searches the smallest ε by an arg-max success test, which means nothing for "
                "values; use minimal=False")
    return _no_restarts(get)


#: the ART attacks that run on a regressor (class name -> a check of their settings, returning a refusal or None)
REGRESSION_SUPPORT: Mapping[str, Callable[[Callable[[str], Any]], str | None]] = {
    "FastGradientMethod": _fgm,
    "ProjectedGradientDescent": _no_restarts,
    "ProjectedGradientDescentNumpy": _no_restarts,
    "BasicIterativeMethod": _no_restarts,
}


class RegressionLoss(nn.Module):
    """The task's per-sample loss (:meth:`Task.loss`) as a module ART holds; ``reduction`` as ART sets it."""

    def __init__(self, task: Task, reduction: str = "mean") -> None:
        super().__init__()
        self.task = task
        self.reduction = reduction

    def forward(self, outputs: Tensor, y: Tensor) -> Tensor:
        per = self.task.loss(outputs, y.to(outputs.dtype).reshape(outputs.shape))
        if self.reduction == "none":
            return per
        return per.sum() if self.reduction == "sum" else per.mean()


class ARTRegressor(PyTorchRegressor, metaclass=_EstimatorMeta):
    """ART ``PyTorchRegressor`` for a medadv regression task: ART's FGSM / PGD / BIM run on it, nothing else.

    Args:
        model: ``nn.Module`` returning ``(N, K)`` values (one output per sample: ``(N, 1)``).
        task: a task reading values (``task.label_source == "values"``, e.g. :class:`~medadv.tasks.Regression`); its
            per-output loss is the one ART's attacks ascend.
        input_shape: ``(C, *spatial)`` of one input.
        clip_values: ``(lo, hi)`` data range in the data's own units, or ``None``.
        preprocessing: ``(mean, std)`` applied inside the gradient, as in ART.
        device_type: ``"cpu"`` or ``"gpu"``; default: where the model's parameters are.
        allow_large_budgets: let attacks take an ``eps`` above half the ``clip_values`` range (refused by default:
            a budget in the wrong units, see :func:`medadv.threats.check_budget_scale`).

    ``generate(x, y)`` needs ``y``: the true values ``(N, K)`` (untargeted: move the output away from them) or the
    target values (``targeted=True``).
    """

    def __init__(self, model: nn.Module, task: Task, input_shape: tuple[int, ...], *,
                 clip_values: tuple[float, float] | None = None, preprocessing: Any = (0.0, 1.0),
                 device_type: str | None = None, allow_large_budgets: bool = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(task, Task) or task.label_source != "values":
            raise TypeError(f"`task` of ARTRegressor must be a task whose labels are values (Regression), got {task!r}; "
                            "use medadv.adapters.art.ARTClassifier / ARTSegmenter for class outputs")
        shape = tuple(int(s) for s in input_shape)
        if len(shape) < 2 or min(shape) < 1:
            raise ValueError(f"`input_shape` must be (C, *spatial) with positive sizes, got {input_shape!r}")
        self.task = task
        self._allow_large_budgets = _flag(allow_large_budgets, "allow_large_budgets")
        super().__init__(model=model, loss=RegressionLoss(task), input_shape=shape, clip_values=clip_values,
                         preprocessing=preprocessing, device_type=device_type or _device_type(model))

    def _guard(self, frame: FrameType | None) -> None:
        callers, generate = _art_callers(frame, False)
        for caller in callers:
            if caller.what != "attack" or caller.name not in REGRESSION_SUPPORT:
                what = {"attack": "attack", "trainer": "trainer", "metric": "metric"}[caller.what]
                raise UnsupportedAttackError(
                    f"ART {what} {caller.name} does not apply to a regression model: it assumes class labels (arg-max "
                    f"success tests, class gradients or one-hot labels); {_USE}")
            refusal = REGRESSION_SUPPORT[caller.name](caller.get)
            if refusal is not None:
                raise UnsupportedAttackError(f"ART {caller.name}({refusal.split(':', 1)[0]}) does not apply to a "
                                             f"regression model:{refusal.split(':', 1)[1]}")
            _check_budget(self, caller)
        if generate is not None:
            x, y = generate.get("x"), generate.get("y")
            if y is None:
                raise ValueError(f"ART {callers[0].name}.generate(x) without y does not apply to a regression model: "
                                 "ART turns the predictions into arg-max one-hot labels; pass y, the true values "
                                 "(N, K), or the target values with targeted=True")
            clip = self.clip_values
            if clip is not None and isinstance(x, np.ndarray) and x.size and \
                    (bool(np.any(x < clip[0])) or bool(np.any(x > clip[1]))):
                raise ValueError(f"`x` has values in [{float(np.min(x)):g}, {float(np.max(x)):g}], outside the "
                                 f"estimator's clip_values {tuple(clip)}; pass inputs inside the data range")

    # --- ART interface (each call checks its caller; the model's modes and gradients are restored) -------------
    def loss_gradient(self, x: Any, y: Any, training_mode: bool = False, **kwargs: Any) -> Any:
        self._guard(sys._getframe(1))
        with _preserved(self._model):
            return super().loss_gradient(_float32(x), _float32(y), training_mode=training_mode, **kwargs)

    def compute_loss(self, x: Any, y: Any, reduction: str = "none", **kwargs: Any) -> Any:
        self._guard(sys._getframe(1))
        with _preserved(self._model):
            return super().compute_loss(_float32(x), _float32(y), reduction=reduction, **kwargs)

    def predict(self, x: Any, batch_size: int = 128, **kwargs: Any) -> np.ndarray:
        self._guard(sys._getframe(1))
        modes = [(m, m.training) for m in self._model.modules()]
        try:
            with torch.no_grad():
                return super().predict(_float32(x), batch_size=batch_size, **kwargs)
        finally:
            for m, training in modes:
                m.training = training

    def fit(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedAttackError("ARTRegressor does not train the model (ART's fit would change the caller's "
                                     "weights); train it with torch or medadv's defenses")
