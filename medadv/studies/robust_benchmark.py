"""Batched torch corruptions of Xu et al.'s Robust-Benchmark (2021, §3.3 / Fig. 4) that MONAI does not provide.

Xu et al. build 14 perturbation sequences for 2-D images after Hendrycks & Dietterich's ImageNet-P (2019):
gaussian / shot / speckle noise, gaussian / motion / zoom blur, snow, spatter, brightness, translate, rotate,
tilt, scale, shear. This module holds the ones that are not a MONAI transform already (gaussian noise and
gaussian blur are MONAI's ``RandGaussianNoise`` / ``GaussianSmooth`` in :mod:`.corruptions`). Each function
corrupts a whole batch on its device: ``fn(x, param, ctx) -> x'`` with ``x`` ``(N, C, *spatial)``.

**The data box.** Intensity corruptions work in *box units* ``u = (x − lo) / range`` (``lo`` the box's lower
bound, ``range`` its width; for unbounded data the batch minimum and range), where the ImageNet definitions for
``[0, 1]`` images apply unchanged, and map back with ``lo + range · u'``; the caller clips to the box. Spatial
corruptions fill what comes into view with ``lo`` (air / background, not zero data units) and move label maps
by nearest neighbour, filled with 0 (background).

**Randomness.** Every random draw is seeded per sample (``ctx.seeds``) with a private ``torch.Generator`` on the
data's device: the same seed on the same device gives the same tensor, and torch's global RNG is not touched.

Geometric corruptions (translate, rotate, scale, shear and the zooms of zoom blur) are MONAI's ``Affine``
applied to the batch as channels (one call for the whole batch); tilt (a perspective warp, which MONAI lacks),
motion blur, snow and spatter are written here on ``torch.nn.functional.grid_sample``. Snow and spatter follow
ImageNet-C's definitions adapted to grayscale (each channel on its own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["FrameContext", "shot_noise", "speckle_noise", "brightness", "translate", "rotate", "scale", "shear",
           "tilt", "motion_blur", "zoom_blur", "snow", "spatter"]


@dataclass(frozen=True)
class FrameContext:
    """What a batched corruption needs besides the image and its strength.

    Attributes:
        seeds: one seed per sample (its random draws).
        lo: the box's lower bound (a number or a tensor broadcastable to the batch; unbounded data: the batch
            minimum), in data units.
        data_range: the box's width in data units (unbounded: the batch range).
        label: the input is a label map ``(N, 1, *spatial)`` (float class indices): nearest neighbour, filled with 0.
    """

    seeds: Sequence[int]
    lo: Tensor | float
    data_range: float
    label: bool = False


# --- helpers ---------------------------------------------------------------------------------------------------------
def _generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed) % (2**63))


def _randn(shape: Sequence[int], seeds: Sequence[int], like: Tensor) -> Tensor:
    """``(N, *shape)`` standard normal draws, sample ``i`` from its own seeded generator on ``like``'s device."""
    out = torch.empty((len(seeds), *shape), device=like.device, dtype=like.dtype)
    for i, s in enumerate(seeds):
        out[i] = torch.randn(tuple(shape), generator=_generator(s, like.device), device=like.device, dtype=like.dtype)
    return out


def _uniform(seeds: Sequence[int], lo: float, hi: float, salt: int, like: Tensor) -> Tensor:
    """``(N,)`` uniform draws in ``[lo, hi)`` (a CPU generator per sample, so the value is device-independent)."""
    vals = [lo + (hi - lo) * float(torch.rand((), generator=torch.Generator().manual_seed((int(s) + salt) % (2**63))))
            for s in seeds]
    return torch.tensor(vals, dtype=like.dtype).to(like.device)


def _to_unit(x: Tensor, ctx: FrameContext) -> Tensor:
    return (x - ctx.lo) / ctx.data_range


def _from_unit(u: Tensor, ctx: FrameContext) -> Tensor:
    return u * ctx.data_range + ctx.lo


def _fill(ctx: FrameContext) -> Tensor | float:
    return 0.0 if ctx.label else ctx.lo


def _spatial(x: Tensor) -> int:
    return x.ndim - 2


