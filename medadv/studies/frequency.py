"""Where an attack's damage lives in frequency (Malik et al. 2024), as a study over any task.

For every attack, the perturbation ``δ = x_adv − x`` is restricted to a band of DCT coefficients with
:func:`medadv.frequency.filtered_attack` (``clip(x + IDCT(DCT(δ) ⊙ M))``) and the model is evaluated on the
filtered input. The default bands are the low-pass cube ``[0, n)`` along every axis and its exact complement
(``high``), with ``n = round(cutoff · size)``; any ``{name: mask}`` can be given instead. Rows report the
task's robust metric (accuracy, exact match or mean Dice) on the clean input (band ``"clean"``), the full
attack (``"full"``) and each band, with ``retained`` = the share of the attack's metric drop the band keeps,
``(clean − band) / (clean − full)`` (``None`` when the attack did not lower the metric).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..dct import normalize_block
from ..frequency import filtered_attack, highpass_mask, lowpass_mask
from ..tasks import Task
from ._common import (
    AttackSpec,
    TargetFn,
    add_notes,
    attacked_batches,
    check_model,
    check_task,
    forward,
    named_attacks,
    renormalization_notes,
    robust_metric,
)
from .base import StudyResult

__all__ = ["frequency", "default_bands"]


def default_bands(block: Sequence[int], cutoff: float) -> dict[str, Tensor]:
    """``{"low": [0, n) cube, "high": its complement}`` over a coefficient grid, ``n = round(cutoff · min(block))``."""
    if not 0.0 < float(cutoff) < 1.0:
        raise ValueError(f"`cutoff` must be in (0, 1) (a fraction of the tile size), got {cutoff}")
    n = max(1, min(min(block) - 1, round(float(cutoff) * min(block))))
    return {"low": lowpass_mask(tuple(block), n), "high": highpass_mask(tuple(block), n)}


def frequency(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    cutoff: float = 0.25,
    bands: Mapping[str, Tensor] | None = None,
    tile: int | Sequence[int] | None = None,
    target_fn: TargetFn | None = None,
) -> StudyResult:
    """Robust metric of each attack restricted to low / high DCT bands.

    Args:
        model, task, data, attacks: as for ``evaluate`` (2-D images or 3-D volumes).
        cutoff: the low band is ``[0, round(cutoff · size))`` along every axis of the tile; ``high`` is the rest.
        bands: ``{name: bool mask}`` over the tile's coefficient grid instead of the default two bands.
        tile: DCT tile size in voxels (Malik et al.: 96); ``None``: one DCT over the whole image.
        target_fn: for targeted attacks, as in ``evaluate``.

    Returns:
        ``StudyResult("frequency")``: rows ``{attack, budget, band, value, retained}`` (``band`` is ``"clean"``,
        ``"full"`` or a band name; ``value`` the mean robust metric, ``meta["metric"]``). With a VAFA attack,
        ``meta["notes"]`` says whether its per-slice min–max renormalisation was on and how that bears on the
        low-frequency reading (:func:`~medadv.studies._common.renormalization_notes`).
    """
    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the frequency study filters each attack's perturbation")
    sums: dict[tuple[int, str], list[Tensor]] = {}
    clean: list[Tensor] = []
    names: list[str] = []
    for batch in attacked_batches(model, task, data, named, target_fn):
        x, y = batch.x, batch.y
        block = tuple(x.shape[2:]) if tile is None else normalize_block(tile, x.ndim - 2)
        masks = dict(bands) if bands is not None else default_bands(block, cutoff)
        names = list(masks)
        clean.append(robust_metric(task, batch.clean_logits, y))
        for i, att in enumerate(batch.attacked):
            x_adv = att.result.x_adv.to(x.device)
            sums.setdefault((i, "full"), []).append(robust_metric(task, att.result.logits, y))
            for band, mask in masks.items():
                xf = filtered_attack(x, x_adv, mask, att.attack.box, tile)
                sums.setdefault((i, band), []).append(robust_metric(task, forward(model, xf), y))
    if not clean:
        raise ValueError("`data` is empty")
    c = float(torch.cat(clean).mean())
    rows: list[dict[str, Any]] = []
    for i, (name, atk) in enumerate(named):
        full = float(torch.cat(sums[(i, "full")]).mean())
        drop = c - full
        rows.append({"attack": name, "budget": atk.budget, "band": "clean", "value": c, "retained": None})
        rows.append({"attack": name, "budget": atk.budget, "band": "full", "value": full,
                     "retained": 1.0 if drop > 0 else None})
        for band in names:
            v = float(torch.cat(sums[(i, band)]).mean())
            rows.append({"attack": name, "budget": atk.budget, "band": band, "value": v,
                         "retained": (c - v) / drop if drop > 0 else None})
    tile_meta = tile if tile is None or isinstance(tile, int) else [int(t) for t in tile]
    meta: dict[str, Any] = {"metric": task.robust_metric_name, "cutoff": cutoff, "tile": tile_meta, "bands": names}
    add_notes(meta, renormalization_notes(named))
    return StudyResult("frequency", rows, meta)
