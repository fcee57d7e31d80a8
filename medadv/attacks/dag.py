"""DAG — Dense Adversary Generation for 2-D and 3-D segmentation, with Paschali's target types.

Xie, Wang, Zhang, Zhou, Xie, Yuille. "Adversarial Examples for Semantic Segmentation and Object
Detection", ICCV 2017 (Algorithm 1 and the released code). Target types A/B/C from Paschali, Conjeti,
Navarro, Navab. "Generalizability vs. Robustness: Investigating Medical Imaging Networks Using
Adversarial Examples", MICCAI 2018.

DAG is a *targeted* attack on a whole label map: each step sums, over the voxels of the target region
that are not yet at their adversarial label (the active set), the difference "target logit − logit of
the currently predicted class", and moves the input along that gradient normalised to a step of
length γ (L∞ by default, as in Xie's code). It stops when at most ``stop_fraction`` of the target
region remains unfooled (1 % in Xie's code) or after ``steps`` steps. There is no ε-ball unless one
is given (the bounded variant used by segmentation benchmarks). The loop is the engine's
(:class:`~medadv.attacks.engine.IterativeAttack`): DAG supplies the objective, the normalised step and
the per-sample stop test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..metrics.image import mse, ssim
from ..params import InvalidParameterError, Optional, Options, Real, renamed
from ..tasks import Task
from ..threats import Box, Threat, per_sample_norm
from .base import AttackDetails, AttackResult, bounds_keyword, register
from .engine import EngineOutput, IterativeAttack, StepContext
from .steps import StepRule

__all__ = ["DAG", "DAGDetails", "dag_target_a", "dag_target_b", "dag_target_c", "calibrate_gamma",
           "calibrate_step_size"]


# --- Paschali's adversarial targets ----------------------------------------------------------------------------
def _check_labels(y: Tensor) -> None:
    if not isinstance(y, Tensor):
        raise TypeError(f"`y` must be a torch.Tensor label map, got {type(y).__name__}")
    if y.is_floating_point() or y.dtype == torch.bool:
        raise TypeError(f"`y` must be an integer label map (N, *spatial), got dtype {y.dtype}")
    if y.ndim not in (3, 4):
        raise ValueError(f"`y` must be (N, H, W) or (N, D, H, W), got shape {tuple(y.shape)}")


def dag_target_a(y: Tensor, background: int = 0) -> tuple[Tensor, Tensor]:
    """Type A: every voxel to background. Returns ``(y_adv, target_mask)``.

    The target region is every non-background voxel of ``y`` (the voxels that must change).
    """
    _check_labels(y)
    return torch.full_like(y, background), y != background


def _check_prediction(prediction: Tensor | None, y: Tensor) -> Tensor | None:
    """``prediction`` as a label map on ``y``'s device, or ``None``; one line naming the argument when it is bad."""
    if prediction is None:
        return None
    if not isinstance(prediction, Tensor):
        raise TypeError(f"`prediction` must be a torch.Tensor label map, got {type(prediction).__name__}")
    if prediction.is_floating_point() or prediction.dtype == torch.bool:
        raise TypeError(f"`prediction` must be an integer label map (the clean prediction, e.g. logits.argmax(1)), "
                        f"got dtype {prediction.dtype}")
    if prediction.shape != y.shape:
        raise ValueError(f"`prediction` must have the shape of `y` {tuple(y.shape)}, got {tuple(prediction.shape)}")
    return prediction.to(device=y.device, dtype=y.dtype)


