"""SegPGD: PGD that shifts the loss from correctly to wrongly classified elements over time.

Gu, Zhao, Tresp, Torr. "SegPGD: An Effective and Efficient Adversarial Attack for Evaluating and
Boosting Segmentation Robustness", ECCV 2022.
"""

from __future__ import annotations

from torch import Tensor

from .base import register
from .engine import StepContext
from .gradient import GradientAttack
from .losses import segpgd_weights

__all__ = ["SegPGD"]


@register("segpgd")
class SegPGD(GradientAttack):
    """PGD on ``(1 − λ_t)·ℓ`` over correct elements plus ``λ_t·ℓ`` over wrong ones, λ_t = (t − 1)/(2T).

    With t = 1..T, λ grows from 0 to just under 1/2: early steps push the still-correct elements
    over the boundary, later steps also keep the fooled ones fooled. Both sums are divided by the
    number of (valid) elements N, as in the paper. Works on every task's element grid (voxels,
    labels, samples). Targeted attacks swap the two weights (elements not yet at the target first).

    Args:
        task, threat, steps, step_size, random_start, restarts, targeted, seed, active_set,
        check_every, amp, record_trace: as for :class:`~medadv.attacks.pgd.PGD`.
    """

    def element_weights(self, logits: Tensor, ctx: StepContext) -> Tensor:
        return segpgd_weights(self.task, logits, ctx.y, ctx.step, self.steps, self.targeted)
