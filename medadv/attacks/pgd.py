"""PGD: projected gradient descent with a random start and restarts.

Madry, Makelov, Schmidt, Tsipras, Vladu. "Towards Deep Learning Models Resistant to Adversarial
Attacks", ICLR 2018.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..params import Options
from ..tasks import Task
from ..threats import Threat
from .base import register
from .gradient import GradientAttack
from .losses import VOLUME_PARAMS
from .volume_loss import VolumeLoss

__all__ = ["PGD"]


@register("pgd")
class PGD(VolumeLoss, GradientAttack):
    """Projected gradient descent on the task's per-element loss (uniform weights), or on a clinical endpoint.

    Args:
        task: the model's task (CE for multi-class, per-label BCE, per-voxel CE or Dice).
        threat: ``Linf`` or ``L2`` ball with data bounds; ε in data units.
        steps: number of iterations T.
        step_size: α in data units; default ``2.5 * eps / steps``.
        random_start: uniform start in the ball (default True).
        restarts: random restarts; the worst case per sample is kept.
        loss: ``"ce"`` (default: the task's own loss, :meth:`~medadv.tasks.Task.loss`) or ``"volume"``: the soft
            volume (ml) of class ``volume_class`` of a segmentation, shrunk, grown or driven to a target
            (:class:`~medadv.attacks.losses.VolumeObjective`; untargeted; with restarts the run furthest towards the
            goal is kept, and the active set never stops a sample).
        volume_class: ``loss="volume"``: the class whose volume moves (default 1, the first foreground class).
        volume_goal: ``loss="volume"``: ``"shrink"``, ``"grow"`` or ``"target"``; default: ``"target"``
            when ``volume_target`` or ``volume_fraction`` is given, else ``"shrink"``.
        volume_target: ``volume_goal="target"``: the volume to reach, in ml.
        volume_fraction: ``volume_goal="target"``: the volume to reach as a fraction of the clean soft volume
            (the target is on the soft volume, which the loss moves); exactly one of ``volume_target`` and ``volume_fraction``.
        voxel_volume_ml: ``loss="volume"``: one voxel's volume in ml, ``prod(spacing in mm) / 1000`` (default
            0.001: 1 mm isotropic); it scales the objective only, so it matters for ``volume_target``.
        targeted, seed, active_set, check_every, amp, record_trace: see :class:`GradientAttack`.
    """

    params: ClassVar[dict[str, Any]] = {"loss": Options("ce", "volume"), **VOLUME_PARAMS}

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
        loss: str = "ce",
        volume_class: int = 1,
        volume_goal: str | None = None,
        volume_target: float | None = None,
        volume_fraction: float | None = None,
        voxel_volume_ml: float = 0.001,
    ) -> None:
        super().__init__(task, threat, steps=steps, step_size=step_size, random_start=random_start,
                         restarts=restarts, targeted=targeted, seed=seed, active_set=active_set,
                         check_every=check_every, amp=amp, record_trace=record_trace)
        self._init_params(locals())
        self._init_volume("PGD")
