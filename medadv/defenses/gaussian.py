"""Gaussian-noise augmentation: the training of base models for randomized smoothing.

Cohen, Rosenfeld & Kolter, "Certified Adversarial Robustness via Randomized Smoothing", ICML 2019 (Section 4:
"we trained the base classifier with Gaussian data augmentation at variance σ²"); Lecuyer et al. (S&P 2019) and
SegCertify (Fischer et al., ICML 2021) train the same way. A base model that is accurate under the noise of the
smoothing has a larger top-class probability and hence larger certified radii
(:class:`medadv.certify.RandomizedSmoothing`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Real
from ..tasks import Task
from ..training.loop import draw_seed
from .base import TrainingStrategy

__all__ = ["GaussianAugmentation"]


class GaussianAugmentation(TrainingStrategy):
    """Minimise the task loss on ``x + δ``, ``δ ~ N(0, σ² I)`` drawn fresh for every batch (no clipping).

    Args:
        sigma: noise standard deviation in the data's units (> 0); train at the σ you will certify with.
        clean_fraction: share of each batch left clean (0: Cohen et al.'s recipe, every input noisy), in [0, 1).

    The noise is drawn on the device from a generator seeded by the loop's seeded generator, so a seeded run is
    reproducible and resumes exactly. Any task: the labels are unchanged (the noise is on the input only).
    """

    name = "gaussian"
    params: ClassVar[dict[str, Any]] = {"sigma": Real(low=0.0, low_open=True),
                                        "clean_fraction": Real(low=0.0, high=1.0, high_open=True)}

    sigma: float
    clean_fraction: float

    def __init__(self, sigma: float, *, clean_fraction: float = 0.0) -> None:
        self._init_params(locals())

    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        g = torch.Generator(device=x.device).manual_seed(draw_seed(generator))
        noise = torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype) * self.sigma
        if self.clean_fraction > 0:
            keep = int(round(self.clean_fraction * x.shape[0]))
            noise[:keep] = 0.0  # the loop already shuffles the batch: the first rows are a random subset
        logits = model(x + noise)
        return task.loss(logits, task.to_target(y, logits)).mean()
