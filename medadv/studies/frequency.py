"""Where an attack's damage lives in frequency (Malik et al. 2024), as a study over any task.

For every attack, the perturbation ``δ = x_adv − x`` is restricted to a band of DCT coefficients with
:func:`medadv.frequency.filtered_attack` (``clip(x + IDCT(DCT(δ) ⊙ M))``) and the model is evaluated on the
filtered input. The default bands are the low-pass cube ``[0, n)`` along every axis and its exact complement
(``high``), with ``n = round(cutoff · size)``; any ``{name: mask}`` can be given instead. Rows report the
task's robust metric (accuracy, exact match or mean Dice) on the clean input (band ``"clean"``), the full
attack (``"full"``) and each band, with ``retained`` = the share of the attack's metric drop the band keeps,
``(clean − band) / (clean − full)`` (``None`` when the attack did not lower the metric).

Bands can also be given as coefficient index ranges ``{name: (lo, hi)}``: the cube ``[lo, hi)`` along every axis
(:func:`medadv.frequency.keep_cube`), ``hi`` equal to the grid size (or ``None``) meaning "to the end of every
axis". ``bands="malik2024"`` is Malik et al.'s five filters (:func:`malik2024_bands`): ``0-8``, ``0-16``,
``0-32``, ``16-48`` and ``16-96`` on their 96³ tiles, scaled to the grid. Their "16–96" keeps the coefficients
whose three indices are all >= 16: it is **not** the complement of the low band (spec 003 §3.8).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict, field_validator, model_validator
from pydantic_core import PydanticCustomError
from torch import Tensor, nn

from ..dct import normalize_block
from ..frequency import filtered_attack, highpass_mask, keep_cube, lowpass_mask
from ..report.blocks import (
    Bullets,
    Section,
    StudyLike,
    bars,
    data_table,
    escape,
    figure_image,
    group_rows,
    legend_top,
    pyplot,
    raw_table,
    setting_key,
    study_metric,
)
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
from .registry import Number, StudySpec, one_model, register_study

__all__ = ["frequency", "default_bands", "malik2024_bands", "band_ranges", "MALIK2024_BANDS"]

#: Malik et al.'s five DCT filters (Figs. 3 and 9) as ``[lo, hi)`` coefficient ranges on their 96³ tiles
MALIK2024_BANDS: dict[str, tuple[int, int]] = {"0-8": (0, 8), "0-16": (0, 16), "0-32": (0, 32),
                                                "16-48": (16, 48), "16-96": (16, 96)}
#: the tile size :data:`MALIK2024_BANDS` is given at
MALIK2024_TILE = 96
#: band names the rows use for themselves
_RESERVED = ("clean", "full")

_BandRange = tuple[int, int | None]
_BandsArg = Mapping[str, Tensor | Sequence[int | None]] | str | None


def default_bands(block: Sequence[int], cutoff: float) -> dict[str, Tensor]:
    """``{"low": [0, n) cube, "high": its complement}`` over a coefficient grid, ``n = round(cutoff · min(block))``."""
    if not 0.0 < float(cutoff) < 1.0:
        raise ValueError(f"`cutoff` must be in (0, 1) (a fraction of the tile size), got {cutoff}")
    n = max(1, min(min(block) - 1, round(float(cutoff) * min(block))))
    return {"low": lowpass_mask(tuple(block), n), "high": highpass_mask(tuple(block), n)}


def malik2024_bands(n: int) -> dict[str, tuple[int, int]]:
    """Malik et al.'s five filters on a coefficient grid of size ``n``: each index of
    :data:`MALIK2024_BANDS` scaled as ``round(v · n / 96)`` (at ``n = 32``: ``(0, 3), (0, 5), (0, 11), (5, 16),
    (5, 32)``). A band that would be empty after rounding (a grid too small) is refused."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a positive grid size, got {n!r}")
    out = {}
    for name, (lo, hi) in MALIK2024_BANDS.items():
        a, b = round(lo * n / MALIK2024_TILE), round(hi * n / MALIK2024_TILE)
        if b <= a:
            raise ValueError(f"the malik2024 band {name!r} is empty on a grid of {n} coefficients ([{a}, {b})): "
                             "use a larger `tile` or explicit `bands`")
        out[name] = (a, b)
    return out