def _monai_affine(x: Tensor, ctx: FrameContext, **params: object) -> Tensor:
    """MONAI ``Affine`` on the whole batch (samples × channels as channels), out-of-view filled with the box's
    lower bound (images) or 0 (label maps). MONAI's convention: the matrix maps output to input coordinates."""
    from monai.transforms import Affine

    fill = _fill(ctx)
    n, c = x.shape[:2]
    img = (x - fill).reshape(n * c, *x.shape[2:])
    aff = Affine(**params, mode="nearest" if ctx.label else "bilinear", padding_mode="zeros",  # type: ignore[arg-type]
                 image_only=True, device=x.device)
    out: Any = aff(img)
    out = out.as_tensor() if hasattr(out, "as_tensor") else out
    return torch.as_tensor(out).to(device=x.device, dtype=x.dtype).reshape(x.shape) + fill


def _sample(x: Tensor, grid: Tensor, ctx: FrameContext, padding: str = "zeros") -> Tensor:
    """``grid_sample`` (normalised coordinates, ``align_corners=False``); ``padding="zeros"`` fills with the box's
    lower bound (images) or 0 (labels), ``"border"`` repeats the edge."""
    fill = _fill(ctx) if padding == "zeros" else 0.0
    out = F.grid_sample(x - fill, grid.to(x.dtype), mode="nearest" if ctx.label else "bilinear",
                        padding_mode=padding, align_corners=False)
    return out + fill


def _base_grid(h: int, w: int, like: Tensor) -> Tensor:
    """``(H, W, 2)`` identity sampling grid (x, y) in normalised coordinates (pixel centres)."""
    ys = (torch.arange(h, device=like.device, dtype=like.dtype) * 2 + 1) / h - 1
    xs = (torch.arange(w, device=like.device, dtype=like.dtype) * 2 + 1) / w - 1
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([gx, gy], -1)


def _only_2d(x: Tensor, name: str, instead: str) -> None:
    if _spatial(x) != 2:
        raise ValueError(f"the {name!r} corruption is defined for 2-D images (N, C, H, W) only (Xu et al.'s "
                         f"Robust-Benchmark); got {_spatial(x)} spatial axes: {instead}")


# --- noise (compared with the clean frame) ---------------------------------------------------------------------------
def shot_noise(x: Tensor, photons: float, ctx: FrameContext) -> Tensor:
    """Poisson (shot) noise: ``Poisson(u · λ) / λ`` in box units, ``λ = photons`` per unit of the data range
    (ImageNet-P: 300; fewer photons, more noise)."""
    if ctx.label:
        return x
    u = _to_unit(x, ctx).clamp_min(0)
    out = torch.empty_like(u)
    for i, s in enumerate(ctx.seeds):
        out[i] = torch.poisson(u[i] * photons, generator=_generator(s, x.device)) / photons
    return _from_unit(out, ctx)


def speckle_noise(x: Tensor, sigma: float, ctx: FrameContext) -> Tensor:
    """Multiplicative noise ``u + u · N(0, σ²)`` in box units (ImageNet-P: σ = 0.05)."""
    if ctx.label:
        return x
    u = _to_unit(x, ctx)
    return _from_unit(u + u * sigma * _randn(x.shape[1:], ctx.seeds, x), ctx)


# --- intensity -------------------------------------------------------------------------------------------------------
def brightness(x: Tensor, shift: float, ctx: FrameContext) -> Tensor:
    """``u + shift`` in box units (grayscale form of ImageNet-P's HSV ``V += shift``)."""
    return x if ctx.label else _from_unit(_to_unit(x, ctx) + shift, ctx)


# --- geometry (MONAI Affine; any spatial rank) ----------------------------------------------------------------------
def translate(x: Tensor, fraction: float, ctx: FrameContext) -> Tensor:
    """Move the content by ``fraction`` of the image width along the last axis (towards larger indices)."""
    nd = _spatial(x)
    shift = [0.0] * nd
    shift[-1] = -fraction * x.shape[-1]  # MONAI maps output to input coordinates: content moves by -t
    return _monai_affine(x, ctx, translate_params=shift)


def rotate(x: Tensor, degrees: float, ctx: FrameContext) -> Tensor:
    """Rotate by ``degrees`` about the centre; volumes: in the plane of the last two axes (axial slices)."""
    rad = math.radians(degrees)
    return _monai_affine(x, ctx, rotate_params=rad if _spatial(x) == 2 else (rad, 0.0, 0.0))


