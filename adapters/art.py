"""ART estimators for medical models: multi-label classifiers and 2-D/3-D segmenters.

ART (adversarial-robustness-toolbox) 1.20 assumes single-label classifiers: ``PyTorchClassifier`` reduces
multi-hot labels to an index and crashes with ``BCEWithLogitsLoss`` (ART issues #2064/#2066), FGM divides
multi-hot labels by their sum, and there is no segmentation estimator at all (ART #989, #2291). The
estimators here plug a medadv :class:`~medadv.tasks.Task` loss into ART's own interfaces, so ART's
unmodified attacks and trainers run on:

* :class:`ARTClassifier` -- ``MultiLabel`` (per-label BCE, labels kept multi-hot) and ``MultiClass``
  models; a real ``PyTorchClassifier`` subclass, so ART picks its PyTorch PGD back end.
* :class:`ARTSegmenter` -- ``Segmentation`` models with ``(N, C, *spatial)`` logits (MONAI UNet, SegResNet,
  UNETR, ...), per-voxel CE / Dice / DiceCE from the task. Deliberately *not* a ``ClassifierMixin``:
  ART would otherwise try to one-hot the label maps. ``nb_classes`` is the number of output channels C.
* :class:`LabelPowersetClassifier` (``clf.label_powerset()``) -- a multi-label model seen as a classifier
  over label *sets*, for ART's decision-based attacks (Boundary, HopSkipJump): their arg-max test there is
  the task's own (any label flipped; targeted: the target label vector reached).

Which ART attack, trainer and metric applies to which task is the table in
:mod:`medadv.adapters.art_support` (:data:`SUPPORT`, :data:`TRAINERS_AND_METRICS`). An attack that does not
apply is refused with :class:`~medadv.adapters.support.UnsupportedAttackError` *when it is constructed*:
every ART attack's constructor checks its estimator with ``Attack.is_estimator_valid``, which reads
``type(estimator).__mro__``; the estimators' metaclass answers that read and, when it comes from
``is_estimator_valid``, looks up the calling attack (and the trainer or metric around it) a few stack frames
up. Each call into an estimator repeats the check (a short frame walk, no model call), which covers attacks
without estimator requirements, ART's metrics and trainers, and the first call of ``generate``: there the
estimator also refuses inputs outside ``clip_values`` and, on a multi-label model, ``generate(x)`` without
``y`` (ART would attack arg-max one-hot labels; pass ``y=clf.predict_labels(x)``).

Clip values and preprocessing are in the data's own units (e.g. ``clip_values=(-1024, 3071)`` for CT in HU,
``preprocessing=(mean, std)`` applied inside the gradient).

Models that return probabilities (a final softmax or sigmoid): declare them on the task
(``MultiLabel(outputs="probabilities")``, ``Segmentation(2, outputs="probabilities")``) and the estimators hand
ART the logits they come from (:meth:`~medadv.tasks.Task.logits_model`: ``log p`` for a softmax, ``logit p`` for
sigmoids), so ART's losses, gradients, margins and arg-max tests read logits, ``predict`` returns those logits, and
nothing else changes: ``preprocessing`` is still the input standardisation in data units (applied before the
model) and no softmax setting is needed (ART's ``PyTorchClassifier`` has none; it expects logits). On an
:class:`ARTClassifier` of a ``nn.Sequential`` model, ART then sees one layer (the wrapped model) for
``get_activations`` by index. Undeclared, the first model output an estimator reads (``predict``, a loss or its
gradient) is refused in one line when it looks like probabilities (:meth:`~medadv.tasks.Task.check_outputs`),
before ART's attack takes a step.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
from abc import ABCMeta
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import art.metrics
import numpy as np
import torch
from art.attacks.attack import Attack, EvasionAttack
from art.defences.trainer import Trainer
from art.estimators.classification import BlackBoxClassifier, PyTorchClassifier
from art.estimators.classification.classifier import InputFilter
from art.estimators.pytorch import PyTorchEstimator
from torch import Tensor, nn

from medadv.runtime import model_device
from medadv.tasks import Task
from medadv.threats import check_budget_scale

from ._common import (
    as_tensor,
    check_first_output,
    check_model,
    check_task,
    classifier_target,
    segmentation_target,
)
from .art_support import (
    EXCLUDED,
    EXCLUDED_TRAINERS_AND_METRICS,
    PARAM_RULES,
    POWERSET,
    SUPPORT,
    TRAINERS_AND_METRICS,
)
from .support import UnsupportedAttackError, check_supported, task_kind

__all__ = ["ARTClassifier", "ARTSegmenter", "LabelPowersetClassifier", "TaskLoss", "SUPPORT", "EXCLUDED",
           "TRAINERS_AND_METRICS", "EXCLUDED_TRAINERS_AND_METRICS", "UnsupportedAttackError"]

_TITLES = {"multiclass": "multi-class", "multilabel": "multi-label", "seg2d": "2-D seg", "seg3d": "3-D seg"}
#: ``Attack.is_estimator_valid``: every ART attack's constructor passes its estimator through it.
_IS_VALID_CODE = Attack.is_estimator_valid.__code__
#: the public ``art.metrics`` functions (a metric ART adds later is found, and refused until classified)
_METRIC_CODES = {fn.__code__: name for name, fn in vars(art.metrics).items() if inspect.isfunction(fn)}
#: ``art.metrics.metrics.get_crafter`` turns any error of the attack it constructs into "crafting method not
#: supported", so a classifier's checks wait for the next touch of the estimator (still before any model call);
#: a segmenter's cannot (ART's minimal FGM raises its own error first), its refusal is the cause of ART's error
_GET_CRAFTER_CODE = art.metrics.metrics.get_crafter.__code__
#: attacks whose ``y`` is not a label (FeatureAdversaries: the guide images)
_Y_NOT_LABELS = frozenset({"FeatureAdversariesPyTorch", "FeatureAdversariesNumpy"})
_MAX_POWERSET_LABELS = 16


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


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be True or False, got {value!r}")
    return value


def _float32(x: Any) -> Any:
    """ART's decision-based attacks (Boundary, HopSkipJump, ...) query with float64 arrays; models take float32."""
    if isinstance(x, np.ndarray) and x.dtype != np.float32 and np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32)
    return x


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


