"""Foolbox 3 for multi-label and 2-D/3-D segmentation models: criteria, a task-aware model, a loss hook.

Foolbox's gradient attacks end in ``ep.crossentropy(model(x), labels)``, which only takes ``(N, K)``
logits, and its criteria compare an arg-max with class indices (foolbox #643, #708, #306). Here:

* :class:`TaskModel` -- a ``foolbox.PyTorchModel`` that also carries the medadv task (bounds in data units,
  Foolbox ``preprocessing`` unchanged: use ``axis=-4`` for per-channel ``(N, C, D, H, W)`` volumes).
* Criteria -- :class:`MultiLabelMisclassification` (any label flipped), :class:`TargetedMultiLabel`
  (the target label vector reached), :class:`SegmentationMisclassification` (Dice or pixel accuracy
  below a threshold) and :class:`TargetedSegmentation` (the target map reached on a fraction of voxels).
  They subclass Foolbox's own ``Misclassification`` / ``TargetedMisclassification`` so Foolbox's attack
  loop accepts them unchanged (ascend for the first, descend towards ``target_classes`` for the second).
* :class:`LinfPGD`, :class:`L2PGD`, :class:`FGSM`, :class:`FGM`, :class:`LinfBasicIterativeAttack`,
  :class:`L2BasicIterativeAttack` -- Foolbox's attacks with only the ``get_loss_fn`` hook replaced by the
  task's loss (per-label BCE, per-voxel CE/Dice); steps, projection, random start and ``epsilons`` are
  Foolbox's own. They also run the model in eval mode with frozen parameters, so Foolbox's ``backward``
  leaves the model's ``.grad`` untouched.

Multi-class models need no hook: Foolbox's unmodified attacks (``LinfDeepFoolAttack``, ``L2CarliniWagnerAttack``,
...) run on a :class:`TaskModel` with ``MultiClass()`` and integer labels.
"""

from __future__ import annotations

from typing import Any

import eagerpy as ep
import foolbox as fb
import torch
from torch import Tensor, nn

from medadv.runtime import attack_mode, model_device
from medadv.tasks import MultiClass, MultiLabel, Segmentation, Task

from ._common import check_model, check_task

__all__ = [
    "TaskModel",
    "MultiLabelMisclassification",
    "TargetedMultiLabel",
    "SegmentationMisclassification",
    "TargetedSegmentation",
    "criterion",
    "LinfPGD",
    "L2PGD",
    "FGSM",
    "FGM",
    "LinfBasicIterativeAttack",
    "L2BasicIterativeAttack",
]


class TaskModel(fb.PyTorchModel):
    """A ``foolbox.PyTorchModel`` that knows its medadv task (read by the loss hook and :func:`criterion`).

    Args:
        model: the PyTorch model (put it in eval mode; Foolbox warns otherwise).
        task: :class:`~medadv.tasks.MultiClass`, :class:`~medadv.tasks.MultiLabel` or
            :class:`~medadv.tasks.Segmentation`.
        bounds: ``(lo, hi)`` valid input range in data units (e.g. ``(-1024, 3071)`` HU).
        device: defaults to the model's device.
        preprocessing: Foolbox preprocessing dict (``mean``, ``std``, ``axis``, ``flip_axis``).
    """

    def __init__(self, model: nn.Module, task: Task, bounds: tuple[float, float], *, device: Any = None,
                 preprocessing: dict[str, Any] | None = None) -> None:
        check_model(model)
        check_task(task, (MultiClass, MultiLabel, Segmentation))
        if not isinstance(bounds, (tuple, list)) or len(bounds) != 2 or not float(bounds[0]) < float(bounds[1]):
            raise ValueError(f"`bounds` must be a (lo, hi) pair of numbers with lo < hi, got {bounds!r}")
        super().__init__(model, bounds=(float(bounds[0]), float(bounds[1])),
                         device=device if device is not None else model_device(model), preprocessing=preprocessing)
        self.module = model
        self.task = task


def _raw(t: Any) -> Tensor:
    return t.raw if isinstance(t, ep.Tensor) else t


def _check_labels(task: Task, labels: Any, name: str) -> Tensor:
    if not isinstance(_raw(labels), Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(labels).__name__}")
    y = _raw(labels)
    if isinstance(task, MultiLabel) and y.ndim != 2:
        raise ValueError(f"`{name}` must be multi-hot (N, L) for a multi-label criterion, got {tuple(y.shape)}")
    if isinstance(task, Segmentation) and (y.ndim not in (3, 4) or y.is_floating_point()):
        raise ValueError(f"`{name}` must be an integer label map (N, *spatial), got {tuple(y.shape)} {y.dtype}")
    return y


