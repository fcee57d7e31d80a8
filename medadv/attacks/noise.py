"""Random noise: the non-adversarial control that every robustness table needs.

Malik et al. (2024, ``specs/003_malik_volumetric.md`` §3.6) report additive Gaussian noise ``x′ = clip(x + σ·𝒩(0, I))``
with σ tied to the attacks' ε (σ = 8/255 next to ε = 8/255); Paschali et al. (MICCAI 2018, ``specs/001_paschali2018.md``
§3) contrast their attacks with Gaussian noise of matched SSIM. A model that is hurt much more by an attack than by
noise of the same size is being *attacked*, not merely perturbed: the gap is the point of the control.

One draw per sample from the attack's own seeded generator (same seed, same noise; torch's global RNG is never
touched), batched on the input's device, any task kind and any spatial rank: ``fooled`` is the task's own test.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Optional, Options, Real
from ..runtime import make_generator
from ..tasks import Task
from ..threats import Box, Linf, Threat
from .base import Attack, register

__all__ = ["Noise"]


@register("noise")
class Noise(Attack):
    """Additive random noise of standard deviation σ per input element, i.i.d. (a baseline, not an attack).

    ``x_adv = clip(x + σ·n)`` with ``n`` standard normal (``distribution="gaussian"``) or uniform on
    ``[−√3, √3]`` (``"uniform"``: the same standard deviation σ), one draw per element from the attack's seeded
    generator; ``clip`` is the data box.

    σ and the threat:

    * **with a data Box** (``Noise(task, Box(0, 1), sigma=8/255)``): the box clip is the only change to the draw —
      Malik et al.'s and Paschali et al.'s Gaussian noise exactly. ``sigma`` is required.
    * **with a ball** (``Linf(eps)``/``L2(eps)``, e.g. in a budget sweep next to the attacks): σ defaults to ε for
      L∞ (Malik's "σ tied to ε") and to ``ε/√d`` for L2 (``d`` elements per sample, so ``‖σ·n‖₂ ≈ ε``), and the
      draw is **projected onto the ε-ball** before the box clip, so the control obeys the same threat as the
      attacks it is compared with (every result of a ball threat lies in its ball). Under L∞ with σ = ε that is a
      Gaussian truncated at ±ε (standard deviation ≈ 0.72 ε, 32 % of the elements at ±ε); for the untruncated
      baseline pass the Box and ``sigma``.

    Args:
        task: any task kind (the noise does not read the model; ``fooled`` is the task's test on ``x_adv``).
        threat: a :class:`~medadv.threats.Linf` / :class:`~medadv.threats.L2` ball or a data
            :class:`~medadv.threats.Box` (see above); ε, σ and the box in data units.
        sigma: the noise's standard deviation per element, data units (> 0). ``None``: from the ball's ε (above);
            required with a Box.
        distribution: ``"gaussian"`` or ``"uniform"`` (both of standard deviation σ).
        targeted: a target has no meaning for random noise; ``targeted=True`` only changes ``fooled`` to "the
            prediction equals ``y``".
        seed: seed of the noise (same seed, same ``x_adv``); ``None`` uses torch's global RNG.
    """

    @property
    def optimises_task_metric(self) -> bool:
        return False  # a baseline: it searches nothing

    params: ClassVar[dict[str, Any]] = {
        "sigma": Optional(Real(low=0.0, low_open=True)),
        "distribution": Options("gaussian", "uniform"),
    }
    threat_kind = "ball_or_box"

    sigma: float | None
    distribution: str

    def __init__(
        self,
        task: Task,
        threat: Threat | Box,
        *,
        sigma: float | None = None,
        distribution: str = "gaussian",
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        if self.threat is None and self.sigma is None:
            raise TypeError("`sigma` of Noise is required with a data Box (there is no ε to take it from): "
                            "e.g. Noise(task, Box(0, 1), sigma=8/255), or pass a ball such as Linf(8/255, bounds=...) "
                            "for σ = ε")

    def set_params(self, **params: Any) -> Noise:
        # the positional argument is the box when there is no ball (base ``set_params`` reads ``threat``)
        new = {**self.get_params(), **self.check_kwargs(params)}
        return type(self)(self.task, self.threat_or_box, **new)

    def std(self, x: Tensor) -> float:
        """The noise's standard deviation per element for inputs shaped like ``x`` (data units)."""
        if self.sigma is not None:
            return self.sigma
        assert self.threat is not None
        if isinstance(self.threat, Linf):
            return self.threat.eps
        return self.threat.eps / math.sqrt(max(1, math.prod(x.shape[1:])))

    def draw(self, x: Tensor) -> Tensor:
        """The noise ``σ·n`` for ``x`` (before any projection or clipping), from a fresh seeded generator."""
        gen = make_generator(self.seed, x.device)
        if self.distribution == "gaussian":
            n = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)
        else:
            n = (2 * torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype) - 1) * math.sqrt(3.0)
        return n * self.std(x)

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any) -> Tensor:
        noise = self.draw(x)
        if self.threat is not None:
            return self.threat.finalize(x, x + noise)
        return self.box.clip(x + noise)