def scale(x: Tensor, factor: float, ctx: FrameContext) -> Tensor:
    """Scale the content by ``factor`` about the centre (< 1 shrinks it, as ImageNet-P's scale sequence)."""
    return _monai_affine(x, ctx, scale_params=(1.0 / factor,) * _spatial(x))


def shear(x: Tensor, degrees: float, ctx: FrameContext) -> Tensor:
    """Shear by ``degrees``: rows shift in proportion to the column (volumes: within each axial slice)."""
    k = math.tan(math.radians(degrees))
    return _monai_affine(x, ctx, shear_params=(k, 0.0) if _spatial(x) == 2 else (0.0, 0.0, 0.0, k, 0.0, 0.0))


def tilt(x: Tensor, degrees: float, ctx: FrameContext) -> Tensor:
    """Perspective view of the image plane turned by ``degrees`` about both in-plane axes (ImageNet-P's tilt:
    φ = θ, focal length ``f = √(H² + W²)`` pixels). 2-D only."""
    _only_2d(x, "tilt", "use `rotate` or `shear` for volumes")
    h, w = x.shape[-2:]
    t = math.radians(degrees)
    c, s = math.cos(t), math.sin(t)
    rx = torch.tensor([[1, 0, 0], [0, c, -s], [0, s, c]], dtype=torch.float64)
    ry = torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=torch.float64)
    r = ry @ rx
    f = math.hypot(h, w)
    # plane point (u, v, 0) -> camera R (u, v, 0) + (0, 0, f) -> image f X / Z: homography K [r1 r2 t]
    hom = torch.diag(torch.tensor([f, f, 1.0], dtype=torch.float64)) @ torch.stack(
        [r[:, 0], r[:, 1], torch.tensor([0.0, 0.0, f], dtype=torch.float64)], 1)
    inv = torch.linalg.inv(hom)
    ys = torch.arange(h, dtype=torch.float64) - (h - 1) / 2
    xs = torch.arange(w, dtype=torch.float64) - (w - 1) / 2
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    pts = torch.stack([gx, gy, torch.ones_like(gx)], -1) @ inv.T  # source point of every output pixel
    src = pts[..., :2] / pts[..., 2:]
    grid = torch.stack([2 * src[..., 0] / w, 2 * src[..., 1] / h], -1).to(x.device)
    return _sample(x, grid.unsqueeze(0).expand(x.shape[0], -1, -1, -1), ctx)


# --- blur ------------------------------------------------------------------------------------------------------------
def _motion(x: Tensor, sigma_px: float, angles: Tensor, ctx: FrameContext) -> Tensor:
    """One-sided Gaussian motion blur (ImageMagick's ``-motion-blur``): ``Σ_k w_k x(p + k d)``, ``d`` the unit
    step at ``angles`` (degrees, per sample), ``w_k ∝ exp(−k² / 2σ²)`` for ``k = 0..⌈3σ⌉``; edges repeat."""
    if sigma_px <= 0:
        return x
    h, w = x.shape[-2:]
    taps = int(math.ceil(3 * sigma_px)) + 1
    k = torch.arange(taps, dtype=torch.float64)
    kernel = torch.exp(-(k**2) / (2 * sigma_px**2))
    weights = (kernel / kernel.sum()).tolist()
    rad = angles * (math.pi / 180)
    step = torch.stack([2 * torch.cos(rad) / w, -2 * torch.sin(rad) / h], -1).reshape(-1, 1, 1, 2)
    base = _base_grid(h, w, x).unsqueeze(0)
    out = torch.zeros_like(x)
    for j, wt in enumerate(weights):
        out = out + wt * _sample(x, base + j * step, ctx, padding="border")
    return out


def motion_blur(x: Tensor, sigma: float, ctx: FrameContext) -> Tensor:
    """Motion blur of σ = ``sigma`` pixels (a one-sided Gaussian streak), at a seeded angle per sample drawn from
    U(−45°, 45°) (ImageNet-C; Xu's sequences sweep the angle at σ = 3 px of 224). 2-D only."""
    _only_2d(x, "motion_blur", "use `motion` (rigid patient motion) or `blur` for volumes")
    if ctx.label:
        return x
    return _motion(x, sigma, _uniform(ctx.seeds, -45.0, 45.0, 0, x), ctx)


