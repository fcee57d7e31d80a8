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

Malik et al. 2024, Table 1 (segmentation, ``hd95=True``): each row also has the model's mean per-case HD95 clean
and attacked and ``asr_h = hd95_adv − hd95_clean``, next to ``drop_points`` (their ASR-D, in points). Both are
signed differences of dataset means, as their tables are (spec 003 §2), not means of per-case absolute values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict, model_validator
from pydantic_core import PydanticCustomError
from torch import Tensor, nn

from ..report.blocks import (
    PALETTE,
    Section,
    StudyLike,
    data_table,
    figure_image,
    grid,
    heatmap,
    is_nan,
    pyplot,
    setting_key,
    study_metric,
    style_axes,
)
from ..tasks import Task
from ._common import (
    AttackSpec,
    TargetFn,
    attacked_batches,
    check_models,
    check_task,
    key,
    mean,
    named_attacks,
    robust_metric,
)
from .base import StudyResult
from .registry import StudySpec, pick_models, register_study
from .transfer import _case_hd95, _check_hd95

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
    hd95: bool = False,
    spacing: float | Sequence[float] | None = None,
) -> StudyResult:
    """Clean vs adversarial metric of several models under the same attacks.

    Args:
        models: ``{name: model}`` (one task for all of them).
        task, data, attacks, target_fn: as for ``evaluate``.
        hd95: also each model's HD95, clean and attacked, and Malik et al.'s ASR-H (segmentation tasks only: a
            task without ``num_classes`` is refused).
        spacing: voxel size for HD95 (mm), one number or one per spatial axis; ``None``: voxel units. Only with
            ``hd95``.

    Returns:
        ``StudyResult("models")``: rows ``{model, clean, attack, budget, adv, drop_points}`` with the task's
        robust metric (``meta["metric"]``) averaged over the samples and ``drop_points = 100 (clean − adv)``;
        with ``hd95`` also ``hd95_clean``/``hd95_adv`` (the mean over the cases of the per-case HD95 of
        :func:`~medadv.studies.transfer._case_hd95`, units of ``spacing``, ``None`` when undefined for every case)
        and ``asr_h = hd95_adv − hd95_clean`` (``meta["hd95_units"]`` names the units);
        ``meta["ranking"]`` lists the models by clean metric and, per attack, by adversarial metric.
        Tasks with classes also get ``meta["cosine"]`` (Medi et al.'s cross-model cosine similarity):
        ``{"models", "conditions" (["clean", "<attack>@<budget>", ...]), "recall": {condition: matrix},
        "errors": {condition: matrix}, "vectors": {model: {condition: per-class recall}}}`` (matrices models ×
        models, ``None`` where undefined) and ``meta["cosine_rows"]``: one row ``{model_a, model_b, condition,
        recall_cosine, errors_cosine}`` per pair of models and condition.
    """
    check_task(task)
    _check_hd95(task, hd95, spacing)
    if spacing is not None and not hd95:
        raise ValueError("`spacing` is the voxel size of HD95: give it with `hd95=True` (it is not used otherwise)")
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
        clean_hd: list[Tensor] = []
        adv_hd: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
        counts: dict[str, tuple[str, Tensor]] = {}
        for batch in attacked_batches(net, task, data, named, target_fn):
            clean.append(robust_metric(task, batch.clean_logits, batch.y))
            if hd95:
                clean_hd.append(_case_hd95(task, batch.clean_logits, batch.y, spacing))
            outputs = [batch.clean_logits] + [att.result.logits for att in batch.attacked]
            for i, att in enumerate(batch.attacked):
                adv[i].append(robust_metric(task, att.result.logits, batch.y))
                if hd95:
                    adv_hd[i].append(_case_hd95(task, att.result.logits, batch.y, spacing))
            for cond, logits in zip(conditions, outputs, strict=True):
                got = _class_counts(task, logits.detach(), batch.y)
                if got is not None:
                    counts[cond] = (got[0], got[1] + counts[cond][1]) if cond in counts else got
        if not clean:
            raise ValueError("`data` is empty")
        if counts:
            vectors[mname] = {cond: _vectors(*counts[cond]) for cond in conditions}
        c = float(torch.cat(clean).mean())
        hc = mean(torch.cat(clean_hd)) if hd95 else None
        for i, (aname, atk) in enumerate(named):
            a = float(torch.cat(adv[i]).mean())
            row: dict[str, Any] = {"model": mname, "clean": c, "attack": aname, "budget": atk.budget, "adv": a,
                                   "drop_points": 100.0 * (c - a)}
            if hd95:
                ha = mean(torch.cat(adv_hd[i]))
                # Malik et al.'s ASR-H: the signed difference of the dataset means (spec 003 §2)
                row.update({"hd95_clean": hc, "hd95_adv": ha,
                            "asr_h": None if hc is None or ha is None else ha - hc})
            rows.append(row)
    by_clean = sorted(nets, key=lambda m: -next(r["clean"] for r in rows if r["model"] == m))
    ranking: dict[str, list[str]] = {"clean": by_clean}
    for aname, atk in named:
        sub = [r for r in rows if r["attack"] == aname and r["budget"] == atk.budget]
        ranking[key(aname, atk.budget)] = [r["model"] for r in sorted(sub, key=lambda r: -r["adv"])]
    meta: dict[str, Any] = {"metric": task.robust_metric_name, "models": list(nets), "ranking": ranking}
    if hd95:
        meta["hd95_units"] = "voxels" if spacing is None else "units of `spacing` (mm)"
    if vectors and len(vectors) == len(nets):
        meta["cosine"], meta["cosine_rows"] = _similarity(vectors, list(nets), conditions)
    return StudyResult("models", rows, meta)


