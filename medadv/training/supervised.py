"""Plain supervised training (no attacks) on the shared loop: used by the demo, the examples and the tests."""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from ..params import Real
from ..runtime import check_input, model_device
from ..tasks import Task
from .loop import Fitter

__all__ = ["SupervisedFitter", "fit_supervised"]


class SupervisedFitter(Fitter):
    """Minimise the task's loss on ``(x, y)`` (see :func:`fit_supervised`)."""

    desc = "training"

    def __init__(self, model: nn.Module, task: Task, optimizer: torch.optim.Optimizer, *, epochs: int,
                 batch_size: int, seed: int = 0, checkpoint: str | os.PathLike | None = None,
                 progress: bool = False, desc: str = "training") -> None:
        super().__init__(model, optimizer, epochs=epochs, batch_size=batch_size, seed=seed, checkpoint=checkpoint,
                         progress=progress)
        self.model, self.task, self.desc = model, task, str(desc)

    def batch_loss(self, x: Tensor, y: Tensor | None, generator: torch.Generator) -> Tensor:
        assert y is not None
        logits = self.task.forward(self.model, x)  # `outputs: probabilities`: the loss reads their logits
        return self.task.loss(logits, self.task.to_target(y, logits)).mean()


def fit_supervised(
    model: nn.Module,
    task: Task,
    x: Tensor,
    y: Tensor,
    *,
    epochs: int = 20,
    batch_size: int = 16,
    lr: float = 1e-2,
    seed: int = 0,
    progress: bool = False,
    desc: str = "training",
    checkpoint: str | os.PathLike | None = None,
) -> list[float]:
    """Train ``model`` in place on ``(x, y)`` with Adam(``lr``) and the task's loss.

    The data order comes from a generator seeded with ``seed`` (the global RNG is not used). With
    ``checkpoint``, a checkpoint is written after every epoch and an interrupted run resumes from it to the
    same weights. Returns the per-sample mean loss of every epoch; the model is left in eval mode.
    """
    check_input(x)
    if not isinstance(y, Tensor) or y.shape[0] != x.shape[0]:
        raise ValueError(f"`y` must be a tensor with {x.shape[0]} entries (one per sample of `x`)")
    lr = Real(low=0, low_open=True).check(lr, "lr", "fit_supervised")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    fitter = SupervisedFitter(model, task, opt, epochs=epochs, batch_size=batch_size, seed=seed,
                              checkpoint=checkpoint, progress=progress, desc=desc)
    return fitter.run(x, y, model_device(model, x.device))