def band_ranges(bands: str | Mapping[str, Sequence[int | None]], n: int) -> dict[str, tuple[int, int]]:
    """``{name: (lo, hi)}`` coefficient ranges of a band spec on a grid of size ``n`` (the tile's smallest side):
    ``"malik2024"`` (:func:`malik2024_bands`) or explicit ``{name: (lo, hi)}`` (``hi=None``: ``n``); each must
    satisfy ``0 <= lo < hi <= n``."""
    if isinstance(bands, str):
        if bands != "malik2024":
            raise ValueError(f"`bands` must be 'malik2024' or {{name: [lo, hi]}} ranges, got {bands!r}")
        return malik2024_bands(n)
    if not isinstance(bands, Mapping) or not bands:
        raise ValueError(f"`bands` must be 'malik2024' or a non-empty {{name: [lo, hi]}} mapping, got {bands!r}")
    out = {}
    for name, rng in bands.items():
        lo, hi = _pair(name, rng)
        hi = n if hi is None else hi
        if hi > n:
            raise ValueError(f"`bands[{name!r}]` = [{lo}, {hi}] goes past the {n} coefficients of the tile "
                             f"(need 0 <= lo < hi <= {n})")
        out[str(name)] = (lo, hi)
    return out


def _pair(name: Any, rng: Any) -> _BandRange:
    """``(lo, hi)`` of one explicit band, checked on its own (``0 <= lo < hi``; ``hi`` may be None)."""
    if str(name) in _RESERVED:
        raise ValueError(f"`bands` cannot name a band {name!r}: the rows use it for the unfiltered input")
    ok = (isinstance(rng, Sequence) and not isinstance(rng, str) and len(rng) == 2
          and all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in rng) and rng[0] is not None)
    if not ok:
        raise ValueError(f"`bands[{name!r}]` must be [lo, hi] coefficient indices (hi may be null: to the end), "
                         f"got {rng!r}")
    lo, hi = int(rng[0]), None if rng[1] is None else int(rng[1])
    if lo < 0 or (hi is not None and hi <= lo):
        raise ValueError(f"`bands[{name!r}]` = [{lo}, {hi}] must satisfy 0 <= lo < hi")
    return lo, hi


def _masks(bands: _BandsArg, block: tuple[int, ...], cutoff: float
           ) -> tuple[dict[str, Tensor], dict[str, list[int]] | None]:
    """The band masks over the coefficient grid ``block`` and, for bands given as ranges, those ranges."""
    if bands is None:
        return default_bands(block, cutoff), None
    n = min(block)
    given: Mapping[str, Any]
    if isinstance(bands, str):
        ranges = band_ranges(bands, n)
        given = dict.fromkeys(ranges)
    else:
        given = bands
        explicit = {k: v for k, v in bands.items() if not isinstance(v, Tensor)}
        ranges = band_ranges(explicit, n) if explicit else {}
    masks: dict[str, Tensor] = {}
    for name, v in given.items():
        if isinstance(v, Tensor):
            if v.dtype != torch.bool or tuple(v.shape) != block:
                raise ValueError(f"`bands[{name!r}]` must be a bool mask of the tile's shape {block}, got "
                                 f"{v.dtype} {tuple(v.shape)}")
            masks[str(name)] = v
        else:
            lo, hi = ranges[str(name)]
            masks[str(name)] = keep_cube(block, lo, None if hi == n else hi)  # hi = n: to the end of every axis
    return masks, ({k: [lo, hi] for k, (lo, hi) in ranges.items()} or None)


