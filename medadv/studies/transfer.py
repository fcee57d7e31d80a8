"""Transfer (black-box) attacks: crafted on surrogate models, applied to target models (Paschali et al. 2018;
Malik et al. 2024).

Each attack instance is run once per surrogate and batch; the adversarial batch it returns is then fed to
every target. The table has one row per (attack, budget, surrogate, target): the target's clean metric, its
metric on the transferred examples and the fooling rate (the target's ``task.fooled`` on them: untargeted,
the prediction left the label; targeted, it reached the target). When a surrogate is also a target (the
same object), that cell is the white-box result.

``meta["summary"]`` gives Paschali et al.'s per-target summary: ``avg`` = the unweighted mean of the
target's adversarial metric over every black-box (attack, budget, surrogate) cell, ``drop_points`` =
``100 · (clean − avg)`` (percentage points, as in their Table 1).
"""

from __future__ import annotations

from collections.abc import Mapping
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
    named_attacks,
    robust_metric,
)
from .base import StudyResult

__all__ = ["transfer", "transfer_summary"]


def transfer_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target: ``clean``, ``avg`` (mean ``adv`` over its black-box cells: white-box rows, where the surrogate is
    the target itself, are left out) and ``drop_points = 100 (clean − avg)``."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = out.setdefault(r["target"], {"target": r["target"], "clean": r["clean"], "values": []})
        if r["adv"] is not None and not r.get("white_box", False):
            entry["values"].append(r["adv"])
    table = []
    for entry in out.values():
        vals = entry.pop("values")
        avg = sum(vals) / len(vals) if vals else None
        drop = None if avg is None or entry["clean"] is None else 100.0 * (entry["clean"] - avg)
        table.append({**entry, "avg": avg, "drop_points": drop, "cells": len(vals)})
    return table


def transfer(
    surrogates: Mapping[str, nn.Module],
    targets: Mapping[str, nn.Module],
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    target_fn: TargetFn | None = None,
) -> StudyResult:
    """Surrogate × target table of transferred attacks.

    Args:
        surrogates: ``{name: model}`` the attacks are crafted on.
        targets: ``{name: model}`` the adversarial examples are evaluated on (one task for all models).
        task: how to read every model's output.
        data: an ``(x, y)`` pair or an iterable of ``(x, y)`` batches.
        attacks: one attack, a list or a ``{name: attack}`` mapping; each instance is crafted once per surrogate
            and batch and its examples are reused across all targets.
        target_fn: ``target_fn(x, y, clean_logits_of_the_surrogate) -> target`` for targeted attacks.

    Returns:
        ``StudyResult("transfer")``: rows ``{attack, budget, surrogate, target, clean, adv, fooling_rate}`` where
        ``clean``/``adv`` are means of the task's robust metric (``meta["metric"]``: accuracy, exact match or
        mean Dice) over the samples; ``meta["summary"]`` per target (:func:`transfer_summary`).
    """
    check_task(task)
    sur = check_models(surrogates, "surrogates")
    tgt = check_models(targets, "targets")
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: transfer needs at least one attack")
    check_targets(named, target_fn)
    clean_metric: dict[str, list[Tensor]] = {t: [] for t in tgt}
    adv_metric: dict[tuple[int, str, str], list[Tensor]] = {}
    fooled: dict[tuple[int, str, str], list[Tensor]] = {}
    for x, y in batches(data):
        clean_logits = {}
        for tname, tmodel in tgt.items():
            logits = forward(tmodel, x)
            task.validate(logits, y.to(logits.device), "y")
            clean_logits[tname] = logits
            clean_metric[tname].append(robust_metric(task, logits, y))
        for sname, smodel in sur.items():
            dev = model_device(smodel, x.device)
            xs, ys = x.to(dev), y.to(dev)
            s_logits = forward(smodel, xs)
            for i, (_, atk) in enumerate(named):
                goal = target_fn(xs, ys, s_logits) if target_fn is not None and is_targeted(atk) else ys
                x_adv = atk(smodel, xs, goal).x_adv  # crafted once, reused for every target
                for tname, tmodel in tgt.items():
                    logits = forward(tmodel, x_adv)
                    adv_metric.setdefault((i, sname, tname), []).append(robust_metric(task, logits, y))
                    hit = task.fooled(logits, goal.to(logits.device), is_targeted(atk))
                    fooled.setdefault((i, sname, tname), []).append(hit.detach().cpu().double())
    if not any(clean_metric.values()):
        raise ValueError("`data` is empty")
    clean_mean = {t: float(torch.cat(v).mean()) for t, v in clean_metric.items()}
    rows = []
    for i, (name, atk) in enumerate(named):
        for sname in sur:
            for tname in tgt:
                rows.append({
                    "attack": name, "budget": atk.budget, "surrogate": sname, "target": tname,
                    "clean": clean_mean[tname], "adv": float(torch.cat(adv_metric[(i, sname, tname)]).mean()),
                    "fooling_rate": float(torch.cat(fooled[(i, sname, tname)]).mean()),
                    "white_box": sur[sname] is tgt[tname],
                })
    meta = {"metric": task.robust_metric_name, "surrogates": list(sur), "targets": list(tgt),
            "summary": transfer_summary(rows)}
    return StudyResult("transfer", rows, meta)
