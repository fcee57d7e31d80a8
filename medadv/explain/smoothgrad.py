"""SmoothGrad, written here because captum's ``NoiseTunnel`` cannot be differentiated.

``NoiseTunnel.attribute`` runs under ``torch.no_grad()`` and builds its noisy inputs as new leaves, so
no gradient reaches ``x`` even with a patched inner method (toolkits_api.md §5). Here the noisy copies
``x + ν_k`` stay in the graph.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import ClassScores, Explanation

__all__ = ["SmoothGrad"]


class SmoothGrad(Explanation):
    """SmoothGrad (Smilkov et al., 2017): |(1/n) Σ_k ∇f_c(x + ν_k)|, ν_k ~ N(0, σ²) per element.

    As in Zhang et al. (2023): the absolute value is taken after averaging, σ is absolute (data units).

    Args:
        n_samples: number of noisy copies n (default 10).
        sigma: noise standard deviation in data units (default 0.03, i.e. 3% of a [0, 1] range).
        seed: noise seed. With a seed every call uses the same noise, so the map is a deterministic
            function of ``x`` (reproducible evaluation, exact finite-difference checks). ``None`` draws
            fresh noise from the global RNG on every call (the reference code's behaviour, an
            expectation-over-noise attack). With a seed, an attack and its evaluation see the same noise
            draw; evaluate with another seed for a stricter test.
    """

    name = "smoothgrad"

    def __init__(self, n_samples: int = 10, sigma: float = 0.03, seed: int | None = 0) -> None:
        if int(n_samples) < 1:
            raise ValueError(f"`n_samples` must be >= 1, got {n_samples}")
        if not float(sigma) >= 0:
            raise ValueError(f"`sigma` must be >= 0 (data units), got {sigma}")
        self.n_samples = int(n_samples)
        self.sigma = float(sigma)
        self.seed = seed

    def _noise(self, x: Tensor) -> Tensor:
        shape = (self.n_samples, *x.shape)
        if self.seed is None:
            return torch.randn(shape, device=x.device, dtype=x.dtype)
        g = torch.Generator(device=x.device)
        g.manual_seed(int(self.seed))
        return torch.randn(shape, generator=g, device=x.device, dtype=x.dtype)

    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        n = self.n_samples
        noisy = (x.unsqueeze(0) + self.sigma * self._noise(x)).flatten(0, 1)
        scores = ClassScores(model)(noisy).gather(1, target.repeat(n).unsqueeze(1))
        (g,) = torch.autograd.grad(scores.sum() / n, x, create_graph=create_graph)
        return g

    def __repr__(self) -> str:
        return f"SmoothGrad(n_samples={self.n_samples}, sigma={self.sigma}, seed={self.seed})"
