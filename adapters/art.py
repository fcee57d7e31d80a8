"""ART estimators for medical models: multi-label classifiers and 2-D/3-D segmenters.

ART (adversarial-robustness-toolbox) 1.20 assumes single-label classifiers: ``PyTorchClassifier`` reduces
multi-hot labels to an index and crashes with ``BCEWithLogitsLoss`` (ART issues #2064/#2066), FGM divides
multi-hot labels by their sum, and there is no segmentation estimator at all (ART #989, #2291). The two
estimators here plug a medadv :class:`~medadv.tasks.Task` loss into ART's own interfaces, so ART's
unmodified attacks (FGM, PGD on both back ends, BIM, APGD, JSMA, ...) and ``AdversarialTrainer`` run on:

* :class:`ARTClassifier` -- ``MultiLabel`` (per-label BCE, labels kept multi-hot) and ``MultiClass``
  models; a real ``PyTorchClassifier`` subclass, so ART picks its PyTorch PGD back end.
* :class:`ARTSegmenter` -- ``Segmentation`` models with ``(N, C, *spatial)`` logits (MONAI UNet, SegResNet,
  UNETR, ...), per-voxel CE / Dice / DiceCE from the task. Deliberately *not* a ``ClassifierMixin``:
  ART would otherwise try to one-hot the label maps.

Clip values and preprocessing are in the data's own units (e.g. ``clip_values=(-1024, 3071)`` for CT in HU,
``preprocessing=(mean, std)`` applied inside the gradient).

Always pass ``y`` to ART's attacks for multi-label models: with ``y=None`` ART builds arg-max one-hot
labels from the predictions. :meth:`ARTClassifier.predict_labels` gives the clean multi-hot prediction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from art.estimators.classification import PyTorchClassifier
from art.estimators.pytorch import PyTorchEstimator
from torch import Tensor, nn

from medadv.runtime import model_device
from medadv.tasks import MultiClass, MultiLabel, Segmentation, Task

from ._common import as_tensor, check_model, check_task, classifier_target, segmentation_target

__all__ = ["ARTClassifier", "ARTSegmenter", "TaskLoss"]


def _device_type(model: nn.Module) -> str:
    return "gpu" if model_device(model).type == "cuda" else "cpu"


def _check_input_shape(input_shape: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in input_shape)
    except TypeError:
        raise TypeError(f"`input_shape` must be a sequence of ints (C, *spatial), got {input_shape!r}") from None
    if len(shape) < 2 or min(shape) < 1:
        raise ValueError(f"`input_shape` must be (C, *spatial) with positive sizes, got {shape}")
    return shape


def _infer_outputs(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Number of model outputs, from one forward pass on zeros (mode restored afterwards)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros((1, *input_shape), device=model_device(model)))
    finally:
        for m, training in modes:
            m.training = training
    if not isinstance(out, Tensor) or out.ndim != 2:
        raise ValueError(f"model must return (N, K) logits for a classifier, got {getattr(out, 'shape', type(out))}")
    return int(out.shape[1])


@contextlib.contextmanager
def _preserved(model: nn.Module) -> Iterator[None]:
    """Freeze ``model`` for an input-gradient call and restore modes, ``requires_grad`` and ``.grad`` after.

    ART's ``PyTorchClassifier`` leaves the model in the mode it set, calls ``zero_grad`` and backpropagates
    into the weights; the caller's model must come back as it was.
    """
    modes = [(m, m.training) for m in model.modules()]
    params = [(p, p.requires_grad, p.grad) for p in model.parameters()]
    for p, _, _ in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
        for p, rg, g in params:
            p.requires_grad_(rg)
            p.grad = g


class TaskLoss(nn.Module):
    """A classification task's per-sample loss as an ``nn.Module`` ART can hold (``reduction`` as ART sets it).

    It is not a subclass of ART's recognised BCE/CE losses on purpose: ART then passes labels through
    untouched, and the conversion to the task's label format happens here.
    """

    def __init__(self, task: Task, reduction: str = "mean") -> None:
        super().__init__()
        self.task = task
        self.reduction = reduction

    def forward(self, logits: Tensor, y: Tensor) -> Tensor:
        per = self.task.loss(logits, classifier_target(self.task, y, logits))
        if self.reduction == "none":
            return per
        return per.sum() if self.reduction == "sum" else per.mean()


class ARTClassifier(PyTorchClassifier):
    """ART ``PyTorchClassifier`` for multi-label (per-label BCE) and multi-class medical classifiers.

    Multi-hot labels stay multi-hot from ART's attacks to the loss (rescaled rows from FGM count every
    positive entry as present), so ART's ``FastGradientMethod``, ``ProjectedGradientDescent`` (numpy and
    PyTorch back ends), ``BasicIterativeMethod`` and ``AutoProjectedGradientDescent`` (``loss_type=None``)
    attack all labels at once, untargeted or towards a target label vector. ART's success logging and
    APGD's choice of samples to attack are arg-max based (ART internals), so judge success with
    ``task.fooled`` on the output instead.

    Args:
        model: the PyTorch model, returning ``(N, K)`` logits.
        task: :class:`~medadv.tasks.MultiLabel` or :class:`~medadv.tasks.MultiClass`.
        input_shape: shape of one input ``(C, *spatial)``.
        clip_values: ``(min, max)`` valid input range in data units (e.g. ``(0, 1)`` or HU), or ``None``.
        nb_classes: number of outputs K; inferred with one forward pass when ``None``.
        optimizer: optimiser for ``fit`` (and ART's trainers); ``None`` if the model is not trained.
        preprocessing: ``(mean, std)`` standardisation applied inside the model call (data units).
        **kwargs: further ``PyTorchClassifier`` arguments (``preprocessing_defences``, ...).

    References: Nicolae et al., "Adversarial Robustness Toolbox v1.0.0", arXiv:1807.01069 (2018).
    """

    def __init__(
        self,
        model: nn.Module,
        task: MultiLabel | MultiClass,
        input_shape: Sequence[int],
        *,
        clip_values: tuple[float, float] | None,
        nb_classes: int | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        preprocessing: tuple[Any, Any] = (0.0, 1.0),
        **kwargs: Any,
    ) -> None:
        check_model(model)
        check_task(task, (MultiLabel, MultiClass), "use ARTSegmenter for Segmentation tasks")
        shape = _check_input_shape(input_shape)
        k = _infer_outputs(model, shape) if nb_classes is None else int(nb_classes)
        if k < 2:
            raise ValueError(f"ART needs at least 2 outputs (`nb_classes` >= 2), the model has {k}")
        self.task = task
        kwargs.setdefault("device_type", _device_type(model))
        super().__init__(model=model, loss=TaskLoss(task), input_shape=shape, nb_classes=k, optimizer=optimizer,
                         clip_values=clip_values, preprocessing=preprocessing, **kwargs)

    def loss_gradient(self, x: Any, y: Any, training_mode: bool = False, **kwargs: Any) -> Any:
        with _preserved(self._model):
            return super().loss_gradient(x, y, training_mode=training_mode, **kwargs)

    def class_gradient(self, x: Any, label: Any = None, training_mode: bool = False, **kwargs: Any) -> Any:
        with _preserved(self._model):
            return super().class_gradient(x, label=label, training_mode=training_mode, **kwargs)

    def predict(self, x: np.ndarray, batch_size: int = 128, training_mode: bool = False, **kwargs: Any) -> np.ndarray:
        with _preserved(self._model):
            return super().predict(x, batch_size=batch_size, training_mode=training_mode, **kwargs)

    def compute_loss(self, x: Any, y: Any, reduction: str = "none", **kwargs: Any) -> Any:
        with _preserved(self._model):
            return super().compute_loss(x, y, reduction=reduction, **kwargs)

    def predict_labels(self, x: np.ndarray, batch_size: int = 128) -> np.ndarray:
        """The task's hard prediction (multi-hot float for multi-label, indices for multi-class)."""
        logits = torch.from_numpy(np.asarray(self.predict(x, batch_size=batch_size)))
        return self.task.predict(logits).numpy()


class ARTSegmenter(PyTorchEstimator):
    """ART estimator for 2-D and 3-D segmentation models, with per-voxel losses from the task.

    Implements ART's estimator, neural-network and loss-gradient interfaces (``predict``, ``fit``,
    ``loss_gradient``, ``compute_loss``, ``get_activations``, ``input_shape``, ``device``), so ART's
    ``FastGradientMethod``, ``ProjectedGradientDescent`` (numpy back end, ``num_random_init=0`` as ART
    requires for non-classifiers), ``BasicIterativeMethod`` and ``AdversarialTrainer`` run on
    ``(N, C, D, H, W)`` MONAI models. Labels ``y`` are label maps ``(N, *spatial)``; the score map that ART
    passes when called with ``y=None`` is reduced to its arg-max.

    Args:
        model: PyTorch segmentation network returning ``(N, num_classes, *spatial)`` logits.
        task: :class:`~medadv.tasks.Segmentation` (its loss -- CE, Dice or DiceCE -- is attacked).
        input_shape: shape of one input ``(C, *spatial)``.
        clip_values: ``(min, max)`` valid range in data units (HU for CT), or ``None``.
        optimizer: optimiser for ``fit``; ``None`` if the model is not trained.
        preprocessing: ``(mean, std)`` standardisation in data units, differentiated through.
        channels_first: must be True (PyTorch layout).
        device_type: ``"cpu"`` or ``"gpu"``; defaults to the model's device.
    """

    estimator_params = PyTorchEstimator.estimator_params + ["input_shape", "optimizer"]

    def __init__(
        self,
        model: nn.Module,
        task: Segmentation,
        input_shape: Sequence[int],
        *,
        clip_values: tuple[float, float] | None,
        optimizer: torch.optim.Optimizer | None = None,
        preprocessing: tuple[Any, Any] = (0.0, 1.0),
        channels_first: bool = True,
        device_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        check_model(model)
        check_task(task, (Segmentation,), "use ARTClassifier for classification tasks")
        if not channels_first:
            raise ValueError("`channels_first` must be True: PyTorch segmentation models are (N, C, *spatial)")
        super().__init__(model=model, clip_values=clip_values, channels_first=True, preprocessing=preprocessing,
                         device_type=device_type or _device_type(model), **kwargs)
        self._device = model_device(model)
        self._input_shape = _check_input_shape(input_shape)
        self.task = task
        self._optimizer = optimizer
        self._layer_names = [name for name, _ in model.named_modules() if name]

    # --- properties ART reads -----------------------------------------------------------------------------
    @property
    def input_shape(self) -> tuple[int, ...]:
        return self._input_shape

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self._optimizer

    # --- helpers ------------------------------------------------------------------------------------------
    def _x(self, x: Any) -> Tensor:
        t = as_tensor(x, self._device, "x")
        if not t.is_floating_point():
            raise TypeError(f"`x` must be floating point, got dtype {t.dtype}")
        if tuple(t.shape[1:]) != self._input_shape:
            raise ValueError(f"`x` must have shape (N, *{self._input_shape}), got {tuple(t.shape)}")
        return t.float()

    def _forward(self, x: Tensor, fit: bool = False) -> Tensor:
        xp, _ = self._apply_preprocessing(x, y=None, fit=fit, no_grad=False)
        return self._model(xp)

    def _set_mode(self, training: bool) -> list[tuple[nn.Module, bool]]:
        modes = [(m, m.training) for m in self._model.modules()]
        self._model.train(training)
        return modes

    @staticmethod
    def _restore(modes: list[tuple[nn.Module, bool]]) -> None:
        for m, training in modes:
            m.training = training

    # --- ART interface ------------------------------------------------------------------------------------
    def predict(self, x: np.ndarray, batch_size: int = 128, training_mode: bool = False, **kwargs: Any) -> np.ndarray:
        """Logits ``(N, num_classes, *spatial)`` as a numpy array (torch in gives torch out)."""
        xt = self._x(x)
        modes = self._set_mode(training_mode)
        try:
            with torch.no_grad():
                out = torch.cat([self._forward(xt[i : i + batch_size]) for i in range(0, xt.shape[0], batch_size)])
        finally:
            self._restore(modes)
        return out if isinstance(x, Tensor) else out.cpu().numpy()

    def _loss(self, x: Tensor, y: Any, fit: bool = False) -> Tensor:
        logits = self._forward(x, fit=fit)
        self.task.validate_logits(logits)
        target = segmentation_target(self.task, as_tensor(y, self._device, "y"), logits)
        return self.task.loss(logits, target)

    def loss_gradient(self, x: Any, y: Any, training_mode: bool = False, **kwargs: Any) -> Any:
        """Gradient of the task loss w.r.t. ``x`` (numpy in, numpy out; torch in, torch out).

        Each sample's gradient is that of its own loss (losses summed over the batch), so it does not
        depend on the batch size.
        """
        xt = self._x(x).detach().requires_grad_(True)
        modes = self._set_mode(training_mode)
        try:
            with torch.enable_grad():
                (grad,) = torch.autograd.grad(self._loss(xt, y).sum(), xt)
        finally:
            self._restore(modes)
        return grad if isinstance(x, Tensor) else grad.cpu().numpy()

    def compute_loss(self, x: Any, y: Any, reduction: str = "none", **kwargs: Any) -> Any:
        """Task loss per sample (``reduction="none"``), or its ``"mean"``/``"sum"``."""
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"`reduction` must be 'none', 'mean' or 'sum', got {reduction!r}")
        modes = self._set_mode(False)
        try:
            with torch.no_grad():
                per = self._loss(self._x(x), y)
        finally:
            self._restore(modes)
        out = per if reduction == "none" else (per.mean() if reduction == "mean" else per.sum())
        return out if isinstance(x, Tensor) else out.cpu().numpy()

    def fit(self, x: np.ndarray, y: np.ndarray, batch_size: int = 128, nb_epochs: int = 10,
            training_mode: bool = True, **kwargs: Any) -> None:
        """Train with the optimizer given at construction on the task loss (mean over each batch)."""
        if self._optimizer is None:
            raise ValueError("`optimizer` was not given to ARTSegmenter, so it cannot fit")
        xt, yt = self._x(x), as_tensor(y, self._device, "y")
        modes = self._set_mode(training_mode)
        try:
            for _ in range(int(nb_epochs)):
                perm = torch.randperm(xt.shape[0], device=self._device)
                for i in range(0, xt.shape[0], batch_size):
                    idx = perm[i : i + batch_size]
                    loss = self._loss(xt[idx], yt[idx], fit=True).mean()
                    self._optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self._optimizer.step()
        finally:
            self._restore(modes)

    def get_activations(self, x: Any, layer: int | str, batch_size: int = 128, framework: bool = False) -> Any:
        """Output of a named sub-module (``layer`` a name from ``layer_names`` or its index)."""
        if isinstance(layer, int):
            if not 0 <= layer < len(self._layer_names):
                raise ValueError(f"`layer` index must be in [0, {len(self._layer_names) - 1}], got {layer}")
            layer = self._layer_names[layer]
        modules = dict(self._model.named_modules())
        if layer not in modules or not layer:
            raise ValueError(f"`layer` {layer!r} is not a sub-module name; see `layer_names`")
        captured: list[Tensor] = []
        handle = modules[layer].register_forward_hook(lambda _m, _i, out: captured.append(out))
        xt = self._x(x)
        modes = self._set_mode(False)
        try:
            with torch.no_grad():
                for i in range(0, xt.shape[0], batch_size):
                    self._forward(xt[i : i + batch_size])
        finally:
            handle.remove()
            self._restore(modes)
        if not all(isinstance(a, Tensor) for a in captured):
            raise ValueError(f"`layer` {layer!r} does not return a single tensor; choose another layer")
        acts = torch.cat(captured)
        return acts if framework else acts.cpu().numpy()
