"""Foolbox 3 for multi-label and 2-D/3-D segmentation models: a task-aware model, criteria, and the support table.

Foolbox's gradient attacks end in ``ep.crossentropy(model(x), labels)``, which only takes ``(N, K)``
logits and class indices, and its criteria compare an arg-max with class indices (foolbox #643, #708, #306).
Here:

* :class:`TaskModel` -- a ``foolbox.PyTorchModel`` that also carries the medadv task (bounds in data units,
  Foolbox ``preprocessing`` unchanged: use ``axis=-4`` for per-channel ``(N, C, D, H, W)`` volumes). Foolbox's
  **own** attack classes run on it unchanged:

  - every gradient attack (``fb.attacks.L1PGD``, ``L2AdamPGD``, ``LinfBasicIterativeAttack``, ``MIFGSM``,
    ``SparseL1DescentAttack``, ...) gets the task's loss: the logits a ``TaskModel`` returns compute the task's
    per-sample loss (per-label BCE, per-voxel CE or Dice) where Foolbox asks for ``crossentropy``, so one
    mechanism serves every attack built on ``BaseGradientDescent``, including user subclasses;
  - decision- and score-based attacks (noise, blur, contrast, Boundary, HopSkipJump, Pointwise, ...) get the
    task's own success test through the criteria below;
  - an attack that does not apply to the model's task (DeepFool, C&W, FMN, ... on multi-label or
    segmentation models, see :data:`SUPPORT`) is refused with :class:`UnsupportedAttackError` before it does
    any work, saying what to use instead. The model finds the attack at the first call into it: every Foolbox
    attack starts with ``verify_input_bounds``, which reads ``model.bounds``; from there the model walks a
    few stack frames up to the calling ``foolbox.attacks`` instance (and checks again, cheaply, on each
    forward, for attacks that reach the model another way). The same first call turns a plain labels tensor
    on a multi-label or segmentation model (Foolbox would wrap it in ``Misclassification`` and fail with a
    bare ``AssertionError``) and inputs outside the bounds into clear errors.

  Each forward runs in eval mode with frozen parameters, so Foolbox's ``backward`` leaves the model's
  ``.grad`` untouched.
* Criteria -- :class:`MultiLabelMisclassification` (any label flipped), :class:`TargetedMultiLabel`
  (the target label vector reached), :class:`SegmentationMisclassification` (Dice or pixel accuracy
  below a threshold) and :class:`TargetedSegmentation` (the target map reached on a fraction of voxels);
  :func:`criterion` picks the one matching a task. They subclass Foolbox's own ``Misclassification`` /
  ``TargetedMisclassification`` so Foolbox's attack loops accept them unchanged (ascend for the first,
  descend towards ``target_classes`` for the second).
* :class:`LinfPGD`, :class:`L2PGD`, :class:`FGSM`, :class:`FGM`, :class:`LinfBasicIterativeAttack`,
  :class:`L2BasicIterativeAttack` -- kept for backward compatibility: Foolbox's attacks with the task loss
  as their ``get_loss_fn`` and the whole call in eval mode with frozen parameters. Foolbox's own classes do the
  same on a :class:`TaskModel`.

Multi-class models need no hook: Foolbox's unmodified attacks run on a :class:`TaskModel` with ``MultiClass()``
and integer labels.

Models that return probabilities (a final softmax or sigmoid): with the task declaring
``outputs="probabilities"``, a :class:`TaskModel` returns the logits they come from
(:meth:`~medadv.tasks.Task.logits_model`: ``log p`` / ``logit p``), so Foolbox's cross-entropy, margins and arg-max
read logits and the criteria read them as the task does; Foolbox ``preprocessing`` stays the input
standardisation. Undeclared, the first forward refuses outputs that look like probabilities in one line
(:meth:`~medadv.tasks.Task.check_outputs`), before the attack's first step.
"""

from __future__ import annotations

