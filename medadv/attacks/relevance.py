"""Relevance test: change the explanation, keep the prediction (Ghorbani et al.; Dombrowski et al.; Zhang et al.)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..explain import Explanation
from ..metrics.saliency import center_of_mass
from ..tasks import Task
from ..threats import Threat
from .base import register
from .saliency import REFERENCE_PIXELS, SaliencyAttack, square_target

__all__ = ["SaliencyRelevance"]


@register("saliency_relevance")
class SaliencyRelevance(SaliencyAttack):
    """Saliency attack x^s: drive the map away from the original while the prediction stays put.

    Minimises ``γ_s·L_map(h(x')) + γ_p·MSE(p(x'), p(x))`` over the threat's ball, where ``p`` is the
    predicted distribution over *all* outputs (softmax, or the sigmoids of every label; spec 002 A5) and
    ``L_map`` depends on ``goal``:

    * ``"target"`` (Dombrowski et al. 2019; Zhang et al. 2024): MSE between the map and a target map
      (default: Zhang et al.'s upper-right square, :func:`~medadv.attacks.saliency.square_target`);
    * ``"topk"`` (Ghorbani et al. 2019): the map's mass on the original top-``k`` pixels;
    * ``"center"`` (Ghorbani et al. 2019): minus the centre-of-mass shift (over the map diagonal).

    An iterate is admissible only if the original model's prediction is unchanged (``keep_fraction`` of
    the task's elements: labels, voxels) and, optionally, no probability moved by more than
    ``max_prob_change``. The admissible iterate with the best ``goal`` value on the original model's map
    is returned (Ghorbani et al. reject prediction-changing steps the same way).

    Defaults follow spec 002 §1.4 (Zhang et al.'s configuration): Adam, lr 2e-4, 200 steps, β growing
    10 → 100, prefactors (1e14, 1e4) at 512² — γ_s is rescaled by (P/512²)² for maps of P pixels so the
    balance of the two terms does not depend on the image size. The paper's budget is L∞ ε = 0.06 on
    [0, 1] images: pass ``Linf(0.06, bounds=(0, 1))``.

    Args:
        task, threat, explanation, label, steps, lr, optimizer, beta, check_every, record_trace, seed:
            see :class:`~medadv.attacks.saliency.SaliencyAttack`.
        goal: ``"target"``, ``"topk"`` or ``"center"``.
        target_map: for ``goal="target"``: ``(*spatial)`` or ``(N, *spatial)`` non-negative map (normalised to
            sum 1 here); default the square target (2-D only).
        k: for ``goal="topk"``: number of top pixels (default 2% of the map, Ghorbani et al.'s 1000 of 227²).
        prefactors: ``(γ_s, γ_p)``; default see above (``"topk"``/``"center"``: (1e3, 1e4), our choice).
        keep_fraction: fraction of prediction elements that must stay unchanged (1.0: all labels/voxels).
        max_prob_change: optional bound on max |p(x') − p(x)| over outputs for an admissible iterate.
    """

    default_steps = 200

    def __init__(
        self,
        task: Task,
        threat: Threat,
        explanation: Explanation,
        *,
        goal: str = "target",
        target_map: Tensor | None = None,
        k: int | None = None,
        label: int | Tensor | None = None,
        steps: int | None = None,
        lr: float = 2e-4,
        optimizer: str = "adam",
        prefactors: tuple[float, float] | None = None,
        beta: float | tuple[float, float] | None = (10.0, 100.0),
        keep_fraction: float = 1.0,
        max_prob_change: float | None = None,
        check_every: int = 1,
        record_trace: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, explanation, label=label, steps=steps, lr=lr, optimizer=optimizer,
                         prefactors=prefactors, beta=beta, check_every=check_every, record_trace=record_trace,
                         seed=seed)
        if goal not in ("target", "topk", "center"):
            raise ValueError(f"`goal` must be 'target', 'topk' or 'center', got {goal!r}")
        self.goal = goal
        if target_map is not None:
            if not isinstance(target_map, Tensor) or not target_map.is_floating_point():
                raise TypeError("`target_map` must be a floating-point torch.Tensor")
            if (target_map < 0).any() or not torch.isfinite(target_map).all() or target_map.sum() <= 0:
                raise ValueError("`target_map` must be finite, non-negative and not all zero")
        self.target_map = target_map
        if k is not None and int(k) < 1:
            raise ValueError(f"`k` must be >= 1, got {k}")
        self.k = k
        if not 0.0 < float(keep_fraction) <= 1.0:
            raise ValueError(f"`keep_fraction` must be in (0, 1], got {keep_fraction}")
        self.keep_fraction = float(keep_fraction)
        if max_prob_change is not None and not float(max_prob_change) > 0:
            raise ValueError(f"`max_prob_change` must be > 0 or None, got {max_prob_change}")
        self.max_prob_change = None if max_prob_change is None else float(max_prob_change)

    def _default_prefactors(self, pixels: int) -> tuple[float, float]:
        if self.goal == "target":
            return 1e14 * (pixels / REFERENCE_PIXELS) ** 2, 1e4
        return 1e3, 1e4

    def _target(self, map0: Tensor) -> Tensor:
        spatial = tuple(map0.shape[1:])
        if self.target_map is None:
            if len(spatial) != 2:
                raise ValueError("`target_map` is required for goal='target' on non-2-D maps")
            t = square_target(spatial)  # type: ignore[arg-type]
        else:
            t = self.target_map
        t = t.to(device=map0.device, dtype=map0.dtype)
        if tuple(t.shape[-len(spatial):]) != spatial or t.ndim not in (len(spatial), len(spatial) + 1):
            raise ValueError(f"`target_map` must have shape {spatial} or (N, *{spatial}), got {tuple(t.shape)}")
        t = t.expand_as(map0)
        return t / t.flatten(1).sum(1).reshape(-1, *([1] * len(spatial)))

    def _setup(self, x: Tensor, y: Tensor, logits: Tensor, label: Tensor, map0: Tensor) -> dict[str, Any]:
        state: dict[str, Any] = {"pred0": self.task.predict(logits), "probs0": self._probs(logits), "map0": map0}
        if self.goal == "target":
            state["target"] = self._target(map0)
        elif self.goal == "topk":
            n = map0[0].numel()
            k = max(1, round(0.02 * n)) if self.k is None else self.k
            if k > n:
                raise ValueError(f"`k` = {k} exceeds the map size {n}")
            idx = map0.flatten(1).topk(k, dim=1).indices
            state["topk"] = torch.zeros_like(map0.flatten(1)).scatter_(1, idx, 1.0)
        else:
            state["com0"] = center_of_mass(map0)
            state["diag"] = float(sum(s * s for s in map0.shape[1:])) ** 0.5
        return state

    def _criterion(self, state: dict[str, Any], m: Tensor) -> Tensor:
        if self.goal == "target":
            return (m - state["target"]).pow(2).flatten(1).mean(1)
        if self.goal == "topk":
            return (m.flatten(1) * state["topk"]).sum(1)
        return -(center_of_mass(m) - state["com0"]).norm(dim=1) / state["diag"]

    def _losses(self, state: dict[str, Any], m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        l_pred = F.mse_loss(self._probs(logits), state["probs0"], reduction="none").flatten(1).mean(1)
        return self._criterion(state, m), l_pred

    def _check(self, state: dict[str, Any], m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        same = (self.task.predict(logits) == state["pred0"]).to(m.dtype)
        ok = same.reshape(same.shape[0], -1).mean(1) >= self.keep_fraction  # (N,) for MultiClass too
        if self.max_prob_change is not None:
            change = (self._probs(logits) - state["probs0"]).abs().flatten(1).amax(1)
            ok = ok & (change <= self.max_prob_change)
        return ok, self._criterion(state, m)

    def _extras(self, state: dict[str, Any], map_adv: Tensor, logits_adv: Tensor) -> dict[str, Any]:
        out: dict[str, Any] = {"prob_change": (self._probs(logits_adv) - state["probs0"]).abs().flatten(1).amax(1)}
        if self.goal == "target":
            out["target_map"] = state["target"]
        return out
