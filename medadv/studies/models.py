"""Generalizability vs robustness (Paschali et al. 2018): several models, the same data and attacks.

Each model is attacked white-box by every attack (the same instances, so the same settings) and the table
puts its clean metric next to its adversarial one. Two models with about the same clean score can differ a
lot under attack: that is the paper's argument for reporting robustness next to clean performance. For
Paschali et al.'s black-box version (examples crafted on the other models) use :func:`~medadv.studies.transfer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..tasks import Task
from ._common import (
    AttackSpec,
    TargetFn,
    attacked_batches,
    check_models,
    check_task,
    key,
    named_attacks,
    robust_metric,
)
from .base import StudyResult

__all__ = ["models"]


def models(
    models: Mapping[str, nn.Module],
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    target_fn: TargetFn | None = None,
) -> StudyResult:
    """Clean vs adversarial metric of several models under the same attacks.

    Args:
        models: ``{name: model}`` (one task for all of them).
        task, data, attacks, target_fn: as for ``evaluate``.

    Returns:
        ``StudyResult("models")``: rows ``{model, clean, attack, budget, adv, drop_points}`` with the task's
        robust metric (``meta["metric"]``) averaged over the samples and ``drop_points = 100 (clean − adv)``;
        ``meta["ranking"]`` lists the models by clean metric and, per attack, by adversarial metric.
    """
    check_task(task)
    nets = check_models(models, "models")
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the models study compares clean and attacked metrics")
    rows: list[dict[str, Any]] = []
    for mname, net in nets.items():
        clean: list[Tensor] = []
        adv: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
        for batch in attacked_batches(net, task, data, named, target_fn):
            clean.append(robust_metric(task, batch.clean_logits, batch.y))
            for i, att in enumerate(batch.attacked):
                adv[i].append(robust_metric(task, att.result.logits, batch.y))
        if not clean:
            raise ValueError("`data` is empty")
        c = float(torch.cat(clean).mean())
        for i, (aname, atk) in enumerate(named):
            a = float(torch.cat(adv[i]).mean())
            rows.append({"model": mname, "clean": c, "attack": aname, "budget": atk.budget, "adv": a,
                         "drop_points": 100.0 * (c - a)})
    by_clean = sorted(nets, key=lambda m: -next(r["clean"] for r in rows if r["model"] == m))
    ranking: dict[str, list[str]] = {"clean": by_clean}
    for aname, atk in named:
        sub = [r for r in rows if r["attack"] == aname and r["budget"] == atk.budget]
        ranking[key(aname, atk.budget)] = [r["model"] for r in sorted(sub, key=lambda r: -r["adv"])]
    return StudyResult("models", rows, {"metric": task.robust_metric_name, "models": list(nets), "ranking": ranking})
