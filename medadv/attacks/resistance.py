"""Resistance test: change the prediction, keep the explanation (Zhang et al., Radiology: AI 2024)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from .base import register
from .engine import EngineOutput, StepContext
from .saliency import REFERENCE_PIXELS, SaliencyAttack, SaliencyDetails

__all__ = ["SaliencyResistance", "ResistanceDetails", "RESISTANCE_STEPS"]

#: Zhang et al.'s iteration counts per attacked method (notebook: "VBP:8 | VBP*I: 8 | IG: 20 | SG: 50 | GCAM:60")
RESISTANCE_STEPS = {"gradient": 8, "gradient_x_input": 8, "integrated_gradients": 20, "smoothgrad": 50, "gradcam": 60}


@dataclass
class ResistanceDetails(SaliencyDetails):
    """:class:`~medadv.attacks.saliency.SaliencyDetails` plus the column ``flipped`` (the attacked
    prediction changed on the returned input; equals ``admissible``)."""

    columns: ClassVar[tuple[str, ...]] = SaliencyDetails.columns + ("flipped",)

    flipped: Tensor


@register("saliency_resistance")
class SaliencyResistance(SaliencyAttack):
    """Prediction attack x^p: flip the prediction while the saliency map stays close to the original.

    Minimises ``γ_s·MSE(h(x'), h(x)) + γ_p·L_flip(f(x'))`` over the threat's ball (reconstruction of
    Zhang et al.'s missing ``attack_pred_T``, spec 002 §1.3):

    * multi-label: BCE-with-logits of the attacked label towards ``1 − y_c`` (``y``: the ground truth if
      given, else the clean prediction); flipped when that label's prediction changed;
    * multi-class: cross-entropy towards ``y`` if ``targeted``, else towards the clean second most likely
      class (spec 002 A16); flipped when the arg-max left ``y`` (reached it, if targeted);
    * segmentation: the task's loss, ascended (descended towards ``y`` if ``targeted``); flipped when the
      task's ``fooled`` test holds.

    Among flipped iterates the one whose map (on the original model) is closest to the clean map in MSE
    is returned; samples never flipped get the last iterate (``details.admissible`` is False). Results:
    :class:`ResistanceDetails`.

    Defaults follow Zhang et al.'s configuration: the gradient map, Adam with step size 2e-4 × the data
    range, steps per method (:data:`RESISTANCE_STEPS`; 50 for other methods), prefactors (8e4, 10) at
    512² (γ_s rescaled by (P/512²)²), and no softplus surrogate (``softplus_beta=None``): on ReLU networks
    the map term then has no gradient for gradient, IG and SmoothGrad maps and the map is kept only by the
    small step count. Pass ``softplus_beta`` for the principled variant. The paper's budget is L∞ ε = 0.03
    on [0, 1] images.

    Args:
        task, threat, explanation, label, steps, step_size, optimizer, prefactors, softplus_beta,
            check_every, record_trace, seed: see :class:`~medadv.attacks.saliency.SaliencyAttack`.
        targeted: drive the prediction to ``y`` (multi-class, segmentation; not multi-label).
    """

    def _check_settings(self) -> None:
        if self.targeted and not self.task.flip_targeted:
            raise ValueError(f"`targeted` is not supported for {type(self.task).__name__}: the attack flips the chosen "
                             "`label`")

    def _default_steps(self) -> int:
        return RESISTANCE_STEPS.get(self.explanation.name, 50)

    def _default_prefactors(self, pixels: int) -> tuple[float, float]:
        return 8e4 * (pixels / REFERENCE_PIXELS) ** 2, 10.0

    def _setup(self, ctx: StepContext, label: Tensor, map0: Tensor) -> None:
        # what the flip aims at, from the task (the runner-up class, the chosen label the other way, or none)
        goal = self.task.flip_goal(ctx.y, label, ctx.clean_logits, self.targeted)
        if goal is not None:
            ctx.state["flip_to"] = goal

    def _flip_loss(self, ctx: StepContext, logits: Tensor) -> Tensor:
        return self.task.flip_loss(logits, ctx.y, ctx.state["label"], ctx.state.get("flip_to"), self.targeted)

    def _flipped(self, ctx: StepContext, logits: Tensor) -> Tensor:
        return self.task.flipped(logits, ctx.y, ctx.state["label"], ctx.state.get("flip_to"), self.targeted)

    def _losses(self, ctx: StepContext, m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        return (m - ctx.state["map0"]).pow(2).flatten(1).mean(1), self._flip_loss(ctx, logits)

    def _check(self, ctx: StepContext, m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        return self._flipped(ctx, logits), (m - ctx.state["map0"]).pow(2).flatten(1).mean(1)

    def _details(self, out: EngineOutput, common: dict[str, Any], logits_adv: Tensor) -> ResistanceDetails:
        return ResistanceDetails(**common, flipped=self._flipped(out.ctx, logits_adv))
