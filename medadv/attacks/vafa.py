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

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..dct import crop, dct_blocks, from_blocks, idct_blocks, normalize_block, pad_to_multiple, to_blocks
from ..metrics.image import ssim
from ..tasks import Segmentation, Task
from ..threats import Bounds, Linf
from .base import Attack, register

__all__ = ["VAFA", "VAFA2D", "soft_round", "soft_quantize"]


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


class _FrequencyAttack(Attack):
    """The quantisation loop shared by VAFA (3-D blocks) and VAFA2D (2-D blocks per axial slice)."""

    block_ndim: int = 3

    def __init__(
        self,
        task: Task,
        *,
        bounds: Bounds,
        steps: int,
        q_min: float,
        q_max: float,
        block: int | Sequence[int],
        use_ssim: bool,
        ssim_window: int = 3,
        renormalize: str = "slice_minmax",
        alpha_start: float = 0.1,
        alpha_end: float = 1e-20,
        q_step: float = 1.0,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        if not isinstance(task, Segmentation):
            raise TypeError(f"`task` must be a Segmentation task for {type(self).__name__}, got {task!r}")
        super().__init__(task, None, targeted=targeted, seed=seed)
        if bounds is None:
            raise ValueError("`bounds` (lo, hi) are required: VAFA maps the data range onto 0-255 grey levels")
        self._range = Linf(0.0, bounds=bounds)  # validation and clipping of the data range only
        if int(steps) < 1:
            raise ValueError(f"`steps` must be >= 1, got {steps}")
        if not 0 < float(q_min) <= float(q_max):
            raise ValueError(f"need 0 < q_min <= q_max, got q_min={q_min}, q_max={q_max}")
        if renormalize not in ("slice_minmax", "none"):
            raise ValueError(f"`renormalize` must be 'slice_minmax' or 'none', got {renormalize!r}")
        if not 0.0 < float(alpha_end) <= float(alpha_start) < 1.0:
            raise ValueError(f"need 0 < alpha_end <= alpha_start < 1, got {alpha_start}, {alpha_end}")
        if not float(q_step) > 0:
            raise ValueError(f"`q_step` must be > 0, got {q_step}")
        self.block = normalize_block(block, self.block_ndim)
        if use_ssim and (int(ssim_window) < 1 or int(ssim_window) % 2 == 0 or ssim_window > min(self.block)):
            raise ValueError(f"`ssim_window` must be odd and at most the block size {min(self.block)}, got {ssim_window}")
        self.steps = int(steps)
        self.q_min, self.q_max = float(q_min), float(q_max)
        self.use_ssim = bool(use_ssim)
        self.ssim_window = int(ssim_window)
        self.renormalize = renormalize
        self.alpha_start, self.alpha_end = float(alpha_start), float(alpha_end)
        self.q_step = float(q_step)

    @property
    def bounds(self):
        return self._range.bounds

    # --- layout: fold everything that is not a block axis into one leading dim --------------------------------
    def _fold(self, t: Tensor) -> Tensor:
        """``(N, C, *spatial)`` -> ``(M, 1, *block_spatial)`` for the blockwise transform."""
        raise NotImplementedError

    def _unfold(self, t: Tensor, like: Tensor) -> Tensor:
        raise NotImplementedError

    def _lohi(self, x: Tensor) -> tuple[Tensor, Tensor]:
        lo, hi = self._range.bounds  # type: ignore[misc]
        return (torch.as_tensor(lo, dtype=x.dtype, device=x.device),
                torch.as_tensor(hi, dtype=x.dtype, device=x.device))

    def _renorm(self, grey: Tensor) -> Tensor:
        """Reconstruction in grey levels -> [0, 1] (per-slice min–max, or /255 and clip)."""
        plain = (grey / 255.0).clamp(0.0, 1.0)
        if self.renormalize == "none":
            return plain
        # axial slices: reduce over every spatial dim but the last one (whole image in 2-D)
        dims = tuple(range(2, grey.ndim - 1)) if grey.ndim == 5 else tuple(range(2, grey.ndim))
        mn = grey.amin(dim=dims, keepdim=True)
        mx = grey.amax(dim=dims, keepdim=True)
        span = mx - mn
        # constant slices have no range to stretch: fall back to /255 instead of dividing by ~0
        return torch.where(span > 1e-6, (grey - mn) / (span + 1e-8), plain)

    def _blocks(self, u: Tensor) -> Tensor:
        """``(N, C, *spatial)`` -> ``(N·C·n_blocks, 1, *block)``: blocks as the batch, any channel count."""
        return to_blocks(pad_to_multiple(self._fold(u), self.block), self.block).reshape(-1, 1, *self.block)

    def _ssim_term(self, clean_blocks: Tensor, u_adv: Tensor) -> Tensor:
        """``1 − mean blockwise SSIM`` per sample ``(N,)``."""
        s = ssim(clean_blocks, self._blocks(u_adv), data_range=1.0, win_size=self.ssim_window, nonnegative=True)
        return 1.0 - s.reshape(u_adv.shape[0], -1).mean(dim=1)

    def _setup(self, x: Tensor) -> dict[str, Any]:
        """Per-call constants: the clean block coefficients (and SSIM blocks) do not depend on q."""
        self._range.check_inside(x, "x")
        lo, hi = self._lohi(x)
        u = (x - lo) / (hi - lo)  # [0, 1]
        folded = self._fold(u)
        padded = pad_to_multiple(255.0 * folded - 128.0, self.block)
        coeffs = dct_blocks(to_blocks(padded, self.block), self.block_ndim).detach()
        ctx = {"lo": lo, "hi": hi, "u": u, "coeffs": coeffs, "spatial": folded.shape[2:], "padded": padded.shape[2:]}
        if self.use_ssim:
            ctx["clean_blocks"] = self._blocks(u)
        return ctx

    def _objective(self, model: nn.Module, q: Tensor, ctx: dict[str, Any], y: Tensor,
                   alpha: float) -> tuple[Tensor, Tensor, Tensor]:
        """``(J, loss, x_adv)`` for tables ``q``: J (minimised) and the task loss per sample ``(N,)``."""
        rec = soft_quantize(q, ctx["coeffs"], alpha)
        grey = crop(from_blocks(idct_blocks(rec, self.block_ndim), ctx["padded"]), ctx["spatial"]) + 128.0
        u_adv = self._renorm(self._unfold(grey, ctx["u"]))
        x_adv = ctx["lo"] + (ctx["hi"] - ctx["lo"]) * u_adv
        loss = self.task.loss(model(x_adv), y)
        obj = loss if self.targeted else -loss
        if self.use_ssim:
            obj = obj + self._ssim_term(ctx["clean_blocks"], u_adv)
        return obj, loss, x_adv

    def _step(self, q: Tensor, g: Tensor) -> Tensor:
        """Signed descent on J in quantisation units, projected onto ``[q_min, q_max]``."""
        return (q - self.q_step * g.sign()).clamp(self.q_min, self.q_max)

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor):
        ctx = self._setup(x)
        q = torch.full_like(ctx["coeffs"], self.q_max)  # fresh per call: no state between calls
        alphas = [self.alpha_start + t * (self.alpha_end - self.alpha_start) / self.steps for t in range(self.steps)]
        losses = []
        x_adv = x
        q_used = q
        for alpha in alphas:
            with torch.enable_grad():
                q.requires_grad_(True)
                obj, loss, x_adv = self._objective(model, q, ctx, y, alpha)
                (g,) = torch.autograd.grad(obj.sum(), q)
            losses.append(loss.detach())
            q_used = q.detach()
            q = self._step(q_used, g)
        x_adv = self._range.clip(x_adv.detach())
        extras = {
            # the tables that produced x_adv (the last update is never applied, as in the reference code)
            "q_tables": self._tables(q_used, x),
            "block": self.block,
        }
        return x_adv, extras, {"loss": torch.stack(losses)}

    def _tables(self, q: Tensor, like: Tensor) -> Tensor:
        """``(M, 1, n_blocks, *block)`` -> ``(N, C, [D,] n_blocks, *block)``."""
        lead = like.shape[:2] if (self.block_ndim == 3 or like.ndim == 4) else (*like.shape[:2], like.shape[-1])
        return q.reshape(*lead, *q.shape[2:])