# --- the report section -------------------------------------------------------------------------------------------
def _draw_models(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = study_metric(study)
    rows = study.rows
    settings = list(dict.fromkeys((r.get("attack"), r.get("budget")) for r in rows))
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    markers = "osD^vP*X"
    for si, s in enumerate(settings):
        for mi, m in enumerate(models):
            sel = [r for r in rows if (r.get("attack"), r.get("budget")) == s and str(r["model"]) == m]
            if sel:
                ax.scatter([sel[0].get("clean")], [sel[0].get("adv")], color=PALETTE[si % len(PALETTE)],
                           marker=markers[mi % len(markers)], s=50, label=setting_key(*s) if mi == 0 else None)
                ax.annotate(m, (float(sel[0].get("clean") or 0), float(sel[0].get("adv") or 0)), fontsize=7,
                            xytext=(4, 3), textcoords="offset points")
    vals = [float(v) for r in rows for v in (r.get("clean"), r.get("adv")) if v is not None and not is_nan(v)]
    if vals and min(vals) >= 0 and max(vals) <= 1:  # a [0, 1] metric: the whole square and the no-loss diagonal
        ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="no loss under attack")
        ax.set_xlim(0, 1.02)
        ax.set_ylim(0, 1.02)
        ax.set_aspect("equal")
    style_axes(ax, f"clean {metric}", f"attacked {metric}", "generalisation vs robustness")
    ax.legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    pivot = []
    for m in models:
        row: dict[str, Any] = {"model": m, f"clean {metric}": next((r.get("clean") for r in rows
                                                                   if str(r["model"]) == m), None)}
        for s in settings:
            row[setting_key(*s)] = next((r.get("adv") for r in rows if str(r["model"]) == m
                                  and (r.get("attack"), r.get("budget")) == s), None)
        pivot.append(row)
    blocks: list[Any] = [figure_image(fig, "clean vs attacked metric per model"),
                         data_table(pivot, list(pivot[0]) if pivot else [], f"attacked {metric} per model and attack")]
    blocks.extend(_malik_table(rows, models, settings, str(study.meta.get("hd95_units") or "voxels")))
    blocks.extend(_models_cosine(study.meta.get("cosine")))
    return Section("study-models", "Models: generalisation vs robustness (Paschali)",
                   "Several models on the same data and attacks: a better clean score does not imply robustness.",
                   blocks)


