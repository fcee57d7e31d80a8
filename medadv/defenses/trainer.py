"""The adversarial-training loop; strategies (PGD-AT, MPAdvT, MAAdvT, TRADES, ...) supply the loss.

:class:`AdversarialTrainer` is the shared fitting loop (:class:`~medadv.training.loop.Fitter`: the epoch/batch
schedule, the seeded ``torch.Generator`` handed to the strategy for all of its random choices, a progress
bar, and a checkpoint after every epoch from which an interrupted run resumes to exactly the parameters an
uninterrupted run would have reached) with a strategy's loss and an optimiser over the model. Train-time
attacks are medadv attacks, which run with the model in eval mode and frozen parameters and restore train
mode afterwards (Xu et al.'s code does the same).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..params import Real
from ..runtime import check_input, model_device
from ..tasks import Task
from ..training.loop import Fitter, draw_seed
from .base import TrainingStrategy

__all__ = ["AdversarialTrainer", "draw_seed"]


class AdversarialTrainer(Fitter):
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

    A model ending in a softmax or sigmoid trains on its logits when the task declares
    ``outputs="probabilities"`` (:meth:`~medadv.tasks.Task.logits_model`: the strategy's loss and its train-time
    attacks read ``log p`` / ``logit p``); undeclared, :meth:`fit` refuses it before the first step.
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
        if optimizer is None:
            optimizer = torch.optim.Adam(model.parameters(), lr=Real(low=0, low_open=True).check(
                lr, "lr", "AdversarialTrainer"))
        elif not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"`optimizer` must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
        super().__init__(model, optimizer, epochs=epochs, batch_size=batch_size, seed=seed, checkpoint=checkpoint,
                         progress=progress)
        self.model, self.task, self.strategy = model, task, strategy
        # what every strategy's loss and train-time attack reads: the model's logits, also when the task declares
        # outputs="probabilities" (log p / logit p: the loss is not computed on probabilities). The wrapper has no
        # parameters of its own: the optimiser and the checkpoints hold `model` itself
        self.logits_model = task.logits_model(model)
        self.desc = f"train[{strategy.name}]"

    # --- loop hooks -----------------------------------------------------------------------------------
    def batch_loss(self, x: Tensor, y: Tensor | None, generator: torch.Generator) -> Tensor:
        assert y is not None
        return self.strategy.loss(self.logits_model, x, y, self.task, generator)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"strategy": self.strategy.state_dict(), "strategy_name": self.strategy.name}

    def load_checkpoint_state(self, payload: dict[str, Any]) -> None:
        if payload.get("strategy_name") != self.strategy.name:
            raise ValueError(f"checkpoint {self.checkpoint} was written by strategy {payload.get('strategy_name')!r}, "
                             f"not {self.strategy.name!r}")
        self.strategy.load_state_dict(payload["strategy"])

    # --- the fit --------------------------------------------------------------------------------------
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
            probe = self.task.forward(self.model, x[:2].to(device))
        # refuses undeclared probabilities before any step (a loss on them would train the wrong objective)
        self.task.validate(probe, y[:2].to(device), "y")
        return self.run(x, y, device, callback)