def _check_bands(bands: _BandsArg) -> None:
    """What can be checked of ``bands`` before the grid is known (its kind, names and each range on its own)."""
    if bands is None or bands == "malik2024":
        return
    if isinstance(bands, str) or not isinstance(bands, Mapping) or not bands:
        raise ValueError(f"`bands` must be 'malik2024', a non-empty {{name: [lo, hi]}} mapping or {{name: bool "
                         f"mask}}, got {bands!r}")
    for name, v in bands.items():
        if isinstance(v, Tensor):
            if str(name) in _RESERVED:
                raise ValueError(f"`bands` cannot name a band {name!r}: the rows use it for the unfiltered input")
        else:
            _pair(name, v)


def frequency(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    cutoff: float = 0.25,
    bands: _BandsArg = None,
    tile: int | Sequence[int] | None = None,
    target_fn: TargetFn | None = None,
) -> StudyResult:
    """Robust metric of each attack restricted to low / high DCT bands.

    Args:
        model, task, data, attacks: as for ``evaluate`` (2-D images or 3-D volumes).
        cutoff: the low band is ``[0, round(cutoff · size))`` along every axis of the tile; ``high`` is the rest.
        bands: instead of the default two bands: ``{name: bool mask}`` over the tile's coefficient grid,
            ``{name: (lo, hi)}`` coefficient ranges (the cube ``[lo, hi)`` along every axis; ``hi`` ``None`` or
            the grid size ``n``: to the end of every axis; ``0 <= lo < hi <= n``, ``n`` the tile's smallest
            side), or ``"malik2024"``: Malik et al.'s five filters scaled to ``n`` (:func:`malik2024_bands`).
        tile: DCT tile size in voxels (Malik et al.: 96); ``None``: one DCT over the whole image.
        target_fn: for targeted attacks, as in ``evaluate``.

    Returns:
        ``StudyResult("frequency")``: rows ``{attack, budget, band, value, retained}`` (``band`` is ``"clean"``,
        ``"full"`` or a band name; ``value`` the mean robust metric, ``meta["metric"]``); bands given as ranges
        also give ``meta["band_ranges"]`` ``{name: [lo, hi]}`` on the grid used. With a VAFA attack,
        ``meta["notes"]`` says whether its per-slice min–max renormalisation was on and how that bears on the
        low-frequency reading (:func:`~medadv.studies._common.renormalization_notes`).
    """
    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the frequency study filters each attack's perturbation")
    _check_bands(bands)
    sums: dict[tuple[int, str], list[Tensor]] = {}
    clean: list[Tensor] = []
    grids: dict[tuple[int, ...], tuple[dict[str, Tensor], dict[str, list[int]] | None]] = {}

    def resolve(x: Tensor) -> None:
        # the masks of each grid, resolved (and a range past the grid refused) before the batch is attacked
        block = tuple(x.shape[2:]) if tile is None else tuple(normalize_block(tile, x.ndim - 2))
        if block not in grids:
            grids[block] = _masks(bands, block, cutoff)

    names: list[str] = []
    ranges: dict[str, list[int]] | None = None
    for batch in attacked_batches(model, task, data, named, target_fn, check=resolve):
        x, y = batch.x, batch.y
        block = tuple(x.shape[2:]) if tile is None else tuple(normalize_block(tile, x.ndim - 2))
        masks, ranges = grids[block]
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
    meta: dict[str, Any] = {"metric": task.robust_metric_name, "cutoff": None if bands is not None else cutoff,
                            "tile": tile_meta, "bands": names}
    if ranges is not None:
        meta["band_ranges"] = ranges
    add_notes(meta, renormalization_notes(named))
    return StudyResult("frequency", rows, meta)


