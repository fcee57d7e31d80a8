"""TRADES: trade-off between clean accuracy and robustness (Zhang et al., ICML 2019).

Also holds the distribution helper shared with MAAdvT: the per-element KL between log-distributions with the
class axis at dim 1 (softmax for single-label and segmentation tasks, independent Bernoulli pairs
``[p, 1 - p]`` for multi-label tasks: the layout of :meth:`medadv.tasks.Task.log_probs`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attacks.engine import StepContext
from ..attacks.gradient import GradientAttack
from ..params import Int, Optional, Real
from ..tasks import Task
from ..threats import Threat
from ..training.loop import draw_seed
from .base import TrainingStrategy

__all__ = ["TRADES", "KLAttack", "kl_elements"]


def kl_elements(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p ‖ q) per element (summed over the class axis, dim 1), from log-probabilities."""
    return (log_p.exp() * (log_p - log_q)).sum(dim=1)


class KLAttack(GradientAttack):
    """PGD that ascends KL(f(x) ‖ f(x')) from the clean prediction (the TRADES inner maximisation).

    A gradient attack on the iterative engine with the KL as its objective. The clean log-probabilities are
    per-sample state (``ctx.state["clean_log_probs"]``, filled in :meth:`setup`), so they follow the active
    set when ``active_set=True`` compacts the batch. Not registered: a train-time attack.
    """

    needs_clean_logits = True  # the KL reference is the clean prediction

    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        assert ctx.clean_logits is not None
        ctx.state["clean_log_probs"] = self.task.log_probs(ctx.clean_logits).detach()

    def logits_objective(self, logits: Tensor, ctx: StepContext) -> Tensor:
        kl = kl_elements(ctx.state["clean_log_probs"], self.task.log_probs(logits))
        return self.task.reduce(kl, ctx.y)


class TRADES(TrainingStrategy):
    """TRADES loss: ``CE(f(x), y) + β · KL(f(x) ‖ f(x'))``, x' maximising the KL in the ε-ball.

    Zhang, Yu, Jiao, Xing, El Ghaoui, Jordan. "Theoretically Principled Trade-off between Robustness and
    Accuracy", ICML 2019. The KL is summed over classes and averaged over samples (and over labels or
    voxels, as the task averages its loss). Multi-label tasks use independent per-label Bernoulli KLs.
    The inner maximisation (:class:`KLAttack`) is PGD on the KL from a uniform random start in the ball
    (the reference starts at x + 0.001·N(0, 1); any start off x will do, since the KL's gradient vanishes
    at x), with the model in eval mode (the reference leaves it in train mode, which lets adversarial
    batches move BatchNorm statistics). Both terms keep their gradients, as in the reference.

    Args:
        threat: the training threat model (ε and the data box in data units; reference ε = 0.031 on [0, 1]).
        steps: inner PGD iterations (reference 10).
        step_size: inner step α in data units (reference 0.007); None = ``2.5 * eps / steps``.
        beta: the paper's β (= 1/λ), the weight of the robustness (KL) term; 6 is the paper's best CIFAR-10
            setting. The name is TRADES' own; it is unrelated to the ``beta``/``betas`` of other components
            (Adam's moment decays, for instance).
    """

    name = "trades"
    positional: ClassVar[tuple[str, ...]] = ("threat",)
    params: ClassVar[dict[str, Any]] = {"steps": Int(low=1), "step_size": Optional(Real(low=0)),
                                        "beta": Real(low=0)}

    threat: Threat
    steps: int
    step_size: float | None
    beta: float

    def __init__(self, threat: Threat, *, steps: int = 10, step_size: float | None = None, beta: float = 6.0) -> None:
        self._set_threat(threat)
        self._init_params(locals())

    def inner_attack(self, task: Task, seed: int | None = 0, **options: Any) -> KLAttack:
        """The KL attack of this strategy for ``task`` (``options``: engine options such as ``active_set``)."""
        return KLAttack(task, self.threat, steps=self.steps, step_size=self.step_size, random_start=True, seed=seed,
                        **options)

    def adversarial(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        """x' maximising the KL to the clean prediction (seeded from the loop's generator)."""
        return self.inner_attack(task, seed=draw_seed(generator))(model, x, y).x_adv

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