import inspect
import os
import sys
from types import FrameType
from typing import Any

import eagerpy as ep
import foolbox as fb
import torch
from foolbox.attacks.base import Repeated, verify_input_bounds
from torch import Tensor, nn

from medadv.runtime import attack_mode, model_device
from medadv.tasks import Task, get_task
from medadv.threats import check_budget_scale

from ._common import check_first_output, check_model, check_task
from .foolbox_support import EXCLUDED, SUPPORT, UNIT_BOX_ONLY
from .support import UnsupportedAttackError, check_supported, task_kind

__all__ = [
    "TaskModel",
    "MultiLabelMisclassification",
    "TargetedMultiLabel",
    "SegmentationMisclassification",
    "TargetedSegmentation",
    "criterion",
    "SUPPORT",
    "EXCLUDED",
    "UnsupportedAttackError",
    "attack_name",
    "LinfPGD",
    "L2PGD",
    "FGSM",
    "FGM",
    "LinfBasicIterativeAttack",
    "L2BasicIterativeAttack",
]

TOOLKIT = "Foolbox"
_FOOLBOX_DIR = os.path.dirname(fb.__file__) + os.sep
_VERIFY_CODE = verify_input_bounds.__code__
#: how many frames above the model call are searched for the calling attack (Foolbox nests at most ~6)
_MAX_DEPTH = 24
#: frames above the model call in which any method (not only Foolbox's) is checked for an attack ``self``
_NEAR = 8


def _raw(t: Any) -> Any:
    return t.raw if isinstance(t, ep.Tensor) else t


class _TaskLogits(ep.PyTorchTensor):
    """Logits of a multi-label or segmentation :class:`TaskModel`: ``crossentropy`` is the task's loss.

    Foolbox's gradient attacks compute ``ep.crossentropy(logits, labels)`` (``logits.crossentropy(labels)``),
    which eagerpy only defines for ``(N, K)`` logits and class indices. With these logits it is the task's
    per-sample loss against the criterion's multi-hot labels or label map, so Foolbox's ascent (untargeted)
    and descent (targeted) keep their meaning. Every other operation is eagerpy's own.
    """

    __slots__ = ()
    task: Task  # set on the per-task subclass made by ``_logits_type``

    def crossentropy(self, labels: Any) -> Any:
        logits, y = self.raw, _raw(labels)
        task = self.task
        if not isinstance(y, Tensor):
            raise TypeError(f"labels must be a torch.Tensor, got {type(y).__name__}")
        if task.label_source == "vector" and tuple(y.shape) != tuple(logits.shape):
            raise ValueError(f"multi-label loss needs multi-hot labels of shape {tuple(logits.shape)}, got "
                             f"{tuple(y.shape)}; build the criterion with mfb.criterion(task, y)")
        if task.label_source == "map" and tuple(y.shape) != (logits.shape[0], *logits.shape[2:]):
            raise ValueError(f"segmentation loss needs a label map of shape {(logits.shape[0], *logits.shape[2:])}, "
                             f"got {tuple(y.shape)}; build the criterion with mfb.criterion(task, y)")
        return type(self)(task.loss(logits, task.to_target(y, logits)))


def _logits_type(task: Task) -> type[_TaskLogits] | None:
    if task.label_source == "index":
        return None  # Foolbox's cross-entropy is the multi-class task loss: nothing to change
    return type("TaskLogits", (_TaskLogits,), {"__slots__": (), "task": task})