class MultiLabelMisclassification(fb.criteria.Misclassification):
    """Adversarial when any label's thresholded prediction differs from ``labels`` (multi-hot ``(N, L)``).

    Args:
        labels: multi-hot float/bool tensor ``(N, L)``.
        threshold: probability threshold of a positive label (the task's).
    """

    def __init__(self, labels: Tensor, threshold: float = 0.5) -> None:
        self.task = MultiLabel(threshold)
        super().__init__(_check_labels(self.task, labels, "labels").float())

    def __call__(self, perturbed: Any, outputs: Any) -> Any:
        out, restore = ep.astensor_(outputs)
        return restore(ep.astensor(self.task.fooled(out.raw, self.labels.raw, targeted=False)))


class TargetedMultiLabel(fb.criteria.TargetedMisclassification):
    """Adversarial when every label's thresholded prediction equals the target vector ``(N, L)``."""

    def __init__(self, target_classes: Tensor, threshold: float = 0.5) -> None:
        self.task = MultiLabel(threshold)
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

    def __init__(self, labels: Tensor, task: Segmentation, metric: str = "dice", threshold: float | None = None):
        check_task(task, (Segmentation,))
        if metric not in ("dice", "pixel_accuracy"):
            raise ValueError(f"`metric` must be 'dice' or 'pixel_accuracy', got {metric!r}")
        self.task, self.metric = task, metric
        self.threshold = task.dice_threshold if threshold is None else float(threshold)
        super().__init__(_check_labels(task, labels, "labels"))

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

    def __init__(self, target_classes: Tensor, task: Segmentation, fraction: float | None = None) -> None:
        check_task(task, (Segmentation,))
        self.task = task
        self.fraction = task.target_fraction if fraction is None else float(fraction)
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"`fraction` must be in (0, 1], got {fraction}")
        super().__init__(_check_labels(task, target_classes, "target_classes"))

    def __call__(self, perturbed: Any, outputs: Any) -> Any:
        out, restore = ep.astensor_(outputs)
        y = self.target_classes.raw
        hit = self.task.reduce((self.task.predict(out.raw) == y).float(), y)
        return restore(ep.astensor(hit >= self.fraction))


def criterion(task: Task, y: Tensor, targeted: bool = False) -> fb.criteria.Criterion:
    """The Foolbox criterion matching a medadv task (its ``fooled`` test) for labels or targets ``y``."""
    if isinstance(task, MultiLabel):
        return (TargetedMultiLabel if targeted else MultiLabelMisclassification)(y, task.threshold)
    if isinstance(task, Segmentation):
        return TargetedSegmentation(y, task) if targeted else SegmentationMisclassification(y, task)
    if isinstance(task, MultiClass):
        return fb.criteria.TargetedMisclassification(y) if targeted else fb.criteria.Misclassification(y)
    raise TypeError(f"`task` must be MultiClass, MultiLabel or Segmentation, got {task!r}")


class _TaskLoss:
    """Foolbox loss hook: the task's per-sample loss summed over the batch, from the model's task."""

    def get_loss_fn(self, model: Any, labels: ep.Tensor):  # type: ignore[override]
        task = getattr(model, "task", None)
        if task is None:
            raise TypeError("the model must be a medadv.adapters.foolbox.TaskModel (it carries the task)")

        def loss_fn(inputs: ep.Tensor) -> ep.Tensor:
            logits = model(inputs).raw
            return ep.astensor(task.loss(logits, task.to_target(labels.raw, logits)).sum())

        return loss_fn

    def __call__(self, model: Any, inputs: Any, criterion: Any, *, epsilons: Any, **kwargs: Any) -> Any:
        if not isinstance(model, TaskModel):
            raise TypeError(f"`model` must be a medadv.adapters.foolbox.TaskModel, got {type(model).__name__}")
        x = _raw(inputs)
        lo, hi = model.bounds
        # Foolbox itself only asserts (bare AssertionError) on out-of-bounds inputs
        if isinstance(x, Tensor) and (bool((x < lo).any()) or bool((x > hi).any())):
            raise ValueError(f"`inputs` has values in [{float(x.min()):.6g}, {float(x.max()):.6g}], outside the "
                             f"model bounds ({lo:.6g}, {hi:.6g})")
        with attack_mode(model.module), torch.enable_grad():
            return super().__call__(model, inputs, criterion, epsilons=epsilons, **kwargs)  # type: ignore[misc]


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