def dag_target_b(
    y: Tensor,
    fraction: float = 0.05,
    background: int = 0,
    generator: torch.Generator | None = None,
    prediction: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Type B: a random ``fraction`` of the foreground voxels to one random foreground class.

    Per sample, the class ``c`` is drawn uniformly from the non-background classes present in ``y``;
    then each non-background voxel whose label is not ``c`` joins the target with probability
    ``fraction`` (Paschali: "a small percentage of pixels, chosen at random"). Samples without two
    distinct foreground classes get an empty target. Returns ``(y_adv, target_mask)``.

    Without ``prediction``, ``y_adv`` is the label map with the chosen voxels set to ``c``: pass
    ``target_mask`` to :class:`DAG` with it. DAG's *default* region is every voxel whose clean prediction
    differs from ``y_adv``, which for a label-based map includes every voxel the clean model gets wrong,
    and DAG then steers those toward their true label: the attack "repairs" 95 % of the map (Dice against
    the label can rise above the clean Dice). With ``prediction`` (the clean prediction, as
    ``logits.argmax(1)``), ``y_adv`` is that prediction with the chosen voxels set to ``c``, and the mask
    drops the voxels already predicted as ``c``: ``y_adv`` differs from the prediction exactly on the
    mask, so DAG's default region is the paper's target set (the retargeted voxels) and nothing else.
    The voxels and the class are drawn from ``y`` either way (the same draws for the same generator).

    Args:
        fraction: expected share of eligible voxels that are retargeted, in (0, 1].
        generator: CPU ``torch.Generator`` for the random choices (seed it for reproducibility).
        prediction: the clean prediction ``(N, *spatial)`` to build ``y_adv`` on, or ``None``.
    """
    _check_labels(y)
    pred = _check_prediction(prediction, y)
    if not 0.0 < float(fraction) <= 1.0:
        raise ValueError(f"`fraction` must be in (0, 1], got {fraction}")
    yc = y.detach().cpu()
    base = yc if pred is None else pred.detach().cpu()
    y_adv = base.clone()  # a copy: neither `y` nor `prediction` is written
    mask = torch.zeros_like(yc, dtype=torch.bool)
    for i in range(yc.shape[0]):  # per sample: class choice differs; not a step loop
        classes = torch.unique(yc[i])
        classes = classes[classes != background]
        if classes.numel() == 0:
            continue
        c = classes[torch.randint(classes.numel(), (1,), generator=generator)]
        eligible = (yc[i] != background) & (yc[i] != c)
        pick = eligible & (torch.rand(yc[i].shape, generator=generator) < float(fraction))
        # a voxel already predicted as c has nothing to flip: it is no target (and y_adv keeps it)
        pick = pick & (base[i] != c)
        y_adv[i][pick] = c
        mask[i] = pick
    return y_adv.to(y.device), mask.to(y.device)


def _dilate(m: Tensor, iterations: int) -> Tensor:
    """Binary dilation with the cross element (4-connected in 2-D, 6-connected in 3-D)."""
    ndim = m.ndim - 1
    k = torch.zeros((3,) * ndim, dtype=torch.float32, device=m.device)
    centre = (1,) * ndim
    k[centre] = 1
    for a in range(ndim):
        for d in (0, 2):
            idx = list(centre)
            idx[a] = d
            k[tuple(idx)] = 1
    conv = F.conv2d if ndim == 2 else F.conv3d
    t = m.unsqueeze(1).float()
    for _ in range(iterations):
        t = (conv(t, k[None, None], padding=1) > 0).float()
    return t[:, 0].bool()


def dag_target_c(
    y: Tensor,
    cls: int,
    iterations: int = 6,
    background: int = 0,
    include_background: bool = False,
    prediction: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Type C: dilate class ``cls`` by ``iterations`` steps of the cross element, keep the rest.

    The target region is the newly claimed voxels; voxels that were background are claimed only with
    ``include_background=True`` (Paschali's target set is non-background). ``y_adv`` differs from ``y``
    exactly on the returned mask. Returns ``(y_adv, target_mask)``.

    With ``prediction`` (the clean prediction), the dilation is still that of ``cls`` in ``y``, but ``y_adv``
    is the prediction with the claimed voxels set to ``cls`` and the mask drops the voxels already predicted
    as ``cls``: ``y_adv`` then differs from the prediction exactly on the mask, so DAG's default region
    (prediction ≠ ``y_adv``) is the claimed voxels only, not also every voxel the clean model gets wrong
    (see :func:`dag_target_b`).
    """
    _check_labels(y)
    pred = _check_prediction(prediction, y)
    if int(iterations) < 1:
        raise ValueError(f"`iterations` must be >= 1, got {iterations}")
    grown = _dilate(y == cls, int(iterations))
    mask = grown & (y != cls)
    if not include_background:
        mask = mask & (y != background)
    if pred is None:
        return torch.where(mask, torch.full_like(y, cls), y), mask
    mask = mask & (pred != cls)
    return torch.where(mask, torch.full_like(y, cls), pred), mask


# --- the attack ---------------------------------------------------------------------------------------------------
@dataclass
class DAGDetails(AttackDetails):
    """DAG's per-sample results (the declared ``columns`` become result-table columns).

    Attributes:
        fooled_fraction: share of the target region at its adversarial label on ``x_adv``, ``(N,)``
            (NaN for a sample whose target region is empty).
        iterations: steps that moved the sample (a stopped sample no longer moves), ``(N,)``.
        mse: mean squared perturbation (data units squared), ``(N,)``.
        ssim: SSIM between ``x`` and ``x_adv`` over the box's data range (Gaussian window ≤ 7), ``(N,)``.
        target_region_size: voxels in the target region, ``(N,)``.
        linf, l2: perturbation norms in data units, ``(N,)`` (also in :class:`AttackResult`).
    """

    columns: ClassVar[tuple[str, ...]] = ("fooled_fraction", "iterations", "mse", "ssim", "target_region_size")
    sample_fields: ClassVar[tuple[str, ...]] = ("linf", "l2")

    fooled_fraction: Tensor
    iterations: Tensor
    mse: Tensor
    ssim: Tensor
    target_region_size: Tensor
    linf: Tensor
    l2: Tensor


class _DAGStep(StepRule):
    """``v + γ · g / ‖g‖_p`` per sample, no move for a zero gradient (:class:`NormalizedStep`'s rule with
    the scale applied per sample: one pass over the input instead of four)."""

    def __init__(self, step_size: float, p: float) -> None:
        self.step_size, self.p = step_size, p

    def step(self, v: Tensor, g: Tensor, objective: Tensor, ctx: StepContext, state: dict[str, Any]) -> Tensor:
        n = per_sample_norm(g, self.p)
        # γ/‖g‖ per sample (0 where the gradient is 0: a sample with no active voxel must not move)
        scale = torch.where(n > 0, self.step_size / n.clamp_min(1e-30), torch.zeros_like(n))
        return torch.addcmul(v, g, scale.reshape((-1,) + (1,) * (g.ndim - 1)))


@register("dag")
class DAG(IterativeAttack):
    """Dense Adversary Generation (Xie et al. 2017): targeted, per-voxel, logit-difference steps.

    Call as ``attack(model, x, y_adv, target_mask=None)`` where ``y_adv`` is the adversarial label map
    (for example from :func:`dag_target_a`/``b``/``c``). ``target_mask`` marks the voxels that must
    reach their target; by default, those whose clean prediction differs from ``y_adv``.

    At step m the active set is ``A_m = target_mask ∧ (prediction ≠ y_adv)``; the ascent direction is
    ``∇_x Σ_{p∈A_m} [z_{y_adv(p)}(p) − z_{pred(p)}(p)]`` on the logits, normalised per sample to
    length ``step_size`` in the chosen norm (Xie's code uses L∞: ``r' = γ ∇/‖∇‖∞``). A sample stops
    moving once at most ``stop_fraction`` of its target region remains (tested every step on the device);
    stopped samples leave the batch every ``check_every`` steps (the only host synchronisation), and
    the loop ends when none is left or after ``steps``.

    Args:
        task: a :class:`~medadv.tasks.Segmentation` task (2-D or 3-D logits).
        threat: the data :class:`~medadv.threats.Box` (``Box(lo, hi)`` in data units, or
            ``Box.unbounded()``) for the original, unbounded attack; or a :class:`~medadv.threats.Linf`
            ball (ε and box in data units) for the bounded variant used by segmentation benchmarks.
        steps: maximum number of steps M₀ (200 for segmentation in Xie et al.). Formerly ``max_iter``.
        step_size: step length γ in data units. Default ``None``: ``0.5/255`` of the box's data range
            (Xie's 0.5 grey levels on 0–255 images; ``0.5/255`` on ``[0, 1]`` data). Required when the box
            is unbounded. Formerly ``gamma``.
        stop_fraction: a sample stops once the unfooled share of its target region is at most this
            (Xie: 0.01).
        norm: ``"linf"`` (Xie) or ``"l2"`` (the Naeem & Paschali PyTorch port) step normalisation.
        check_every: steps between compactions of the batch (each is one host sync; stopped samples
            do not move in between, so this only bounds wasted forward passes).
        amp: forward/backward under bf16 autocast on CUDA (logits in fp32).
        record_trace: keep the per-sample objective (the summed logit difference over the active set)
            of every step in ``AttackResult.trace["objective"]``, ``(steps, N)``, NaN after a sample stopped.
        seed: unused (DAG is deterministic); kept for the common signature.

    The result's ``details`` is a :class:`DAGDetails` (``fooled_fraction``, ``iterations``, ``mse``,
    ``ssim``, ``target_region_size`` per sample, plus ``linf``/``l2``).
    """

    params: ClassVar[dict[str, Any]] = {
        "step_size": Optional(Real(low=0, low_open=True)),
        "stop_fraction": Real(low=0, high=1, high_open=True),
        "norm": Options("linf", "l2"),
    }
    threat_kind = "ball_or_box"
    norms = ("Linf",)
    tasks = ("Segmentation",)
    spatial_dims = (2, 3)
    always_targeted = True
    call_args = ("target_mask",)
    per_sample_call_args = ("target_mask",)  # one target region per sample
    aliases: ClassVar[dict[str, str]] = {"max_iter": "steps", "gamma": "step_size"}  # configs, get_attack
    # the first step's forward is the clean forward (DAG starts at x): no separate clean pass
    needs_clean_logits = False
    trace_key = "objective"
    step_size: float | None
    stop_fraction: float
    norm: str

    @renamed(max_iter="steps", gamma="step_size")
    @bounds_keyword("threat")
    def __init__(
        self,
        task: Task,
        threat: Threat | Box | None = None,
        *,
        steps: int = 200,
        step_size: float | None = None,
        stop_fraction: float = 0.01,
        norm: str = "linf",
        check_every: int = 10,
        amp: bool = False,
        record_trace: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, targeted=True, seed=seed)
        self.targeted = True  # not a parameter: DAG's y is always the adversarial target map
        self._init_params(locals())
        if self.step_size is None and not self.box.bounded:
            raise InvalidParameterError("`step_size` of DAG is required when the data box is unbounded (the "
                                        "default is 0.5/255 of the box's data range)")

    @property
    def alpha(self) -> float:
        """The step length γ in data units (``step_size``, or ``0.5/255`` of the box's data range)."""
        return self.step_size if self.step_size is not None else 0.5 / 255 * self.box.data_range()

    @property
    def gamma(self) -> float:
        """Deprecated name of :attr:`alpha`."""
        return self.alpha

    @property
    def max_iter(self) -> int:
        """Deprecated name of ``steps``."""
        return self.steps

    def set_params(self, **params: Any) -> DAG:
        # the positional argument is the box when there is no ball (base ``set_params`` reads ``threat``)
        new = {**self.get_params(), **self.check_kwargs(params)}
        return type(self)(self.task, self.threat_or_box, **new)

    # --- engine hooks ----------------------------------------------------------------------------------------
    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        y = ctx.y
        mask = ctx.shared.pop("target_mask", None)
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                raise TypeError("`target_mask` must be a bool tensor (N, *spatial)")
            if mask.shape != y.shape:
                raise ValueError(f"`target_mask` must have the shape of `y` {tuple(y.shape)}, got {tuple(mask.shape)}")
            ctx.state["region"] = self._valid_region(mask.to(y.device), y)
        task: Any = self.task  # the class declares tasks = ("Segmentation",): label maps with safe_labels
        ctx.state["target"] = task.safe_labels(y)

    def _valid_region(self, region: Tensor, y: Tensor) -> Tensor:
        valid = self.task.valid_mask(y)
        return region if valid is None else region & valid

    def step_rule(self) -> StepRule:
        return _DAGStep(self.alpha, float("inf") if self.norm == "linf" else 2.0)

    def starts_at_input(self) -> bool:
        return True  # the variable is the input, starting at x, and the objective's output is the model's

    def objective(self, model: nn.Module, v: Tensor, ctx: StepContext) -> tuple[Tensor, Tensor]:
        logits = self.forward(model, v)
        if ctx.shared.pop("validate_y", False):  # y checked against the first (clean) output
            self.task.validate(logits, ctx.y, "y")
        st = ctx.state
        # one max over the class axis gives both the prediction (first maximum, as argmax) and its logit,
        # whose backward is the same index scatter as a gather; argmax(dim=1) alone is ~9x slower on CPU
        top = logits.max(dim=1)
        pred = top.indices
        if "region" not in st:
            # default region: voxels whose clean prediction is not the target; step 0 is at x, so this
            # forward is the clean one
            st["region"] = self._valid_region(pred != st["target"], ctx.y)
        if "n_region" not in st:
            st["n_region"] = st["region"].flatten(1).sum(dim=1).clamp_min(1)
        active = st["region"] & (pred != st["target"])
        ctx.shared["active"] = active  # read by stop() on this same step
        diff = logits.gather(1, st["target"].unsqueeze(1)).squeeze(1) - top.values
        obj = (diff * active.to(diff.dtype)).flatten(1).sum(dim=1)
        return obj, logits

    def stop(self, logits: Tensor, ctx: StepContext) -> Tensor:
        active = ctx.shared.pop("active")
        remaining = active.flatten(1).sum(dim=1) / ctx.state["n_region"]
        return remaining <= self.stop_fraction

    def project(self, v: Tensor, ctx: StepContext) -> Tensor:
        if self.threat is not None:
            return self.threat.finalize(ctx.x, v)
        return self.box.clip(v)

    def _ssim_range(self, x: Tensor) -> float:
        """SSIM's data range: the box's width (the widest channel's for per-channel boxes), else x's range."""
        if not self.box.bounded:
            return float(x.max() - x.min()) or 1.0
        lo, hi = self.box.lohi(x)
        return float((hi - lo).max())

    def details(self, model: nn.Module, out: EngineOutput) -> DAGDetails:
        ctx = out.ctx
        x, x_adv = ctx.x, out.x_adv
        region, target = ctx.state["region"], ctx.state["target"]
        with torch.no_grad():
            pred = self.task.predict(self.forward(model, x_adv))
        size = region.flatten(1).sum(dim=1)
        hit = (region & (pred == target)).flatten(1).sum(dim=1)
        delta = x_adv - x
        win = min(7, *[s - (1 - s % 2) for s in x.shape[2:]])
        return DAGDetails(
            # an empty target region has no share to report (NaN, not 0: nothing failed to flip)
            fooled_fraction=torch.where(size > 0, hit.to(x.dtype) / size.clamp_min(1).to(x.dtype),
                                        torch.full_like(hit, float("nan"), dtype=x.dtype)),
            iterations=out.iterations,
            mse=mse(x, x_adv),
            ssim=ssim(x, x_adv, data_range=self._ssim_range(x), win_size=max(1, win)),
            target_region_size=size,
            linf=per_sample_norm(delta, float("inf")),
            l2=per_sample_norm(delta, 2.0),
        )


def calibrate_step_size(
    model: nn.Module,
    task: Task,
    x: Tensor,
    y_adv: Tensor,
    target_mask: Tensor | None = None,
    *,
    threat: Threat | Box | None = None,
    target_mse: float = 0.004,
    low: float = 1e-4,
    high: float = 0.05,
    iters: int = 6,
    **dag_kwargs: Any,
) -> tuple[float, AttackResult]:
    """Choose DAG's step γ so the mean MSE of the attack is close to ``target_mse``.

    Paschali et al. report the size of their DAG perturbations, not the step (MSE 0.004 for type A,
    0.002 for types B and C, on [0, 1] images), so the spec calibrates γ to the MSE rather than copying
    it. This is a geometric bisection on ``[low, high]`` (data units), one full DAG run per iteration.
    Larger steps give larger perturbations until the stopping rule ends the run. ``threat`` is DAG's
    box or ball; other keyword arguments go to :class:`DAG`. Returns the γ with the closest mean MSE
    and its result.
    """
    if not float(target_mse) > 0:
        raise ValueError(f"`target_mse` must be > 0, got {target_mse}")
    if not 0 < float(low) < float(high):
        raise ValueError(f"need 0 < low < high, got low={low}, high={high}")
    if int(iters) < 1:
        raise ValueError(f"`iters` must be >= 1, got {iters}")
    lo, hi = float(low), float(high)
    best: tuple[float, float, AttackResult] | None = None
    for _ in range(int(iters)):
        gamma = (lo * hi) ** 0.5
        res = DAG(task, threat, step_size=gamma, **dag_kwargs)(model, x, y_adv, target_mask=target_mask)
        assert isinstance(res.details, DAGDetails)
        m = float(res.details.mse.mean())
        if best is None or abs(m - target_mse) < best[0]:
            best = (abs(m - target_mse), gamma, res)
        if m < target_mse:
            lo = gamma
        else:
            hi = gamma
    assert best is not None
    return best[1], best[2]


#: the former name of :func:`calibrate_step_size`
calibrate_gamma = calibrate_step_size
