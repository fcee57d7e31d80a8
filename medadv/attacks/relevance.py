"""Relevance test: change the explanation, keep the prediction (Ghorbani et al.; Dombrowski et al.; Zhang et al.)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..explain import Explanation, softplus_surrogate
from ..metrics.saliency import center_of_mass, mass_in_region
from ..params import Bool, Constraint, Int, Optional, Options, Real, renamed
from ..tasks import Task
from ..threats import Threat
from .base import register
from .engine import EngineOutput, StepContext
from .saliency import REFERENCE_PIXELS, SaliencyAttack, SaliencyDetails, square_target

__all__ = ["SaliencyRelevance", "RelevanceDetails"]


class _MapTensor(Constraint):
    """A target map: a finite, non-negative floating-point tensor that is not all zero."""

    def describe(self) -> str:
        return "a finite, non-negative floating-point tensor, not all zero"

    def convert(self, value: Any) -> Tensor:
        if not isinstance(value, Tensor) or not value.is_floating_point():
            raise TypeError
        if (value < 0).any() or not torch.isfinite(value).all() or value.sum() <= 0:
            raise ValueError
        return value


@dataclass
class RelevanceDetails(SaliencyDetails):
    """:class:`~medadv.attacks.saliency.SaliencyDetails` plus the columns ``prob_change`` (max |p(x') − p(x)|
    over the outputs), ``target_mass_clean`` and ``target_mass`` (``goal="target"``: the share of the clean
    and of the adversarial map's mass inside the target region, :func:`~medadv.metrics.saliency.mass_in_region`;
    NaN for the other goals), and ``target_map`` (``goal="target"``: the normalised target, ``(N, *spatial)``)."""

    columns: ClassVar[tuple[str, ...]] = SaliencyDetails.columns + ("prob_change", "target_mass_clean", "target_mass")
    sample_fields: ClassVar[tuple[str, ...]] = SaliencyDetails.sample_fields + ("target_map",)

    prob_change: Tensor
    target_mass_clean: Tensor
    target_mass: Tensor
    target_map: Tensor | None = None


@register("saliency_relevance")
class SaliencyRelevance(SaliencyAttack):
    """Saliency attack x^s: drive the map away from the original while the prediction stays put.

    Minimises ``γ_s·L_map(h(x')) + γ_p·MSE(p(x'), p(x))`` over the threat's ball, where ``p`` is the
    predicted distribution over *all* outputs (softmax, or the sigmoids of every label; spec 002 A5) and
    ``L_map`` depends on ``goal``:

    * ``"target"``: move the map onto a target region (default: Zhang et al.'s upper-right square,
      :func:`~medadv.attacks.saliency.square_target`) by minimising ``−log Σ_i m_i·w_i``, the log of the
      share of the (L1-normalised) map ``m`` inside the region, ``w = target_map / max(target_map)`` (the
      region's indicator for a square);
    * ``"target_mse"`` (Dombrowski et al. 2019; Zhang et al. 2024, as reconstructed in spec 002): MSE
      between the map and the normalised target map. Kept for fidelity, but it is what made the attack
      fail: ``MSE = Σm² − 2Σm·t + Σt²`` rewards spreading the map (``Σm²``) as much as moving it, and an
      all-zero map (Grad-CAM can be switched off entirely) scores better than any map that overlaps the
      target little — the attack erased Grad-CAM maps instead of moving them
      (``tests/attacks/test_saliency.py``, ``benchmarks/saliency.md``);
    * ``"topk"`` (Ghorbani et al. 2019): the map's mass on the original top-``k`` pixels;
    * ``"center"`` (Ghorbani et al. 2019): minus the centre-of-mass shift (over the map diagonal).

    An iterate is admissible only if the original model's prediction is unchanged (``keep_fraction`` of
    the task's elements: labels, voxels) and, optionally, no probability moved by more than
    ``max_prob_change``. The admissible iterate with the best ``goal`` value on the original model's map
    is returned (Ghorbani et al. reject prediction-changing steps the same way). Results:
    :class:`RelevanceDetails` (``AttackResult.details``).

    Defaults follow spec 002 §1.4 (Zhang et al.'s configuration): the gradient map, Adam, 200 steps,
    softplus β growing 10 → 100. The paper's budget is L∞ ε = 0.06 on [0, 1] images: pass
    ``Linf(0.06, bounds=(0, 1))``. Two departures, both measured (``benchmarks/saliency.md``): the
    ``"target"`` loss is the log mass share above (Zhang et al.'s MSE is ``goal="target_mse"``, with their
    prefactors (1e14, 1e4) at 512², γ_s rescaled by (P/512²)² for maps of P pixels; the mass share is
    scale-free and uses (1, 1e4)); and the default step size is ε/20 for L∞ threats, not Zhang et al.'s
    2e-4 — Adam moves each pixel by about the step size per step, so 2e-4 × 200 steps cannot even reach
    ε = 0.06 (ε = 0.06 and ε = 0.3 gave identical results). Pass ``goal="target_mse", step_size=2e-4`` for
    the paper's setting.

    How far the map can be moved is then set by the budget and by the map's resolution, not by the
    optimiser (``benchmarks/saliency.md``, "Why the relevance attack did not move the map"): Grad-CAM upsampled from a grid as
    coarse as the target square can hold at most ~(3/4)² of its mass inside it, and pixel-level gradient
    maps of ReLU CNNs cannot be confined to a small square at all (their mass outside vanishes only where
    every path to those pixels is switched off). ``details.target_mass`` reports the share achieved.
    Max pooling decides where the gradient flows through argmax switches the softplus swap leaves hard, so
    by default (``smooth_pools=True``) the surrogate's max pools become log-mean-exp pools of the same β:
    on a max-pool CNN trained on the real chest X-ray (64², ε = 0.06) the mass share in the square went
    0.010 → 0.030 (hard pools: 0.014), |Δp| 0.003 (hard: 0.044), but SSIM to the target only 0.45 (noise
    control 0.38). Without max pools the map moves further: on a strided-conv CNN with a 2×2 average pool
    (held-out accuracy 0.95, same task) 200 steps took SSIM to the target 0.235 → 0.47 and the mass share
    0.005 → 0.047 (|Δp| 0.0006) with the defaults, and to SSIM 0.56, mass 0.078 (|Δp| 0.019 under
    ``max_prob_change=0.02``) with ``prefactors=(1, 10)``; ±ε noise: SSIM 0.22, mass 0.005
    (``tests/attacks/test_relevance_target.py``).

    Args:
        task, threat, explanation, label, steps, optimizer, softplus_beta, check_every, record_trace, seed:
            see :class:`~medadv.attacks.saliency.SaliencyAttack`.
        step_size: Adam learning rate (or signed step) in data units; default ε/20 for L∞ threats, else
            2e-4 × the data range.
        goal: ``"target"``, ``"target_mse"``, ``"topk"`` or ``"center"``.
        target_map: for the target goals: ``(*spatial)`` or ``(N, *spatial)`` non-negative map (normalised to
            sum 1 here); default the square target (on every slice of a 3-D map).
        k: for ``goal="topk"``: number of top pixels (default 2% of the map, Ghorbani et al.'s 1000 of 227²).
        prefactors: ``(γ_s, γ_p)``; default see above (``"target"``: (1, 1e4); ``"target_mse"``: Zhang et
            al.'s, rescaled; ``"topk"``/``"center"``: (1e3, 1e4), our choice).
        keep_fraction: fraction in (0, 1] of prediction elements that must stay unchanged (1: all
            labels/voxels).
        max_prob_change: optional bound (probability units) on max |p(x') − p(x)| over outputs for an
            admissible iterate.
        smooth_pools: with ``softplus_beta`` set, also smooth the model's max pools in the surrogate
            (log-mean-exp pools of the same β, :func:`~medadv.explain.softplus_surrogate`); admissibility and
            the returned maps are always evaluated on the original model.
    """

    needs_class_scores = True  # its prediction-preservation term compares class distributions

    params: ClassVar[dict[str, Any]] = {
        "goal": Options("target", "target_mse", "topk", "center"),
        "target_map": Optional(_MapTensor()),
        "k": Optional(Int(low=1)),
        "keep_fraction": Real(low=0, high=1, low_open=True),
        "max_prob_change": Optional(Real(low=0, low_open=True)),
        "smooth_pools": Bool(),
    }
    default_steps = 200

    goal: str
    target_map: Tensor | None
    k: int | None
    keep_fraction: float
    max_prob_change: float | None
    smooth_pools: bool

    @renamed(lr="step_size", beta="softplus_beta")
    def __init__(
        self,
        task: Task,
        threat: Threat,
        explanation: Explanation | str | dict[str, Any] = "gradient",
        *,
        goal: str = "target",
        target_map: Tensor | None = None,
        k: int | None = None,
        label: int | Tensor | Sequence[int] | None = None,
        steps: int | None = None,
        step_size: float | None = None,
        optimizer: str = "adam",
        prefactors: tuple[float, float] | None = None,
        softplus_beta: float | tuple[float, float] | None = (10.0, 100.0),
        keep_fraction: float = 1.0,
        max_prob_change: float | None = None,
        smooth_pools: bool = True,
        check_every: int = 1,
        record_trace: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, explanation, label=label, steps=steps, step_size=step_size,
                         optimizer=optimizer, prefactors=prefactors, softplus_beta=softplus_beta,
                         check_every=check_every, record_trace=record_trace, seed=seed)
        self._init_params(locals())

    def _default_step_size(self) -> float | None:
        # Zhang et al.'s 2e-4 travels at most ~T × 2e-4 per pixel (0.04 in 200 Adam steps) and never reaches
        # the paper's own budget ε = 0.06 (benchmarks/saliency.md: ε = 0.06 and 0.3 gave identical results);
        # ε/20 reaches the boundary within ~20 steps and keeps moving on it
        assert self.threat is not None
        if self.threat.p == math.inf and self.threat.eps > 0:
            return self.threat.eps / 20
        return super()._default_step_size()

    def _default_prefactors(self, pixels: int) -> tuple[float, float]:
        if self.goal == "target":
            return 1.0, 1e4
        if self.goal == "target_mse":
            return 1e14 * (pixels / REFERENCE_PIXELS) ** 2, 1e4
        return 1e3, 1e4

    def _target(self, map0: Tensor) -> Tensor:
        spatial = tuple(map0.shape[1:])
        if self.target_map is None:
            if len(spatial) < 2:
                raise ValueError(f"`target_map` is required for goal={self.goal!r} on 1-D maps")
            # the square on the last two (in-plane) dims, on every slice of a volume
            t = square_target((spatial[-2], spatial[-1])).expand(spatial)
        else:
            t = self.target_map
        t = t.to(device=map0.device, dtype=map0.dtype)
        if tuple(t.shape[-len(spatial):]) != spatial or t.ndim not in (len(spatial), len(spatial) + 1):
            raise ValueError(f"`target_map` must have shape {spatial} or (N, *{spatial}), got {tuple(t.shape)}")
        t = t.expand_as(map0)
        return t / t.flatten(1).sum(1).reshape(-1, *([1] * len(spatial)))

    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        super().setup(model, ctx)
        betas = ctx.shared["betas"]
        if self.smooth_pools and betas is not None:
            ctx.shared["surrogate"] = softplus_surrogate(model, betas[0], smooth_pools=True)

    def _setup(self, ctx: StepContext, label: Tensor, map0: Tensor) -> None:
        assert ctx.clean_logits is not None
        ctx.state["pred0"] = self.task.predict(ctx.clean_logits)
        ctx.state["probs0"] = self._probs(ctx.clean_logits)
        if self.goal in ("target", "target_mse"):
            ctx.state["target"] = target = self._target(map0)
            # the region's weights in [0, 1] (its indicator for a square target)
            ctx.state["weight"] = target / target.flatten(1).amax(1).reshape(-1, *([1] * (target.ndim - 1)))
        elif self.goal == "topk":
            n = map0[0].numel()
            k = max(1, round(0.02 * n)) if self.k is None else self.k
            if k > n:
                raise ValueError(f"`k` = {k} exceeds the map size {n}")
            idx = map0.flatten(1).topk(k, dim=1).indices
            ctx.state["topk"] = torch.zeros_like(map0.flatten(1)).scatter_(1, idx, 1.0)
        else:
            ctx.state["com0"] = center_of_mass(map0)
            ctx.shared["diag"] = float(sum(s * s for s in map0.shape[1:])) ** 0.5

    def _criterion(self, ctx: StepContext, m: Tensor) -> Tensor:
        if self.goal == "target":
            # −log of the map's share inside the region (maps sum to 1); an erased (all-zero) map scores worst
            share = (m * ctx.state["weight"]).flatten(1).sum(1)
            return -(share + 1e-12).log()
        if self.goal == "target_mse":
            return (m - ctx.state["target"]).pow(2).flatten(1).mean(1)
        if self.goal == "topk":
            return (m.flatten(1) * ctx.state["topk"]).sum(1)
        return -(center_of_mass(m) - ctx.state["com0"]).norm(dim=1) / ctx.shared["diag"]

    def _step_setup(self, surrogate: nn.Module, ctx: StepContext) -> None:
        # The prediction term compares the surrogate at x' with the *surrogate* at x (same β), so it is zero
        # at x' = x. Against the original model's p(x) it was not: a softplus net at β = 10 is off by ≈ 0.4
        # (RMS) in probability on the brain model, and that mismatch, not the attack, drove the first steps
        # (it dominated a scale-free map loss; benchmarks/saliency.md).
        if ctx.shared["betas"] is None:
            ctx.state["probs_ref"] = ctx.state["probs0"]
            return
        with torch.no_grad():
            ctx.state["probs_ref"] = self._probs(self.forward(surrogate, ctx.x))

    def _losses(self, ctx: StepContext, m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        l_pred = F.mse_loss(self._probs(logits), ctx.state["probs_ref"], reduction="none").flatten(1).mean(1)
        return self._criterion(ctx, m), l_pred

    def _check(self, ctx: StepContext, m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        same = (self.task.predict(logits) == ctx.state["pred0"]).to(m.dtype)
        ok = same.reshape(same.shape[0], -1).mean(1) >= self.keep_fraction  # (n,) for MultiClass too
        if self.max_prob_change is not None:
            change = (self._probs(logits) - ctx.state["probs0"]).abs().flatten(1).amax(1)
            ok = ok & (change <= self.max_prob_change)
        return ok, self._criterion(ctx, m)

    def _details(self, out: EngineOutput, common: dict[str, Any], logits_adv: Tensor) -> RelevanceDetails:
        state = out.ctx.state
        change = (self._probs(logits_adv) - state["probs0"]).abs().flatten(1).amax(1)
        target = state.get("target")
        if target is None:
            before = after = torch.full_like(change, float("nan"))
        else:
            before, after = mass_in_region(common["map"], target), mass_in_region(common["map_adv"], target)
        return RelevanceDetails(**common, prob_change=change, target_mass_clean=before, target_mass=after,
                                target_map=target)
