"""Synthetic data for unit tests and quick checks (never presented as medical data).

Each generator is seeded and returns tensors ``(x, y)`` in [0, 1] with labels a small model learns
in seconds on a CPU, so tests can check that attacks lower the metric on a *trained* model.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["multiclass_blobs", "multilabel_blobs", "segmentation_blobs"]


def _grid(size: int, ndim: int) -> list[Tensor]:
    ax = torch.linspace(-1.0, 1.0, size)
    return list(torch.meshgrid(*([ax] * ndim), indexing="ij"))


def _anchors(k: int, ndim: int, gen: torch.Generator) -> Tensor:
    return (torch.rand(k, ndim, generator=gen) * 1.2 - 0.6)


def multilabel_blobs(n: int = 64, num_labels: int = 4, size: int = 16, channels: int = 1, seed: int = 0,
                     ndim: int = 2) -> tuple[Tensor, Tensor]:
    """Images ``(n, channels, size, ...)`` where label i is present iff a blob sits at anchor i."""
    gen = torch.Generator().manual_seed(seed)
    grid = torch.stack(_grid(size, ndim))  # (ndim, *S)
    anchors = _anchors(num_labels, ndim, gen)
    y = (torch.rand(n, num_labels, generator=gen) < 0.5).float()
    x = 0.1 * torch.rand(n, channels, *([size] * ndim), generator=gen)
    for i in range(num_labels):
        d2 = ((grid - anchors[i].reshape(-1, *([1] * ndim))) ** 2).sum(0)
        blob = torch.exp(-d2 / 0.02)
        x = x + 0.8 * y[:, i].reshape(-1, 1, *([1] * ndim)) * blob
    return x.clamp(0, 1), y


def multiclass_blobs(n: int = 64, num_classes: int = 4, size: int = 16, channels: int = 1, seed: int = 0,
                     ndim: int = 2) -> tuple[Tensor, Tensor]:
    """Images with one blob whose position encodes the class, ``y`` int64 ``(n,)``."""
    gen = torch.Generator().manual_seed(seed)
    grid = torch.stack(_grid(size, ndim))
    anchors = _anchors(num_classes, ndim, gen)
    y = torch.randint(0, num_classes, (n,), generator=gen)
    centre = anchors[y] + 0.05 * torch.randn(n, ndim, generator=gen)
    d2 = ((grid.unsqueeze(0) - centre.reshape(n, ndim, *([1] * ndim))) ** 2).sum(1)
    x = 0.1 * torch.rand(n, channels, *([size] * ndim), generator=gen) + 0.8 * torch.exp(-d2 / 0.03).unsqueeze(1)
    return x.clamp(0, 1), y


def segmentation_blobs(n: int = 8, num_classes: int = 3, size: int = 16, channels: int = 1, seed: int = 0,
                       ndim: int = 3) -> tuple[Tensor, Tensor]:
    """2-D or 3-D images with spheres of classes 1..C-1 (brightness encodes class) and their label map."""
    gen = torch.Generator().manual_seed(seed)
    grid = torch.stack(_grid(size, ndim))
    y = torch.zeros(n, *([size] * ndim), dtype=torch.long)
    for _ in range(3):
        for c in range(1, num_classes):
            centre = torch.rand(n, ndim, generator=gen) * 1.2 - 0.6
            r = 0.2 + 0.2 * torch.rand(n, generator=gen)
            d2 = ((grid.unsqueeze(0) - centre.reshape(n, ndim, *([1] * ndim))) ** 2).sum(1)
            y = torch.where(d2 < (r ** 2).reshape(n, *([1] * ndim)), torch.full_like(y, c), y)
    level = y.float() / (num_classes - 1)
    noise = 0.15 * torch.randn(n, channels, *([size] * ndim), generator=gen)
    x = (0.1 + 0.8 * level).unsqueeze(1) + noise
    return x.clamp(0, 1), y
