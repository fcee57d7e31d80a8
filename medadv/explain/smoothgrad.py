"""SmoothGrad, written here because captum's ``NoiseTunnel`` cannot be differentiated.

``NoiseTunnel.attribute`` runs under ``torch.no_grad()`` and builds its noisy inputs as new leaves, so
no gradient reaches ``x`` even with a patched inner method (toolkits_api.md §5). Here the noisy copies
``x + ν_k`` stay in the graph.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Bool, Int, Optional, Real
from .base import ClassScores, Explanation, register_explanation

__all__ = ["SmoothGrad"]


@register_explanation("smoothgrad")
class SmoothGrad(Explanation):
    """SmoothGrad (Smilkov et al., 2017): |(1/n) Σ_k ∇f_c(x + ν_k)|, ν_k ~ N(0, σ²) per element.

    As in Zhang et al. (2023) the absolute value is taken after averaging. The noise level is relative
    to each sample's input range, as Smilkov et al. define it (σ / (x_max − x_min)): the default 0.03
    is 3% of the sample's range, which on [0, 1] images spanning the full range is Zhang et al.'s
    absolute σ = 0.03, and stays meaningful for CT in Hounsfield units or z-scored MRI. The range is
    that of the input being explained (for an attack: of the current adversarial input), so the map
    is a deterministic function of ``x`` and its gradient is exact.

    Args:
        n_samples: number of noisy copies n (default 10).
        sigma: noise standard deviation, as a fraction of each sample's range ``max(x_i) − min(x_i)``
            (default 0.03); in data units when ``relative=False``. A constant sample gets no noise
            under the relative rule.
        relative: ``True`` (default): ``sigma`` is relative to each sample's range; ``False``: ``sigma``
            is in data units.
        seed: noise seed. With a seed every call uses the same noise, so the map is a deterministic
            function of ``x`` (reproducible evaluation, exact finite-difference checks). ``None`` draws
            fresh noise from the global RNG on every call (the reference code's behaviour, an
            expectation-over-noise attack). With a seed, an attack and its evaluation see the same noise
            draw; evaluate with another seed for a stricter test.
    """

    params: ClassVar[dict[str, Any]] = {
        "n_samples": Int(low=1),
        "sigma": Real(low=0),
        "relative": Bool(),
        "seed": Optional(Int()),
    }
    n_samples: int
    sigma: float
    relative: bool
    seed: int | None

    def __init__(self, n_samples: int = 10, sigma: float = 0.03, relative: bool = True, seed: int | None = 0) -> None:
        self._init_params(locals())

    def _noise(self, x: Tensor) -> Tensor:
        shape = (self.n_samples, *x.shape)
        if self.seed is None:
            return torch.randn(shape, device=x.device, dtype=x.dtype)
        g = torch.Generator(device=x.device)
        g.manual_seed(int(self.seed))
        return torch.randn(shape, generator=g, device=x.device, dtype=x.dtype)

    def scale(self, x: Tensor) -> Tensor | float:
        """The noise standard deviation per sample, ``(N, 1, ...)`` (relative) or a number (data units)."""
        if not self.relative:
            return self.sigma
        flat = x.flatten(1)
        span = flat.amax(dim=1) - flat.amin(dim=1)
        return self.sigma * span.reshape(-1, *([1] * (x.ndim - 1)))

    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        n = self.n_samples
        noisy = (x.unsqueeze(0) + self.scale(x) * self._noise(x)).flatten(0, 1)
        scores = ClassScores(model)(noisy).gather(1, target.repeat(n).unsqueeze(1))
        # the gradient at each noisy point (w.r.t. the noisy input, not through the noise scale); the average
        # stays a function of x (through x + σ(x)·ν), so its own gradient is exact under create_graph
        (g,) = torch.autograd.grad(scores.sum() / n, noisy, create_graph=create_graph)
        return g.unflatten(0, (n, x.shape[0])).sum(0)