def attack_name(attack: Any) -> str | None:
    """The :data:`SUPPORT` row of a Foolbox attack instance or class: its nearest class defined by Foolbox.

    Aliases (``fb.attacks.PGD``) are the class itself; medadv's and users' subclasses of a Foolbox attack take
    their Foolbox parent's row. A Foolbox attack class missing from the table (a newer Foolbox) gives its own
    name, which :func:`~medadv.adapters.support.check_supported` refuses. ``None`` for an attack written on
    Foolbox's internal base classes only (the user's own attack, not Foolbox's).
    """
    cls = attack if isinstance(attack, type) else type(attack)
    for c in cls.__mro__:
        if c.__module__.startswith("foolbox.attacks."):
            if c.__name__ in SUPPORT or c.__name__ in EXCLUDED or (
                    getattr(fb.attacks, c.__name__, None) is c and not inspect.isabstract(c)):
                return c.__name__
            return None
    return None


def _attacks_on_stack(frame: FrameType | None, first: bool = False) -> list[tuple[Any, FrameType]]:
    """``(attack, frame)`` for each Foolbox attack method running above ``frame``, innermost first (only the
    innermost with ``first``).

    Reading ``f_locals`` builds a dict, so only methods are opened: those of Foolbox's own code anywhere in
    the walk, and any method in the first few frames (a user's subclass overriding ``run`` or the loss calls
    the model from there); the walk stays in the microseconds under a deep caller stack. ``Repeated`` is
    unwrapped to the attack it repeats.
    """
    found: list[tuple[Any, FrameType]] = []
    depth = 0
    while frame is not None and depth < _MAX_DEPTH:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self" and (
                depth < _NEAR or code.co_filename.startswith(_FOOLBOX_DIR)):
            obj = frame.f_locals.get("self")
            while isinstance(obj, Repeated):
                obj = obj.attack
            if isinstance(obj, fb.attacks.base.Attack):
                found.append((obj, frame))
                if first:
                    break
        frame = frame.f_back
        depth += 1
    return found


