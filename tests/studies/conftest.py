"""Toy models whose predictions can be worked out by hand, for the studies' hand-computed tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class SumModel(nn.Module):
    """Two classes on 2×2 one-channel images: logits ``[s, −s]`` with ``s = Σ pixels − 2`` (class 0 iff the mean
    is above 0.5)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))  # a parameter, so the model has a device and a dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale * x.flatten(1).sum(1) - 2.0
        return torch.stack([s, -s], 1)


class PixelModel(nn.Module):
    """Like :class:`SumModel` but reads only the top-left pixel: ``s = 4 · x[0, 0] − 2`` (zero gradient elsewhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale * 4.0 * x[:, 0, 0, 0] - 2.0
        return torch.stack([s, -s], 1)


class VoxelModel(nn.Module):
    """Segmentation into 3 classes voxel by voxel: the class whose level (0.1, 0.5, 0.9) is nearest the intensity."""

    def __init__(self) -> None:
        super().__init__()
        self.levels = nn.Parameter(torch.tensor([0.1, 0.5, 0.9]), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return -50.0 * (x - self.levels.reshape(shape)) ** 2


@pytest.fixture
def toy_pair():
    """Constant 2×2 images (value c) with labels, the two toy models; see test_transfer for the hand table."""
    c = torch.tensor([0.6, 0.9, 0.2, 0.45])
    x = c.reshape(4, 1, 1, 1).expand(4, 1, 2, 2).clone()
    y = torch.tensor([0, 0, 1, 0])
    return x, y, SumModel(), PixelModel()


@pytest.fixture
def voxel_model():
    return VoxelModel()
