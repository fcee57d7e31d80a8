"""CosPGD: PGD on a loss weighted per element by the cosine similarity of prediction and target.

Agnihotri, Jung, Keuper. "CosPGD: an efficient white-box adversarial attack for pixel-wise
prediction tasks", ICML 2024.
"""

from __future__ import annotations

from torch import Tensor

from .base import register
from .engine import StepContext
from .gradient import GradientAttack
from .losses import cosine_weights

__all__ = ["CosPGD"]


@register("cospgd")
class CosPGD(GradientAttack):
    """PGD whose per-element loss is weighted by ``cos(softmax(z), onehot(y))``, detached.

    The weight is computed per element (per pixel/voxel for segmentation, per label for multi-label
    with the Bernoulli pair ``[σ(z), 1 − σ(z)]``, per sample for multi-class) from the current
    iterate, as in the paper — not the scalar mean cosine some 3-D ports use. Elements the model
    still predicts confidently correctly get high weight; already-fooled ones fade out. Targeted
    attacks use ``1 − cos`` (weight on elements still far from the target).

    Args:
        task, threat, steps, step_size, random_start, restarts, targeted, seed, active_set,
        check_every, amp, record_trace: as for :class:`~medadv.attacks.pgd.PGD`. The paper's L∞
        setting is ε = 0.03, α = 0.01 on [0, 1] images.
    """

    needs_class_scores = True  # the cosine of the predicted and label distributions

    def element_weights(self, logits: Tensor, ctx: StepContext) -> Tensor:
        return cosine_weights(self.task, logits, ctx.y, self.targeted)
