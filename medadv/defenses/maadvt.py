"""MAAdvT: misclassification-aware adversarial training (the MART loss), plus a multi-label form."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Bool, Int, Optional, Real
from ..tasks import Task
from ..threats import Threat
from .base import TrainingStrategy
from .pgd_at import adversarial_examples
from .trades import kl_elements

__all__ = ["MAAdvT"]


class MAAdvT(TrainingStrategy):
    r"""Misclassification-aware adversarial training (MART loss; MAAdvT of Xu et al.).

    Wang, Zou, Yi, Bailey, Ma, Gu. "Improving Adversarial Robustness Requires Revisiting Misclassified
    Examples", ICLR 2020; used on medical models as MAAdvT by Xu et al., Medical Image Analysis 2021
    (Eqs. 7-10, Alg. 2). With x' a PGD example on the task's cross-entropy:

    .. math::
        \ell = \mathrm{CE}(p(x'), y) - \log(1 - \max_{k \ne y} p_k(x'))
               + \beta \, \mathrm{KL}(p(x) \| p(x')) \, (1 - p_y(x))

    The second term is MART's "boosted CE" (in the authors' code, missing from Xu et al.'s Eq. 10;
    ``boosted_ce=False`` gives Eq. 10). The weight ``1 - p_y(x)`` uses the *clean* true-class probability
    and is not detached by default (MART and the authors' code let gradients flow through it). The
    constants 1.0001 and 1.0000001 of MART's code guard the logarithm and the weight.

    **Multi-label form (an extension; no published code has one).** Treat each label l as its own
    binary problem with Bernoulli distribution :math:`(p_l, 1 - p_l)`, :math:`p_l = \sigma(z_l)`. A
    sigmoid *is* the softmax over the two logits :math:`(z_l, 0)`, so MART applies per label verbatim:

    * CE becomes the label's BCE, :math:`-\log p_{l,y_l}(x')` with :math:`p_{l,1} = p_l`,
      :math:`p_{l,0} = 1 - p_l`;
    * with two states the "largest wrong class" is the other state, :math:`1 - p_{l,y_l}(x')`, so the
      boosted term is :math:`-\log(1.0001 - (1 - p_{l,y_l}(x'))) \approx \mathrm{BCE}`: for binary
      outcomes MART's margin term doubles the BCE (kept as is, for fidelity to the formula);
    * the KL becomes the Bernoulli KL
      :math:`p_l \log\frac{p_l}{p'_l} + (1 - p_l)\log\frac{1 - p_l}{1 - p'_l}` between clean and
      adversarial outputs;
    * the misclassification weight becomes per label, :math:`1 - p_{l,y_l}(x)`, so a label the clean
      model gets wrong is pushed harder towards stability than one it gets right.

    Per-label terms are averaged over labels (as the task's BCE is), then over the batch. The same code
    covers single-label (softmax over classes) and segmentation (softmax per voxel, ignored voxels
    masked) through :meth:`medadv.tasks.Task.distributions`.

    Args:
        threat: the training threat model (Xu et al.: ε = 4/255 on [0, 1] data), ε and box in data units.
        steps: inner PGD iterations (4).
        step_size: inner step α in data units (1/255 in the paper's setting); None = ``2.5 * eps / steps``.
        beta: MART's β (Xu et al.'s λ), the weight of the KL term; 6 (MART, Xu et al.'s melanoma code). The
            name is MART's own, unrelated to the ``beta``/``betas`` of other components.
        boosted_ce: include MART's margin term (True: MART and the authors' code).
        detach_weight: stop gradients through the weight ``1 - p_y(x)``.
    """

    name = "maadvt"
    positional: ClassVar[tuple[str, ...]] = ("threat",)
    params: ClassVar[dict[str, Any]] = {"steps": Int(low=1), "step_size": Optional(Real(low=0)),
                                        "beta": Real(low=0), "boosted_ce": Bool(), "detach_weight": Bool()}

    threat: Threat
    steps: int
    step_size: float | None
    beta: float
    boosted_ce: bool
    detach_weight: bool

    def __init__(self, threat: Threat, *, steps: int = 4, step_size: float | None = None, beta: float = 6.0,
                 boosted_ce: bool = True, detach_weight: bool = False) -> None:
        self._set_threat(threat)
        self._init_params(locals())

    def criterion(self, logits_nat: Tensor, logits_adv: Tensor, y: Tensor, task: Task) -> Tensor:
        """The MART objective from clean and adversarial logits (scalar)."""
        log_adv, log_nat = task.log_probs(logits_adv), task.log_probs(logits_nat)
        target = task.distributions(logits_adv, y)[1]  # one-hot / Bernoulli pair, zero where ignored
        adv_term = -(target * log_adv).sum(dim=1)
        if self.boosted_ce:
            wrong = (log_adv.exp() * (1 - target)).amax(dim=1)
            adv_term = adv_term - torch.log(1.0001 - wrong + 1e-12)
        weight = 1.0000001 - (log_nat.exp() * target).sum(dim=1)
        if self.detach_weight:
            weight = weight.detach()
        robust = kl_elements(log_nat, log_adv) * weight
        return task.reduce(adv_term, y).mean() + self.beta * task.reduce(robust, y).mean()

    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        x_adv = adversarial_examples(model, x, y, task, self.threat, self.steps, self.step_size, generator)
        return self.criterion(model(x), model(x_adv), y, task)

    def state_dict(self) -> dict[str, Any]:
        return {"beta": self.beta, "eps": self.threat.eps, "steps": self.steps}
