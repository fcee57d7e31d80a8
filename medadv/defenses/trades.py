"""TRADES: trade-off between clean accuracy and robustness (Zhang et al., ICML 2019).

Also holds the distribution helpers shared with MAAdvT: per-element log-distributions with the class
axis at dim 1, softmax for single-label and segmentation tasks and independent Bernoulli pairs
``[p, 1 - p]`` for multi-label tasks (the layout of :meth:`medadv.tasks.Task.distributions`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..attacks.gradient import GradientAttack
from ..tasks import Task
from ..threats import Threat
from .base import TrainingStrategy, check_inner_attack
from .trainer import draw_seed

__all__ = ["TRADES", "kl_elements"]


def kl_elements(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p ‖ q) per element (summed over the class axis, dim 1), from log-probabilities."""
    return (log_p.exp() * (log_p - log_q)).sum(dim=1)


class _KLAttack(GradientAttack):
    """PGD that ascends KL(f(x) ‖ f(x')) from the clean prediction (the TRADES inner maximisation)."""

    needs_clean_logits = True  # the KL reference is the clean prediction

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor):
        self._ref = self.task.log_probs(logits).detach()
        try:
            return super().perturb(model, x, y, logits)
        finally:
            self._ref = None

    def objective(self, logits: Tensor, y: Tensor, step: int) -> Tensor:
        return self.task.reduce(kl_elements(self._ref, self.task.log_probs(logits)), y)


class TRADES(TrainingStrategy):
    """TRADES loss: ``CE(f(x), y) + β · KL(f(x) ‖ f(x'))``, x' maximising the KL in the ε-ball.

    Zhang, Yu, Jiao, Xing, El Ghaoui, Jordan. "Theoretically Principled Trade-off between Robustness and
    Accuracy", ICML 2019. The KL is summed over classes and averaged over samples (and over labels or
    voxels, as the task averages its loss). Multi-label tasks use independent per-label Bernoulli KLs.
    The inner maximisation is PGD on the KL from a uniform random start in the ball (the reference starts
    at x + 0.001·N(0, 1); any start off x will do, since the KL's gradient vanishes at x), with the model
    in eval mode (the reference leaves it in train mode, which lets adversarial batches move BatchNorm
    statistics). Both terms keep their gradients, as in the reference.

    Args:
        threat: the training threat model (ε and bounds in data units; reference ε = 0.031 on [0, 1]).
        steps: inner PGD iterations (reference 10).
        step_size: inner step α in data units (reference 0.007); None = ``2.5 * eps / steps``.
        beta: weight β of the robustness term (= 1/λ; 6 is the paper's best CIFAR-10 setting).
    """

    name = "trades"

    def __init__(self, threat: Threat, *, steps: int = 10, step_size: float | None = None, beta: float = 6.0) -> None:
        check_inner_attack(threat, steps, step_size)
        if not float(beta) >= 0:
            raise ValueError(f"`beta` must be >= 0, got {beta}")
        self.threat, self.steps, self.step_size, self.beta = threat, steps, step_size, float(beta)

    def adversarial(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        attack = _KLAttack(task, self.threat, steps=self.steps, step_size=self.step_size, random_start=True,
                           seed=draw_seed(generator))
        return attack(model, x, y).x_adv

    def criterion(self, logits_nat: Tensor, logits_adv: Tensor, y: Tensor, task: Task) -> Tensor:
        """The TRADES objective from clean and adversarial logits (scalar)."""
        natural = task.loss(logits_nat, task.to_target(y, logits_nat)).mean()
        kl = kl_elements(task.log_probs(logits_nat), task.log_probs(logits_adv))
        return natural + self.beta * task.reduce(kl, y).mean()

    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        x_adv = self.adversarial(model, x, y, task, generator)
        return self.criterion(model(x), model(x_adv), y, task)

    def state_dict(self) -> dict[str, Any]:
        return {"beta": self.beta, "eps": self.threat.eps, "steps": self.steps}
