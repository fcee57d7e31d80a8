"""XRAI: integrated gradients aggregated over image regions (Kapishnikov et al., ICCV 2019).

XRAI over-segments the image at several scales (Felzenszwalb & Huttenlocher graph segmentation, scikit-image
``felzenszwalb``), dilates every segment, and grows a saliency ranking greedily: at each step it adds the
segment whose *not yet covered* pixels have the highest mean attribution ("gain density"), and gives those
pixels that density. The attribution is integrated gradients (:class:`~medadv.explain.IntegratedGradients`),
the base map Zhang et al. (2024) use for XRAI. The result is piecewise constant on the added regions; its
value ranks regions by attribution density, the highest first.

Defaults follow Kapishnikov et al.'s reference setting as Zhang et al. use it (spec 002 §1.7): the image is
min–max scaled to [−1, 1] and resized to 224×224 for the segmentation (labels are resized back, nearest
neighbour), Felzenszwalb scales {50, 100, 150, 250, 500, 1200}, σ = 0.8, minimum segment 150 pixels (at
224²), every segment dilated with a disk of radius 5 pixels (at the image's own resolution), segments
adding fewer than ``min_pixel_diff`` new pixels skipped, the whole image covered (area threshold 1).

XRAI is evaluation-only (``differentiable`` False): the segmentation and the greedy selection are
piecewise constant in the input and computed in numpy, so the map has no input gradient. Zhang et al.
never attack it: they evaluate XRAI on the images attacked through integrated gradients (transfer). Attack
``"integrated_gradients"`` and evaluate ``"xrai"`` on the returned images. 2-D images only.

scikit-image is imported when a map is first computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..params import AnyOf, Constraint, Instance, Int, Optional, Options, Real
from .base import Explanation, register_explanation
from .gradient import IG_METHODS, IntegratedGradients

__all__ = ["XRAI", "xrai_segments", "xrai_rank"]

#: Felzenszwalb scales of the reference XRAI
XRAI_SCALES = (50.0, 100.0, 150.0, 250.0, 500.0, 1200.0)


class _PositiveReals(Constraint):
    """A non-empty sequence of positive finite numbers (stored as a tuple of floats)."""

    def describe(self) -> str:
        return "a non-empty list of positive numbers"

    def convert(self, value: Any) -> tuple[float, ...]:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
            raise TypeError
        out = tuple(Real(low=0, low_open=True).convert(v) for v in value)
        if not all(np.isfinite(out)):
            raise ValueError
        return out


def _disk(radius: int) -> np.ndarray:
    r = np.arange(-radius, radius + 1)
    return (r[:, None] ** 2 + r[None, :] ** 2) <= radius * radius


def xrai_segments(
    image: np.ndarray, scales: Sequence[float] = XRAI_SCALES, sigma: float = 0.8, min_size: int = 150,
    segment_size: int | None = 224, dilation_radius: int = 5,
) -> np.ndarray:
    """XRAI's candidate regions: Felzenszwalb segments at several scales, dilated, as boolean masks.

    Args:
        image: ``(H, W)`` or ``(H, W, C)`` array (any range: min–max scaled to [−1, 1] here).
        scales: Felzenszwalb ``scale`` values (larger: bigger segments).
        sigma: Gaussian pre-smoothing of the segmentation, pixels (of the segmentation grid).
        min_size: minimum segment size, pixels of the segmentation grid.
        segment_size: side of the square grid the image is resized to for the segmentation (224, as the
            reference); ``None`` segments at the image's own size.
        dilation_radius: radius in image pixels of the disk every mask is dilated with (0: none).

    Returns:
        ``(K, H, W)`` boolean masks, in scale order then label order (deterministic).
    """
    from scipy.ndimage import binary_dilation
    from skimage.segmentation import felzenszwalb

    img = np.asarray(image, dtype=np.float64)
    h, w = img.shape[:2]
    lo, hi = float(img.min()), float(img.max())
    img = (img - lo) / (hi - lo) * 2.0 - 1.0 if hi > lo else np.zeros_like(img)
    channel_axis = -1 if img.ndim == 3 else None
    if segment_size is not None:
        t = torch.from_numpy(img if img.ndim == 3 else img[..., None]).permute(2, 0, 1)[None]
        t = F.interpolate(t, size=(segment_size, segment_size), mode="bilinear", align_corners=False)
        img = t[0].permute(1, 2, 0).numpy()
        img = img if channel_axis is not None else img[..., 0]
    masks: list[np.ndarray] = []
    footprint = _disk(dilation_radius) if dilation_radius > 0 else None
    for scale in scales:
        seg = felzenszwalb(img, scale=scale, sigma=sigma, min_size=min_size, channel_axis=channel_axis)
        if segment_size is not None:
            # nearest-neighbour back to the image's grid
            seg = F.interpolate(torch.from_numpy(seg.astype(np.float64))[None, None], size=(h, w),
                                mode="nearest")[0, 0].numpy().astype(np.int64)
        for label in np.unique(seg):
            m = seg == label
            if footprint is not None:
                m = binary_dilation(m, structure=footprint)
            masks.append(m)
    return np.stack(masks)


def xrai_rank(attr: np.ndarray, masks: np.ndarray, min_pixel_diff: int = 50, area_threshold: float = 1.0) -> np.ndarray:
    """XRAI's greedy region ranking ("full" algorithm): the gain density of each pixel's region.

    Repeatedly adds the mask whose not-yet-covered pixels have the highest mean ``attr`` (gain density),
    giving those pixels that density, until the covered share reaches ``area_threshold``; masks adding fewer
    than ``min_pixel_diff`` new pixels are dropped. Pixels never covered get the mean attribution of the
    uncovered pixels.

    Args:
        attr: ``(H, W)`` attribution (signed).
        masks: ``(K, H, W)`` boolean candidate regions (:func:`xrai_segments`).
        min_pixel_diff: minimum number of new pixels for a mask to be added.
        area_threshold: stop once this share of the image (0, 1] is covered.

    Returns:
        ``(H, W)`` float64 map, constant on every added region's new pixels.
    """
    a = np.asarray(attr, dtype=np.float64).reshape(-1)
    mk = np.asarray(masks, dtype=bool).reshape(masks.shape[0], -1)
    out = np.full(a.shape, -np.inf)
    covered = np.zeros(a.shape, dtype=bool)
    alive = np.ones(mk.shape[0], dtype=bool)
    while covered.mean() < area_threshold and alive.any():
        new = mk & ~covered  # (K, P)
        counts = new.sum(1)
        alive &= counts >= max(1, min_pixel_diff)
        if not alive.any():
            break
        gain = np.where(alive, (new @ a) / np.maximum(counts, 1), -np.inf)
        best = int(np.argmax(gain))  # first of equal gains: deterministic
        out[new[best]] = gain[best]
        covered |= mk[best]
        alive[best] = False
    rest = ~covered
    if rest.any():
        out[rest] = a[rest].mean()
    return out.reshape(np.shape(attr))


@register_explanation("xrai")
class XRAI(Explanation):
    """XRAI (Kapishnikov et al., ICCV 2019): integrated gradients ranked over multi-scale image regions.

    The raw attribution is XRAI's region map (gain densities of :func:`xrai_rank` over the masks of
    :func:`xrai_segments`, on the integrated-gradients attribution summed over input channels), shifted so
    that its minimum is 0 (spec 002 A11: XRAI values are signed densities, not a distribution), then, like
    every map, L1-normalised. Regions with more attribution per pixel get higher values; the map is constant
    on each added region. Evaluation-only and 2-D only (see the module docstring).

    Args:
        n_steps, baseline, method: the integrated-gradients base attribution
            (:class:`~medadv.explain.IntegratedGradients`; n = 10, zero baseline, right Riemann sum).
        scales: Felzenszwalb scales (default 50, 100, 150, 250, 500, 1200).
        sigma: Felzenszwalb Gaussian pre-smoothing, pixels of the segmentation grid (0.8).
        min_size: minimum Felzenszwalb segment, pixels of the segmentation grid (150 at 224²).
        segment_size: side of the square grid the image is resized to for the segmentation (224);
            ``None``: the image's own size.
        dilation_radius: disk radius, image pixels, every segment is dilated with (5).
        min_pixel_diff: a segment must add at least this many uncovered image pixels; default
            ``None``: 50 pixels at 224², scaled with the image's area (at least 1).
    """

    params: ClassVar[dict[str, Any]] = {
        "n_steps": Int(low=1),
        "baseline": AnyOf(Real(), Instance(Tensor, text="a tensor broadcastable to x")),
        "method": Options(*IG_METHODS),
        "scales": _PositiveReals(),
        "sigma": Real(low=0),
        "min_size": Int(low=1),
        "segment_size": Optional(Int(low=8)),
        "dilation_radius": Int(low=0),
        "min_pixel_diff": Optional(Int(low=1)),
    }
    differentiable = False
    not_differentiable_because = (
        "its Felzenszwalb segmentation and greedy region selection are piecewise constant in the input and "
        "computed in numpy (no input gradient)")
    attack_instead = "integrated_gradients"

    n_steps: int
    baseline: float | Tensor
    method: str
    scales: tuple[float, ...]
    sigma: float
    min_size: int
    segment_size: int | None
    dilation_radius: int
    min_pixel_diff: int | None

    def __init__(
        self, n_steps: int = 10, baseline: float | Tensor = 0.0, method: str = "riemann_right",
        scales: Sequence[float] = XRAI_SCALES, sigma: float = 0.8, min_size: int = 150,
        segment_size: int | None = 224, dilation_radius: int = 5, min_pixel_diff: int | None = None,
    ) -> None:
        self._init_params(locals())

    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        """XRAI region map ``(N, 1, H, W)``, non-negative (the minimum of each sample's map is 0)."""
        if create_graph:
            self.require_differentiable("create_graph=True")
        if x.ndim != 4:
            raise ValueError(
                f"XRAI is defined for 2-D images (N, C, H, W); got an input of shape {tuple(x.shape)}. For volumes "
                "use 'integrated_gradients' (XRAI's base attribution) or 'gradcam'")
        ig = IntegratedGradients(n_steps=self.n_steps, baseline=self.baseline, method=self.method)
        attr = ig.attribute(model, x, target).detach().sum(dim=1)  # (N, H, W), signed
        h, w = x.shape[-2:]
        diff = self.min_pixel_diff
        if diff is None:
            diff = max(1, round(50 * h * w / 224**2))
        imgs = x.detach().to("cpu", torch.float64).numpy()
        attrs = attr.to("cpu", torch.float64).numpy()
        out = []
        for img, a in zip(imgs, attrs, strict=True):
            masks = xrai_segments(img[0] if img.shape[0] == 1 else np.moveaxis(img, 0, -1), self.scales,
                                  self.sigma, self.min_size, self.segment_size, self.dilation_radius)
            r = xrai_rank(a, masks, min_pixel_diff=diff)
            out.append(r - r.min())
        return torch.from_numpy(np.stack(out)).to(device=x.device, dtype=x.dtype)[:, None]
