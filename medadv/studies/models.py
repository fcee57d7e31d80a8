"""Generalizability vs robustness (Paschali et al. 2018): several models, the same data and attacks.

Each model is attacked white-box by every attack (the same instances, so the same settings) and the table
puts its clean metric next to its adversarial one. Two models with about the same clean score can differ a
lot under attack: that is the paper's argument for reporting robustness next to clean performance. For
Paschali et al.'s black-box version (examples crafted on the other models) use :func:`~medadv.studies.transfer`.

Model-to-model similarity of class-wise behaviour (Medi, Grabinski & Keuper 2024, App. B, Fig. 7: "cosine
similarities between the class-wise predictions across different models"; spec 004 ambiguity A7). For every
condition (clean, and each attack on each model's own examples) and every pair of models, ``meta["cosine"]``
holds the cosine similarity of two class-wise vectors:

* ``recall``: per-class recall ``M_jj / N_j`` (multi-class, and voxel-level for segmentation) or per-label
  sensitivity ``TP / (TP + FN)`` (multi-label); classes without support are left out of both vectors;
* ``errors``: the error pattern, the off-diagonal entries of the confusion matrix (multi-class, segmentation:
  which class is mistaken for which) or the per-label counts of missed and spurious findings (multi-label) — the
  spec's recommended primary reading (recall vectors of balanced data are all close to 1).

A cosine is ``None`` when a vector is all zeros (e.g. recall 0 for every class under a strong attack). Tasks
without classes (regression) get no ``cosine``.
"""

from __future__ import annotations

import math
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

__all__ = ["models", "cosine"]


def _class_counts(task: Task, logits: Tensor, y: Tensor) -> tuple[str, Tensor] | None:
    """Class-wise counts of one batch on the CPU (int64): exclusive classes (multi-class, segmentation)
    ``("confusion", (C, C))`` over the valid elements (rows = truth, columns = prediction); multi-label
    ``("labels", (3, L))`` with TP, FN, FP per label; ``None`` for a task without classes."""
    y = y.to(logits.device)
    if task.class_scores and task.exclusive_classes:
        c = int(getattr(task, "num_classes", None) or logits.shape[1])
        pred, truth = task.predict(logits).long(), y.long()
        valid = task.valid_mask(y)
        if valid is not None:
            pred, truth = pred[valid], truth[valid]
        idx = (truth.reshape(-1) * c + pred.reshape(-1)).cpu()
        return "confusion", torch.bincount(idx, minlength=c * c).reshape(c, c)
    if task.class_scores and task.classwise_view == "labels":
        pred, truth = task.predict(logits) > 0.5, y > 0.5
        counts = torch.stack([(pred & truth).sum(0), (~pred & truth).sum(0), (pred & ~truth).sum(0)])
        return "labels", counts.long().cpu()
    return None


def _vectors(kind: str, counts: Tensor) -> dict[str, Tensor]:
    """``recall`` and ``errors`` vectors (float64; NaN where undefined) of :func:`_class_counts` counts."""
    m = counts.double()
    if kind == "confusion":
        support = m.sum(1)
        recall = torch.where(support > 0, m.diagonal() / support.clamp_min(1.0), torch.full_like(support, math.nan))
        off = ~torch.eye(m.shape[0], dtype=torch.bool)
        return {"recall": recall, "errors": m[off]}
    tp, fn, fp = m
    support = tp + fn
    recall = torch.where(support > 0, tp / support.clamp_min(1.0), torch.full_like(support, math.nan))
    return {"recall": recall, "errors": torch.cat([fn, fp])}


def cosine(u: Tensor, v: Tensor) -> float | None:
    """Cosine similarity of two vectors over the entries defined (finite) in both; ``None`` when either is all
    zeros there (undefined)."""
    keep = torch.isfinite(u) & torch.isfinite(v)
    a, b = u[keep].double(), v[keep].double()
    na, nb = a.norm(), b.norm()
    if not keep.any() or float(na) == 0.0 or float(nb) == 0.0:
        return None
    return float((a @ b) / (na * nb))


def _similarity(vectors: dict[str, dict[str, dict[str, Tensor]]], names: list[str],
                conditions: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``meta["cosine"]`` (per vector kind, per condition: a models × models matrix) and one row per model pair
    and condition."""
    out: dict[str, Any] = {"models": names, "conditions": conditions, "recall": {}, "errors": {},
                           "vectors": {m: {c: [None if math.isnan(v) else v for v in vectors[m][c]["recall"].tolist()]
                                           for c in conditions} for m in names}}
    rows: list[dict[str, Any]] = []
    for cond in conditions:
        for kind in ("recall", "errors"):
            out[kind][cond] = [[cosine(vectors[a][cond][kind], vectors[b][cond][kind]) for b in names] for a in names]
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                rows.append({"model_a": a, "model_b": b, "condition": cond,
                             "recall_cosine": cosine(vectors[a][cond]["recall"], vectors[b][cond]["recall"]),
                             "errors_cosine": cosine(vectors[a][cond]["errors"], vectors[b][cond]["errors"])})
    return out, rows


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
        Tasks with classes also get ``meta["cosine"]`` (Medi et al.'s cross-model cosine similarity):
        ``{"models", "conditions" (["clean", "<attack>@<budget>", ...]), "recall": {condition: matrix},
        "errors": {condition: matrix}, "vectors": {model: {condition: per-class recall}}}`` (matrices models ×
        models, ``None`` where undefined) and ``meta["cosine_rows"]``: one row ``{model_a, model_b, condition,
        recall_cosine, errors_cosine}`` per pair of models and condition.
    """
    check_task(task)
    nets = check_models(models, "models")
    nets = {k: task.logits_model(m) for k, m in nets.items()}  # declared probabilities: logits
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the models study compares clean and attacked metrics")
    rows: list[dict[str, Any]] = []
    conditions = ["clean"] + [key(aname, atk.budget) for aname, atk in named]
    vectors: dict[str, dict[str, dict[str, Tensor]]] = {}
    for mname, net in nets.items():
        clean: list[Tensor] = []
        adv: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
        counts: dict[str, tuple[str, Tensor]] = {}
        for batch in attacked_batches(net, task, data, named, target_fn):
            clean.append(robust_metric(task, batch.clean_logits, batch.y))
            outputs = [batch.clean_logits] + [att.result.logits for att in batch.attacked]
            for i, att in enumerate(batch.attacked):
                adv[i].append(robust_metric(task, att.result.logits, batch.y))
            for cond, logits in zip(conditions, outputs, strict=True):
                got = _class_counts(task, logits.detach(), batch.y)
                if got is not None:
                    counts[cond] = (got[0], got[1] + counts[cond][1]) if cond in counts else got
        if not clean:
            raise ValueError("`data` is empty")
        if counts:
            vectors[mname] = {cond: _vectors(*counts[cond]) for cond in conditions}
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
    meta: dict[str, Any] = {"metric": task.robust_metric_name, "models": list(nets), "ranking": ranking}
    if vectors and len(vectors) == len(nets):
        meta["cosine"], meta["cosine_rows"] = _similarity(vectors, list(nets), conditions)
    return StudyResult("models", rows, meta)
