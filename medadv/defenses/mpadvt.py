"""MPAdvT: multi-perturbation adversarial training (Xu et al., Medical Image Analysis 2021, Algorithm 1)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Int, InvalidParameterError, Pair, Real, renamed
from ..tasks import Task
from ..threats import Bounds, Box, Linf, Threat
from .base import TrainingStrategy
from .pgd_at import adversarial_examples

__all__ = ["MPAdvT"]


class MPAdvT(TrainingStrategy):
    """Multi-perturbation adversarial training.

    Per minibatch (Xu et al., "Towards evaluating the robustness of deep diagnostic models by adversarial
    attack", MedIA 2021, Alg. 1): draw p ~ U(0, 1), ε ~ U(eps_range) and T ~ UniformInt(steps_range); if
    p ≥ 1 - ``p_adv`` the *whole* batch is replaced by random-start L∞ PGD examples (ε, T steps of α,
    projected around the clean x), otherwise it trains on the clean batch. One optimiser step on the task
    loss either way. Draws are made every batch, clean or not, so the random stream does not depend on
    the coin.

    ``eps_range`` and ``step_size`` are **fractions of the box's data range** ``hi − lo`` (the widest
    channel's for per-channel boxes): on data in [0, 1] they are data units, on CT in [-1000, 1000] HU the
    default ε range is 20 to 80 HU. The box must therefore be bounded.

    Args:
        box: the data box (:class:`~medadv.threats.Box` or a ``(lo, hi)`` pair in data units). MPAdvT draws
            its own ε per batch, so it takes the box, not a threat model.
        eps_range: ``(lo, hi)`` of the uniform ε draw, as fractions of the data range (paper U(0.01, 0.04);
            the authors' code applies it to mean/std-normalised inputs, so rescale for a reproduction).
        steps_range: inclusive ``(lo, hi)`` of the uniform integer step count (code {1..9}; paper U(1, 5)).
        step_size: PGD step α as a fraction of the data range (1/255 in the authors' code).
        p_adv: probability that a batch is adversarial (0.5).
    """

    name = "mpadvt"
    positional: ClassVar[tuple[str, ...]] = ("box",)
    params: ClassVar[dict[str, Any]] = {
        "eps_range": Pair(Real(low=0), ordered=True),
        "steps_range": Pair(Int(low=1), ordered=True),
        "step_size": Real(low=0),
        "p_adv": Real(low=0, high=1),
    }

    box: Box
    eps_range: tuple[float, float]
    steps_range: tuple[int, int]
    step_size: float
    p_adv: float

    @renamed(bounds="box")
    def __init__(self, box: Box | Bounds, *, eps_range: tuple[float, float] = (0.01, 0.04),
                 steps_range: tuple[int, int] = (1, 9), step_size: float = 1 / 255, p_adv: float = 0.5) -> None:
        if isinstance(box, Threat):
            raise InvalidParameterError(f"MPAdvT draws its own ε: pass the data box (e.g. {box!r}.box), not a threat")
        self.box = Box.coerce(box, "box")
        if not self.box.bounded:
            raise InvalidParameterError("MPAdvT needs a bounded box: `eps_range` and `step_size` are fractions of "
                                        "its data range (hi - lo)")
        self._init_params(locals())
        self.adversarial_batches = 0
        self.batches = 0

    @property
    def bounds(self) -> Bounds | None:
        """The box's ``(lo, hi)`` (older name)."""
        return self.box.bounds

    def draw(self, generator: torch.Generator) -> tuple[bool, float, int]:
        """One batch's (adversarial?, ε in data units, steps) from the loop's generator."""
        u = torch.rand(3, generator=generator, dtype=torch.float64)
        lo, hi = self.eps_range
        eps = (lo + (hi - lo) * float(u[1])) * self.box.data_range()
        s_lo, s_hi = self.steps_range
        steps = s_lo + min(int(float(u[2]) * (s_hi - s_lo + 1)), s_hi - s_lo)
        return float(u[0]) >= 1.0 - self.p_adv, eps, steps

    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        adversarial, eps, steps = self.draw(generator)
        self.batches += 1
        if adversarial and eps > 0:
            self.adversarial_batches += 1
            x = adversarial_examples(model, x, y, task, Linf(eps, bounds=self.box), steps,
                                     self.step_size * self.box.data_range(), generator)
        logits = model(x)
        return task.loss(logits, task.to_target(y, logits)).mean()

    def state_dict(self) -> dict[str, Any]:
        return {"adversarial_batches": self.adversarial_batches, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.adversarial_batches = int(state.get("adversarial_batches", 0))
        self.batches = int(state.get("batches", 0))