# --- the report section -------------------------------------------------------------------------------------------
def _draw_frequency(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = study_metric(study, "value")
    groups = group_rows(study.rows, ["attack", "budget"])
    bands = list(dict.fromkeys(str(r["band"]) for r in study.rows))
    series = []
    for (attack, budget), rows in groups.items():
        by = {str(r["band"]): r.get("value") for r in rows}
        series.append((setting_key(attack, budget), [by.get(b) for b in bands]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(bands) * max(1, len(series)) / 2 + 2), 3.6))
    bars(ax, bands, series, metric, "attack restricted to a frequency band", None)
    legend_top(fig, ax, 3)
    notes = study.meta.get("notes") if isinstance(study.meta, Mapping) else None  # e.g. VAFA's renormalisation
    ranges = study.meta.get("band_ranges") if isinstance(study.meta, Mapping) else None
    # Malik et al.'s layout (Figs. 3/9): one row per attack, the metric clean, attacked and per filter; a band
    # given as a coefficient range says which one in its header
    label = {b: (f"{b} [{ranges[b][0]}, {ranges[b][1]})" if isinstance(ranges, Mapping) and b in ranges else b)
             for b in bands}
    table = []
    for (attack, budget), rows in groups.items():
        by = {str(r["band"]): r.get("value") for r in rows}
        table.append({"attack": setting_key(attack, budget), **{label[b]: by.get(b) for b in bands}})
    cols = ["attack", *(label[b] for b in bands)]
    caption = (f"{metric} of each attack restricted to a DCT band (clean: no attack; full: the whole perturbation)"
               + ("; a band [lo, hi) keeps the coefficients whose indices are all in [lo, hi) along every axis "
                  "(so the highest band is not the complement of a low one)" if ranges else ""))
    return Section("study-frequency", "Frequency bands (Malik et al.)",
                   "The perturbation filtered to low or high spatial frequencies: which band carries the attack.",
                   ([Bullets([escape(n) for n in notes], "warn")] if notes else [])
                   + [figure_image(fig, "frequency band bars"), data_table(table, cols, caption),
                      raw_table(study.rows, "all rows")])


# --- the config entry ---------------------------------------------------------------------------------------------
@register_study("frequency", draw=_draw_frequency)
class FrequencySpec(StudySpec):
    """The attacks restricted to low / high DCT bands (Malik et al.); ``bands: malik2024`` gives the paper's five
    filters, ``tile`` the DCT tile (default: the whole image)."""

    study: Literal["frequency"]
    cutoff: Number = Field(0.25, gt=0.0, lt=1.0)
    tile: Annotated[int, Strict(), Field(ge=1)] | Annotated[list[Annotated[int, Strict(), Field(ge=1)]],
                                                             Field(min_length=2, max_length=3)] | None = None
    #: instead of low/high at ``cutoff``: ``malik2024`` (Malik et al.'s five filters, scaled to the tile) or
    #: ``{name: [lo, hi]}`` coefficient ranges (the cube ``[lo, hi)`` along every axis; ``hi: null``: to the end)
    bands: Literal["malik2024"] | Annotated[dict[str, list[Annotated[int, Strict()] | None]], Field(min_length=1)] \
        | None = None

    @field_validator("bands")
    @classmethod
    def _ranges(cls, bands: str | dict[str, list[int | None]] | None) -> str | dict[str, list[int | None]] | None:
        if isinstance(bands, dict):
            for name, rng in bands.items():
                try:
                    _pair(name, rng)
                except ValueError as e:
                    raise PydanticCustomError("bands", "{error}", {"error": str(e)}) from None
        return bands

    @model_validator(mode="after")
    def _one_way(self) -> FrequencySpec:
        if self.bands is not None and "cutoff" in self.model_fields_set:
            raise PydanticCustomError("frequency_bands", "give `cutoff` (low/high) or `bands`, not both: with "
                                      "`bands` the cutoff is not used")
        return self

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        return frequency(one_model(models, self), task, data, attacks if attacks is not None else {}, cutoff=self.cutoff,
                         bands=self.bands, tile=self.tile, target_fn=target_fn)
