"""Whole volumes larger than a model's ROI: sliding windows and ROI tiles.

Two ways, usable with every segmentation attack:

* :class:`SlidingWindow` wraps a model so its forward is MONAI ``sliding_window_inference``. The
  blending is built from ordinary torch ops, so gradients flow through it: an attack on the wrapper
  optimises exactly what overlapping-window evaluation sees (stronger, costs ~(1/(1−overlap))^d more).
* :func:`tile_slices` cuts the volume into ROI tiles (MONAI ``dense_patch_slices`` order, the last
  tile shifted inward at a border; later tiles overwrite earlier ones where they overlap) and
  :class:`TileWise` is the differentiable model wrapper over them (one forward per tile).
  :func:`medadv.attacks.tilewise.attack_tilewise` attacks batches of those tiles independently and pastes the
  results back — the protocol of Malik et al. and Hanif et al. (it drives an attack, so it lives with the
  attacks: the models import none of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..runtime import forward_tensor

__all__ = ["SlidingWindow", "TileWise", "tile_slices"]


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
        checkpoint: when a gradient is taken, keep only each window batch's input and output and
            recompute its activations in the backward pass (``torch.utils.checkpoint``): the memory of
            one window batch instead of every window's activations, for one more forward pass. The
            values and gradients are the same as without it.
    """

    def __init__(self, model: nn.Module, roi_size: int | Sequence[int], *, overlap: float = 0.5,
                 mode: str = "gaussian", sw_batch_size: int = 4, padding_mode: str = "constant",
                 cval: float = 0.0, checkpoint: bool = False) -> None:
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
        self.checkpoint = bool(checkpoint)

    def _window(self, w: Tensor) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.model, w, use_reentrant=False)

    def forward(self, x: Tensor) -> Tensor:
        from monai.inferers import sliding_window_inference

        roi = _roi(self.roi_size, x.ndim - 2)
        recompute = self.checkpoint and torch.is_grad_enabled() and x.requires_grad
        predictor = self._window if recompute else self.model
        out = sliding_window_inference(x, roi, self.sw_batch_size, predictor, overlap=self.overlap,
                                       mode=self.mode, padding_mode=self.padding_mode, cval=self.cval)
        if not isinstance(out, Tensor):  # the model returned several outputs (deep supervision heads)
            raise TypeError(f"the wrapped model returned a {type(out).__name__}, not one tensor of logits; "
                            "wrap it so its forward returns the main head")
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
        z = forward_tensor(self.model, torch.cat([xp[(slice(None), slice(None), *sl)] for sl in slices]))
        out = z.new_zeros((n, z.shape[1], *xp.shape[2:]))
        for i, sl in enumerate(slices):  # later tiles overwrite overlaps, as in the reference protocol
            out[(slice(None), slice(None), *sl)] = z[i * n:(i + 1) * n]
        return out[(slice(None), slice(None), *(slice(0, s) for s in spatial))]
