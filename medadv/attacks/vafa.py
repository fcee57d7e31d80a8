"""VAFA — Volumetric Adversarial Frequency Attack (3-D) and its 2-D per-slice variant.

Hanif, Naseer, Khan, Shah, Khan. "Frequency Domain Adversarial Training for Robust Volumetric Medical
Segmentation", MICCAI 2023; benchmarked by Malik et al., "On Evaluating Adversarial Robustness of
Volumetric Medical Segmentation Models", BMVC 2024. Soft rounding from AdvDrop (Duan et al., ICCV 2021).

VAFA is not an Lp-ball attack. It compresses the input like a learnable JPEG: the image, mapped to
0–255 and centred by 128, is cut into blocks; each block's orthonormal DCT is divided by a learnable
quantisation table ``q`` (one entry per coefficient, per block, per sample), rounded differentiably,
multiplied back and inverted. The attack moves ``q`` by signed unit steps inside ``[q_min, q_max]`` to
maximise the segmentation loss, optionally penalising ``1 − SSIM`` between the clean and the
reconstructed blocks. The perceptibility budget is therefore ``q_max`` (with an orthonormal DCT the
per-block RMS error before renormalisation is at most ``q_max / 2`` grey levels) plus the SSIM term.

The faithful mode ends with a per-slice min–max renormalisation of the reconstruction (as both
reference implementations do, although neither paper mentions it). It is a global, unbounded intensity
change, not a frequency-domain one: ``renormalize="none"`` turns it off (reconstruction / 255, clipped).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..dct import crop, dct_blocks, from_blocks, idct_blocks, pad_to_multiple, to_blocks
from ..metrics.image import _blur, _gaussian
from ..params import Bool, Constraint, Int, InvalidParameterError, Options, Real, renamed
from ..tasks import Task
from ..threats import Box
from .base import AttackDetails, bounds_keyword, register
from .engine import IterativeAttack, StepContext
from .steps import SignStep, StepRule

__all__ = ["VAFA", "VAFA2D", "VAFADetails", "soft_round", "soft_quantize"]


def _soft_round_parts(z: Tensor, alpha: float) -> tuple[Tensor, Tensor, float]:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"`alpha` must be in (0, 1), got {alpha}")
    kappa = math.log(2.0 / alpha - 1.0)
    s = 1.0 / (1.0 - alpha)
    fl = torch.floor(z)
    th = torch.tanh(kappa * (z - fl - 0.5))
    return fl + 0.5 * (1.0 + s * th), th, 0.5 * s * kappa


def soft_round(z: Tensor, alpha: float) -> Tensor:
    """AdvDrop's differentiable rounding ``φ_α`` (→ ``round(z)`` as α → 0, continuous at integers).

    ``φ_α(z) = ⌊z⌋ + ½ [1 + s · tanh(κ (z − ⌊z⌋ − ½))]`` with ``κ = ln(2/α − 1)``, ``s = 1/(1 − α)``.
    """
    return _soft_round_parts(z, alpha)[0]


class _SoftQuantize(torch.autograd.Function):
    """``q · φ_α(c / q)`` with a hand-written backward to ``q`` (c is constant).

    d/dq [q φ(c/q)] = φ(z) − z φ'(z), z = c/q, φ'(z) = ½ s κ (1 − tanh²): one elementwise expression
    instead of the ~10 saved intermediates autograd would keep for the composed ops (VAFA's step is
    memory-bound elementwise work around the model).
    """

    @staticmethod
    def forward(ctx, q: Tensor, c: Tensor, alpha: float) -> Tensor:  # type: ignore[override]
        z = c / q
        phi, th, scale = _soft_round_parts(z, alpha)
        ctx.save_for_backward(z, phi, th)
        ctx.scale = scale
        return q * phi

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        z, phi, th = ctx.saved_tensors
        return grad * (phi - z * ctx.scale * (1.0 - th * th)), None, None


def soft_quantize(q: Tensor, coeffs: Tensor, alpha: float) -> Tensor:
    """Differentiable quantise/dequantise ``q ⊙ φ_α(coeffs ⊘ q)`` (gradient to ``q`` only)."""
    return _SoftQuantize.apply(q, coeffs.detach(), float(alpha))


# --- SSIM against a fixed reference ---------------------------------------------------------------------------
# VAFA's SSIM penalty compares every step's reconstruction with the same clean blocks. Generic SSIM
# (medadv.metrics.image.ssim) blurs five maps and lets autograd differentiate every shifted-view sum;
# here the clean blocks' blurred mean and variance are computed once per call and the backward is written
# out: three blurred maps forward, three "transposed blurs" backward, and a few elementwise products. Same
# SSIM as ``ssim(a, b, data_range=1, win_size=w, nonnegative=True)`` (Gaussian window, σ 1.5, valid filter).
_K1, _K2, _SIGMA = 0.01, 0.03, 1.5


def ssim_reference(a: Tensor, ndim: int, win: int) -> dict[str, Tensor]:
    """Statistics of reference blocks ``a`` ``(B, 1, *block)`` for :func:`ssim_to_reference`."""
    g = _gaussian(int(win), _SIGMA, a.dtype, a.device)
    mu_a, aa = _blur(torch.cat([a, a * a]), g, ndim).chunk(2)
    return {"a": a, "mu_a": mu_a, "var_a": aa - mu_a**2}


class _SSIMToReference(torch.autograd.Function):
    """Per-position SSIM of ``b`` against a constant reference; gradient to ``b`` only."""

    @staticmethod
    def forward(ctx, b: Tensor, a: Tensor, mu_a: Tensor, var_a: Tensor, g: Tensor,  # type: ignore[override]
                ndim: int) -> Tensor:
        mu_b, bb, ab = _blur(torch.cat([b, b * b, a * b]), g, ndim).chunk(3)
        c1, c2 = _K1**2, _K2**2  # data range 1
        var_b = bb - mu_b**2
        cov = ab - mu_a * mu_b
        cs = (2 * cov + c2) / (var_a + var_b + c2)
        lum = (2 * mu_a * mu_b + c1) / (mu_a**2 + mu_b**2 + c1)
        ctx.save_for_backward(b, a, mu_a, var_a, mu_b, var_b, cs, lum, g)
        ctx.ndim = ndim
        return lum * torch.relu(cs)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        b, a, mu_a, var_a, mu_b, var_b, cs, lum, g = ctx.saved_tensors
        ndim = ctx.ndim
        c1, c2 = _K1**2, _K2**2
        g_lum = grad * torch.relu(cs)
        g_cs = torch.where(cs > 0, grad * lum, torch.zeros_like(grad))  # relu: no gradient where cs <= 0
        denom2 = var_a + var_b + c2
        g_cov = g_cs * (2.0 / denom2)  # ∂cs/∂cov = 2 / (σ_a² + σ_b² + c2)
        g_var_b = -g_cs * cs / denom2  # ∂cs/∂σ_b² = −cs / (σ_a² + σ_b² + c2)
        # ∂lum/∂μ_b = 2 (μ_a − μ_b lum) / (μ_a² + μ_b² + c1); σ_b² = ⟨b²⟩ − μ_b², cov = ⟨ab⟩ − μ_a μ_b
        g_mu_b = (g_lum * 2.0 * (mu_a - mu_b * lum) / (mu_a**2 + mu_b**2 + c1)
                  - g_cov * mu_a - 2.0 * g_var_b * mu_b)
        # the adjoint of a valid Gaussian filter is the same (symmetric) filter on the zero-padded map
        w = g.numel() - 1
        padded = torch.nn.functional.pad(torch.cat([g_mu_b, g_var_b, g_cov]), (w, w) * ndim)
        t_mu, t_bb, t_ab = _blur(padded, g, ndim).chunk(3)
        return t_mu + 2.0 * b * t_bb + a * t_ab, None, None, None, None, None


def ssim_to_reference(b: Tensor, ref: dict[str, Tensor], ndim: int, win: int) -> Tensor:
    """Per-position SSIM map of blocks ``b`` ``(B, 1, *block)`` against :func:`ssim_reference` statistics
    (``nonnegative`` contrast–structure term, as ``pytorch_msssim`` and VAFA's code)."""
    g = _gaussian(int(win), _SIGMA, b.dtype, b.device)
    return _SSIMToReference.apply(b, ref["a"], ref["mu_a"], ref["var_a"], g, ndim)


class _Block(Constraint):
    """A DCT block size: a positive int (a square/cube) or ``ndim`` positive ints; stored as a tuple."""

    def __init__(self, ndim: int) -> None:
        self.ndim = ndim

    def describe(self) -> str:
        return f"a positive integer or {self.ndim} positive integers"

    def convert(self, value: Any) -> tuple[int, ...]:
        if isinstance(value, bool) or isinstance(value, str):
            raise TypeError
        items = [value] * self.ndim if not isinstance(value, Sequence) else list(value)
        if len(items) != self.ndim:
            raise ValueError
        return tuple(_POSITIVE.convert(b) for b in items)


_POSITIVE = Int(low=1)


@dataclass
class VAFADetails(AttackDetails):
    """VAFA's results.

    Attributes:
        q_tables: the quantisation tables that produced ``x_adv`` (the last update is never applied, as
            in the reference code): ``(N, C, n_blocks, *block)`` for VAFA and VAFA2D on images,
            ``(N, C, D, n_blocks, b_h, b_w)`` for VAFA2D on volumes (one table set per axial slice).
            Not a result column (one table per block).
        block: the DCT block size.
        final_loss: the task loss of the last step's reconstruction, per sample ``(N,)`` (a column).
    """

    columns: ClassVar[tuple[str, ...]] = ("final_loss",)
    sample_fields: ClassVar[tuple[str, ...]] = ("q_tables",)

    q_tables: Tensor
    block: tuple[int, ...]
    final_loss: Tensor


class _FrequencyAttack(IterativeAttack):
    """The quantisation attack shared by VAFA (3-D blocks) and VAFA2D (2-D blocks per axial slice).

    On the engine, the optimised variable is the table set ``q`` with a leading batch dim,
    ``(N, M, n_blocks, *block)`` (M tables per sample: channels, times slices for VAFA2D on volumes);
    :meth:`to_input` reconstructs the input from it. Each step ascends the task loss (descends it when
    targeted) minus the optional ``1 − SSIM`` penalty by a signed step of ``step_size`` grey levels,
    projected onto ``[q_min, q_max]``; the soft-rounding α follows a linear schedule over the steps.
    The reference code never applies the last update (``update_after_last = False``).
    """

    block_ndim: ClassVar[int] = 3
    threat_kind = "box"
    tasks = ("Segmentation",)
    transforms_whole_input = True  # the DCT quantisation moves every channel
    update_after_last = False
    needs_clean_logits = False  # y is validated against the first step's forward
    params: ClassVar[dict[str, Any]] = {
        "q_min": Real(low=0, low_open=True),
        "q_max": Real(low=0, low_open=True),
        "use_ssim": Bool(),
        "ssim_window": Int(low=1),
        "renormalize": Options("slice_minmax", "none"),
        "alpha_start": Real(low=0, high=1, low_open=True, high_open=True),
        "alpha_end": Real(low=0, high=1, low_open=True, high_open=True),
        "step_size": Real(low=0, low_open=True),
        "squared_pred": Bool(),
    }
    positional: ClassVar[tuple[str, ...]] = ("task", "box")
    aliases: ClassVar[dict[str, str]] = {"q_step": "step_size"}  # for configs and get_attack
    q_min: float
    q_max: float
    block: tuple[int, ...]
    use_ssim: bool
    squared_pred: bool
    ssim_window: int
    renormalize: str
    alpha_start: float
    alpha_end: float
    step_size: float

    @property
    def _loss_task(self) -> Task:
        """The task whose loss VAFA ascends: the caller's, with the Dice denominator squared when
        ``squared_pred`` (Hanif et al.'s and Malik et al.'s DiceCE) — the caller's task is not changed."""
        # the class declares tasks = ("Segmentation",): the task has the Dice loss's `squared_pred` knob; a kind
        # without it (none is accepted today) keeps its own loss
        if not self.squared_pred or getattr(self.task, "squared_pred", True):
            return self.task
        cached: Any = self.__dict__.get("_loss_task_cache")
        if cached is None:
            cached = copy.copy(self.task)
            cached.squared_pred = True
            self.__dict__["_loss_task_cache"] = cached
        return cached

    def _init_frequency(self, values: dict[str, Any]) -> None:
        """Common checks once the declared parameters are stored (cross-parameter constraints only)."""
        self._init_params(values)
        if not self.box.bounded:
            raise InvalidParameterError(
                f"{type(self).__name__} needs a bounded data box: its bounds (lo, hi) are mapped onto grey levels "
                f"0-255; got {self.box!r}")
        if self.q_min > self.q_max:
            raise InvalidParameterError(f"need q_min <= q_max, got q_min={self.q_min}, q_max={self.q_max}")
        if self.alpha_end > self.alpha_start:
            raise InvalidParameterError(
                f"need alpha_end <= alpha_start, got alpha_start={self.alpha_start}, alpha_end={self.alpha_end}")
        if self.use_ssim and (self.ssim_window % 2 == 0 or self.ssim_window > min(self.block)):
            raise InvalidParameterError(
                f"`ssim_window` must be odd and at most the block size {min(self.block)}, got {self.ssim_window}")

    @property
    def q_step(self) -> float:
        """Deprecated name of ``step_size``."""
        return self.step_size

    # --- layout: fold everything that is not a block axis into one leading dim --------------------------------
    def _fold(self, t: Tensor) -> Tensor:
        """``(N, C, *spatial)`` -> ``(M, 1, *block_spatial)`` for the blockwise transform."""
        raise NotImplementedError

    def _unfold(self, t: Tensor, shape: torch.Size) -> Tensor:
        """Inverse of :meth:`_fold` for an input of ``shape``."""
        raise NotImplementedError

    def alpha(self, step: int) -> float:
        """Soft-rounding α at 0-based ``step`` (linear from ``alpha_start``; step -1 means the last one)."""
        t = self.steps - 1 if step < 0 else step
        return self.alpha_start + t * (self.alpha_end - self.alpha_start) / self.steps

    def _renorm(self, grey: Tensor) -> Tensor:
        """Reconstruction in grey levels -> [0, 1] (per-slice min–max, or /255 and clip)."""
        if self.renormalize == "none":
            return (grey / 255.0).clamp(0.0, 1.0)
        # axial slices: reduce over every spatial dim but the last one (whole image in 2-D)
        dims = tuple(range(2, grey.ndim - 1)) if grey.ndim == 5 else tuple(range(2, grey.ndim))
        mn = grey.amin(dim=dims, keepdim=True)
        mx = grey.amax(dim=dims, keepdim=True)
        span = mx - mn
        # min–max per slice, (grey − mn) / (span + 1e-8); constant slices have no range to stretch and fall
        # back to grey / 255, clipped. The choice is made on the per-slice shift and divisor, so the volume
        # takes three passes (subtract, divide, clamp) instead of two full branches and a select; the clamp
        # is the identity on min–max slices (the quotient is in [0, 1] exactly).
        stretch = span > 1e-6
        shift = torch.where(stretch, mn, torch.zeros_like(mn))
        divisor = torch.where(stretch, span + 1e-8, torch.full_like(span, 255.0))
        return ((grey - shift) / divisor).clamp(0.0, 1.0)

    def _blocks(self, u: Tensor) -> Tensor:
        """``(N, C, *spatial)`` -> ``(N·M·n_blocks, 1, *block)``: blocks as the batch, any channel count."""
        return to_blocks(pad_to_multiple(self._fold(u), self.block), self.block).reshape(-1, 1, *self.block)

    def _ssim_reference(self, u: Tensor) -> dict[str, Tensor]:
        """The clean blocks and their SSIM statistics, per sample (leading dim N): constant over the steps."""
        blocks = self._blocks(u)
        ref = ssim_reference(blocks, self.block_ndim, self.ssim_window)
        return {k: t.reshape(u.shape[0], -1, *t.shape[2:]) for k, t in ref.items()}

    def _ssim_term(self, ref: dict[str, Tensor], u_adv: Tensor) -> Tensor:
        """``1 − mean blockwise SSIM`` per sample ``(N,)`` against the clean blocks' statistics ``ref``."""
        flat = {k: t.reshape(-1, 1, *t.shape[2:]) for k, t in ref.items()}
        s = ssim_to_reference(self._blocks(u_adv), flat, self.block_ndim, self.ssim_window)
        return 1.0 - s.reshape(u_adv.shape[0], -1).mean(dim=1)

    # --- engine hooks ----------------------------------------------------------------------------------------
    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        """Per-call constants: the clean block coefficients (and SSIM blocks) do not depend on q."""
        x = ctx.x
        n = x.shape[0]
        lo, hi = self.box.lohi(x)
        u = (x - lo) / (hi - lo)  # [0, 1]
        folded = self._fold(u)
        padded = pad_to_multiple(255.0 * folded - 128.0, self.block)
        coeffs = dct_blocks(to_blocks(padded, self.block), self.block_ndim).detach()
        ctx.state["coeffs"] = coeffs.reshape(n, -1, *coeffs.shape[2:])  # per sample: follows the batch
        if self.use_ssim:
            ctx.state["ssim_ref"] = self._ssim_reference(u)
        unit = not isinstance(self.box.lo, Tensor) and self.box.lo == 0.0 and self.box.hi == 1.0
        ctx.shared.update(lo=lo, hi=hi, unit=unit, spatial=folded.shape[2:], padded=padded.shape[2:], losses=[])

    def init_variable(self, ctx: StepContext, generator: torch.Generator | None) -> Tensor:
        return torch.full_like(ctx.state["coeffs"], self.q_max)  # fresh per call: no state between calls

    def _reconstruct(self, q: Tensor, ctx: StepContext) -> Tensor:
        """Tables -> reconstruction in [0, 1] (before the data range)."""
        coeffs = ctx.state["coeffs"]
        m = coeffs.shape[0] * coeffs.shape[1]
        rec = soft_quantize(q.reshape(m, 1, *q.shape[2:]), coeffs.reshape(m, 1, *coeffs.shape[2:]),
                            self.alpha(ctx.step))
        grey = crop(from_blocks(idct_blocks(rec, self.block_ndim), ctx.shared["padded"]), ctx.shared["spatial"])
        return self._renorm(self._unfold(grey + 128.0, ctx.x.shape))

    def _to_data(self, u: Tensor, ctx: StepContext) -> Tensor:
        """[0, 1] -> data units (nothing to do on [0, 1] data: ``0 + 1·u`` is ``u`` exactly)."""
        if ctx.shared["unit"]:
            return u
        lo, hi = ctx.shared["lo"], ctx.shared["hi"]
        return lo + (hi - lo) * u

    def to_input(self, v: Tensor, ctx: StepContext) -> Tensor:
        return self._to_data(self._reconstruct(v, ctx), ctx)

    def objective(self, model: nn.Module, v: Tensor, ctx: StepContext) -> tuple[Tensor, Tensor]:
        u_adv = self._reconstruct(v, ctx)
        logits = self.forward(model, self._to_data(u_adv, ctx))
        if ctx.shared.pop("validate_y", False):
            self.task.validate(logits, ctx.y, "y")
        loss = self._loss_task.loss(logits, ctx.y)
        ctx.shared["losses"].append(loss.detach())
        obj = -loss if self.targeted else loss
        if self.use_ssim:
            obj = obj - self._ssim_term(ctx.state["ssim_ref"], u_adv)
        return obj, logits

    def step_rule(self) -> StepRule:
        return SignStep(self.step_size)

    def project(self, v: Tensor, ctx: StepContext) -> Tensor:
        return v.clamp(self.q_min, self.q_max)

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any):
        out = self.run(model, x, y, logits, **call_args)
        losses = out.ctx.shared["losses"]
        q = out.variable
        details = VAFADetails(q_tables=self._tables(q, x), block=self.block, final_loss=losses[-1])
        return self.box.clip(out.x_adv), details, {"loss": torch.stack(losses)}

    def _tables(self, q: Tensor, like: Tensor) -> Tensor:
        """``(N, M, n_blocks, *block)`` -> ``(N, C, [D,] n_blocks, *block)``."""
        lead = like.shape[:2] if (self.block_ndim == 3 or like.ndim == 4) else (*like.shape[:2], like.shape[-1])
        return q.reshape(*lead, *q.shape[2:])


