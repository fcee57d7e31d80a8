"""Whole volumes larger than a model's ROI: attack through sliding windows or tile by tile.

Two ways, usable with every segmentation attack:

* :class:`SlidingWindow` wraps a model so its forward is MONAI ``sliding_window_inference``. The
  blending is built from ordinary torch ops, so gradients flow through it: an attack on the wrapper
  optimises exactly what overlapping-window evaluation sees (stronger, costs ~(1/(1−overlap))^d more).
* :func:`attack_tilewise` cuts the volume into ROI tiles (MONAI ``dense_patch_slices`` order, the last
  tile shifted inward at a border; later tiles overwrite earlier ones where they overlap), attacks
  batches of tiles independently and pastes the results back — the protocol of Malik et al. and Hanif
  et al. :class:`TileWise` is the matching differentiable model wrapper (one forward per tile).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attacks.base import Attack, AttackResult, attack_mode, model_device
from ..threats import per_sample_norm

__all__ = ["SlidingWindow", "TileWise", "tile_slices", "attack_tilewise"]


def _roi(roi_size: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    roi = (int(roi_size),) * ndim if isinstance(roi_size, int) else tuple(int(r) for r in roi_size)
    if len(roi) != ndim or any(r < 1 for r in roi):
        raise ValueError(f"`roi_size` must be {ndim} positive sizes, got {roi_size}")
    return roi


class SlidingWindow(nn.Module):
    """A model evaluated by MONAI ``sliding_window_inference``; differentiable w.r.t. the input.

    Args:
        model: the network (takes ROI-sized inputs, returns ``(N, K, *roi)`` logits).
        roi_size: window size in voxels (int or one size per spatial dim).
        overlap: fraction of overlap between neighbouring windows (Malik et al.: 0.5).
        mode: ``"gaussian"`` or ``"constant"`` blending (the paper says Gaussian; its code used constant).
        sw_batch_size: windows per forward pass.
        padding_mode, cval: how volumes smaller than the ROI are padded (MONAI semantics).
    """

    def __init__(self, model: nn.Module, roi_size: int | Sequence[int], *, overlap: float = 0.5,
                 mode: str = "gaussian", sw_batch_size: int = 4, padding_mode: str = "constant",
                 cval: float = 0.0) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
        if not 0.0 <= float(overlap) < 1.0:
            raise ValueError(f"`overlap` must be in [0, 1), got {overlap}")
        if mode not in ("gaussian", "constant"):
            raise ValueError(f"`mode` must be 'gaussian' or 'constant', got {mode!r}")
        if int(sw_batch_size) < 1:
            raise ValueError(f"`sw_batch_size` must be >= 1, got {sw_batch_size}")
        self.model = model
        self.roi_size = roi_size
        self.overlap = float(overlap)
        self.mode = mode
        self.sw_batch_size = int(sw_batch_size)
        self.padding_mode = padding_mode
        self.cval = float(cval)

    def forward(self, x: Tensor) -> Tensor:
        from monai.inferers import sliding_window_inference

        roi = _roi(self.roi_size, x.ndim - 2)
        out = sliding_window_inference(x, roi, self.sw_batch_size, self.model, overlap=self.overlap,
                                       mode=self.mode, padding_mode=self.padding_mode, cval=self.cval)
        # MONAI may return a MetaTensor; attacks and metrics want a plain tensor
        return out.as_tensor() if hasattr(out, "as_tensor") else out


def tile_slices(spatial: Sequence[int], roi: Sequence[int]) -> list[tuple[slice, ...]]:
    """Non-overlapping ROI tiles of a volume, in MONAI ``dense_patch_slices`` order.

    Along an axis that is not a multiple of the ROI the last tile is shifted to end at the border.
    ``spatial`` must be at least ``roi`` along every axis (pad first).
    """
    from monai.data.utils import dense_patch_slices

    if any(s < r for s, r in zip(spatial, roi, strict=True)):
        raise ValueError(f"volume {tuple(spatial)} is smaller than the ROI {tuple(roi)}; pad it first")
    return [tuple(slice(int(s.start), int(s.stop)) for s in sl)
            for sl in dense_patch_slices(tuple(spatial), tuple(roi), tuple(roi))]


def _pad_to_roi(t: Tensor, roi: Sequence[int], ndim: int) -> Tensor:
    """Pad the trailing ``ndim`` dims at their end (edge replicate) to at least ``roi``."""
    pads: list[int] = []
    for s, r in zip(reversed(t.shape[-ndim:]), reversed(roi), strict=True):
        pads += [0, max(0, r - s)]
    if not any(pads):
        return t
    if t.is_floating_point():
        return F.pad(t, pads, mode="replicate")
    # labels: replicate through a float view (exact for the small ints of a label map)
    return F.pad(t.unsqueeze(1).double(), pads, mode="replicate").squeeze(1).to(t.dtype)


class TileWise(nn.Module):
    """A model applied to non-overlapping ROI tiles (:func:`tile_slices`) and stitched back.

    Differentiable; the tiles of all samples go through the model as one batch. Volumes smaller than
    the ROI along an axis are padded (edge replicate) and the output cropped back.
    """

    def __init__(self, model: nn.Module, roi_size: int | Sequence[int]) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.roi_size = roi_size

    def forward(self, x: Tensor) -> Tensor:
        ndim = x.ndim - 2
        roi = _roi(self.roi_size, ndim)
        spatial = tuple(x.shape[2:])
        xp = _pad_to_roi(x, roi, ndim)
        slices = tile_slices(xp.shape[2:], roi)
        n = x.shape[0]
        z = self.model(torch.cat([xp[(..., *sl)] for sl in slices]))
        out = z.new_zeros((n, z.shape[1], *xp.shape[2:]))
        for i, sl in enumerate(slices):  # later tiles overwrite overlaps, as in the reference protocol
            out[(slice(None), slice(None), *sl)] = z[i * n:(i + 1) * n]
        return out[(slice(None), slice(None), *(slice(0, s) for s in spatial))]


def _cut(t: Tensor, group: Sequence[tuple[slice, ...]], lead: int) -> Tensor:
    """Stack the tiles ``group`` of ``t`` along the batch dim (tile-major), ``lead`` non-spatial dims."""
    pre = (slice(None),) * lead
    return torch.cat([t[(*pre, *sl)] for sl in group])


def attack_tilewise(
    attack: Attack,
    model: nn.Module,
    x: Tensor,
    y: Tensor | None = None,
    *,
    roi_size: int | Sequence[int],
    tiles_per_batch: int = 1,
    tile_kwargs: Mapping[str, Tensor] | None = None,
    evaluator: nn.Module | None = None,
) -> AttackResult:
    """Attack a large volume tile by tile and paste the adversarial tiles back.

    Args:
        attack: any medadv attack (PGD, CosPGD, SegPGD, DAG, VAFA, ...).
        model: the ROI-sized network.
        x: ``(N, C, *spatial)`` volumes; ``y``: ``(N, *spatial)`` labels or targets (``None``: the
            tile-wise clean prediction).
        roi_size: tile size in voxels.
        tiles_per_batch: tiles attacked together (each attack call sees ``tiles_per_batch × N`` inputs).
        tile_kwargs: extra per-voxel tensors ``(N, *spatial)`` for the attack call, cut like ``y``
            (e.g. ``{"target_mask": mask}`` for DAG).
        evaluator: whole-volume model used for the returned logits and ``fooled`` (default
            :class:`TileWise`; pass a :class:`SlidingWindow` to evaluate as Malik et al. do).

    Returns an :class:`AttackResult` for the whole volumes; ``extras["tiles"]`` lists each tile
    batch's own extras (for VAFA, its quantisation tables) in tile order.
    """
    if not isinstance(attack, Attack):
        raise TypeError(f"`attack` must be a medadv Attack, got {type(attack).__name__}")
    if not isinstance(x, Tensor) or x.ndim not in (4, 5):
        raise ValueError("`x` must be a (N, C, *spatial) tensor with 2 or 3 spatial dims")
    if int(tiles_per_batch) < 1:
        raise ValueError(f"`tiles_per_batch` must be >= 1, got {tiles_per_batch}")
    ndim = x.ndim - 2
    roi = _roi(roi_size, ndim)
    evaluator = evaluator if evaluator is not None else TileWise(model, roi)
    device = model_device(model, x.device)
    x0 = x.detach().to(device)
    n, spatial = x0.shape[0], tuple(x0.shape[2:])
    if y is None:
        with attack_mode(evaluator), torch.no_grad():
            y = attack.task.predict(evaluator(x0))
    y0 = y.detach().to(device)
    extra = {k: v.detach().to(device) for k, v in (tile_kwargs or {}).items()}
    xp = _pad_to_roi(x0, roi, ndim)
    yp = _pad_to_roi(y0, roi, ndim)
    extra_p = {k: _pad_to_roi(v, roi, ndim) for k, v in extra.items()}
    slices = tile_slices(xp.shape[2:], roi)
    out = xp.clone()
    tile_extras: list[dict[str, Any]] = []
    step = int(tiles_per_batch)
    for start in range(0, len(slices), step):
        group = slices[start:start + step]
        kw = {k: _cut(v, group, 1) for k, v in extra_p.items()}
        res = attack(model, _cut(xp, group, 2), _cut(yp, group, 1), **kw)
        for i, sl in enumerate(group):
            out[(slice(None), slice(None), *sl)] = res.x_adv[i * n:(i + 1) * n].to(device)
        tile_extras.append(res.extras)
    x_adv = out[(slice(None), slice(None), *(slice(0, s) for s in spatial))]
    with attack_mode(evaluator), torch.no_grad():
        logits = evaluator(x_adv)
    fooled = attack.task.fooled(logits, y0, attack.targeted)
    delta = x_adv - x0
    return AttackResult(
        x_adv=x_adv.to(x.device), fooled=fooled, linf=per_sample_norm(delta, float("inf")),
        l2=per_sample_norm(delta, 2.0), logits=logits, y=y0, trace=None, extras={"tiles": tile_extras},
    )
