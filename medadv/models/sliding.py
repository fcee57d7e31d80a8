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

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..runtime import attack_mode, forward_tensor, model_device
from ..threats import per_sample_norm

if TYPE_CHECKING:  # imported on use: medadv.models must not import the attacks package (no import cycle)
    from ..attacks.base import Attack, AttackDetails, AttackResult

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


def _cut(t: Tensor, group: Sequence[tuple[slice, ...]], lead: int) -> Tensor:
    """Stack the tiles ``group`` of ``t`` along the batch dim (tile-major), ``lead`` non-spatial dims."""
    pre = (slice(None),) * lead
    return torch.cat([t[(*pre, *sl)] for sl in group])


@functools.cache
def _tile_details_class() -> Callable[..., AttackDetails]:
    # built on first use: AttackDetails lives in the attacks package, which medadv.models must not import
    # at module import (attacks -> models.generators already; the other way would be a package cycle)
    from ..attacks.base import AttackDetails

    @dataclass
    class TileDetails(AttackDetails):
        """The typed details of :func:`attack_tilewise`: each tile batch's own details, in tile order."""

        tiles: list[AttackDetails | None] = field(default_factory=list)

        def as_dict(self) -> dict[str, Any]:
            # the compat dict view nests: extras["tiles"][i] is tile batch i's own extras dict
            return {"tiles": [{} if d is None else d.as_dict() for d in self.tiles]}

    TileDetails.__module__ = __name__
    TileDetails.__qualname__ = "TileDetails"
    return TileDetails


def __getattr__(name: str) -> Any:
    if name == "TileDetails":  # ``from medadv.models.sliding import TileDetails`` (and pickling) work
        return _tile_details_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

    The threat's budget holds for the whole volume. Under L∞ every tile may use all of ε (the L∞ norm
    of the stitched perturbation is the largest tile's). Under L2 the budget is shared: each of the T
    tiles of a volume is attacked in a ball of radius ε/√T, so ``‖x_adv − x‖₂ ≤ ε`` for the whole volume
    (tile-wise L2 is weak; for a joint L2 attack on the whole volume call the attack on
    ``SlidingWindow(model, roi_size)`` or ``TileWise(model, roi_size)`` instead).

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

    Returns an :class:`~medadv.attacks.base.AttackResult` for the whole volumes; ``details.tiles``
    (:class:`TileDetails`) lists each tile batch's own details (for VAFA, its quantisation tables) in
    tile order (``extras["tiles"]``: the same as dicts).
    """
    from ..attacks.base import Attack, AttackResult

    if not isinstance(attack, Attack):
        raise TypeError(f"`attack` must be a medadv Attack, got {type(attack).__name__}")
    if not isinstance(x, Tensor) or x.ndim not in (4, 5):
        raise ValueError("`x` must be a (N, C, *spatial) tensor with 2 or 3 spatial dims")
    if isinstance(tiles_per_batch, bool) or not isinstance(tiles_per_batch, int) or tiles_per_batch < 1:
        raise ValueError(f"`tiles_per_batch` must be an integer >= 1, got {tiles_per_batch!r}")
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
    threat = attack.threat
    tile_attack = attack
    if threat is not None and math.isfinite(threat.p):
        # each voxel of the result comes from one tile, so ‖δ‖_p^p <= Σ_t ‖δ_t‖_p^p <= T (ε/T^(1/p))^p = ε^p
        share = threat.with_eps(threat.eps / len(slices) ** (1.0 / threat.p))
        tile_attack = type(attack)(attack.task, share, **attack.get_params())
    out = xp.clone()
    tiles: list[AttackDetails | None] = []
    for start in range(0, len(slices), tiles_per_batch):
        group = slices[start:start + tiles_per_batch]
        kw = {k: _cut(v, group, 1) for k, v in extra_p.items()}
        res = tile_attack(model, _cut(xp, group, 2), _cut(yp, group, 1), **kw)
        for i, sl in enumerate(group):
            out[(slice(None), slice(None), *sl)] = res.x_adv[i * n:(i + 1) * n].to(device)
        tiles.append(res.details)
    x_adv = out[(slice(None), slice(None), *(slice(0, s) for s in spatial))]
    if threat is not None:
        x_adv = threat.finalize(x0, x_adv)  # the whole-volume ball, exactly (no round-off above ε)
    with attack_mode(evaluator), torch.no_grad():
        logits = evaluator(x_adv)
    fooled = attack.task.fooled(logits, y0, attack.targeted)
    delta = x_adv - x0
    return AttackResult(
        x_adv=x_adv.to(x.device), fooled=fooled, linf=per_sample_norm(delta, float("inf")),
        l2=per_sample_norm(delta, 2.0), logits=logits, y=y0, trace=None,
        details=_tile_details_class()(tiles=tiles),
    )