def zoom_blur(x: Tensor, zoom: float, ctx: FrameContext) -> Tensor:
    """Mean of the image zoomed about its centre by factors ``1 … zoom`` in steps of at most 0.005
    (ImageNet-C's zoom blur; ImageNet-P zooms by 1 + 0.004 per frame). Any spatial rank."""
    if ctx.label or zoom <= 1.0:
        return x
    n = int(math.ceil((zoom - 1.0) / 0.005)) + 1
    out = x.clone()
    for z in torch.linspace(1.0, zoom, n, dtype=torch.float64)[1:].tolist():
        out = out + _monai_affine(x, ctx, scale_params=(1.0 / z,) * _spatial(x))
    return out / n


# --- weather ---------------------------------------------------------------------------------------------------------
def _gauss(x: Tensor, sigma: float) -> Tensor:
    from monai.networks.layers import GaussianFilter

    return GaussianFilter(_spatial(x), sigma=sigma).to(x.device)(x) if sigma > 0 else x


def snow(x: Tensor, strength: float, ctx: FrameContext) -> Tensor:
    """ImageNet-C snow, grayscale: a fixed seeded flake layer (N(0.55, 0.3) on a grid 3× coarser, bilinear up,
    zero below 0.85, motion-blurred with σ = 3 % of the larger side at U(−135°, −45°)), and

    ``u' = clip(u + s · (max(u, 1.5 u + 0.5) − u) + 2 s · (L + rot180 L), 0, 1)``, ``s = strength``:

    the image whitens by ``s`` (ImageNet-C blends with weight 1 − c₆ = 0.2…0.45) and the flakes are drawn at
    opacity ``2 s`` (full at s = 0.5). 2-D only."""
    _only_2d(x, "snow", "it is a 2-D camera effect")
    if ctx.label:
        return x
    h, w = x.shape[-2:]
    ch, cw = max(1, math.ceil(h / 3)), max(1, math.ceil(w / 3))
    coarse = 0.55 + 0.3 * _randn((1, ch, cw), ctx.seeds, x)
    layer = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
    layer = torch.where(layer < 0.85, torch.zeros_like(layer), layer)
    layer = _motion(layer, 0.03 * max(h, w), _uniform(ctx.seeds, -135.0, -45.0, 1, x),
                    FrameContext(ctx.seeds, 0.0, 1.0))
    u = _to_unit(x, ctx)
    out = u + strength * (torch.maximum(u, 1.5 * u + 0.5) - u) + 2 * strength * (layer + layer.flip(-1, -2))
    return _from_unit(out.clamp(0, 1), ctx)


#: ImageNet-C's water colour (175, 238, 238) / 255 as luminance (0.299 R + 0.587 G + 0.114 B)
_WATER = (0.299 * 175 + 0.587 * 238 + 0.114 * 238) / 255


def spatter(x: Tensor, coverage: float, ctx: FrameContext) -> Tensor:
    """ImageNet-C spatter (water), grayscale: a seeded liquid field (N(0, 1), Gaussian blur σ = 1.65 % of the
    larger side, standardised) is thresholded so that a fraction ``coverage`` of the image is wet (the field's
    upper ``coverage`` quantile), the drop mask is softened (σ = 1 px), and drops blend the image towards the
    water's grey (0.86 of the range) with opacity 0.6 (ImageNet-P's mask × 0.6). 2-D only."""
    _only_2d(x, "spatter", "it is a 2-D camera effect")
    if ctx.label or coverage <= 0:
        return x
    h, w = x.shape[-2:]
    field = _gauss(_randn((1, h, w), ctx.seeds, x), 0.0165 * max(h, w))
    flat = field.flatten(1)
    z = (field - flat.mean(1).reshape(-1, 1, 1, 1)) / flat.std(1).clamp_min(1e-12).reshape(-1, 1, 1, 1)
    thr = math.sqrt(2.0) * float(torch.erfinv(torch.tensor(1.0 - 2.0 * min(coverage, 0.999))))
    mask = _gauss((z > thr).to(x.dtype), 1.0)
    u = _to_unit(x, ctx)
    return _from_unit(u + 0.6 * mask * (_WATER - u), ctx)