# --- finding the ART attack, trainer or metric that called an estimator ------------------------------------
def _art_name(obj: Any) -> str:
    """The ART class an attack or trainer is (a user subclass counts as the ART class it extends)."""
    for cls in type(obj).__mro__:
        if cls.__module__.startswith("art."):
            return cls.__name__
    return type(obj).__name__


class _Caller:
    __slots__ = ("what", "name", "obj", "init")

    def __init__(self, what: str, name: str, obj: Any) -> None:
        self.what, self.name, self.obj = what, name, obj
        self.init: dict[str, Any] = {}  # the constructor's arguments while it runs

    def get(self, attr: str) -> Any:
        if self.obj is not None and hasattr(self.obj, attr):
            return getattr(self.obj, attr)
        return self.init.get(attr)


def _art_callers(frame: FrameType | None, classifier: bool) -> tuple[list[_Caller], dict[str, Any] | None]:
    """ART attacks, trainers and metrics on the stack above ``frame`` (outermost first), and the locals of
    the outermost evasion attack's ``generate`` (the user's ``x`` and ``y`` at the first estimator call).
    Nothing inside ART's ``get_crafter``, which would hide a refusal behind its own error."""
    callers: dict[int, _Caller] = {}
    order: list[int] = []
    generate: dict[str, Any] | None = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("art."):
            code = frame.f_code
            if code is _GET_CRAFTER_CODE and classifier:
                return [], None
            if module.startswith(("art.attacks.", "art.defences.trainer.")) and code.co_varnames[:1] == ("self",):
                local = frame.f_locals
                obj = local.get("self")
                if isinstance(obj, (Attack, Trainer)):
                    key = id(obj)
                    if key not in callers:
                        callers[key] = _Caller("attack" if isinstance(obj, Attack) else "trainer", _art_name(obj), obj)
                        order.append(key)
                    if code.co_name == "__init__":
                        callers[key].init = local  # outer (more derived) constructors override inner ones
                    elif code.co_name == "generate" and isinstance(obj, EvasionAttack):
                        generate = dict(local, self=obj, __frame__=frame)
            elif code in _METRIC_CODES:
                key = id(code)
                if key not in callers:
                    callers[key] = _Caller("metric", _METRIC_CODES[code], None)
                    order.append(key)
        frame = frame.f_back
    return [callers[k] for k in reversed(order)], generate


def _takes_budget(obj: Any) -> bool:
    """Whether the ART class of an attack or trainer takes a perturbation budget: its constructor has ``eps``
    (read from ART's own signatures, so an ART release that adds a budgeted attack is covered)."""
    for cls in type(obj).__mro__:
        if cls.__module__.startswith("art."):
            try:
                return "eps" in inspect.signature(cls).parameters
            except (TypeError, ValueError):
                return False
    return False


