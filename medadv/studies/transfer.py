"""Transfer (black-box) attacks: crafted on surrogate models, applied to target models (Paschali et al. 2018;
Malik et al. 2024).

Each attack instance is run once per surrogate and batch; the adversarial batch it returns is then fed to
every target. The table has one row per (attack, budget, surrogate, target): the target's clean metric, its
metric on the transferred examples, their drop (``drop_points = 100 (clean − adv)``, Paschali's "% Drop" in
percentage points, and ``drop_pct = 100 (clean − adv) / clean``, the relative drop) and the fooling rate (the
target's ``task.fooled`` on them: untargeted, the prediction left the label; targeted, it reached the target).
When a surrogate is also a target (the same object), that cell is the white-box result. The rows of one attack
are Paschali et al.'s Table 2 block (evaluated model × source model). With ``hd95=True`` (segmentation) each
row also has the target's HD95 clean and on the transferred examples (Malik et al.'s transfer tables: DSC and
HD95).

``meta["summary"]`` gives Paschali et al.'s per-target summary: ``avg`` = the unweighted mean of the
target's adversarial metric over every black-box (attack, budget, surrogate) cell, ``drop_points`` =
``100 · (clean − avg)`` (percentage points, as in their Table 1), ``drop_pct`` the relative drop, and
``avg_all_cells`` / ``drop_points_all_cells`` with the white-box diagonal included (their Table 1's Avg).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..runtime import model_device
from ..tasks import Task
from ._common import (
    AttackSpec,
    TargetFn,
    batches,
    check_models,
    check_targets,
    check_task,
    forward,
    is_targeted,
    mean,
    named_attacks,
    robust_metric,
    target_for,
)
from .base import StudyResult

__all__ = ["transfer", "transfer_summary"]


def transfer_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target: ``clean``, ``avg`` (mean ``adv`` over its black-box cells: white-box rows, where the surrogate is
    the target itself, are left out), ``drop_points = 100 (clean − avg)`` and ``drop_pct = 100 (clean − avg) /
    clean`` (relative); ``avg_all_cells`` / ``drop_points_all_cells``: the same over every cell including the
    white-box diagonal (Paschali et al.'s Table 1 "Avg" is the plain mean of the 9 Table 2 cells, diagonal
    included)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = out.setdefault(r["target"], {"target": r["target"], "clean": r["clean"], "values": [], "all": []})
        if r["adv"] is not None:
            entry["all"].append(r["adv"])
            if not r.get("white_box", False):
                entry["values"].append(r["adv"])
    table = []
    for entry in out.values():
        vals, every = entry.pop("values"), entry.pop("all")
        avg = sum(vals) / len(vals) if vals else None
        avg_all = sum(every) / len(every) if every else None
        clean = entry["clean"]
        drops = _drops(clean, avg) if avg is not None and clean is not None else \
            {"drop_points": None, "drop_pct": None}
        table.append({**entry, "avg": avg, **drops, "cells": len(vals), "avg_all_cells": avg_all,
                      "drop_points_all_cells": None if avg_all is None or clean is None else 100.0 * (clean - avg_all)})
    return table


def _drops(clean: float, adv: float) -> dict[str, float | None]:
    """``drop_points = 100 (clean − adv)`` (Paschali's "% Drop", percentage points) and ``drop_pct =
    100 (clean − adv) / clean`` (relative drop in percent; ``None`` when ``clean`` is 0)."""
    return {"drop_points": 100.0 * (clean - adv), "drop_pct": 100.0 * (clean - adv) / clean if clean else None}


def _check_hd95(task: Task, hd95: Any, spacing: Any) -> None:
    if not isinstance(hd95, bool):
        raise TypeError(f"`hd95` must be True or False, got {hd95!r}")
    if hd95 and not isinstance(getattr(task, "num_classes", None), int):
        raise ValueError(f"`hd95=True` needs a segmentation task (label maps with `num_classes`), got {task!r}; "
                         "HD95 is a distance between label maps and does not apply to classifiers")
    if spacing is None:
        return
    values = [spacing] if isinstance(spacing, int | float) else spacing
    if isinstance(values, str) or not isinstance(values, Sequence) or not values \
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                       for v in values):
        raise ValueError(f"`spacing` must be a positive number or one positive number per spatial axis (mm), "
                         f"got {spacing!r}")


def _case_hd95(task: Task, logits: Tensor, y: Tensor, spacing: Any) -> Tensor:
    """Per-case HD95 ``(N,)`` on the CPU (float64): the mean over the classes the task's mean Dice counts
    (background only with ``include_background``) of the 95th-percentile Hausdorff distance, in the units of
    ``spacing`` (voxels when ``None``). A class absent from the label is skipped; a class in the label that the
    prediction lost gets the volume diagonal (so erasing an organ is not dropped from the mean: Malik et al.,
    spec 003 ambiguity 4, as :func:`medadv.metrics.attack_success.segmentation_asr`). NaN when no class counts."""
    from ..metrics.attack_success import _hd95_filled

    k = int(getattr(task, "num_classes"))  # noqa: B009 (checked by _check_hd95)
    y = y.to(logits.device)
    pred = task.predict(logits)
    valid = task.valid_mask(y)
    kk = k
    if valid is not None:  # ignored voxels become an extra class k in both maps; its column is dropped
        kk = k + 1
        y = torch.where(valid, y.long(), torch.full_like(y, k).long())
        pred = torch.where(valid, pred, torch.full_like(pred, k))
    hd = _hd95_filled(pred, y.long(), kk, spacing)[:, :k]
    classes = torch.arange(k, device=y.device).reshape(1, -1, *([1] * (y.ndim - 1)))
    present = (y.unsqueeze(1) == classes).flatten(2).any(dim=2).to(hd.device)
    hd = torch.where(present, hd, torch.full_like(hd, math.nan))
    first = 0 if getattr(task, "include_background", True) else 1
    return hd[:, first:].double().nanmean(dim=1).cpu()


def transfer(
    surrogates: Mapping[str, nn.Module],
    targets: Mapping[str, nn.Module],
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    target_fn: TargetFn | None = None,
    hd95: bool = False,
    spacing: float | Sequence[float] | None = None,
) -> StudyResult:
    """Surrogate × target table of transferred attacks (Paschali et al. 2018, Table 2; Malik et al. 2024).

    Args:
        surrogates: ``{name: model}`` the attacks are crafted on.
        targets: ``{name: model}`` the adversarial examples are evaluated on (one task for all models).
        task: how to read every model's output.
        data: an ``(x, y)`` pair or an iterable of ``(x, y)`` batches.
        attacks: one attack, a list or a ``{name: attack}`` mapping; each instance is crafted once per surrogate
            and batch and its examples are reused across all targets.
        target_fn: ``target_fn(x, y, clean_logits_of_the_surrogate) -> target`` for targeted attacks.
        hd95: also give each target's HD95 clean and on the transferred examples (segmentation tasks only:
            a task without ``num_classes`` is refused).
        spacing: voxel size for HD95 (mm), one number or one per spatial axis; ``None``: voxel units (as Malik
            et al., whose HD95 is in voxels of the resampled grid).

    Returns:
        ``StudyResult("transfer")``: rows ``{attack, budget, surrogate, target, clean, adv, drop_points, drop_pct,
        fooling_rate, white_box}`` where ``clean``/``adv`` are means of the task's robust metric
        (``meta["metric"]``: accuracy, exact match or mean Dice) over the samples, ``drop_points = 100 (clean −
        adv)`` (points) and ``drop_pct = 100 (clean − adv) / clean`` (relative, percent; ``None`` when clean is 0);
        with ``hd95`` also ``hd95_clean``/``hd95_adv``: the mean over the cases of the per-case HD95
        (:func:`_case_hd95`; units of ``spacing``, ``None`` when undefined for every case).
        ``meta["summary"]`` per target (:func:`transfer_summary`).
    """
    check_task(task)
    _check_hd95(task, hd95, spacing)
    sur, tgt = check_models(surrogates, "surrogates"), check_models(targets, "targets")
    seen: dict[int, nn.Module] = {}  # one wrapper per model: a surrogate that is a target stays white-box (`is`)
    sur, tgt = ({k: seen.setdefault(id(m), task.logits_model(m)) for k, m in d.items()} for d in (sur, tgt))
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: transfer needs at least one attack")
    check_targets(named, target_fn)
    clean_metric: dict[str, list[Tensor]] = {t: [] for t in tgt}
    adv_metric: dict[tuple[int, str, str], list[Tensor]] = {}
    fooled: dict[tuple[int, str, str], list[Tensor]] = {}
    clean_hd: dict[str, list[Tensor]] = {t: [] for t in tgt}
    adv_hd: dict[tuple[int, str, str], list[Tensor]] = {}
    for x, y in batches(data):
        for tname, tmodel in tgt.items():
            logits = forward(tmodel, x)
            task.validate(logits, y.to(logits.device), "y")
            clean_metric[tname].append(robust_metric(task, logits, y))
            if hd95:
                clean_hd[tname].append(_case_hd95(task, logits, y, spacing))
        for sname, smodel in sur.items():
            dev = model_device(smodel, x.device)
            xs, ys = x.to(dev), y.to(dev)
            s_logits = forward(smodel, xs)
            for i, (aname, atk) in enumerate(named):
                fn = target_for(target_fn, aname)  # one function, or one per attack name
                goal = fn(xs, ys, s_logits) if fn is not None and is_targeted(atk) else ys
                x_adv = atk(smodel, xs, goal).x_adv  # crafted once, reused for every target
                for tname, tmodel in tgt.items():
                    logits = forward(tmodel, x_adv)
                    adv_metric.setdefault((i, sname, tname), []).append(robust_metric(task, logits, y))
                    hit = task.fooled(logits, goal.to(logits.device), is_targeted(atk))
                    fooled.setdefault((i, sname, tname), []).append(hit.detach().cpu().double())
                    if hd95:
                        adv_hd.setdefault((i, sname, tname), []).append(_case_hd95(task, logits, y, spacing))
    if not any(clean_metric.values()):
        raise ValueError("`data` is empty")
    clean_mean = {t: float(torch.cat(v).mean()) for t, v in clean_metric.items()}
    rows = []
    for i, (name, atk) in enumerate(named):
        for sname in sur:
            for tname in tgt:
                adv = float(torch.cat(adv_metric[(i, sname, tname)]).mean())
                row: dict[str, Any] = {
                    "attack": name, "budget": atk.budget, "surrogate": sname, "target": tname,
                    "clean": clean_mean[tname], "adv": adv, **_drops(clean_mean[tname], adv),
                    "fooling_rate": float(torch.cat(fooled[(i, sname, tname)]).mean()),
                    "white_box": sur[sname] is tgt[tname],
                }
                if hd95:
                    row["hd95_clean"] = mean(torch.cat(clean_hd[tname]))
                    row["hd95_adv"] = mean(torch.cat(adv_hd[(i, sname, tname)]))
                rows.append(row)
    meta: dict[str, Any] = {"metric": task.robust_metric_name, "surrogates": list(sur), "targets": list(tgt),
                            "summary": transfer_summary(rows)}
    if hd95:
        meta["hd95_units"] = "voxels" if spacing is None else "units of `spacing` (mm)"
    return StudyResult("transfer", rows, meta)