def _malik_table(rows: list[dict[str, Any]], models: list[str], settings: list[tuple[Any, Any]],
                 units: str) -> list[Any]:
    """Malik et al.'s Table 1 when the rows have HD95: a Clean row (clean DSC in % and HD95), then per attack and
    budget ASR-D (``drop_points``) and ASR-H per model, with their mean over the models."""
    if not any("asr_h" in r for r in rows):
        return []

    def cell(m: str, s: tuple[Any, Any] | None, col: str) -> Any:
        r = next((r for r in rows if str(r["model"]) == m and (s is None or (r.get("attack"), r.get("budget")) == s)),
                 None)
        return None if r is None else r.get(col)

    def avg(values: list[Any]) -> float | None:
        v = [float(x) for x in values if x is not None and not is_nan(x)]
        return sum(v) / len(v) if v else None

    table: list[dict[str, Any]] = []
    clean: dict[str, Any] = {"attack": "Clean"}
    for m in models:
        c = cell(m, None, "clean")
        clean[f"{m} D"] = None if c is None else 100.0 * float(c)
        clean[f"{m} H"] = cell(m, None, "hd95_clean")
    table.append({**clean, "Avg D": None, "Avg H": None})  # the paper leaves the clean row's average out
    for s in settings:
        row: dict[str, Any] = {"attack": setting_key(*s)}
        for m in models:
            row[f"{m} D"], row[f"{m} H"] = cell(m, s, "drop_points"), cell(m, s, "asr_h")
        row["Avg D"] = avg([row[f"{m} D"] for m in models])
        row["Avg H"] = avg([row[f"{m} H"] for m in models])
        table.append(row)
    cols = ["attack", *(f"{m} {k}" for m in models for k in ("D", "H")), "Avg D", "Avg H"]
    return [data_table(table, cols, "Malik et al., Table 1: the Clean row holds the clean DSC (%) and HD95; the "
                       "attack rows D = ASR-D (DSC drop, points: 100 × (clean − attacked)) and H = ASR-H (HD95 "
                       f"attacked − clean, {units}), signed differences of the means over the cases; Avg: the "
                       "mean over the models.")]


def _models_cosine(cos: Any) -> list[Any]:
    """Heatmaps of the models study's cross-model cosine similarities (Medi et al., Fig. 7): per condition, the
    per-class recall vectors and the error patterns, models × models."""
    if not isinstance(cos, Mapping) or not cos.get("conditions") or not cos.get("models"):
        return []
    names = [str(m) for m in cos["models"]]
    panels = [(cond, kind) for cond in cos["conditions"] for kind in ("recall", "errors")
              if isinstance(cos.get(kind), Mapping) and cos[kind].get(cond) is not None]
    if not panels:
        return []
    side = max(3.2, 1.2 + 0.7 * len(names))
    fig, axes = grid(len(panels), 2, side + 1.0, side)
    what = {"recall": "per-class recall", "errors": "error pattern (off-diagonal confusion)"}
    for ax, (cond, kind) in zip(axes, panels, strict=False):
        name, _, budget = str(cond).rpartition("@")
        try:
            label = setting_key(name, float(budget)) if name else str(cond)
        except ValueError:
            label = str(cond)
        heatmap(ax, cos[kind][cond], names, names, title=f"{label}: {what[kind]}", cmap="viridis", vmin=0.0,
                vmax=1.0, xlabel="model", ylabel="model")
    fig.tight_layout()
    return [figure_image(fig, "cosine similarity of class-wise vectors between models",
                         "Cosine similarity of two models' class-wise vectors (Medi et al., App. B): per-class "
                         "recall, and the error pattern (which class is mistaken for which; multi-label: missed and "
                         "spurious findings per label). Attacked: each model on its own adversarial examples. "
                         "Blank: undefined (a vector of zeros).")]


# --- the config entry ---------------------------------------------------------------------------------------------
_models_study = models  # the spec's run() has a `models` argument


@register_study("models", draw=_draw_models)
class ModelsSpec(StudySpec):
    """Clean vs robust over several models (Paschali et al.); ``models`` names them (default: all). ``hd95``: also
    each model's HD95 and ASR-H (segmentation; Malik et al.'s Table 1), ``spacing``: the voxel size for it in mm,
    one number or one per spatial axis (default: voxel units)."""

    study: Literal["models"]
    models: Annotated[list[str], Field(min_length=1)] | None = None
    hd95: Annotated[bool, Strict()] = False
    spacing: (Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
              | Annotated[list[Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]],
                          Field(min_length=1, max_length=3)]
              | None) = None

    @model_validator(mode="after")
    def _spacing_needs_hd95(self) -> ModelsSpec:
        if self.spacing is not None and not self.hd95:
            raise PydanticCustomError("models_spacing", "`spacing` is the voxel size of HD95: give it with "
                                      "`hd95: true` (it is not used otherwise)")
        return self

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        return _models_study(pick_models(models, self.models, "models"), task, data, attacks if attacks is not None else {},
                             target_fn=target_fn, hd95=self.hd95, spacing=self.spacing)
