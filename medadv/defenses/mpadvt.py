"""MPAdvT: multi-perturbation adversarial training (Xu et al., Medical Image Analysis 2021, Algorithm 1)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..tasks import Task
from ..threats import Bounds, Linf
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

    Args:
        bounds: the data range ``(lo, hi)`` (data units), as for :class:`~medadv.threats.Linf`.
        eps_range: ``(lo, hi)`` of the uniform ε draw, in data units (paper U(0.01, 0.04); the authors'
            code applies it to mean/std-normalised inputs, so rescale for a reproduction).
        steps_range: inclusive ``(lo, hi)`` of the uniform integer step count (code {1..9}; paper U(1, 5)).
        step_size: PGD step α in data units (1/255 in the authors' code).
        p_adv: probability that a batch is adversarial (0.5).
    """

    name = "mpadvt"

    def __init__(self, bounds: Bounds | None, *, eps_range: tuple[float, float] = (0.01, 0.04),
                 steps_range: tuple[int, int] = (1, 9), step_size: float = 1 / 255, p_adv: float = 0.5) -> None:
        lo, hi = (float(v) for v in eps_range)
        if not 0 <= lo <= hi:
            raise ValueError(f"`eps_range` must be (lo, hi) with 0 <= lo <= hi, got {eps_range!r}")
        s_lo, s_hi = steps_range
        if not (isinstance(s_lo, int) and isinstance(s_hi, int) and 1 <= s_lo <= s_hi):
            raise ValueError(f"`steps_range` must be integers (lo, hi) with 1 <= lo <= hi, got {steps_range!r}")
        if not float(step_size) >= 0:
            raise ValueError(f"`step_size` must be >= 0, got {step_size}")
        if not 0.0 <= float(p_adv) <= 1.0:
            raise ValueError(f"`p_adv` must be in [0, 1], got {p_adv}")
        Linf(hi, bounds=bounds)  # validates the bounds once, with the usual messages
        self.bounds, self.eps_range, self.steps_range = bounds, (lo, hi), (s_lo, s_hi)
        self.step_size, self.p_adv = float(step_size), float(p_adv)
        self.adversarial_batches = 0
        self.batches = 0

    def draw(self, generator: torch.Generator) -> tuple[bool, float, int]:
        """One batch's (adversarial?, ε, steps) from the loop's generator."""
        u = torch.rand(3, generator=generator, dtype=torch.float64)
        lo, hi = self.eps_range
        eps = lo + (hi - lo) * float(u[1])
        s_lo, s_hi = self.steps_range
        steps = s_lo + min(int(float(u[2]) * (s_hi - s_lo + 1)), s_hi - s_lo)
        return float(u[0]) >= 1.0 - self.p_adv, eps, steps

    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        adversarial, eps, steps = self.draw(generator)
        self.batches += 1
        if adversarial and eps > 0:
            self.adversarial_batches += 1
            x = adversarial_examples(model, x, y, task, Linf(eps, bounds=self.bounds), steps, self.step_size, generator)
        logits = model(x)
        return task.loss(logits, task.to_target(y, logits)).mean()

    def state_dict(self) -> dict[str, Any]:
        return {"adversarial_batches": self.adversarial_batches, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.adversarial_batches = int(state.get("adversarial_batches", 0))
        self.batches = int(state.get("batches", 0))