class TaskModel(fb.PyTorchModel):
    """A ``foolbox.PyTorchModel`` that knows its medadv task: Foolbox's own attacks run on it task-aware.

    Gradient attacks get the task loss, the medadv criteria give every attack the task's success test, and
    attacks that do not apply to the task are refused (:data:`SUPPORT`) before they do any work.

    Args:
        model: the PyTorch model (each forward runs in eval mode with frozen parameters), returning logits, or
            probabilities with the task declaring ``outputs="probabilities"`` (converted to logits).
        task: :class:`~medadv.tasks.MultiClass`, :class:`~medadv.tasks.MultiLabel` or
            :class:`~medadv.tasks.Segmentation`.
        bounds: ``(lo, hi)`` valid input range in data units (e.g. ``(-1024, 3071)`` HU).
        device: defaults to the model's device.
        preprocessing: Foolbox preprocessing dict (``mean``, ``std``, ``axis``, ``flip_axis``).
        allow_large_budgets: let attacks take ``epsilons`` above half the ``bounds`` range (L∞; for Lp, half the
            box's Lp diagonal). Refused by default before the attack does any work: ``epsilons=8`` on [0, 1] data
            is 8 meant as 8/255 and Foolbox would return any point of the box. An epsilon below 0.1 % of the range
            warns (:func:`medadv.threats.check_budget_scale`).
    """

    def __init__(self, model: nn.Module, task: Task, bounds: tuple[float, float], *, device: Any = None,
                 preprocessing: dict[str, Any] | None = None, allow_large_budgets: bool = False) -> None:
        check_model(model)
        if not isinstance(allow_large_budgets, bool):
            raise TypeError(f"`allow_large_budgets` must be True or False, got {allow_large_budgets!r}")
        check_task(task, "foolbox")
        if not isinstance(bounds, (tuple, list)) or len(bounds) != 2 or not float(bounds[0]) < float(bounds[1]):
            raise ValueError(f"`bounds` must be a (lo, hi) pair of numbers with lo < hi, got {bounds!r}")
        # declared probabilities: Foolbox gets their logits (its crossentropy, margins and arg-max expect logits)
        super().__init__(task.logits_model(model), bounds=(float(bounds[0]), float(bounds[1])),
                         device=device if device is not None else model_device(model), preprocessing=preprocessing)
        self.module = model
        self.task = task
        self.allow_large_budgets = allow_large_budgets
        self._budget_checked: tuple[int, str, int] | None = None
        self._logits = _logits_type(task)
        self._frozen = False  # True while a medadv attack class holds attack_mode for the whole call
        # listed once: walking a deep model's modules() and parameters() costs more than the freezing itself
        self._module_list = list(model.modules())
        self._param_list = list(model.parameters())

    # --- the first call of every Foolbox attack: verify_input_bounds(x, model) reads model.bounds -------------
    @property
    def bounds(self) -> Any:
        caller = sys._getframe(1)
        if caller.f_code is _VERIFY_CODE:
            self._check_call(caller)
        return self._bounds

    def _kind(self, x: Any) -> str:
        if self.task.spatial_labels:
            if x.ndim not in (4, 5):
                raise ValueError(f"a segmentation TaskModel takes (N, C, H, W) or (N, C, D, H, W) inputs, got "
                                 f"shape {tuple(x.shape)}")
            return task_kind(self.task, x.ndim - 2)
        return task_kind(self.task)

    def _check_call(self, verify_frame: FrameType) -> None:
        """At an attack's entry: refuse an attack that does not apply, a labels tensor where a medadv
        criterion is needed, inputs outside the bounds, and [0, 1]-only attacks on other bounds."""
        x = _raw(verify_frame.f_locals.get("input"))
        if not isinstance(x, Tensor):
            return
        attacks = _attacks_on_stack(verify_frame.f_back)
        if not attacks:
            return
        kind = self._kind(x)
        for attack, frame in attacks:
            name = attack_name(attack)
            if name is not None:
                check_supported(SUPPORT, TOOLKIT, name, kind)
            for local in ("criterion", "criterion_"):
                if local in frame.f_locals:
                    self._check_criterion(frame.f_locals[local], name or type(attack).__name__)
            if "epsilons" in frame.f_locals:  # the attack's __call__: its budgets, before any work
                self._check_epsilons(attack, name or type(attack).__name__, frame.f_locals["epsilons"], x)
            lo, hi = self._bounds
            if name in UNIT_BOX_ONLY and (lo, hi) != (0.0, 1.0):
                raise ValueError(
                    f"Foolbox's {name} clips its iterates to [0, 1] whatever the model bounds, so with bounds "
                    f"({lo:g}, {hi:g}) it would return inputs squeezed into [0, 1]; attack in [0, 1] units: "
                    f"`fmodel.transform_bounds((0, 1))` with inputs `(x - {lo:g}) / {hi - lo:g}`")
        lo, hi = self._bounds
        # Foolbox itself only asserts (bare AssertionError) on out-of-bounds inputs
        if bool((x < lo).any()) or bool((x > hi).any()):
            raise ValueError(f"`inputs` has values in [{float(x.min()):.6g}, {float(x.max()):.6g}], outside the "
                             f"model bounds ({lo:.6g}, {hi:.6g})")

    def _check_epsilons(self, attack: Any, name: str, epsilons: Any, x: Tensor) -> None:
        """The budget-scale rule of medadv's ``Linf`` (:func:`medadv.threats.check_budget_scale`) on the
        ``epsilons`` of a Foolbox attack call, in the norm of the attack's ``distance``."""
        key = (id(attack), repr(epsilons), id(x))
        if self._budget_checked == key:
            return  # Foolbox reads model.bounds twice per call: one warning per call
        try:
            p = float(attack.distance.p)
        except Exception:  # attacks with no fixed distance (Spatial; minimisation attacks without `distance`)
            return
        check_budget_scale(
            epsilons, self._bounds, name="epsilons", owner=f"Foolbox {name} ",
            where=" (the TaskModel's `bounds`)", p=p, size=int(x[0].numel()) if x.ndim else None,
            allow_large_budgets=self.allow_large_budgets, stacklevel=6,  # the user's attack call
            advice="budgets are in data units, e.g. 8/255 for 8 on a 0-255 scale; build TaskModel(..., "
                   "allow_large_budgets=True) if you mean it")
        self._budget_checked = key  # only once passed: a refused call refuses again when repeated

    def _check_criterion(self, crit: Any, attack: str) -> None:
        task = self.task
        if isinstance(crit, fb.criteria._And):
            self._check_criterion(crit.a, attack)
            self._check_criterion(crit.b, attack)
            return
        own = getattr(crit, "task", None) if isinstance(crit, _MEDADV_CRITERIA) else None
        if own is not None and type(own) is not type(task):
            raise TypeError(f"{type(crit).__name__} is a criterion for {type(own).__name__} models, but this "
                            f"TaskModel's task is {task!r}; use mfb.criterion(fmodel.task, y)")
        if task.label_source == "index" or own is not None:
            return
        if isinstance(crit, fb.criteria.Criterion) and not isinstance(
                crit, (fb.criteria.Misclassification, fb.criteria.TargetedMisclassification)):
            return  # a user's own criterion: it defines success itself
        what = "multi-hot label vectors" if task.label_source == "vector" else "label maps"
        got = (f"Foolbox's {type(crit).__name__}" if isinstance(crit, fb.criteria.Criterion)
               else "a plain labels tensor" if isinstance(_raw(crit), Tensor) else f"{type(crit).__name__}")
        raise TypeError(
            f"Foolbox {attack} got {got}, which Foolbox reads as one class index per sample (arg-max over the "
            f"last axis); for {what} pass `mfb.criterion(fmodel.task, y)` (or `targeted=True` with the target), "
            "i.e. a medadv.adapters.foolbox criterion such as "
            + ("MultiLabelMisclassification(y)" if task.label_source == "vector"
               else "SegmentationMisclassification(y, task)"))

    # --- every forward ------------------------------------------------------------------------------------
    def __call__(self, inputs: Any) -> Any:
        x = _raw(inputs)
        if isinstance(x, Tensor):
            # the safety net for attacks that reach the model without verify_input_bounds (DatasetAttack.feed)
            for attack, _ in _attacks_on_stack(sys._getframe(1), first=True):
                name = attack_name(attack)
                if name is not None:
                    check_supported(SUPPORT, TOOLKIT, name, self._kind(x))
        if self._frozen:
            out = super().__call__(inputs)
        else:
            # eval mode and frozen parameters for this forward (what attack_mode does for a whole attack): the
            # graph Foolbox differentiates then reaches the input only, and the model's .grad stays untouched
            training = [m for m in self._module_list if m.training]
            trainable = [p for p in self._param_list if p.requires_grad]
            for m in training:
                m.training = False
            for p in trainable:
                p.requires_grad_(False)
            try:
                out = super().__call__(inputs)
            finally:
                for m in training:
                    m.training = True
                for p in trainable:
                    p.requires_grad_(True)
        check_first_output(self, self.task, _raw(out))  # undeclared probabilities: refused before the first step
        if self._logits is not None and type(out) is ep.PyTorchTensor:
            out = self._logits(out.raw)
        return out


