"""Helpers shared by the toolkit adapters (label conversion, argument checks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from medadv.tasks import Task, registered_task_classes

__all__ = ["check_model", "check_task", "classifier_target", "segmentation_target", "as_tensor",
           "check_first_output"]


def check_model(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    return model


def check_task(task: Any, toolkit: str, forms: tuple[str, ...] | None = None, hint: str = "") -> Task:
    """``task``, when its kind declares the ``toolkit`` adapter (``traits.toolkits.adapters``) and, with
    ``forms``, one of those label forms (``traits.labels.label_source``: ``"index"``, ``"vector"``, ``"map"``,
    ``"values"``); else a ``TypeError`` naming the registered kinds that fit (the kinds declare it: no class list
    here, so a new kind that declares the toolkit is taken)."""

    def fits(traits: Any) -> bool:
        return toolkit in traits.toolkits.adapters and (forms is None or traits.labels.label_source in forms)

    if not isinstance(task, Task) or not fits(task.traits):
        names = ", ".join(c.name for c in registered_task_classes() if fits(c.traits))
        raise TypeError(f"`task` must be a task of a kind the {toolkit} adapter takes ({names}), got {task!r}"
                        + (f"; {hint}" if hint else ""))
    return task


def as_tensor(v: Any, device: torch.device, name: str) -> Tensor:
    """A numpy array or tensor as a tensor on ``device`` (no copy when already there)."""
    if isinstance(v, Tensor):
        return v.to(device)
    if isinstance(v, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(v)).to(device)
    raise TypeError(f"`{name}` must be a numpy array or a torch.Tensor, got {type(v).__name__}")


def classifier_target(task: Task, y: Tensor, logits: Tensor) -> Tensor:
    """Labels as the task's loss expects them, from what a toolkit passes around.

    Multi-label: toolkits hand over multi-hot vectors, sometimes rescaled (ART's FGM divides by the row
    sum), so any positive entry counts as present. Multi-class: one-hot or probability rows become indices.
    """
    form = task.label_source  # the kind's declared label form: what the toolkit's labels must become
    if form == "vector":
        if tuple(y.shape) != tuple(logits.shape):
            raise ValueError(f"`y` must be multi-hot with shape {tuple(logits.shape)}, got {tuple(y.shape)}")
        return (y > 0).to(logits.dtype)
    if form == "index":
        if y.ndim == 2:
            return y.argmax(dim=1)
        return y.long()
    raise TypeError(f"expected a classification task (labels: class indices or 0/1 vectors), got {task!r}")


def segmentation_target(task: Task, y: Tensor, logits: Tensor) -> Tensor:
    """A label map ``(N, *spatial)`` from either a label map or a per-class score map ``(N, C, *spatial)``.

    Toolkits that attack with ``y=None`` pass the model's own output as the label (ART does), so a score
    map is reduced to its arg-max; integer-valued float maps (numpy round trips) become integers.
    """
    spatial = (logits.shape[0], *logits.shape[2:])
    if tuple(y.shape) == tuple(logits.shape) and y.ndim == logits.ndim:
        return y.argmax(dim=1)
    if tuple(y.shape) != spatial:
        raise ValueError(
            f"`y` must be a label map of shape {spatial} or a score map of shape {tuple(logits.shape)}, "
            f"got {tuple(y.shape)}"
        )
    if y.is_floating_point():
        if not bool((y == y.round()).all()):
            raise ValueError("`y` label map must hold integer class values")
        y = y.round()
    y = y.long()
    task.validate_labels(logits, y, "y")
    return y


def check_first_output(owner: Any, task: Task, out: Any) -> None:
    """Refuse probability outputs of a task that does not declare them (:meth:`~medadv.tasks.Task.check_outputs`,
    one line saying to declare ``outputs: probabilities``) on the first model output ``owner`` (an adapter) reads,
    before the toolkit's attack takes a step; later outputs pass unchecked (one host read per adapter, not per
    step). Declared outputs are trusted (converted by :meth:`~medadv.tasks.Task.logits_model`, which every
    adapter hands its toolkit: the toolkits compute losses, gradients and margins on logits, as they expect)."""
    if getattr(owner, "_outputs_checked", False) or not isinstance(out, Tensor):
        return
    task.check_outputs(out.detach())
    owner._outputs_checked = True
