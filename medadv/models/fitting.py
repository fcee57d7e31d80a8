"""The one fitting loop: epochs, seeded data order, checkpoints, exact resume and a progress bar; and plain
supervised training on it (:class:`SupervisedFitter`, :func:`fit_supervised`).

It lives in :mod:`medadv.models` (next to the checkpoint I/O it writes with) so that ``medadv.models.fit_supervised``
needs nothing above the models; :mod:`medadv.training` (``Fitter``, ``draw_seed``, ``SupervisedFitter``,
``fit_supervised``) re-exports it, and GAP's trainer and adversarial training build on it from above
(``tests/test_layout.py``).

:class:`Fitter` owns what every medadv training shares — plain supervised training
(:func:`~medadv.training.fit_supervised`), adversarial training
(:class:`~medadv.defenses.AdversarialTrainer`) and GAP's generator fitting
(:class:`~medadv.training.GAPTrainer`). A subclass supplies the per-batch loss and, where it needs to, the
modes around an epoch, the per-epoch record and extra checkpoint state:

* :meth:`Fitter.batch_loss` — the scalar loss of one batch (graph attached to the trained parameters);
* :meth:`Fitter.session` — a context around the whole fit (train/eval modes, frozen models);
* :meth:`Fitter.begin_epoch` / :meth:`Fitter.end_epoch` — modes before an epoch, the epoch's history
  record after it (validation, best-model tracking);
* :meth:`Fitter.checkpoint_state` / :meth:`Fitter.load_checkpoint_state` — what else a checkpoint holds.

Every random choice (the data order, and the strategy's draws through the generator handed to
:meth:`Fitter.batch_loss`) comes from one seeded CPU ``torch.Generator``, whose state is checkpointed
after every epoch: a run interrupted and resumed from its checkpoint ends with exactly the parameters of an
uninterrupted run. The global RNG is never touched.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..params import Bool, Instance, Int, Optional, Real
from ..runtime import check_input, model_device
from ..tasks import Task
from .io import load_checkpoint, save_checkpoint

__all__ = ["Fitter", "draw_seed", "SupervisedFitter", "fit_supervised"]


def draw_seed(generator: torch.Generator) -> int:
    """A fresh seed (e.g. an attack's) from the loop's generator, so its randomness is part of the seeded stream."""
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator))


_PATH = Optional(Instance(str, os.PathLike, text="a file path"))


class Fitter:
    """Base of every medadv training loop (see the module docstring for the hooks).

    Args:
        module: the network whose parameters are trained (its ``state_dict`` is checkpointed).
        optimizer: the optimiser over ``module``'s parameters.
        epochs: passes over the training data (>= 1).
        batch_size: minibatch size (>= 1); the last batch of an epoch may be smaller.
        seed: seed of the loop's generator (data order and every random choice of the loss).
        checkpoint: file written after every epoch; if it exists when the fit starts, the fit resumes from
            it (module, optimiser, generator state, history and the subclass's own state).
        progress: show a tqdm progress bar over epochs (the displayed loss syncs once per epoch).
        max_batches: cap on the batches of one epoch (``None``: the whole data).
    """

    #: the progress bar's label
    desc: str = "fit"

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, *, epochs: int, batch_size: int,
                 seed: int = 0, checkpoint: str | os.PathLike | None = None, progress: bool = False,
                 max_batches: int | None = None) -> None:
        owner = type(self).__name__
        self.module, self.optimizer = module, optimizer
        self.epochs: int = Int(low=1).check(epochs, "epochs", owner)
        self.batch_size: int = Int(low=1).check(batch_size, "batch_size", owner)
        self.seed: int = Int().check(seed, "seed", owner)
        self.max_batches: int | None = Optional(Int(low=1)).check(max_batches, "max_batches", owner)
        path = _PATH.check(checkpoint, "checkpoint", owner)
        self.checkpoint: Path | None = None if path is None else Path(path)
        self.progress: bool = Bool().check(progress, "progress", owner)
        self.history: list[Any] = []

    # --- hooks ------------------------------------------------------------------------------------------
    def batch_loss(self, x: Tensor, y: Tensor | None, generator: torch.Generator) -> Tensor:
        """The scalar loss of one batch (already on the device)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Context around the whole fit (default: the module is left in eval mode, even on error)."""
        try:
            yield
        finally:
            self.module.eval()

    def begin_epoch(self, epoch: int) -> None:
        """Before epoch ``epoch`` (0-based); default: train mode."""
        self.module.train()

    def end_epoch(self, epoch: int, mean_loss: Tensor) -> Any:
        """The history record of epoch ``epoch`` (1-based) from its per-sample mean loss (default: a float)."""
        return float(mean_loss)

    def postfix(self, record: Any) -> dict[str, str]:
        """What the progress bar shows after an epoch."""
        return {"loss": f"{float(record):.4f}"}

    def checkpoint_state(self) -> dict[str, Any]:
        """Extra entries of the checkpoint (tensors and plain Python values only)."""
        return {}

    def load_checkpoint_state(self, payload: dict[str, Any]) -> None:
        """Restore what :meth:`checkpoint_state` wrote (and refuse a checkpoint of another kind)."""

    # --- the loop ---------------------------------------------------------------------------------------
    def _save(self, epoch: int, rng: Tensor) -> None:
        assert self.checkpoint is not None
        save_checkpoint(self.checkpoint, self.module, optimizer=self.optimizer.state_dict(), epoch=epoch,
                        rng_state=rng, history=self.history, **self.checkpoint_state())

    def _resume(self, generator: torch.Generator) -> int:
        assert self.checkpoint is not None
        payload = load_checkpoint(self.checkpoint)
        self.load_checkpoint_state(payload)  # first: a checkpoint of another kind is refused before loading
        self.module.load_state_dict(payload["state_dict"])
        self.optimizer.load_state_dict(payload["optimizer"])
        generator.set_state(payload["rng_state"])
        self.history = list(payload["history"])
        return int(payload["epoch"])

    def run(self, x: Tensor, y: Tensor | None, device: torch.device,
            callback: Callable[[int, Any], Any] | None = None) -> list[Any]:
        """Fit on ``(x, y)`` (``y`` may be ``None``); returns the history (one record per epoch, resumed
        epochs included). ``callback(epoch, record)`` runs after each epoch's checkpoint."""
        gen = torch.Generator().manual_seed(self.seed)
        start = self._resume(gen) if self.checkpoint is not None and self.checkpoint.is_file() else 0
        n = x.shape[0]
        epochs: Any = range(start, self.epochs)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(epochs, desc=self.desc, unit="epoch", initial=start, total=self.epochs)
            epochs = bar
        with self.session():
            for epoch in epochs:
                self.begin_epoch(epoch)
                perm = torch.randperm(n, generator=gen)
                total = torch.zeros((), device=device)  # on the device: no host sync per batch
                count = 0
                for b, i in enumerate(range(0, n, self.batch_size)):
                    if self.max_batches is not None and b >= self.max_batches:
                        break
                    idx = perm[i:i + self.batch_size]
                    xb = x[idx].to(device)
                    yb = None if y is None else y[idx].to(device)
                    loss = self.batch_loss(xb, yb, gen)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self.optimizer.step()
                    total = total + loss.detach() * idx.numel()
                    count += idx.numel()
                record = self.end_epoch(epoch + 1, total / max(count, 1))
                self.history.append(record)
                if self.checkpoint is not None:
                    self._save(epoch + 1, gen.get_state())
                if bar is not None:
                    bar.set_postfix(**self.postfix(record))
                if callback is not None:
                    callback(epoch + 1, record)
        return self.history


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