def _check_labels(task: Task, labels: Any, name: str) -> Tensor:
    if not isinstance(_raw(labels), Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(labels).__name__}")
    y = _raw(labels)
    if task.label_source == "vector" and y.ndim != 2:
        raise ValueError(f"`{name}` must be multi-hot (N, L) for a multi-label criterion, got {tuple(y.shape)}")
    if task.label_source == "map" and (y.ndim not in (3, 4) or y.is_floating_point()):
        raise ValueError(f"`{name}` must be an integer label map (N, *spatial), got {tuple(y.shape)} {y.dtype}")
    return y


class MultiLabelMisclassification(fb.criteria.Misclassification):
    """Adversarial when any label's thresholded prediction differs from ``labels`` (multi-hot ``(N, L)``).

    Args:
        labels: multi-hot float/bool tensor ``(N, L)``.
        threshold: probability threshold of a positive label (the task's).
    """

    def __init__(self, labels: Tensor, threshold: float = 0.5) -> None:
        self.task = get_task("multilabel", threshold=threshold)
        super().__init__(_check_labels(self.task, labels, "labels").float())

    def __call__(self, perturbed: Any, outputs: Any) -> Any:
        out, restore = ep.astensor_(outputs)
        return restore(ep.astensor(self.task.fooled(out.raw, self.labels.raw, targeted=False)))


