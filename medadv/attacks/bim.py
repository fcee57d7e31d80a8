"""BIM / I-FGSM: iterated FGSM from the clean input.

Kurakin, Goodfellow, Bengio. "Adversarial examples in the physical world", ICLR workshop 2017.
"""

from __future__ import annotations

from ..tasks import Task
from ..threats import Threat
from .base import register
from .gradient import GradientAttack

__all__ = ["BIM"]


@register("bim")
class BIM(GradientAttack):
    """Basic iterative method: PGD without random start.

    Args:
        task: the model's task.
        threat: ε-ball and data bounds (data units).
        steps: number of iterations.
        step_size: α per step in data units; default ``2.5 * eps / steps``.
        targeted, seed, active_set, check_every, amp, record_trace: see :class:`GradientAttack`.
    """

    def __init__(self, task: Task, threat: Threat, *, steps: int = 10, step_size: float | None = None,
                 restarts: int = 1, targeted: bool = False, seed: int | None = 0, active_set: bool = False,
                 check_every: int = 1, amp: bool = False, record_trace: bool = False) -> None:
        super(GradientAttack, self).__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        self.random_start = False  # BIM starts at the clean input (PGD has the random start)
