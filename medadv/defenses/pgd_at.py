"""Standard PGD adversarial training.

Madry, Makelov, Schmidt, Tsipras, Vladu. "Towards Deep Learning Models Resistant to Adversarial
Attacks", ICLR 2018 (Eq. 6 of Xu et al., MedIA 2021, is the same min-max).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attacks.pgd import PGD
from ..params import Int, Optional, Real
from ..tasks import Task
from ..threats import Threat
from ..training.loop import draw_seed
from .base import TrainingStrategy

__all__ = ["PGDAT", "adversarial_examples"]


def adversarial_examples(model: nn.Module, x: Tensor, y: Tensor, task: Task, threat: Threat, steps: int,
                         step_size: float | None, generator: torch.Generator) -> Tensor:
    """Random-start PGD on the task loss, seeded from the loop's generator; model in eval mode meanwhile."""
    attack = PGD(task, threat, steps=steps, step_size=step_size, random_start=True, seed=draw_seed(generator))
    return attack(model, x, y).x_adv


class PGDAT(TrainingStrategy):
    """Madry PGD adversarial training: minimise the task loss on PGD examples only.

    Every batch is replaced by random-start PGD examples at a fixed ε and step count (Xu et al.'s
    "Standard" baseline: ε = 4/255, 4 steps, α = 1/255 on [0, 1] data). Works for any task the PGD attack
    supports, segmentation included (the task's per-voxel or Dice loss).

    Args:
        threat: the training threat model (``Linf``/``L2`` with ε and the data box in data units).
        steps: PGD iterations per batch.
        step_size: PGD step α in data units; None = ``2.5 * eps / steps``.
    """

    name = "pgd_at"
    positional: ClassVar[tuple[str, ...]] = ("threat",)
    params: ClassVar[dict[str, Any]] = {"steps": Int(low=1), "step_size": Optional(Real(low=0))}

    threat: Threat
    steps: int
    step_size: float | None

    def __init__(self, threat: Threat, *, steps: int = 4, step_size: float | None = None) -> None:
        self._set_threat(threat)
        self._init_params(locals())

    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        x_adv = adversarial_examples(model, x, y, task, self.threat, self.steps, self.step_size, generator)
        logits = model(x_adv)
        return task.loss(logits, task.to_target(y, logits)).mean()

    def state_dict(self) -> dict[str, Any]:
        return {"eps": self.threat.eps, "steps": self.steps}