def _norm_p(norm: Any) -> float:
    """ART's ``norm`` argument (``np.inf``, ``"inf"``, 1, 2, ``"1"``, ``"2"``) as p; NaN for non-Lp balls
    (Wasserstein's ``"wasserstein"``), whose budgets have no scale in data units."""
    if norm is None:
        return math.inf  # attacks without a norm argument (BIM, the Madry trainer) are L∞
    try:
        return float(norm)
    except (TypeError, ValueError):
        return math.nan


def _check_budget(est: Any, caller: _Caller) -> None:
    """The budget-scale rule of medadv's ``Linf`` (:func:`medadv.threats.check_budget_scale`) on an ART attack's or
    trainer's ``eps`` against the estimator's ``clip_values``: too large refused before any work (unless the
    estimator was built with ``allow_large_budgets=True``), too small warned, once per attack and setting."""
    obj, clip = caller.obj, getattr(est, "_clip_values", None)
    if obj is None or clip is None or not _takes_budget(obj):
        return
    eps, norm = caller.get("eps"), caller.get("norm")
    if eps is None:  # ART's FBF trainer keeps its budget as `_eps`
        eps = getattr(obj, "_eps", None)
    key = (id(obj), repr(eps), repr(norm))
    done: set[tuple[int, str, str]] = est.__dict__.setdefault("_budgets_checked", set())
    if key in done:
        return
    lo, hi = (torch.as_tensor(np.asarray(v, dtype=np.float64)) for v in clip)
    kind = type(est).__name__
    check_budget_scale(
        eps, (lo, hi), name="eps", owner=f"ART {caller.name} ", where=f" (`clip_values` of this {kind})",
        p=_norm_p(norm), size=math.prod(int(s) for s in est._input_shape),
        allow_large_budgets=bool(getattr(est, "_allow_large_budgets", False)),
        advice=f"budgets are in data units, e.g. 8/255 for 8 on a 0-255 scale; build {kind}(..., "
               "allow_large_budgets=True) if you mean it")
    done.add(key)


class _Guarded:
    """Refusals from the support tables, raised before an ART attack, trainer or metric does any work."""

    _kind: str
    _clip_values: Any
    _input_shape: tuple[int, ...]
    _nb_classes: int

    _checked_generate: FrameType | None = None

    def _guard(self, frame: FrameType | None) -> None:
        callers, generate = _art_callers(frame, not isinstance(self, ARTSegmenter))
        if not callers:
            self._checked_generate = None
            return
        kind = self._kind
        for caller in callers:
            table = SUPPORT if caller.what == "attack" else TRAINERS_AND_METRICS
            check_supported(table, "ART", caller.name, kind)
            self._check_view(caller)
            rule = PARAM_RULES.get(caller.name)
            refusal = rule(caller.get, kind, self) if rule is not None else None
            if refusal is not None:
                setting, reason = refusal
                raise UnsupportedAttackError(
                    f"ART {caller.name}({setting}) does not apply to a {_TITLES[kind]} model: {reason}")
            _check_budget(self, caller)
        if generate is None:
            self._checked_generate = None
        elif generate["__frame__"] is not self._checked_generate:
            # the user's x and y, checked once per generate call at the first touch of the estimator (attacks
            # such as PixelAttack rescale their local x later); the frame is kept, not its id, which a later
            # generate call could reuse
            self._check_generate(generate)
            self._checked_generate = generate["__frame__"]

    # ART attacks read these properties first (LaserAttack raises on ``channels_first``, PixelAttack rescales
    # ``x`` after reading ``clip_values``, ART's trainers reshape labels with ``nb_classes``, all before any
    # model call), so reading them runs the check too.
    @property
    def clip_values(self) -> Any:
        self._guard(sys._getframe(1))
        return self._clip_values

    @property
    def input_shape(self) -> tuple[int, ...]:
        self._guard(sys._getframe(1))
        return tuple(self._input_shape)

    @property
    def channels_first(self) -> bool:
        self._guard(sys._getframe(1))
        return bool(getattr(self, "_channels_first", True))

    @property
    def nb_classes(self) -> int:
        self._guard(sys._getframe(1))
        return int(self._nb_classes)

    @nb_classes.setter
    def nb_classes(self, nb_classes: int) -> None:
        if not isinstance(nb_classes, (int, np.integer)) or nb_classes < 2:
            raise ValueError(f"`nb_classes` must be an integer >= 2, got {nb_classes!r}")
        self._nb_classes = int(nb_classes)

    def _check_view(self, caller: _Caller) -> None:
        """Extra conditions of the estimator type (the label-powerset view)."""

    def _check_generate(self, local: dict[str, Any]) -> None:
        x = local.get("x")
        clip = self._clip_values
        if clip is not None and isinstance(x, np.ndarray) and x.size and np.issubdtype(x.dtype, np.number):
            lo, hi = clip
            if bool(np.any(np.less(x, lo))) or bool(np.any(np.greater(x, hi))):
                raise ValueError(
                    f"`x` has values in [{float(np.min(x)):g}, {float(np.max(x)):g}], outside the estimator's "
                    f"clip_values ({np.min(lo):g}, {np.max(hi):g}); ART would return x_adv outside them too. Pass "
                    "inputs inside the box, or build the estimator with clip_values matching the data (e.g. "
                    "(-1024, 3071) for CT in HU)")