class TargetedMultiLabel(fb.criteria.TargetedMisclassification):
    """Adversarial when every label's thresholded prediction equals the target vector ``(N, L)``."""

    def __init__(self, target_classes: Tensor, threshold: float = 0.5) -> None:
        self.task = get_task("multilabel", threshold=threshold)
        super().__init__(_check_labels(self.task, target_classes, "target_classes").float())

    def __call__(self, perturbed: Any, outputs: Any) -> Any:
        out, restore = ep.astensor_(outputs)
        return restore(ep.astensor(self.task.fooled(out.raw, self.target_classes.raw, targeted=True)))


class SegmentationMisclassification(fb.criteria.Misclassification):
    """Adversarial when the segmentation quality against ``labels`` falls below ``threshold``.

    Args:
        labels: integer label map ``(N, *spatial)``.
        task: the :class:`~medadv.tasks.Segmentation` task (classes counted, ignore index).
        metric: ``"dice"`` (mean Dice over counted classes) or ``"pixel_accuracy"``.
        threshold: the metric value below which a sample counts as fooled; default the task's
            ``dice_threshold``.
    """

    def __init__(self, labels: Tensor, task: Task, metric: str = "dice", threshold: float | None = None):
        seg: Any = check_task(task, "foolbox", ("map",))  # a label-map kind: its `dice_threshold`
        if metric not in ("dice", "pixel_accuracy"):
            raise ValueError(f"`metric` must be 'dice' or 'pixel_accuracy', got {metric!r}")
        self.task, self.metric = seg, metric
        self.threshold = seg.dice_threshold if threshold is None else float(threshold)
        super().__init__(_check_labels(seg, labels, "labels"))

    def __call__(self, perturbed: Any, outputs: Any) -> Any:
        out, restore = ep.astensor_(outputs)
        metrics = self.task.metrics(out.raw, self.labels.raw)
        value = metrics["mean_dice"] if self.metric == "dice" else metrics["pixel_accuracy"]
        return restore(ep.astensor(value < self.threshold))


class TargetedSegmentation(fb.criteria.TargetedMisclassification):
    """Adversarial when at least ``fraction`` of the valid voxels are predicted as in ``target_classes``.

    Args:
        target_classes: integer target map ``(N, *spatial)``.
        task: the :class:`~medadv.tasks.Segmentation` task.
        fraction: required fraction of voxels at the target; default the task's ``target_fraction``.
    """

    def __init__(self, target_classes: Tensor, task: Task, fraction: float | None = None) -> None:
        seg: Any = check_task(task, "foolbox", ("map",))  # a label-map kind: its `target_fraction`
        self.task = seg
        self.fraction = seg.target_fraction if fraction is None else float(fraction)
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"`fraction` must be in (0, 1], got {fraction}")
        super().__init__(_check_labels(task, target_classes, "target_classes"))

    def __call__(self, perturbed: Any, outputs: Any) -> Any:
        out, restore = ep.astensor_(outputs)
        y = self.target_classes.raw
        hit = self.task.reduce((self.task.predict(out.raw) == y).float(), y)
        return restore(ep.astensor(hit >= self.fraction))


_MEDADV_CRITERIA = (MultiLabelMisclassification, TargetedMultiLabel, SegmentationMisclassification,
                    TargetedSegmentation)


