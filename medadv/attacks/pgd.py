"""PGD: projected gradient descent with a random start and restarts.

Madry, Makelov, Schmidt, Tsipras, Vladu. "Towards Deep Learning Models Resistant to Adversarial
Attacks", ICLR 2018.
"""

from __future__ import annotations

from .base import register
from .gradient import GradientAttack

__all__ = ["PGD"]


@register("pgd")
class PGD(GradientAttack):
    """Projected gradient descent on the task's per-element loss (uniform weights).

    Args:
        task: the model's task (CE for multi-class, per-label BCE, per-voxel CE or Dice).
        threat: ``Linf`` or ``L2`` ball with data bounds; ε in data units.
        steps: number of iterations T.
        step_size: α in data units; default ``2.5 * eps / steps``.
        random_start: uniform start in the ball (default True).
        restarts: random restarts; the worst case per sample is kept.
        targeted, seed, active_set, check_every, amp, record_trace: see :class:`GradientAttack`.
    """