class _HookMeta(type):
    """Answers ``type(estimator).__mro__`` as Python does, and checks the attack when ART's
    ``Attack.is_estimator_valid`` is the one asking (every attack constructor calls it, before any work)."""

    @property
    def __mro__(cls) -> tuple[type, ...]:  # type: ignore[override]
        mro = type.__dict__["__mro__"].__get__(cls)
        caller = sys._getframe(1)
        if caller.f_code is _IS_VALID_CODE:
            estimator = caller.f_locals.get("estimator")
            guard = getattr(estimator, "_guard", None)  # medadv's estimators (this module's and the regressor)
            if callable(guard):
                guard(caller.f_back)
        return mro


class _ClassifierMeta(_HookMeta, InputFilter):
    pass


class _EstimatorMeta(_HookMeta, ABCMeta):
    pass


class _TaskCallable:
    """A task test or loss handed to an ART attack argument (``SquareAttack``'s ``adv_criterion``/``loss``)."""

    _medadv_task_callable = True

    def __init__(self, fn: Callable[..., np.ndarray], name: str) -> None:
        self._fn, self._name = fn, name

    def __call__(self, *args: Any) -> np.ndarray:
        return self._fn(*args)

    def __repr__(self) -> str:
        return self._name


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
        check_first_output(self, self.task, logits)  # undeclared probabilities: refused before ART's first step
        per = self.task.loss(logits, classifier_target(self.task, y, logits))
        if self.reduction == "none":
            return per
        return per.sum() if self.reduction == "sum" else per.mean()