@register("vafa")
class VAFA(_FrequencyAttack):
    """VAFA on 3-D volumes ``(N, C, H, W, D)``: learnable quantisation of 3-D block DCTs.

    Args:
        task: a 3-D :class:`~medadv.tasks.Segmentation` task; its loss is the attack loss (the papers
            use ``Segmentation(K, loss="dicece", include_background=True)``).
        bounds: ``(lo, hi)`` data range in data units, mapped onto grey levels 0–255 (required).
        steps: number of q updates T (20).
        q_min, q_max: quantisation-table bounds in grey levels (5, 20; Malik's main tables use q_max 30).
            q starts at q_max.
        block: DCT block size, int or ``(b_h, b_w, b_d)`` (32, the papers' runs; class default 8 in Hanif's
            code). Volumes are padded (edge replicate) to a block multiple and cropped back.
        use_ssim: add ``1 − SSIM`` between clean and reconstructed blocks to the objective (True).
        ssim_window: Gaussian SSIM window (3, σ 1.5).
        renormalize: ``"slice_minmax"`` — per-sample, per-channel min–max over each axial slice (the
            last spatial dim indexes slices), as in the reference code — or ``"none"`` (grey / 255).
        alpha_start, alpha_end: soft-rounding α annealed linearly over the steps (0.1 → 1e-20).
        q_step: signed step on q, in grey levels (1).
        targeted: descend the loss towards a target map instead of ascending it.
        seed: unused (VAFA is deterministic); kept for the common signature.

    Returns ``x_adv`` in the data range; ``extras["q_tables"]`` is ``(N, C, n_blocks, *block)``, the
    tables that produced ``x_adv``; ``trace["loss"]`` the per-step, per-sample loss ``(T, N)``.
    """

    block_ndim = 3

    def __init__(
        self,
        task: Task,
        *,
        bounds: Bounds,
        steps: int = 20,
        q_min: float = 5.0,
        q_max: float = 20.0,
        block: int | Sequence[int] = 32,
        use_ssim: bool = True,
        ssim_window: int = 3,
        renormalize: str = "slice_minmax",
        alpha_start: float = 0.1,
        alpha_end: float = 1e-20,
        q_step: float = 1.0,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, bounds=bounds, steps=steps, q_min=q_min, q_max=q_max, block=block,
                         use_ssim=use_ssim, ssim_window=ssim_window, renormalize=renormalize,
                         alpha_start=alpha_start, alpha_end=alpha_end, q_step=q_step,
                         targeted=targeted, seed=seed)

    def _fold(self, t: Tensor) -> Tensor:
        if t.ndim != 5:
            raise ValueError(f"VAFA needs 3-D volumes (N, C, H, W, D), got shape {tuple(t.shape)}; use VAFA2D for images")
        return t.reshape(-1, 1, *t.shape[2:])

    def _unfold(self, t: Tensor, like: Tensor) -> Tensor:
        return t.reshape(like.shape)


