"""Step rules of the iterative engine: how a variable moves given the gradient of the objective.

Each rule is a small object with ``init(v, ctx) -> state`` and ``step(v, g, objective, ctx, state) ->
v_new`` (before projection). All state tensors are per sample (leading batch dim), so the engine can
subset them with the active set; nothing synchronises with the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..threats import Threat, per_sample_norm

if TYPE_CHECKING:
    from .engine import StepContext

__all__ = ["StepRule", "ThreatStep", "SignStep", "NormalizedStep", "MomentumStep", "AdamStep"]


def _rows(t: Tensor, like: Tensor) -> Tensor:
    return t.reshape((-1,) + (1,) * (like.ndim - 1))


class StepRule:
    """Base: no state, subclasses implement :meth:`step` (ascent on the objective)."""

    def init(self, v: Tensor, ctx: StepContext) -> dict[str, Any]:
        return {}

    def step(self, v: Tensor, g: Tensor, objective: Tensor, ctx: StepContext, state: dict[str, Any]) -> Tensor:
        raise NotImplementedError


class ThreatStep(StepRule):
    """``v + α · d(g)`` with the threat's steepest-ascent direction ``d`` (sign for L∞, g/‖g‖₂ for L2)."""

    def __init__(self, threat: Threat, step_size: float | Tensor) -> None:
        self.threat, self.step_size = threat, step_size

    def step(self, v: Tensor, g: Tensor, objective: Tensor, ctx: StepContext, state: dict[str, Any]) -> Tensor:
        return v + self.step_size * self.threat.ascent_direction(g)


class SignStep(StepRule):
    """``v + α · sign(g)`` (VAFA's signed table updates; FGSM-style steps without a threat)."""

    def __init__(self, step_size: float) -> None:
        self.step_size = step_size

    def step(self, v: Tensor, g: Tensor, objective: Tensor, ctx: StepContext, state: dict[str, Any]) -> Tensor:
        return v + self.step_size * g.sign()


class NormalizedStep(StepRule):
    """``v + α · g / ‖g‖_p`` per sample; a sample with a zero gradient does not move (DAG's step)."""

    def __init__(self, step_size: float, p: float) -> None:
        self.step_size, self.p = step_size, p

    def step(self, v: Tensor, g: Tensor, objective: Tensor, ctx: StepContext, state: dict[str, Any]) -> Tensor:
        n = _rows(per_sample_norm(g, self.p), g)
        return v + self.step_size * torch.where(n > 0, g / n.clamp_min(1e-30), torch.zeros_like(g))


class MomentumStep(StepRule):
    """MI-FGSM (Dong et al., CVPR 2018): ``m ← μ m + g/‖g‖₁``, then a threat step along ``m``."""

    def __init__(self, threat: Threat, step_size: float, decay: float = 1.0) -> None:
        self.threat, self.step_size, self.decay = threat, step_size, decay

    def init(self, v: Tensor, ctx: StepContext) -> dict[str, Any]:
        return {"momentum": torch.zeros_like(v)}

    def step(self, v: Tensor, g: Tensor, objective: Tensor, ctx: StepContext, state: dict[str, Any]) -> Tensor:
        g1 = _rows(per_sample_norm(g, 1.0).clamp_min(1e-12), g)
        state["momentum"] = self.decay * state["momentum"] + g / g1
        return v + self.step_size * self.threat.ascent_direction(state["momentum"])


class AdamStep(StepRule):
    """Adam ascent with torch's update formula (bias-corrected moments, elementwise), per sample state.

    Equal to ``torch.optim.Adam`` minimising ``-objective`` on the variable.
    """

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.lr, self.betas, self.eps = lr, betas, eps

    def init(self, v: Tensor, ctx: StepContext) -> dict[str, Any]:
        return {"m": torch.zeros_like(v), "v": torch.zeros_like(v), "t": 0}

    def step(self, v: Tensor, g: Tensor, objective: Tensor, ctx: StepContext, state: dict[str, Any]) -> Tensor:
        b1, b2 = self.betas
        state["t"] += 1
        t = state["t"]
        state["m"] = state["m"].mul(b1).add(g, alpha=1 - b1)
        state["v"] = state["v"].mul(b2).addcmul(g, g, value=1 - b2)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        denom = (state["v"].sqrt() / (c2 ** 0.5)).add(self.eps)
        return v + (self.lr / c1) * state["m"] / denom
