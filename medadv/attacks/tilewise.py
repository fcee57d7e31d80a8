"""Attack a volume larger than the model's ROI tile by tile: the protocol of Malik et al. and Hanif et al.

:func:`attack_tilewise` cuts the volume into ROI tiles (MONAI ``dense_patch_slices`` order, the last tile shifted
inward at a border; later tiles overwrite earlier ones where they overlap), attacks batches of tiles independently
and pastes the results back. The tiling and the differentiable wrappers (:class:`~medadv.models.sliding.TileWise`,
:class:`~medadv.models.sliding.SlidingWindow`) live in :mod:`medadv.models.sliding`; the function lives here
because it drives an attack (the models sit below the attacks and import none of them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..models.sliding import TileWise, _pad_to_roi, _roi, tile_slices
from ..runtime import attack_mode, model_device
from ..threats import per_sample_norm
from .base import Attack, AttackDetails, AttackResult

__all__ = ["TileDetails", "attack_tilewise"]


@dataclass
class TileDetails(AttackDetails):
    """The typed details of :func:`attack_tilewise`: each tile batch's own details, in tile order."""

    tiles: list[AttackDetails | None] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The compat dict view, nested: ``extras["tiles"][i]`` is tile batch ``i``'s own extras dict."""
        return {"tiles": [{} if d is None else d.as_dict() for d in self.tiles]}


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
            :class:`~medadv.models.sliding.TileWise`; pass a :class:`~medadv.models.sliding.SlidingWindow` to
            evaluate as Malik et al. do).

    Returns an :class:`~medadv.attacks.base.AttackResult` for the whole volumes; ``details.tiles``
    (:class:`TileDetails`) lists each tile batch's own details (for VAFA, its quantisation tables) in
    tile order (``extras["tiles"]``: the same as dicts).
    """
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
        details=TileDetails(tiles=tiles),
    )