class ARTClassifier(_Guarded, PyTorchClassifier, metaclass=_ClassifierMeta):
    """ART ``PyTorchClassifier`` for multi-label (per-label BCE) and multi-class medical classifiers.

    Multi-hot labels stay multi-hot from ART's attacks to the loss (rescaled rows from FGM count every
    positive entry as present), so ART's ``FastGradientMethod``, ``ProjectedGradientDescent`` (numpy and
    PyTorch back ends), ``BasicIterativeMethod``, ``MomentumIterativeMethod`` and ``ShadowAttack`` attack all
    labels at once, untargeted or towards a target label vector; ``SquareAttack`` runs with
    ``adv_criterion=clf.adversarial_criterion, loss=clf.margin_loss``; ``BoundaryAttack`` and ``HopSkipJump``
    run on :meth:`label_powerset`. Attacks built on ART's arg-max logic (APGD, DeepFool, C&W, ...) are refused
    on multi-label models when constructed (see :mod:`medadv.adapters.art_support`). Always pass ``y`` (the
    multi-hot labels, or :meth:`predict_labels`) to ``generate`` on a multi-label model.

    Args:
        model: the PyTorch model, returning ``(N, K)`` logits (or probabilities, with the task declaring
            ``outputs="probabilities"``: ART then gets their logits, see the module docstring).
        task: :class:`~medadv.tasks.MultiLabel` or :class:`~medadv.tasks.MultiClass`.
        input_shape: shape of one input ``(C, *spatial)``.
        clip_values: ``(min, max)`` valid input range in data units (e.g. ``(0, 1)`` or HU), or ``None``.
        nb_classes: number of outputs K; inferred with one forward pass when ``None``.
        optimizer: optimiser for ``fit`` (and ART's trainers); ``None`` if the model is not trained.
        preprocessing: ``(mean, std)`` standardisation applied inside the model call (data units).
        allow_large_budgets: let attacks and trainers take an ``eps`` above half the ``clip_values`` range (refused
            by default: ``FastGradientMethod(clf, eps=8)`` on [0, 1] data is 8 meant as 8/255, and ART would return
            any point of the box); a budget below 0.1 % of the range warns (:func:`medadv.threats.check_budget_scale`).
        **kwargs: further ``PyTorchClassifier`` arguments (``preprocessing_defences``, ...).

    References: Nicolae et al., "Adversarial Robustness Toolbox v1.0.0", arXiv:1807.01069 (2018).
    """

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        input_shape: Sequence[int],
        *,
        clip_values: tuple[float, float] | None,
        nb_classes: int | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        preprocessing: tuple[Any, Any] = (0.0, 1.0),
        allow_large_budgets: bool = False,
        **kwargs: Any,
    ) -> None:
        check_model(model)
        check_task(task, "art", ("index", "vector"), "use ARTSegmenter for segmentation tasks")
        model = task.logits_model(model)  # declared probabilities: ART gets their logits
        self._allow_large_budgets = _flag(allow_large_budgets, "allow_large_budgets")
        shape = _check_input_shape(input_shape)
        k = _infer_outputs(model, shape) if nb_classes is None else int(nb_classes)
        if k < 2:
            raise ValueError(f"ART needs at least 2 outputs (`nb_classes` >= 2), the model has {k}")
        self.task = task
        self._kind = task_kind(task)
        kwargs.setdefault("device_type", _device_type(model))
        super().__init__(model=model, loss=TaskLoss(task), input_shape=shape, nb_classes=k, optimizer=optimizer,
                         clip_values=clip_values, preprocessing=preprocessing, **kwargs)

    # --- checks -------------------------------------------------------------------------------------------
    def _check_view(self, caller: _Caller) -> None:
        if caller.what == "attack" and caller.name in POWERSET and self._kind == "multilabel":
            raise UnsupportedAttackError(
                f"ART {caller.name} does not apply to a multi-label ARTClassifier directly: it compares arg-max "
                "classes; run it on clf.label_powerset() (label sets as classes), where ART's test is the "
                "task's own")

    def _check_generate(self, local: dict[str, Any]) -> None:
        super()._check_generate(local)
        attack = local["self"]
        if self._kind != "multilabel" or _art_name(attack) in _Y_NOT_LABELS:
            return
        y = local.get("y")
        name = _art_name(attack)
        if y is None:
            raise UnsupportedAttackError(
                f"ART {name}.generate(x) without y does not apply to a multi-label model: ART builds arg-max "
                "one-hot labels from the predictions; pass y=clf.predict_labels(x) (the multi-hot prediction) or "
                "the true multi-hot labels")
        if isinstance(y, np.ndarray) and (y.ndim != 2 or y.shape[1] != self._nb_classes):
            raise ValueError(f"`y` must be multi-hot of shape (N, {self._nb_classes}) for a multi-label model, got "
                             f"shape {y.shape}")

    # --- ART interface ------------------------------------------------------------------------------------
    def loss_gradient(self, x: Any, y: Any, training_mode: bool = False, **kwargs: Any) -> Any:
        self._guard(sys._getframe(1))
        with _preserved(self._model):
            return super().loss_gradient(_float32(x), y, training_mode=training_mode, **kwargs)

    def class_gradient(self, x: Any, label: Any = None, training_mode: bool = False, **kwargs: Any) -> Any:
        self._guard(sys._getframe(1))
        with _preserved(self._model):
            return super().class_gradient(_float32(x), label=label, training_mode=training_mode, **kwargs)

    def predict(self, x: np.ndarray, batch_size: int = 128, training_mode: bool = False, **kwargs: Any) -> np.ndarray:
        self._guard(sys._getframe(1))
        return self._logits(x, batch_size, training_mode, **kwargs)

    def _logits(self, x: np.ndarray, batch_size: int = 128, training_mode: bool = False, **kwargs: Any) -> np.ndarray:
        """``PyTorchClassifier.predict`` without its DataLoader (decision-based attacks query one image at a
        time, thousands of times) and with the model's modes restored."""
        xp, _ = self._apply_preprocessing(_float32(np.asarray(x)), y=None, fit=False)
        modes = [(m, m.training) for m in self._model.modules()]
        self._model.train(training_mode)
        try:
            with torch.no_grad():
                outs = [self._model(torch.from_numpy(np.ascontiguousarray(xp[i : i + batch_size])).to(self._device))[-1]
                        for i in range(0, xp.shape[0], batch_size)]
        finally:
            for m, training in modes:
                m.training = training
        check_first_output(self, self.task, outs[0])
        preds = torch.cat(outs).detach().cpu().numpy().astype(np.float32)
        return self._apply_postprocessing(preds=preds, fit=False)

    def compute_loss(self, x: Any, y: Any, reduction: str = "none", **kwargs: Any) -> Any:
        self._guard(sys._getframe(1))
        with _preserved(self._model):
            return super().compute_loss(_float32(x), y, reduction=reduction, **kwargs)

    def fit(self, x: np.ndarray, y: np.ndarray, batch_size: int = 128, nb_epochs: int = 10, **kwargs: Any) -> None:
        self._guard(sys._getframe(1))
        super().fit(_float32(x), y, batch_size=batch_size, nb_epochs=nb_epochs, **kwargs)

    def get_activations(self, x: Any, layer: int | str | None = None, batch_size: int = 128,
                        framework: bool = False) -> Any:
        self._guard(sys._getframe(1))
        modes = [(m, m.training) for m in self._model.modules()]
        try:
            return super().get_activations(_float32(x), layer, batch_size=batch_size, framework=framework)
        finally:
            for m, training in modes:
                m.training = training

    # --- medadv helpers -----------------------------------------------------------------------------------
    def predict_labels(self, x: np.ndarray, batch_size: int = 128) -> np.ndarray:
        """The task's hard prediction (multi-hot float for multi-label, indices for multi-class)."""
        logits = torch.from_numpy(np.asarray(self._logits(np.asarray(x), batch_size=batch_size)))
        return self.task.predict(logits).numpy()

    @property
    def adversarial_criterion(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """``(y_pred, y) -> (N,) bool``: the task's untargeted ``fooled`` on ART predictions (logits) and labels
        (multi-hot or class indices / one-hot); for ``SquareAttack(adv_criterion=...)``."""

        def fooled(y_pred: np.ndarray, y: np.ndarray) -> np.ndarray:
            logits = torch.from_numpy(np.asarray(y_pred, dtype=np.float32))
            target = classifier_target(self.task, torch.from_numpy(np.asarray(y)), logits)
            return self.task.fooled(logits, target).numpy()

        return _TaskCallable(fooled, "ARTClassifier.adversarial_criterion")

    @property
    def margin_loss(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """``(x, y) -> (N,)``: the task's logit margin (positive while the labels are predicted right), which
        ``SquareAttack(loss=...)`` lowers."""

        def margin(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            logits = torch.from_numpy(self.predict(x))
            target = classifier_target(self.task, torch.from_numpy(np.asarray(y)), logits)
            return self.task.margin(logits, target).numpy()

        return _TaskCallable(margin, "ARTClassifier.margin_loss")

    def label_powerset(self) -> LabelPowersetClassifier:
        """This multi-label model as an ART classifier over label sets, for decision-based attacks."""
        return LabelPowersetClassifier(self)


class LabelPowersetClassifier(_Guarded, BlackBoxClassifier, metaclass=_ClassifierMeta):
    """A multi-label :class:`ARTClassifier` as an ART classifier whose classes are label *sets*.

    Class ``c`` is the label vector with bits ``c = sum_k y_k 2**k`` (:meth:`encode` / :meth:`decode`), and
    ``predict`` returns the one-hot of the predicted set, so ART's decision-based attacks (``BoundaryAttack``,
    ``HopSkipJump``), which only compare arg-max classes, test exactly the task's success: untargeted (``y``
    omitted or ``encode(labels)``) -- any label flipped; targeted (``y=encode(target_vectors)``) -- every label
    equal to the target. No gradients and no scores: other attacks are refused on it. At most 16 labels.

    Args:
        classifier: a multi-label :class:`ARTClassifier`.
    """

    def __init__(self, classifier: ARTClassifier) -> None:
        if not isinstance(classifier, ARTClassifier) or classifier.task.label_source != "vector":
            raise TypeError("`classifier` must be an ARTClassifier with a multi-label task (0/1 label vectors)")
        k = classifier.nb_classes
        if k > _MAX_POWERSET_LABELS:
            raise ValueError(f"label_powerset() takes at most {_MAX_POWERSET_LABELS} labels (2**K classes), the "
                             f"model has {k}; use ART ProjectedGradientDescent with the multi-hot y")
        self.classifier = classifier
        self._allow_large_budgets = classifier._allow_large_budgets
        self._kind = "multilabel"
        self._bits = (2 ** np.arange(k)).astype(np.int64)
        super().__init__(self._predict_sets, tuple(classifier._input_shape), 2**k,
                         clip_values=classifier.clip_values)

    def __repr__(self) -> str:
        return f"LabelPowersetClassifier({self.classifier!r})"

    def _check_view(self, caller: _Caller) -> None:
        if caller.what == "attack" and caller.name not in POWERSET:
            raise UnsupportedAttackError(
                f"ART {caller.name} does not apply to clf.label_powerset(): it only serves decision-based attacks "
                f"({', '.join(sorted(POWERSET))}); run {caller.name} on the ARTClassifier itself")

    def _check_generate(self, local: dict[str, Any]) -> None:
        super()._check_generate(local)
        y = local.get("y")
        if isinstance(y, np.ndarray) and y.ndim == 2 and y.shape[1] == len(self._bits) != self._nb_classes:
            raise ValueError(f"`y` looks like multi-hot labels of shape {y.shape}; label_powerset() takes label-set "
                             "classes: pass y=view.encode(labels)")

    def _predict_sets(self, x: np.ndarray) -> np.ndarray:
        codes = self.encode(self.classifier.predict_labels(x))
        out = np.zeros((len(codes), self.nb_classes), dtype=np.float32)
        out[np.arange(len(codes)), codes] = 1.0
        return out

    def predict(self, x: np.ndarray, batch_size: int = 128, **kwargs: Any) -> np.ndarray:
        self._guard(sys._getframe(1))
        return super().predict(_float32(x), batch_size=batch_size, **kwargs)

    def encode(self, labels: np.ndarray) -> np.ndarray:
        """Multi-hot ``(N, K)`` labels -> label-set classes ``(N,)`` (int64)."""
        labels = np.asarray(labels)
        if labels.ndim != 2 or labels.shape[1] != len(self._bits) or not np.isin(labels, (0, 1)).all():
            raise ValueError(f"`labels` must be multi-hot of shape (N, {len(self._bits)}), got {labels.shape}")
        return (labels.astype(np.int64) * self._bits).sum(axis=1)

    def decode(self, classes: np.ndarray) -> np.ndarray:
        """Label-set classes ``(N,)`` (or their one-hot rows) -> multi-hot ``(N, K)`` float32 labels."""
        classes = np.asarray(classes)
        if classes.ndim == 2:
            classes = classes.argmax(axis=1)
        return ((classes.astype(np.int64)[:, None] & self._bits) > 0).astype(np.float32)


class ARTSegmenter(_Guarded, PyTorchEstimator, metaclass=_EstimatorMeta):
    """ART estimator for 2-D and 3-D segmentation models, with per-voxel losses from the task.

    Implements ART's estimator, neural-network and loss-gradient interfaces (``predict``, ``fit``,
    ``loss_gradient``, ``compute_loss``, ``get_activations``, ``input_shape``, ``device``, ``nb_classes`` =
    C), so ART's ``FastGradientMethod``, ``ProjectedGradientDescent`` (numpy back end, ``num_random_init=0`` as
    ART requires for non-classifiers), ``BasicIterativeMethod``, ``MomentumIterativeMethod``,
    ``FeatureAdversariesPyTorch``, ``SquareAttack`` (2-D, with ``adv_criterion=est.adversarial_criterion,
    loss=est.margin_loss``), ``AdversarialTrainer`` and ``AdversarialTrainerMadryPGD(num_random_init=0)`` run
    on ``(N, C, D, H, W)`` MONAI models; classifier attacks are refused when constructed. Labels ``y`` are
    label maps ``(N, *spatial)``; the score map that ART passes when called with ``y=None`` is reduced to its
    arg-max.

    Args:
        model: PyTorch segmentation network returning ``(N, num_classes, *spatial)`` logits (or softmax
            probabilities, with the task declaring ``outputs="probabilities"``: ART then gets ``log p``).
        task: :class:`~medadv.tasks.Segmentation` (its loss -- CE, Dice or DiceCE -- is attacked).
        input_shape: shape of one input ``(C, *spatial)``.
        clip_values: ``(min, max)`` valid range in data units (HU for CT), or ``None``.
        optimizer: optimiser for ``fit``; ``None`` if the model is not trained.
        preprocessing: ``(mean, std)`` standardisation in data units, differentiated through.
        channels_first: must be True (PyTorch layout).
        device_type: ``"cpu"`` or ``"gpu"``; defaults to the model's device.
        allow_large_budgets: let attacks and trainers take an ``eps`` above half the ``clip_values`` range
            (refused by default, as on :class:`ARTClassifier`).
    """

    estimator_params = PyTorchEstimator.estimator_params + ["input_shape", "optimizer"]

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        input_shape: Sequence[int],
        *,
        clip_values: tuple[float, float] | None,
        optimizer: torch.optim.Optimizer | None = None,
        preprocessing: tuple[Any, Any] = (0.0, 1.0),
        channels_first: bool = True,
        device_type: str | None = None,
        allow_large_budgets: bool = False,
        **kwargs: Any,
    ) -> None:
        check_model(model)
        check_task(task, "art", ("map",), "use ARTClassifier for classification tasks")
        model = task.logits_model(model)  # declared probabilities: ART gets their logits (log p)
        self._allow_large_budgets = _flag(allow_large_budgets, "allow_large_budgets")
        if not channels_first:
            raise ValueError("`channels_first` must be True: PyTorch segmentation models are (N, C, *spatial)")
        shape = _check_input_shape(input_shape)
        if len(shape) not in (3, 4):
            raise ValueError(f"`input_shape` must be (C, H, W) or (C, D, H, W) for segmentation, got {shape}")
        self._kind = task_kind(task, len(shape) - 1)
        self._input_shape = shape
        seg: Any = task  # a label-map kind (checked above): it has classes
        self._nb_classes = int(seg.num_classes)
        super().__init__(model=model, clip_values=clip_values, channels_first=True, preprocessing=preprocessing,
                         device_type=device_type or _device_type(model), **kwargs)
        self._device = model_device(model)
        self.task = task
        self._optimizer = optimizer
        self._layer_names = [name for name, _ in model.named_modules() if name]

    # --- properties ART reads -----------------------------------------------------------------------------
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
        out = self._model(xp)
        check_first_output(self, self.task, out)  # undeclared probabilities: refused before ART's first step
        return out

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
        self._guard(sys._getframe(1))
        return self._logits(x, batch_size, training_mode)

    def _logits(self, x: Any, batch_size: int = 128, training_mode: bool = False) -> Any:
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
        self._guard(sys._getframe(1))
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
        self._guard(sys._getframe(1))
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
        self._guard(sys._getframe(1))
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
        """Output of a named sub-module (``layer`` a name from ``layer_names`` or its index); with
        ``framework=True`` a torch tensor that keeps the graph to ``x`` (for ART's feature-space attacks)."""
        self._guard(sys._getframe(1))
        if isinstance(layer, (int, np.integer)):
            index = int(layer) + (len(self._layer_names) if layer < 0 else 0)  # -1: the last layer, as in ART
            if not 0 <= index < len(self._layer_names):
                raise ValueError(f"`layer` index must be in [0, {len(self._layer_names) - 1}], got {layer}")
            layer = self._layer_names[index]
        modules = dict(self._model.named_modules())
        if layer not in modules or not layer:
            raise ValueError(f"`layer` {layer!r} is not a sub-module name; see `layer_names`")
        captured: list[Tensor] = []
        handle = modules[layer].register_forward_hook(lambda _m, _i, out: captured.append(out))
        xt = self._x(x)
        modes = self._set_mode(False)
        try:
            with torch.set_grad_enabled(framework and torch.is_grad_enabled()):
                for i in range(0, xt.shape[0], batch_size):
                    self._forward(xt[i : i + batch_size])
        finally:
            handle.remove()
            self._restore(modes)
        if not all(isinstance(a, Tensor) for a in captured):
            raise ValueError(f"`layer` {layer!r} does not return a single tensor; choose another layer")
        acts = torch.cat(captured)
        return acts if framework else acts.cpu().numpy()

    # --- medadv helpers -----------------------------------------------------------------------------------
    @property
    def adversarial_criterion(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """``(y_pred, y) -> (N,) bool``: the task's untargeted ``fooled`` (mean Dice below
        ``task.dice_threshold``) on ART predictions (logits) and label maps or score maps; for
        ``SquareAttack(adv_criterion=...)``."""

        def fooled(y_pred: np.ndarray, y: np.ndarray) -> np.ndarray:
            logits = torch.from_numpy(np.asarray(y_pred, dtype=np.float32))
            target = segmentation_target(self.task, torch.from_numpy(np.asarray(y)), logits)
            return self.task.fooled(logits, target).numpy()

        return _TaskCallable(fooled, "ARTSegmenter.adversarial_criterion")

    @property
    def margin_loss(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """``(x, y) -> (N,)``: the task's mean per-voxel logit margin, which ``SquareAttack(loss=...)`` lowers."""

        def margin(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            logits = torch.from_numpy(self.predict(x))
            target = segmentation_target(self.task, torch.from_numpy(np.asarray(y)), logits)
            return self.task.margin(logits, target).numpy()

        return _TaskCallable(margin, "ARTSegmenter.margin_loss")
