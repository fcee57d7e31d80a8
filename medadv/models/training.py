"""Plain supervised training (no attacks): used by the demo, the examples and the tests."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..tasks import Task

__all__ = ["fit_supervised"]


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
) -> list[float]:
    """Train ``model`` in place on ``(x, y)`` with Adam and the task's loss; returns per-epoch mean loss."""
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history: list[float] = []
    epochs_iter = range(epochs)
    if progress:
        from tqdm.auto import tqdm

        epochs_iter = tqdm(epochs_iter, desc=desc, unit="epoch")
    model.train()
    for _ in epochs_iter:
        perm = torch.randperm(x.shape[0], generator=gen)
        total = 0.0
        for i in range(0, x.shape[0], batch_size):
            idx = perm[i : i + batch_size]
            xb, yb = x[idx].to(device), y[idx].to(device)
            logits = model(xb)
            loss = task.loss(logits, task.to_target(yb, logits)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * idx.numel()
        history.append(total / x.shape[0])
        if progress:
            epochs_iter.set_postfix(loss=f"{history[-1]:.4f}")
    model.eval()
    return history