@register("vafa2d")
class VAFA2D(_FrequencyAttack):
    """VAFA with 2-D block DCTs: on images ``(N, C, H, W)``, or per axial slice of volumes ``(N, C, H, W, D)``.

    Same parameters as :class:`VAFA` with 2-D ``block`` (default 32; Hanif's class default 8) and the
    reference 2-D defaults ``steps=10``, ``q_max=20``, ``use_ssim=False``. For volumes, each slice
    along the last spatial dim gets its own tables: ``extras["q_tables"]`` is
    ``(N, C, D, n_blocks, b_h, b_w)`` (``(N, C, n_blocks, b_h, b_w)`` for images).
    """

    block_ndim = 2

    def __init__(
        self,
        task: Task,
        *,
        bounds: Bounds,
        steps: int = 10,
        q_min: float = 5.0,
        q_max: float = 20.0,
        block: int | Sequence[int] = 32,
        use_ssim: bool = False,
        ssim_window: int = 3,
        renormalize: str = "slice_minmax",
        alpha_start: float = 0.1,
        alpha_end: float = 1e-20,
        q_step: float = 1.0,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, bounds=bounds, steps=steps, q_min=q_min, q_max=q_max, block=block,
                         use_ssim=use_ssim, ssim_window=ssim_window, renormalize=renormalize,
                         alpha_start=alpha_start, alpha_end=alpha_end, q_step=q_step,
                         targeted=targeted, seed=seed)

    def _fold(self, t: Tensor) -> Tensor:
        if t.ndim == 4:
            return t.reshape(-1, 1, *t.shape[2:])
        if t.ndim == 5:  # slices along the last spatial dim become independent images
            return t.movedim(-1, 2).reshape(-1, 1, *t.shape[2:4])
        raise ValueError(f"VAFA2D needs (N, C, H, W) images or (N, C, H, W, D) volumes, got shape {tuple(t.shape)}")

    def _unfold(self, t: Tensor, like: Tensor) -> Tensor:
        if like.ndim == 4:
            return t.reshape(like.shape)
        n, c, h, w, d = like.shape
        return t.reshape(n, c, d, h, w).movedim(2, -1)
