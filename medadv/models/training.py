"""Plain supervised training (no attacks): used by the demo, the examples and the tests.

The implementation is :func:`medadv.training.fit_supervised` (defined in :mod:`medadv.models.fitting`, on the loop
shared with adversarial training and GAP): ``medadv.models`` imports nothing from ``medadv.training``.
"""

from __future__ import annotations

import os

from torch import Tensor, nn

from ..tasks import Task
from .fitting import fit_supervised as fit

__all__ = ["fit_supervised"]


def fit_supervised(model: nn.Module, task: Task, x: Tensor, y: Tensor, *, epochs: int = 20, batch_size: int = 16,
                   lr: float = 1e-2, seed: int = 0, progress: bool = False, desc: str = "training",
                   checkpoint: str | os.PathLike | None = None) -> list[float]:
    """Train ``model`` in place on ``(x, y)`` with Adam(``lr``) and the task's loss; returns the per-epoch mean
    loss. See :func:`medadv.training.fit_supervised` (seeded order, optional checkpoint with exact resume)."""
    return fit(model, task, x, y, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, progress=progress,
               desc=desc, checkpoint=checkpoint)
