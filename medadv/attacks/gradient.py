"""The gradient family on the engine: FGSM, BIM, PGD, CosPGD and SegPGD.

They differ only in their start (random or not), step count and the per-element weighting of the task's
loss; this module holds what they share, each attack module holds its weighting. The loop itself is
:class:`~medadv.attacks.engine.IterativeAttack`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from ..params import Bool, Optional, Real
from ..tasks import Task
from ..threats import Threat
from .engine import IterativeAttack, StepContext
from .steps import StepRule, ThreatStep

__all__ = ["GradientAttack"]


class GradientAttack(IterativeAttack):
    """Iterative first-order attack on the task's (optionally weighted) per-element loss.

    Untargeted: ascend the loss w.r.t. ``y`` (true labels or clean prediction). Targeted: descend the
    loss w.r.t. the target ``y``. Each step moves ``step_size`` (data units) along the threat's
    steepest-ascent direction (sign for L∞, normalised gradient for L2), projects onto the ε-ball and
    clips to the data bounds.

    Args:
        task: the model's :class:`~medadv.tasks.Task`.
        threat: :class:`~medadv.threats.Linf` or :class:`~medadv.threats.L2` (ε and bounds in data units).
        steps: number of gradient steps T (>= 1).
        step_size: step length α in data units; default ``2.5 * eps / steps`` (Madry et al.).
        random_start: start from a uniform random point of the ball instead of ``x``.
        restarts: number of random restarts; per sample the worst case is kept (fooled first, then the
            highest loss — lowest for targeted attacks).
        targeted: see :class:`~medadv.attacks.base.Attack`.
        seed: seed of the random start (same seed, same adversarial tensor).
        active_set: stop attacking samples once they are fooled (tested every step on the device; the
            active set is compacted every ``check_every`` steps). Less work; a fooled sample stays put.
        check_every: how often (steps) the active set is compacted; each compaction is one host sync.
        amp: run forward/backward under bf16 autocast (CUDA fast path; the loss is computed in fp32).
        record_trace: keep the per-sample loss of every step in ``AttackResult.trace["loss"]``,
            ``(T * restarts, N)`` (restarts one after the other; NaN once a sample left the active set).
    """

    params: ClassVar[dict[str, Any]] = {
        "step_size": Optional(Real(low=0)),
        "random_start": Bool(),
    }
    trace_key = "loss"
    needs_clean_logits = False  # y is validated against the first step's forward instead

    def __init__(
        self,
        task: Task,
        threat: Threat,
        *,
        steps: int = 10,
        step_size: float | None = None,
        random_start: bool = True,
        restarts: int = 1,
        targeted: bool = False,
        seed: int | None = 0,
        active_set: bool = False,
        check_every: int = 1,
        amp: bool = False,
        record_trace: bool = False,
    ) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())

    @property
    def alpha(self) -> float:
        """The step length in data units (``step_size``, or ``2.5 ε / T``)."""
        assert self.threat is not None
        step_size = getattr(self, "step_size", None)
        return 2.5 * self.threat.eps / self.steps if step_size is None else step_size

    # --- the part that differs between attacks ------------------------------------------------------------
    def element_weights(self, logits: Tensor, ctx: StepContext) -> Tensor | None:
        """Per-element weights of the loss at step ``ctx.step`` (0-based), detached; ``None`` = uniform."""
        return None

    def logits_objective(self, logits: Tensor, ctx: StepContext) -> Tensor:
        w = self.element_weights(logits, ctx) if ctx.step >= 0 else None
        loss = self.task.loss(logits, ctx.y, None if w is None else w.detach())
        return -loss if self.targeted else loss

    # --- engine hooks ----------------------------------------------------------------------------------------
    def step_rule(self) -> StepRule:
        assert self.threat is not None
        return ThreatStep(self.threat, self.alpha)

    def starts_at_input(self) -> bool:
        assert self.threat is not None
        return not getattr(self, "random_start", False) or self.threat.eps == 0

    def init_variable(self, ctx: StepContext, generator: torch.Generator | None) -> Tensor:
        assert self.threat is not None
        if not getattr(self, "random_start", False) or self.threat.eps == 0:
            return ctx.x.clone()
        return self.threat.clip(ctx.x + self.threat.random_delta(ctx.x, generator))