@register("vafa")
class VAFA(_FrequencyAttack):
    """VAFA on 3-D volumes ``(N, C, H, W, D)``: learnable quantisation of 3-D block DCTs.

    The papers' loss is DiceCE with MONAI's ``squared_pred=True`` (Hanif et al.'s and Malik et al.'s code):
    with ``squared_pred=True`` (default) VAFA ascends the task's Dice term with squared probabilities in the
    denominator whatever the task's own setting; use ``Segmentation(K, loss="dicece",
    include_background=True)`` to reproduce the papers (see ``benchmarks/vafa.md`` for the effect of ``squared_pred``). VAFA uses the task's
    loss as given.

    Args:
        task: a :class:`~medadv.tasks.Segmentation` task; its loss is the attack loss.
        box: the data :class:`~medadv.threats.Box` ``Box(lo, hi)`` in data units (bounded), mapped onto
            grey levels 0–255. (The deprecated keyword ``bounds=(lo, hi)`` still works, with a warning.)
        steps: number of q updates T (20).
        q_min, q_max: quantisation-table bounds in grey levels (5, 20; Malik's main tables use q_max 30).
            q starts at q_max.
        block: DCT block size, int or ``(b_h, b_w, b_d)`` (32, the papers' runs; class default 8 in Hanif's
            code). Volumes are padded (edge replicate) to a block multiple and cropped back.
        use_ssim: add ``1 − SSIM`` between clean and reconstructed blocks to the objective (True).
        ssim_window: Gaussian SSIM window (3, σ 1.5); odd, at most the block size.
        renormalize: ``"slice_minmax"`` — per-sample, per-channel min–max over each axial slice (the
            last spatial dim indexes slices), as in the reference code — or ``"none"`` (grey / 255).
        alpha_start, alpha_end: soft-rounding α annealed linearly over the steps (0.1 → 1e-20).
        step_size: signed step on q, in grey levels (1). Formerly ``q_step``.
        squared_pred: Dice term with squared probabilities and targets in the denominator, as the papers'
            code (True); False uses the task's Dice as it is. Only matters for Dice/DiceCE task losses.
        amp: forward/backward under bf16 autocast on CUDA.
        targeted: descend the loss towards a target map instead of ascending it.
        seed: unused (VAFA is deterministic); kept for the common signature.

    Returns ``x_adv`` in the box; ``details`` is a :class:`VAFADetails` (``q_tables``
    ``(N, C, n_blocks, *block)``, the tables that produced ``x_adv``, and the per-sample ``final_loss``);
    ``trace["loss"]`` is the per-step, per-sample task loss ``(T, N)``.
    """

    block_ndim = 3
    spatial_dims = (3,)
    params: ClassVar[dict[str, Any]] = {"block": _Block(3)}

    @renamed(q_step="step_size")
    @bounds_keyword("box")
    def __init__(
        self,
        task: Task,
        box: Box | None = None,
        *,
        steps: int = 20,
        q_min: float = 5.0,
        q_max: float = 20.0,
        block: int | Sequence[int] = 32,
        use_ssim: bool = True,
        ssim_window: int = 3,
        renormalize: str = "slice_minmax",
        alpha_start: float = 0.1,
        alpha_end: float = 1e-20,
        step_size: float = 1.0,
        squared_pred: bool = True,
        amp: bool = False,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, box, targeted=targeted, seed=seed)
        self._init_frequency(locals())

    def _fold(self, t: Tensor) -> Tensor:
        return t.reshape(-1, 1, *t.shape[2:])

    def _unfold(self, t: Tensor, shape: torch.Size) -> Tensor:
        return t.reshape(shape)


