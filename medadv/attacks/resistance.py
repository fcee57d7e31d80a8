"""Resistance test: change the prediction, keep the explanation (Zhang et al., Radiology: AI 2024)."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from ..tasks import MultiClass, MultiLabel
from .base import register
from .saliency import REFERENCE_PIXELS, SaliencyAttack

__all__ = ["SaliencyResistance", "RESISTANCE_STEPS"]

#: Zhang et al.'s iteration counts per attacked method (notebook: "VBP:8 | VBP*I: 8 | IG: 20 | SG: 50 | GCAM:60")
RESISTANCE_STEPS = {"gradient": 8, "gradient_x_input": 8, "integrated_gradients": 20, "smoothgrad": 50, "gradcam": 60}


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
    is returned; samples never flipped get the last iterate (``extras["admissible"]`` is False).

    Defaults follow Zhang et al.'s configuration: Adam, lr 2e-4, steps per method (:data:`RESISTANCE_STEPS`;
    50 for other methods), prefactors (8e4, 10) at 512² (γ_s rescaled by (P/512²)²), and no softplus
    surrogate (``beta=None``): on ReLU networks the map term then has no gradient for gradient, IG and
    SmoothGrad maps and the map is kept only by the small step count. Pass ``beta`` for the principled
    variant. The paper's budget is L∞ ε = 0.03 on [0, 1] images.

    Args:
        task, threat, explanation, label, steps, lr, optimizer, prefactors, beta, check_every,
            record_trace, targeted, seed: see :class:`~medadv.attacks.saliency.SaliencyAttack`.
    """

    def _check_settings(self) -> None:
        if self.targeted and isinstance(self.task, MultiLabel):
            raise ValueError("`targeted` is not supported for MultiLabel: the attack flips the chosen `label`")

    def _default_steps(self) -> int:
        return RESISTANCE_STEPS.get(self.explanation.name, 50)

    def _default_prefactors(self, pixels: int) -> tuple[float, float]:
        return 8e4 * (pixels / REFERENCE_PIXELS) ** 2, 10.0

    def _setup(self, x: Tensor, y: Tensor, logits: Tensor, label: Tensor, map0: Tensor) -> dict[str, Any]:
        state: dict[str, Any] = {"y": y, "label": label, "map0": map0}
        if isinstance(self.task, MultiLabel):
            state["flip_to"] = 1.0 - y.gather(1, label[:, None])[:, 0]
        elif isinstance(self.task, MultiClass) and not self.targeted:
            masked = logits.scatter(1, y.long()[:, None], float("-inf"))
            state["flip_to"] = masked.argmax(dim=1)
        return state

    def _flip_loss(self, state: dict[str, Any], logits: Tensor) -> Tensor:
        if isinstance(self.task, MultiLabel):
            z = logits.gather(1, state["label"][:, None])[:, 0]
            return F.binary_cross_entropy_with_logits(z, state["flip_to"].to(z.dtype), reduction="none")
        if isinstance(self.task, MultiClass):
            to = state["y"] if self.targeted else state["flip_to"]
            return F.cross_entropy(logits, to.long(), reduction="none")
        loss = self.task.loss(logits, state["y"])
        return loss if self.targeted else -loss

    def _flipped(self, state: dict[str, Any], logits: Tensor) -> Tensor:
        if isinstance(self.task, MultiLabel):
            pred = self.task.predict(logits).gather(1, state["label"][:, None])[:, 0]
            return pred == state["flip_to"].to(pred.dtype)
        return self.task.fooled(logits, state["y"], self.targeted)

    def _losses(self, state: dict[str, Any], m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        return (m - state["map0"]).pow(2).flatten(1).mean(1), self._flip_loss(state, logits)

    def _check(self, state: dict[str, Any], m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        return self._flipped(state, logits), (m - state["map0"]).pow(2).flatten(1).mean(1)

    def _extras(self, state: dict[str, Any], map_adv: Tensor, logits_adv: Tensor) -> dict[str, Any]:
        return {"flipped": self._flipped(state, logits_adv)}
