"""The interface between the adversarial-training loop and its strategies.

A strategy turns one batch into one scalar training loss (PGD-AT, MPAdvT, MAAdvT, TRADES, VAFT, ...).
The loop owns the optimiser, checkpoints, progress and randomness; the strategy owns the loss.
Train-time attacks are medadv attacks, which put the model in eval mode with frozen parameters for
the attack and restore train mode afterwards.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor, nn

from ..tasks import Task
from ..threats import Threat

__all__ = ["TrainingStrategy", "check_inner_attack"]


class TrainingStrategy(ABC):
    """One adversarial-training recipe: ``loss(model, x, y, task, generator) -> scalar``.

    ``model`` is in train mode on entry and must be in train mode on exit. ``generator`` is the
    loop's seeded ``torch.Generator`` (CPU), used for every random choice of the strategy so that a
    seeded run is reproducible and resumable.
    """

    name: str = "strategy"

    @abstractmethod
    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        """Scalar loss for one batch (autograd graph to the model parameters attached)."""

    def state_dict(self) -> dict[str, Any]:
        """Strategy state to checkpoint (tensors and plain Python values only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def check_inner_attack(threat: Any, steps: Any, step_size: Any) -> None:
    """Validate the train-time PGD settings shared by the strategies (threat, step count, step size)."""
    if not isinstance(threat, Threat):
        raise TypeError(f"`threat` must be a medadv Threat (Linf, L2), got {threat!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"`steps` must be an integer >= 1, got {steps!r}")
    if step_size is not None and not float(step_size) >= 0:
        raise ValueError(f"`step_size` must be >= 0, got {step_size}")
