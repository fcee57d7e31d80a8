"""The one adversarial-training loop; strategies (PGD-AT, MPAdvT, MAAdvT, TRADES, ...) supply the loss.

The loop owns what every recipe shares: the optimiser, the epoch/batch schedule, the seeded
``torch.Generator`` handed to the strategy for all of its random choices, a progress bar, and a
checkpoint after every epoch from which an interrupted run resumes to exactly the parameters an
uninterrupted run would have reached. Train-time attacks are medadv attacks, which run with the model
in eval mode and frozen parameters and restore train mode afterwards (Xu et al.'s code does the same).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..attacks.base import check_input, model_device
from ..models.io import load_checkpoint, save_checkpoint
from ..tasks import Task
from .base import TrainingStrategy

__all__ = ["AdversarialTrainer", "draw_seed"]


def draw_seed(generator: torch.Generator) -> int:
    """A fresh attack seed from the loop's generator (so attack randomness is part of the seeded stream)."""
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator))


class AdversarialTrainer:
    """Train ``model`` in place with a :class:`~medadv.defenses.base.TrainingStrategy`.

    Args:
        model: the network to train (any device; data batches are moved to it).
        task: how to read the model's output (:class:`~medadv.tasks.Task`).
        strategy: the training recipe (its ``loss`` is minimised).
        epochs: passes over the training data.
        batch_size: minibatch size.
        optimizer: a ready optimiser over ``model``'s parameters, or None for Adam(``lr``).
        lr: learning rate of the default Adam.
        seed: seed of the loop's generator (data order and every random choice of the strategy).
        checkpoint: file written after every epoch (model, optimiser, strategy state, generator state,
            history); if it exists when :meth:`fit` starts, training resumes from it.
        progress: show a tqdm progress bar (the displayed loss syncs with the device once per epoch).
    """

    def __init__(self, model: nn.Module, task: Task, strategy: TrainingStrategy, *, epochs: int = 10,
                 batch_size: int = 32, optimizer: torch.optim.Optimizer | None = None, lr: float = 1e-3,
                 seed: int = 0, checkpoint: str | os.PathLike | None = None, progress: bool = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(task, Task):
            raise TypeError(f"`task` must be a medadv Task, got {task!r}")
        if not isinstance(strategy, TrainingStrategy):
            raise TypeError(f"`strategy` must be a medadv TrainingStrategy, got {type(strategy).__name__}")
        for name, v in (("epochs", epochs), ("batch_size", batch_size)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"`{name}` must be an integer >= 1, got {v!r}")
        if optimizer is None:
            if not float(lr) > 0:
                raise ValueError(f"`lr` must be > 0, got {lr}")
            optimizer = torch.optim.Adam(model.parameters(), lr=float(lr))
        elif not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"`optimizer` must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
        self.model, self.task, self.strategy, self.optimizer = model, task, strategy, optimizer
        self.epochs, self.batch_size, self.seed = epochs, batch_size, int(seed)
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.progress = bool(progress)
        self.history: list[float] = []

    def _save(self, epoch: int, rng: Tensor) -> None:
        save_checkpoint(self.checkpoint, self.model, optimizer=self.optimizer.state_dict(), epoch=epoch,
                        rng_state=rng, strategy=self.strategy.state_dict(), strategy_name=self.strategy.name,
                        history=self.history)

    def _resume(self, gen: torch.Generator) -> int:
        payload = load_checkpoint(self.checkpoint, self.model)
        if payload.get("strategy_name") != self.strategy.name:
            raise ValueError(f"checkpoint {self.checkpoint} was written by strategy {payload.get('strategy_name')!r}, "
                             f"not {self.strategy.name!r}")
        self.optimizer.load_state_dict(payload["optimizer"])
        self.strategy.load_state_dict(payload["strategy"])
        gen.set_state(payload["rng_state"])
        self.history = list(payload["history"])
        return int(payload["epoch"])

    def fit(self, x: Tensor, y: Tensor, callback: Callable[[int, float], Any] | None = None) -> list[float]:
        """Train on ``(x, y)``; returns the mean training loss of every epoch (resumed ones included).

        ``callback(epoch, mean_loss)`` runs after each epoch's checkpoint. The model is left in eval mode.
        """
        check_input(x)
        if not isinstance(y, Tensor) or y.shape[0] != x.shape[0]:
            raise ValueError(f"`y` must be a tensor with {x.shape[0]} entries (one per sample of `x`)")
        device = model_device(self.model, x.device)
        with torch.no_grad():
            self.model.eval()
            probe = self.model(x[:2].to(device))
        self.task.validate(probe, y[:2].to(device), "y")
        gen = torch.Generator().manual_seed(self.seed)
        start = self._resume(gen) if self.checkpoint is not None and self.checkpoint.is_file() else 0
        epochs = range(start, self.epochs)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(epochs, desc=f"train[{self.strategy.name}]", unit="epoch", initial=start, total=self.epochs)
            epochs = bar
        try:
            for epoch in epochs:
                self.model.train()
                perm = torch.randperm(x.shape[0], generator=gen)
                total = torch.zeros((), device=device)
                for i in range(0, x.shape[0], self.batch_size):
                    idx = perm[i:i + self.batch_size]
                    xb, yb = x[idx].to(device), y[idx].to(device)
                    loss = self.strategy.loss(self.model, xb, yb, self.task, gen)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self.optimizer.step()
                    total = total + loss.detach() * idx.numel()
                self.history.append(float(total) / x.shape[0])
                if self.checkpoint is not None:
                    self._save(epoch + 1, gen.get_state())
                if bar is not None:
                    bar.set_postfix(loss=f"{self.history[-1]:.4f}")
                if callback is not None:
                    callback(epoch + 1, self.history[-1])
        finally:
            self.model.eval()
        return self.history
