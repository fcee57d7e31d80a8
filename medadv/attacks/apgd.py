"""APGD: Auto-PGD, PGD with a step-size schedule driven by the progress of the objective.

Croce, Hein. "Reliable evaluation of adversarial robustness with an ensemble of diverse parameter-free
attacks", ICML 2020 (the APGD-CE / APGD-DLR attacks of AutoAttack).

APGD runs on the engine like every medadv attack: the schedule is a :class:`~medadv.attacks.steps.StepRule`
whose state (step size, best point, counters) is per sample, so the active set and restarts work as for
PGD, and the checkpoints are known in advance (no host synchronisation in the loop).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Bool, Options, Real
from ..tasks import Task
from ..threats import Linf, Threat
from .base import AttackDetails, PerturbOutput, register
from .engine import EngineOutput, IterativeAttack, StepContext
from .losses import (
    VOLUME_PARAMS,
    balanced_weights,
    cosine_weights,
    js_divergence,
    segpgd_weights,
)
from .steps import StepRule
from .volume_loss import VolumeLoss

__all__ = ["APGD", "APGDDetails", "APGDStep", "apgd_checkpoints", "LOSSES"]

#: APGD's objectives (see :class:`APGD`)
LOSSES = ("ce", "margin", "volume", "dlr", "cospgd", "segpgd", "balanced-ce", "js", "masked-ce", "masked-balanced-ce",
          "signed-up", "signed-down")


def apgd_checkpoints(steps: int) -> dict[int, int]:
    """The checkpoints of a T-step run: ``{step t: window length}`` for the checkpoints with ``t < T``.

    The paper's checkpoints are ``w_j = ⌈p_j T⌉`` with ``p_0 = 0``, ``p_1 = 0.22`` and
    ``p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06)``: the windows shrink by 0.03 T down to 0.06 T. As in
    the reference code (AutoAttack), the window lengths are rounded once — ``⌊0.22 T⌋``, then minus
    ``⌊0.03 T⌋`` each, at least ``⌊0.06 T⌋``, every one at least 1 — so the checkpoints are their partial
    sums (T = 100: 22, 41, 57, 70, 80, 87, 93, 99). A checkpoint is decided after the objective of the
    iterate ``x^(t)`` is known, before the step from it; one at ``t = T`` would change nothing.
    """
    k = max(int(0.22 * steps), 1)
    k_min = max(int(0.06 * steps), 1)
    decrease = max(int(0.03 * steps), 1)
    out: dict[int, int] = {}
    t = k
    while t < steps:
        out[t] = k
        k = max(k - decrease, k_min)
        t += k
    return out


def _rows(t: Tensor, like: Tensor) -> Tensor:
    return t.reshape((-1,) + (1,) * (like.ndim - 1))


def _l2(t: Tensor) -> Tensor:
    """Per-sample L2 norm, ``(N,)``, summed the way the reference code does (bitwise the same steps)."""
    return (t ** 2).reshape(t.shape[0], -1).sum(-1).sqrt()


class APGDStep(StepRule):
    """APGD's update (Algorithm 1 of the paper), per sample.

    ``z = P(x + η·d(g))``, ``x_new = P(x + α(z − x) + (1 − α)(x − x_prev))`` with ``d`` the sign (L∞) or the
    L2-normalised gradient, ``η`` starting at ``2ε`` and the first step a plain one (α = 1). At each
    checkpoint ``η`` halves for the samples where at most ``ρ`` of the steps since the last checkpoint
    increased the objective, or where the previous checkpoint did not halve and the best objective has not
    improved since; those samples restart from their best point (and its gradient).

    The rule sees ``x^(t)``, its gradient and objective at step ``t``: it first books ``x^(t)`` (best point,
    success count, checkpoint), then steps. The projection ``P`` is :meth:`APGD.project`.
    """

    def __init__(self, attack: APGD, steps: int) -> None:
        self.attack = attack
        assert attack.threat is not None
        self.threat = attack.threat
        self.linf = isinstance(attack.threat, Linf)
        self.checkpoints = apgd_checkpoints(steps)
        # the success-count threshold k·ρ, rounded to float32 as the reference compares it
        self.threshold = {t: struct.unpack("f", struct.pack("f", k * attack.rho))[0]
                          for t, k in self.checkpoints.items()}
        self.alpha = attack.momentum

    def init(self, v: Tensor, ctx: StepContext) -> dict[str, Any]:
        n = v.shape[0]
        return {
            "eta": torch.full((n,), 2.0 * self.threat.eps, device=v.device, dtype=v.dtype),
            "prev": v,  # the point the previous step started from (x^(t−1), after any restart)
            "best_v": v, "best_g": torch.zeros_like(v),
            "best_obj": torch.full((n,), float("-inf"), device=v.device, dtype=v.dtype),
            "best_at_check": torch.full((n,), float("-inf"), device=v.device, dtype=v.dtype),
            "halved_at_check": torch.ones(n, dtype=torch.bool, device=v.device),
            # the reference compares the first objective after x^(0) with 0 (its history starts zeroed)
            "last_obj": torch.zeros(n, device=v.device, dtype=v.dtype),
            "successes": torch.zeros(n, device=v.device, dtype=v.dtype),
        }

    def step(self, v: Tensor, g: Tensor, objective: Tensor, ctx: StepContext, state: dict[str, Any]) -> Tensor:
        t = ctx.step
        obj = objective.to(v.dtype)
        log = ctx.shared.get("apgd")  # full-batch records of APGD.setup (halvings, step-size trace)
        if t == 0:
            state["best_v"], state["best_g"], state["best_obj"] = v, g, obj
            state["best_at_check"] = obj
        else:
            state["successes"] = state["successes"] + (obj > state["last_obj"]).to(v.dtype)
            state["last_obj"] = obj
            improved = obj > state["best_obj"]
            rows = _rows(improved, v)
            state["best_v"] = torch.where(rows, v, state["best_v"])
            state["best_g"] = torch.where(rows, g, state["best_g"])
            state["best_obj"] = torch.where(improved, obj, state["best_obj"])
            if t in self.checkpoints:
                oscillating = state["successes"] <= self.threshold[t]
                stalled = ~state["halved_at_check"] & (state["best_at_check"] >= state["best_obj"])
                halve = oscillating | stalled
                state["halved_at_check"] = halve
                state["best_at_check"] = state["best_obj"]
                state["successes"] = torch.zeros_like(state["successes"])
                state["eta"] = torch.where(halve, state["eta"] / 2.0, state["eta"])
                rows = _rows(halve, v)
                v = torch.where(rows, state["best_v"], v)
                g = torch.where(rows, state["best_g"], g)
                if log is not None:
                    log["halvings"].index_add_(0, ctx.index, halve.long())
        if log is not None and "step_size" in log:
            log["step_size"][ctx.restart * ctx.steps + t].index_copy_(0, ctx.index, state["eta"])
        a = 1.0 if t == 0 else self.alpha
        eta = _rows(state["eta"], v)
        if self.linf:
            z = v + eta * g.sign()
        else:
            z = v + eta * (g / _rows(_l2(g) + 1e-12, g))
        z = self.attack.project(z, ctx)
        # the reference's expression order (also at t = 0, where the momentum term is zero)
        new = v + (z - v) * a + (v - state["prev"]) * (1.0 - a)
        state["prev"] = v
        return new


@dataclass
class APGDDetails(AttackDetails):
    """APGD's per-sample record.

    Attributes:
        step_halvings: ``(N,)`` number of step-size halvings (summed over restarts).
    """

    columns: ClassVar[tuple[str, ...]] = ("step_halvings",)
    step_halvings: Tensor


@register("apgd")
class APGD(VolumeLoss, IterativeAttack):
    """Auto-PGD (Croce & Hein, ICML 2020) on any task: PGD with momentum and a self-tuning step size.

    Each run starts at a random point of the ball (AutoAttack's start: a uniform direction scaled to the
    sphere's L∞ or L2 radius ε, clipped to the box), takes a first plain step of size ``η = 2ε``, then
    momentum steps ``x ← P(x + α(z − x) + (1 − α)(x − x_prev))``, ``z = P(x + η·d(∇))``. At checkpoints
    after 22 %, 41 %, 57 %, ... of the steps (:func:`apgd_checkpoints`) a sample's step size halves and the
    sample restarts from its best point when at most ``rho`` of its steps since the previous checkpoint
    increased the objective, or when its step size was kept at the previous checkpoint and its best
    objective has not improved since. Everything is per sample. The returned iterate is the best one seen
    (fooled first, then the highest objective); with ``restarts`` the best run per sample is kept.

    Multi-class APGD-CE takes bitwise the steps of AutoAttack's ``APGDAttack`` (``pyautoattack``) from the
    same start, including its first window comparing the first objective with 0.

    Losses (``loss``), all per sample through the task, so one attack covers every task:

    * ``"ce"``: the task's own loss (:meth:`Task.loss`: softmax CE, per-label BCE, per-voxel CE or Dice),
      ascended (descended towards the target when ``targeted``).
    * ``"margin"``: the task's logit margin (:meth:`Task.margin`: ``z_y − max_{j≠y} z_j`` per sample, per
      label for multi-label, per voxel for segmentation, averaged), descended (ascended when targeted).
    * ``"dlr"``: AutoAttack's difference-of-logits ratio (:meth:`MultiClass.dlr`), multi-class only with
      K >= 3. Targeted: the target's margin over the same normaliser ``z_π1 − z_π3`` (AutoAttack's
      APGD-T uses the true label and ``z_π1 − (z_π3 + z_π4)/2``; a targeted medadv call has only the target).
    * ``"cospgd"`` / ``"segpgd"``: the task's loss with CosPGD's cosine or SegPGD's correct/wrong weighting
      per element (:mod:`medadv.attacks.losses`), as in those attacks, with APGD's schedule.
    * ``"balanced-ce"``: per-voxel cross-entropy where every class present in the label map weighs the same
      (segmentation only).
    * ``"js"``: the Jensen–Shannon divergence between the predicted and the label distribution per element
      (bounded by log 2: confidently wrong elements do not dominate).
    * ``"masked-ce"`` / ``"masked-balanced-ce"``: the per-voxel cross-entropy (plain, or class-balanced as
      ``"balanced-ce"``) of only the voxels still predicted as their label (untargeted; targeted: not yet at the
      target), the mask recomputed and detached every step — SEA's masked losses (Croce, Singh & Hein, ECCV 2024):
      voxels already flipped stop pulling the gradient, so it goes to the ones left. The final scoring of the last
      iterate is unmasked (segmentation only).
    * ``"signed-up"`` / ``"signed-down"``: the task's signed error ``pred − y`` per element (``task.signed_error``,
      regression: target units), averaged and ascended (``up``: drive every output above its target) or descended
      (``down``). Linear in the output, so its gradient does not vanish at ``pred = y`` as the squared or absolute
      error's does; ``auto``'s ``apgd-signed`` member runs both and keeps the larger deviation. Tasks without a
      signed error (class outputs) refuse it. Not targeted: the direction is the goal.
    * ``"volume"``: a clinical endpoint, the soft volume (ml) of class ``volume_class`` (the class probability
      summed over the voxels times ``voxel_volume_ml``, :class:`~medadv.attacks.losses.VolumeObjective`), shrunk,
      grown or driven to a target (``volume_goal``). The best iterate is kept by this objective alone (not by the
      task's Dice test), and the active set never stops a sample. Segmentation only; not targeted.

    The call accepts ``weight=``: per-element weights of the loss or margin, shaped like ``y``'s element grid
    (``(N,)``, ``(N, L)`` or ``(N, *spatial)``), e.g. to focus the attack on some labels or organs; not
    applicable to ``"dlr"``.

    Args:
        task: the model's :class:`~medadv.tasks.Task`.
        threat: :class:`~medadv.threats.Linf` or :class:`~medadv.threats.L2`; ε and the box in data units.
        steps: iterations T (one forward and backward each, plus one forward to score the last iterate);
            the paper uses 100.
        restarts: runs from independent random starts; per sample the best run is kept.
        loss: ``"ce"``, ``"margin"``, ``"dlr"``, ``"cospgd"``, ``"segpgd"``, ``"balanced-ce"``, ``"js"``,
            ``"masked-ce"``, ``"masked-balanced-ce"``, ``"signed-up"`` or ``"signed-down"`` (see above).
        rho: checkpoint test ρ (fraction, 0..1): the step size halves when at most ρ of the steps since the
            last checkpoint increased the objective. 0.75 in the paper.
        momentum: α (weight, 0 < α <= 1) of the new projected step; ``1 − α`` weights the previous move.
            0.75 in the paper; 1 disables momentum.
        random_start: start from AutoAttack's random point of the ball (False: from ``x``).
        targeted: ``y`` is a target to reach (see :class:`~medadv.attacks.base.Attack`).
        seed: seed of the random starts (same seed, same adversarial tensor); ``None`` uses torch's RNG.
        active_set: stop attacking samples once they are fooled (tested on the device every step; the
            active set is compacted every ``check_every`` steps). A stopped sample never moves again.
        check_every: steps between active-set compactions (each one host sync).
        amp: forward/backward under bf16 autocast on CUDA (objective in fp32).
        record_trace: keep ``trace["objective"]`` (the objective of every iterate) and
            ``trace["step_size"]`` (the step size η of every step, data units), both ``(T * restarts, N)``,
            NaN for samples no longer attacked.
        volume_class: ``loss="volume"``: the class whose volume moves (default 1, the first foreground class).
        volume_goal: ``loss="volume"``: ``"shrink"``, ``"grow"`` or ``"target"``; default: ``"target"``
            when ``volume_target`` or ``volume_fraction`` is given, else ``"shrink"``.
        volume_target: ``volume_goal="target"``: the volume to reach, in ml.
        volume_fraction: ``volume_goal="target"``: the volume to reach as a fraction of the clean soft volume
            (e.g. 0.9: 10 % smaller; the target is on the soft volume, which the loss moves); exactly one of ``volume_target`` and ``volume_fraction``.
        voxel_volume_ml: ``loss="volume"``: one voxel's volume in ml, ``prod(spacing in mm) / 1000`` (default
            0.001: 1 mm isotropic). It scales the objective only (the steps are the same for any value), so it
            matters for ``volume_target`` in ml.
    """

    params: ClassVar[dict[str, Any]] = {
        "loss": Options(*LOSSES),
        "rho": Real(low=0.0, high=1.0),
        "momentum": Real(low=0.0, high=1.0, low_open=True),
        "random_start": Bool(),
        **VOLUME_PARAMS,
    }
    keep_best = True
    needs_clean_logits = False  # y is validated against the first step's forward
    call_args = ("weight",)
    per_sample_call_args = ("weight",)  # shaped like y: one weight map per sample

    loss: str
    rho: float
    momentum: float
    random_start: bool

    def __init__(
        self,
        task: Task,
        threat: Threat,
        *,
        steps: int = 100,
        restarts: int = 1,
        loss: str = "ce",
        rho: float = 0.75,
        momentum: float = 0.75,
        random_start: bool = True,
        targeted: bool = False,
        seed: int | None = 0,
        active_set: bool = False,
        check_every: int = 1,
        amp: bool = False,
        record_trace: bool = False,
        volume_class: int = 1,
        volume_goal: str | None = None,
        volume_target: float | None = None,
        volume_fraction: float | None = None,
        voxel_volume_ml: float = 0.001,
    ) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        self._init_volume("APGD")
        if self.loss == "dlr" and not callable(getattr(task, "dlr", None)):
            raise TypeError(f"`loss='dlr'` of APGD is AutoAttack's multi-class loss and {task!r} has none; "
                            "use loss='margin' (the per-label / per-voxel logit margin) or loss='ce'")
        if self.loss.startswith("signed-"):
            if not callable(getattr(task, "signed_error", None)):
                raise TypeError(f"`loss={self.loss!r}` of APGD moves a regression output up or down (the task's "
                                f"`signed_error`); {task!r} has none: use loss='ce' or loss='margin'")
            if self.targeted:
                raise TypeError(f"`loss={self.loss!r}` of APGD is untargeted (its direction is its goal); for a "
                                "targeted attack use loss='ce' with the target values as `y`")
        if self.loss in ("js", "cospgd") and not task.class_scores:
            raise TypeError(f"`loss={self.loss!r}` of APGD compares class distributions and the outputs of {task!r} "
                            "are not class scores: use loss='ce' or loss='margin'")
        # per-class weights and masks over the voxels of label maps: what a kind declaring per-class Dice has
        if self.loss in ("balanced-ce", "masked-ce", "masked-balanced-ce") and not task.traits.metrics.class_dice:
            raise TypeError(f"`loss={self.loss!r}` of APGD works on the voxels of a label map (segmentation); "
                            f"{task!r} has none: use loss='ce' or loss='margin'")

    # --- objective -----------------------------------------------------------------------------------------
    def logits_objective(self, logits: Tensor, ctx: StepContext) -> Tensor:
        y, weight = ctx.y, ctx.state.get("weight")
        if self._volume is not None:  # VolumeLoss's objective (APGD's own losses branch below)
            return super().logits_objective(logits, ctx)
        if self.loss in ("margin", "dlr"):
            if self.loss == "margin":
                value = self.task.margin(logits, y, weight)
            else:
                value = self.task.dlr(logits, y)  # type: ignore[attr-defined]
            return value if self.targeted else -value  # a positive margin means "predicted as y"
        if self.loss.startswith("signed-"):
            value = self.task.reduce(self.task.signed_error(logits, y), y, weight)  # type: ignore[attr-defined]
            return value if self.loss == "signed-up" else -value
        if self.loss == "js":
            value = self.task.reduce(js_divergence(self.task, logits, y), y, weight)
        else:
            w = None
            if self.loss == "cospgd":
                w = cosine_weights(self.task, logits, y, self.targeted)
            elif self.loss == "segpgd" and ctx.step >= 0:  # the final scoring (step -1) is unweighted
                w = segpgd_weights(self.task, logits, y, ctx.step, self.steps, self.targeted)
            elif self.loss in ("balanced-ce", "masked-balanced-ce"):
                w = ctx.state["balance"]
            if self.loss.startswith("masked-") and ctx.step >= 0:  # the final scoring (step -1) is unmasked
                at_label = self.task.predict(logits.detach()) == y
                mask = (~at_label if self.targeted else at_label).to(logits.dtype)
                w = mask if w is None else w * mask
            if weight is not None:
                w = weight if w is None else w * weight
            if self.loss in ("balanced-ce", "masked-ce", "masked-balanced-ce"):  # per-voxel CE, whatever the task trains with
                value = self.task.reduce(self.task.element_loss(logits, y), y, w)
            else:
                value = self.task.loss(logits, y, w)
        return -value if self.targeted else value

    # --- engine hooks --------------------------------------------------------------------------------------
    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        super().setup(model, ctx)  # the volume target (VolumeLoss)
        assert self.threat is not None
        n = ctx.x.shape[0]
        log: dict[str, Tensor] = {"halvings": torch.zeros(n, dtype=torch.long, device=ctx.x.device)}
        if self.record_trace:
            log["step_size"] = torch.full((self.steps * self.restarts, n), float("nan"), device=ctx.x.device,
                                          dtype=ctx.x.dtype)
        ctx.shared["apgd"] = log
        weight = ctx.shared.pop("weight", None)
        if weight is not None:  # per sample: follows the active set
            ctx.state["weight"] = self._check_weight(weight, ctx)
        if self.loss in ("balanced-ce", "masked-balanced-ce"):
            # checked in __init__: the kind declares class_dice (label maps, num_classes, safe_labels)
            ctx.state["balance"] = balanced_weights(self.task, ctx.y)
        if isinstance(self.threat, Linf):  # the ball's corners, per sample (they follow the active set)
            ctx.state["ball_lo"] = ctx.x - self.threat.eps
            ctx.state["ball_hi"] = ctx.x + self.threat.eps

    def _check_weight(self, weight: Any, ctx: StepContext) -> Tensor:
        if not isinstance(weight, Tensor):
            raise TypeError(f"`weight` of APGD must be a tensor shaped like y's element grid, got {type(weight).__name__}")
        if self.loss == "volume":
            raise ValueError("`weight` does not apply to loss='volume' (one class volume per sample)")
        if self.loss == "dlr":
            raise ValueError("`weight` does not apply to loss='dlr' (one value per sample); use loss='margin'")
        if tuple(weight.shape) != tuple(ctx.y.shape):
            raise ValueError(f"`weight` of APGD must have y's element-grid shape {tuple(ctx.y.shape)}, "
                             f"got {tuple(weight.shape)}")
        if not weight.is_floating_point() or not bool(torch.isfinite(weight).all()) or bool((weight < 0).any()):
            raise ValueError("`weight` of APGD must hold finite non-negative floats")
        return weight.detach().to(ctx.x.device, ctx.x.dtype)

    def starts_at_input(self) -> bool:
        assert self.threat is not None
        return not self.random_start or self.threat.eps == 0

    def init_variable(self, ctx: StepContext, generator: torch.Generator | None) -> Tensor:
        assert self.threat is not None
        if not self.random_start or self.threat.eps == 0:
            return ctx.x.clone()
        x = ctx.x
        if isinstance(self.threat, Linf):
            t = 2 * torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype) - 1
            scale = t.abs().reshape(x.shape[0], -1).max(1)[0]
        else:
            t = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            scale = _l2(t)
        return self.box.clip(x + self.threat.eps * (t / _rows(scale + 1e-12, t)))

    def project(self, v: Tensor, ctx: StepContext) -> Tensor:
        """Onto the ε-ball around ``ctx.x``, then the box (the reference code's formulas)."""
        assert self.threat is not None
        if isinstance(self.threat, Linf):
            return self.box.clip(torch.min(torch.max(v, ctx.state["ball_lo"]), ctx.state["ball_hi"]))
        d = v - ctx.x
        n = _l2(d)
        return self.box.clip(ctx.x + (d / _rows(n + 1e-12, d)) * _rows(n.clamp(max=self.threat.eps), d))

    def step_rule(self) -> StepRule:
        return APGDStep(self, self.steps)

    def _assess_every(self) -> int:
        return 1  # the best iterate is the result: score every one

    def details(self, model: nn.Module, out: EngineOutput) -> AttackDetails | None:
        return APGDDetails(step_halvings=out.ctx.shared["apgd"]["halvings"])

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any):
        out = self.run(model, x, y, logits, **call_args)
        trace = out.trace
        if trace is not None:
            trace["step_size"] = out.ctx.shared["apgd"]["step_size"]
        return PerturbOutput(out.x_adv, self.details(model, out), trace, out.start_logits)
