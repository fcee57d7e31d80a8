"""The engine hooks of an attack with a ``volume`` loss (PGD and APGD): one copy for both.

The objective itself is :class:`~medadv.attacks.losses.VolumeObjective`; this mixin builds it from the attack's
declared ``volume_*`` parameters (:data:`~medadv.attacks.losses.VOLUME_PARAMS`) and plugs it into the engine:
the objective replaces the task's loss, no sample stops early (the task's Dice test would stop a shrinking mask
half-way) and restarts keep the iterate furthest towards the volume goal.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .engine import IterativeAttack, StepContext
from .losses import VolumeObjective

__all__ = ["VolumeLoss"]


class VolumeLoss(IterativeAttack):
    """Mixin of an iterative attack whose ``loss`` may be ``"volume"``; call :meth:`_init_volume` in ``__init__``
    after the parameters are set. Every hook falls through to the attack's own when the loss is another."""

    loss: str
    volume_class: int
    volume_goal: str | None
    volume_target: float | None
    volume_fraction: float | None
    voxel_volume_ml: float
    _volume: VolumeObjective | None

    def _init_volume(self, owner: str) -> None:
        VolumeObjective.check_unused(owner, self.loss, self.volume_target, self.volume_fraction)
        self._volume = None if self.loss != "volume" else VolumeObjective(
            self.task, owner, volume_class=self.volume_class, volume_goal=self.volume_goal,
            volume_target=self.volume_target, volume_fraction=self.volume_fraction,
            voxel_volume_ml=self.voxel_volume_ml, targeted=self.targeted)

    @property
    def optimises_task_metric(self) -> bool:
        return self._volume is None  # the volume loss moves a structure's volume, not the task's metric

    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        super().setup(model, ctx)
        if self._volume is not None:
            self._volume.setup(lambda x: self.forward(model, x), ctx.state, ctx.x, ctx.clean_logits)

    def logits_objective(self, logits: Tensor, ctx: StepContext) -> Tensor:
        if self._volume is not None:
            return self._volume(logits, ctx.state)
        return super().logits_objective(logits, ctx)

    def stop(self, logits: Tensor, ctx: StepContext) -> Tensor | None:
        if self._volume is not None:
            return None  # the volume has no "done": the task's Dice test would stop a shrinking mask half-way
        return super().stop(logits, ctx)

    def assess(self, model: nn.Module, v: Tensor, logits: Tensor, objective: Tensor,
               ctx: StepContext) -> tuple[Tensor, Tensor]:
        if self._volume is not None:  # restarts and best-keeping keep the run furthest towards the volume goal
            return torch.zeros_like(objective, dtype=torch.bool), objective.detach()
        return super().assess(model, v, logits, objective, ctx)