def criterion(task: Task, y: Tensor, targeted: bool = False) -> fb.criteria.Criterion:
    """The Foolbox criterion matching a medadv task (its ``fooled`` test) for labels or targets ``y``, by the kind's
    declared label form (:attr:`~medadv.tasks.Task.label_source`)."""
    form = task.label_source if isinstance(task, Task) else None
    if form == "vector":
        return (TargetedMultiLabel if targeted else MultiLabelMisclassification)(y, task.threshold)  # type: ignore[attr-defined]
    if form == "map":
        return TargetedSegmentation(y, task) if targeted else SegmentationMisclassification(y, task)  # type: ignore[arg-type]
    if form == "index":
        return fb.criteria.TargetedMisclassification(y) if targeted else fb.criteria.Misclassification(y)
    raise TypeError(f"`task` must be a kind whose labels are class indices, 0/1 vectors or label maps "
                    f"(traits.labels.label_source), got {task!r}")


class _TaskLoss:
    """Foolbox loss hook: the task's per-sample loss summed over the batch, from the model's task."""

    def get_loss_fn(self, model: Any, labels: ep.Tensor):  # type: ignore[override]
        task = getattr(model, "task", None)
        if task is None:
            raise TypeError("the model must be a medadv.adapters.foolbox.TaskModel (it carries the task)")

        def loss_fn(inputs: ep.Tensor) -> ep.Tensor:
            logits = _raw(model(inputs))
            return ep.astensor(task.loss(logits, task.to_target(labels.raw, logits)).sum())

        return loss_fn

    def __call__(self, model: Any, inputs: Any, criterion: Any, *, epsilons: Any, **kwargs: Any) -> Any:
        if not isinstance(model, TaskModel):
            raise TypeError(f"`model` must be a medadv.adapters.foolbox.TaskModel, got {type(model).__name__}")
        with attack_mode(model.module), torch.enable_grad():
            model._frozen = True
            try:
                return super().__call__(model, inputs, criterion, epsilons=epsilons, **kwargs)  # type: ignore[misc]
            finally:
                model._frozen = False


class LinfPGD(_TaskLoss, fb.attacks.LinfPGD):  # type: ignore[misc]  # _TaskLoss wraps Foolbox's @final __call__ on purpose
    """Foolbox ``LinfPGD`` (Madry et al., ICLR 2018) on the task's loss; same arguments as Foolbox's."""


class L2PGD(_TaskLoss, fb.attacks.L2PGD):  # type: ignore[misc]  # _TaskLoss wraps Foolbox's @final __call__ on purpose
    """Foolbox ``L2PGD`` (Madry et al., ICLR 2018) on the task's loss; same arguments as Foolbox's."""


class FGSM(_TaskLoss, fb.attacks.FGSM):  # type: ignore[misc]  # _TaskLoss wraps Foolbox's @final __call__ on purpose
    """Foolbox ``FGSM`` (Goodfellow et al., ICLR 2015) on the task's loss; untargeted only (as Foolbox)."""


class FGM(_TaskLoss, fb.attacks.FGM):  # type: ignore[misc]  # _TaskLoss wraps Foolbox's @final __call__ on purpose
    """Foolbox ``FGM`` (L2 fast gradient) on the task's loss; untargeted only (as Foolbox)."""


class LinfBasicIterativeAttack(_TaskLoss, fb.attacks.LinfBasicIterativeAttack):  # type: ignore[misc]  # _TaskLoss wraps Foolbox's @final __call__ on purpose
    """Foolbox ``LinfBasicIterativeAttack`` (Kurakin et al., 2017) on the task's loss."""


class L2BasicIterativeAttack(_TaskLoss, fb.attacks.L2BasicIterativeAttack):  # type: ignore[misc]  # _TaskLoss wraps Foolbox's @final __call__ on purpose
    """Foolbox ``L2BasicIterativeAttack`` (Kurakin et al., 2017) on the task's loss."""