@register("vafa2d")
class VAFA2D(_FrequencyAttack):
    """VAFA with 2-D block DCTs: on images ``(N, C, H, W)``, or per axial slice of volumes ``(N, C, H, W, D)``.

    Same parameters as :class:`VAFA` with 2-D ``block`` (default 32; Hanif's class default 8) and the
    reference 2-D defaults ``steps=10``, ``q_max=20``, ``use_ssim=False``. For volumes, each slice
    along the last spatial dim gets its own tables: ``details.q_tables`` is
    ``(N, C, D, n_blocks, b_h, b_w)`` (``(N, C, n_blocks, b_h, b_w)`` for images).
    """

    block_ndim = 2
    spatial_dims = (2, 3)
    params: ClassVar[dict[str, Any]] = {"block": _Block(2)}

    @renamed(q_step="step_size")
    @bounds_keyword("box")
    def __init__(
        self,
        task: Task,
        box: Box | None = None,
        *,
        steps: int = 10,
        q_min: float = 5.0,
        q_max: float = 20.0,
        block: int | Sequence[int] = 32,
        use_ssim: bool = False,
        ssim_window: int = 3,
        renormalize: str = "slice_minmax",
        alpha_start: float = 0.1,
        alpha_end: float = 1e-20,
        step_size: float = 1.0,
        squared_pred: bool = True,
        amp: bool = False,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, box, targeted=targeted, seed=seed)
        self._init_frequency(locals())

    def _fold(self, t: Tensor) -> Tensor:
        if t.ndim == 4:
            return t.reshape(-1, 1, *t.shape[2:])
        # slices along the last spatial dim become independent images
        return t.movedim(-1, 2).reshape(-1, 1, *t.shape[2:4])

    def _unfold(self, t: Tensor, shape: torch.Size) -> Tensor:
        if len(shape) == 4:
            return t.reshape(shape)
        n, c, h, w, d = shape
        return t.reshape(n, c, d, h, w).movedim(2, -1)
