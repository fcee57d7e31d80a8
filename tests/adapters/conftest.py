"""Helpers for the adapter tests: models seen in Hounsfield units (HU) instead of [0, 1]."""

from __future__ import annotations

import pytest
import torch
from torch import nn

HU = (-1024.0, 3071.0)


class HUModel(nn.Module):
    """A model trained on [0, 1] inputs, fed CT-like data in HU (the scaling is part of the model)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - HU[0]) / (HU[1] - HU[0]))


def to_hu(x: torch.Tensor) -> torch.Tensor:
    return x * (HU[1] - HU[0]) + HU[0]


@pytest.fixture
def hu():
    """(wrap, to_hu, bounds) for attacking a [0, 1]-trained model in HU."""
    return lambda model: HUModel(model).eval(), to_hu, HU
