"""FGSM / FGM: one gradient step of size ε.

Goodfellow, Shlens, Szegedy. "Explaining and Harnessing Adversarial Examples", ICLR 2015.
"""

from __future__ import annotations

from ..tasks import Task
from ..threats import Threat
from .base import register
from .gradient import GradientAttack

__all__ = ["FGSM"]


@register("fgsm")
class FGSM(GradientAttack):
    """Fast gradient sign method (L∞) or fast gradient method (L2): ``x + ε · direction(∇ loss)``.

    Args:
        task: the model's task; the loss is the task's per-element loss averaged per sample.
        threat: ``Linf(eps, bounds=...)`` gives FGSM, ``L2(eps, bounds=...)`` gives FGM; ε in data units.
        targeted: step down the loss towards the target ``y`` instead of up.
    """

    def __init__(self, task: Task, threat: Threat, *, targeted: bool = False, seed: int | None = 0,
                 amp: bool = False) -> None:
        # one step of length ε from the clean input; the loop options are not parameters of FGSM
        super(GradientAttack, self).__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        self.steps, self.step_size, self.random_start = 1, self.threat.eps, False  # type: ignore[union-attr]
