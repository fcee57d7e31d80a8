"""Class-wise robustness (Medi, Grabinski & Keuper 2024): per-class accuracy and the Class False Positive Score.

Per class (multi-class), per label (multi-label) or per structure (segmentation, voxel level), clean and under
each attack:

* **recall** ``M_jj / N_j`` (the paper's class-wise accuracy as used in its figures; Eq. 2 as printed is the
  one-vs-rest accuracy, given as ``ovr_accuracy``);
* **CFPS** (Eq. 1) ``FP_j / E``: of all misclassified samples, the share wrongly assigned to class ``j``
  (``E = N − tr M``, ``FP_j`` the column sum of the confusion matrix without its diagonal); sums to 1 over
  classes whenever ``E > 0`` and is undefined (``None``) when there is no error;
* the **attraction ratio** ``A_j = CFPS_j / CFPS_j^null`` with ``CFPS_j^null = (E − FN_j) / ((C − 1) E)``
  (errors spread uniformly over the other classes; > 1: the class attracts more errors than chance);
* the confusion matrices (rows = truth, columns = prediction) and the *attractor* ranking (classes by CFPS).

Multi-label (spec §4.2): ``CFPS_l = FP_l / Σ_k FP_k`` (share of the spurious findings that are label ``l``),
``CFNS_l = FN_l / Σ_k FN_k`` (share of the missed findings), per-label accuracy ``(TP + TN) / N`` and the
label-pair matrix ``P[a, b]`` = images where finding ``a`` was missed while ``b`` was spuriously predicted
(stored as the "confusion" matrix: rows = missed true label, columns = spurious predicted label).

Segmentation (spec §4.3): the voxel-level ``C × C`` confusion summed over the volumes (micro), CFPS with
background (rows with ``background: "included"``) and over the foreground classes only (``"excluded"``:
background's row and column dropped), and per-class Dice averaged over the volumes (macro; a class absent
from both label and prediction of a volume is left out of that volume's mean).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict, field_validator, model_validator
from pydantic_core import PydanticCustomError
from torch import Tensor, nn

from ..attack_cache import craft
from ..attacks.base import Attack
from ..report.blocks import (
    Section,
    StudyLike,
    bars,
    data_table,
    figure_image,
    fmt,
    grid,
    group_rows,
    heatmap,
    is_nan,
    legend_top,
    mean_of,
    pretty_key,
    raw_table,
    setting_title,
    study_metric,
    walk_matrices,
)
from ..tasks import Task, registered_task_classes
from ..threats import Bounds, Box
from ._common import (
    AttackSpec,
    TargetFn,
    attacked_batches,
    check_model,
    check_models,
    check_task,
    forward,
    is_targeted,
    key,
    named_attacks,
)
from .base import StudyResult
from .models import cosine
from .registry import Int, Number, StudySpec, data_box, one_model, pick_models, register_study

__all__ = ["classwise", "confusion_matrix", "class_stats", "cfps", "multilabel_stats", "pair_matrix"]


# --- pure functions on counts (tested against hand computations) ----------------------------------------------------
def confusion_matrix(y: Tensor, pred: Tensor, num_classes: int) -> Tensor:
    """``(C, C)`` int64 counts, ``[i, j]`` = samples (or voxels) of true class ``i`` predicted as ``j``."""
    if y.shape != pred.shape:
        raise ValueError(f"`y` {tuple(y.shape)} and `pred` {tuple(pred.shape)} must have the same shape")
    idx = (y.reshape(-1).long() * num_classes + pred.reshape(-1).long()).cpu()
    return torch.bincount(idx, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def _div(a: Tensor, b: Tensor | float) -> Tensor:
    b = torch.as_tensor(b, dtype=torch.float64).expand_as(a) if not isinstance(b, Tensor) else b.double()
    return torch.where(b > 0, a.double() / b.clamp_min(1e-300), torch.full_like(a, math.nan, dtype=torch.float64))


def cfps(conf: Tensor) -> Tensor:
    """Class False Positive Score (Medi et al., Eq. 1) per class: ``FP_j / E``; NaN when ``E = 0``."""
    m = conf.double()
    fp = m.sum(0) - m.diagonal()
    return _div(fp, m.sum() - m.trace())


def class_stats(conf: Tensor) -> dict[str, Tensor]:
    """Per-class quantities of a ``(C, C)`` confusion matrix (rows = truth, columns = prediction).

    Returns ``support`` (N_j), ``tp``, ``fp``, ``fn``, ``errors`` (E, scalar), ``recall`` (M_jj / N_j),
    ``cfps`` (FP_j / E), ``attraction`` (CFPS_j / ((E − FN_j) / ((C − 1) E))), ``ovr_accuracy`` ((TP + TN) / N,
    Eq. 2 as printed) and ``precision``. Undefined values are NaN.
    """
    if conf.ndim != 2 or conf.shape[0] != conf.shape[1]:
        raise ValueError(f"`conf` must be a square (C, C) matrix, got shape {tuple(conf.shape)}")
    m = conf.double()
    c = m.shape[0]
    n = m.sum()
    tp = m.diagonal().clone()
    support, predicted = m.sum(1), m.sum(0)
    fp, fn = predicted - tp, support - tp
    errors = n - tp.sum()
    share = cfps(conf)
    null = _div(errors - fn, (c - 1) * errors) if c > 1 else torch.full_like(tp, math.nan)
    return {
        "support": support, "tp": tp, "fp": fp, "fn": fn, "errors": errors,
        "recall": _div(tp, support), "cfps": share, "attraction": _div(share, null),
        "ovr_accuracy": _div(n - fp - fn, n), "precision": _div(tp, predicted),
    }


def pair_matrix(y: Tensor, pred: Tensor) -> Tensor:
    """Multi-label ``(L, L)`` counts ``P[a, b]`` of images where label ``a`` was missed (``y=1, ŷ=0``) while
    ``b`` was spuriously predicted (``y=0, ŷ=1``) (Medi et al. spec §4.2)."""
    yb, pb = y.double().cpu() > 0.5, pred.double().cpu() > 0.5
    missed, spurious = (yb & ~pb).double(), (~yb & pb).double()
    return (missed.T @ spurious).round().long()


def multilabel_stats(y: Tensor, pred: Tensor) -> dict[str, Tensor]:
    """Per-label quantities of multi-hot labels and predictions ``(N, L)``.

    ``support`` (positives), ``fp``, ``fn``, ``cfps`` (FP_l / Σ FP), ``cfns`` (FN_l / Σ FN),
    ``label_accuracy`` ((TP + TN) / N), ``sensitivity``, ``specificity``; NaN where undefined.
    """
    if y.shape != pred.shape or y.ndim != 2:
        raise ValueError(f"`y` and `pred` must both be (N, L), got {tuple(y.shape)} and {tuple(pred.shape)}")
    yb, pb = y.double().cpu() > 0.5, pred.double().cpu() > 0.5
    tp, tn = (yb & pb).double().sum(0), (~yb & ~pb).double().sum(0)
    fp, fn = (~yb & pb).double().sum(0), (yb & ~pb).double().sum(0)
    return {
        "support": yb.double().sum(0), "fp": fp, "fn": fn,
        "cfps": _div(fp, fp.sum()), "cfns": _div(fn, fn.sum()),
        "label_accuracy": (tp + tn) / y.shape[0], "sensitivity": _div(tp, tp + fn), "specificity": _div(tn, tn + fp),
    }


# --- the study ---------------------------------------------------------------------------------------------------------
def _num(v: Tensor | float) -> float | None:
    f = float(v)
    return None if math.isnan(f) else f


def _ranking(values: Tensor, names: Sequence[Any]) -> list[Any]:
    """Class names by decreasing value, undefined (NaN) last, ties in class order."""
    order = sorted(range(len(names)), key=lambda j: (math.isnan(float(values[j])), -float(values[j])
                                                      if not math.isnan(float(values[j])) else 0.0, j))
    return [names[j] for j in order]


def _seg_dice(conf: Tensor) -> Tensor:
    """Per-volume Dice ``(N, C)`` from per-volume confusions ``(N, C, C)``; NaN where a class is absent from both."""
    m = conf.double()
    inter = m.diagonal(dim1=1, dim2=2)
    total = m.sum(2) + m.sum(1)
    return _div(2 * inter, total)


@dataclass
class _Condition:
    """One perturbation condition: its key in ``meta``, the predictions, the row columns naming it, and the truth
    where the condition moved it (a spatial corruption of a segmentation's label maps)."""

    label: str
    pred: Tensor | None
    columns: dict[str, Any]
    y: Tensor | None = None


def classwise(
    model: nn.Module | Mapping[str, nn.Module],
    task: Task,
    data: Any,
    attacks: AttackSpec | None,
    *,
    class_names: Sequence[str] | None = None,
    target_fn: TargetFn | None = None,
    corruptions: str | Sequence[Any] | None = None,
    severity: int = 3,
    bounds: Box | Bounds | None = None,
    seed: int = 0,
    target_classes: str | Sequence[int | str] | None = None,
) -> StudyResult:
    """Per-class robustness clean vs under each attack and corruption, with CFPS, confusion matrices, attractors,
    targeted success per target class, and the similarity of several models' class-wise behaviour (Medi et al.).

    Args:
        model: the classifier or segmenter (mode and parameters are left as they were); or ``{name: model}``
            for several models: rows get a ``model`` column and ``meta["similarity"]`` compares them (App. B).
        task: :class:`~medadv.tasks.MultiClass`, :class:`~medadv.tasks.MultiLabel` or
            :class:`~medadv.tasks.Segmentation`.
        data: an ``(x, y)`` pair or an iterable of ``(x, y)`` batches.
        attacks: one attack, a list or a ``{name: attack}`` mapping (as for ``evaluate``); ``None`` or empty:
            clean statistics only (rows with ``attack=None``).
        class_names: names of the classes / labels (default: their indices).
        target_fn: ``target_fn(x, y, clean_logits) -> target`` for targeted attacks (their regular rows; with
            ``target_classes`` and no ``target_fn``, targeted attacks run per target class only).
        corruptions: corruption names of :data:`~medadv.studies.corruptions.CORRUPTIONS` or a suite name
            (``"xu2021"``): each is a condition like an attack (Medi et al.'s CIFAR-10-C), applied once at
            ``severity`` (a ramp at its full level, a random corruption's first seeded draw).
        severity: the corruption level, 1..5.
        bounds: the data box of the corruptions (default: the first attack's box; required without attacks).
        seed: seed of the random corruptions (as in :func:`~medadv.studies.corruptions.corruptions`).
        target_classes: ``"all"`` or class indices / names: every targeted attack runs once per target class
            ``t`` (target ``t`` for every sample), multi-class only (Medi et al., Fig. 5).

    Returns:
        ``StudyResult("classwise")`` with one row per (condition, class): ``attack``/``budget`` (a corruption's
        rows: ``attack`` None and ``corruption``/``severity``), ``support`` (samples, positives or voxels of the
        class), ``clean``/``adv`` (recall, per-label accuracy or Dice: ``meta["metric"]``), ``cfps_clean``/
        ``cfps_adv``; multi-label adds ``cfns_clean``/``cfns_adv``; segmentation has a ``background`` column:
        ``"included"`` rows (every class, CFPS over the whole voxel confusion) and ``"excluded"`` rows
        (foreground classes, CFPS with background's row and column dropped). With ``target_classes``, one row per
        (targeted attack, target class): ``target``, ``eligible`` (samples whose label is not the target),
        ``success`` (share of them predicted as the target), ``success_induced`` (leaving out those already
        predicted as the target), ``cfps_clean`` (the target's clean CFPS). ``meta``: ``classes``, ``metric``,
        ``confusion`` (``{"clean": M, "<attack>@<budget>": M, "<corruption> (severity s)": M}``; multi-label: the
        missed → spurious label-pair matrix), ``attractors`` (class names by decreasing CFPS per condition;
        segmentation also ``attractors_fg``), ``errors`` (E per condition), ``n``, ``per_class`` (per condition,
        lists over the classes of ``attraction``, ``recall``, ``ovr_accuracy``, ``precision``; multi-label
        ``sensitivity``, ``specificity``, ``fp_induced``/``fn_induced``), ``targeted`` (per targeted attack:
        ``targets``, ``source_target`` = SR(s, t) = share of class ``s`` predicted as ``t`` under the attack
        targeted at ``t``, ``spearman_cfps`` = Spearman ρ between the clean CFPS and the success over the
        targets: Medi et al.'s "attractors are easy targets"). Several models: these keys are prefixed
        ``"<model> · "`` and ``similarity`` holds, per definition and condition, the models × models cosine
        similarity of ``errors`` (the off-diagonal confusion entries; primary, spec 004 A7 (ii)), ``cfps`` (iii),
        ``metric`` (per-class recall / accuracy / Dice) and the ``agreement`` of the predictions ((i): the
        cosine of one-hot predictions).
    """
    many = isinstance(model, Mapping)
    models = check_models(model, "model") if many else {"model": check_model(model)}
    models = {k: check_task(task).logits_model(m) for k, m in models.items()}  # declared probabilities: logits
    named = named_attacks(attacks)
    if task.classwise_view not in _BREAKDOWNS:
        kinds = [c.name for c in registered_task_classes() if c.classwise_view in _BREAKDOWNS]
        raise TypeError(f"classwise needs a task with classes or labels ({', '.join(kinds)}), got {task!r}")
    from .corruptions import corruption_suite

    corrs = corruption_suite(corruptions) if corruptions else []
    if not isinstance(severity, int) or isinstance(severity, bool) or not 1 <= severity <= 5:
        raise ValueError(f"`severity` must be an integer level in 1..5, got {severity!r}")
    box = None
    if corrs:
        if bounds is None and not named:
            raise ValueError("`corruptions` need the data box: give `bounds=(lo, hi)` (or attacks whose box they "
                             "take)")
        box = Box.coerce(bounds) if bounds is not None else named[0][1].box
    targeted: list[tuple[str, Attack]] = []
    regular = named
    if target_classes is not None:
        if task.classwise_view != "classes":
            raise ValueError("`target_classes` needs a multi-class task (a target is one class per sample); for "
                             "multi-label or segmentation give targeted attacks with `target_fn`")
        targeted = [(n, a) for n, a in named if is_targeted(a)]
        if not targeted:
            raise ValueError("`target_classes` needs a targeted attack among `attacks` (e.g. PGD(..., "
                             "targeted=True)); none of " + ", ".join(repr(n) for n, _ in named) + " is")
        if target_fn is None:
            regular = [(n, a) for n, a in named if not is_targeted(a)]
    plan = _Plan(regular, targeted, target_classes, corrs, severity, box, seed, target_fn, class_names)
    outs = {name: _one_model(m, task, data, plan) for name, m in models.items()}
    if not many:
        return outs["model"][0]
    return _combine(task, outs)


@dataclass
class _Plan:
    regular: list[tuple[str, Attack]]
    targeted: list[tuple[str, Attack]]
    target_classes: str | Sequence[int | str] | None
    corrs: list[Any]
    severity: int
    box: Box | None
    seed: int
    target_fn: TargetFn | None
    class_names: Sequence[str] | None


def _targets(spec: str | Sequence[int | str], num: int, names: list[Any]) -> list[int]:
    if isinstance(spec, str):
        if spec != "all":
            raise ValueError(f"`target_classes` must be 'all' or a list of classes, got {spec!r}")
        return list(range(num))
    out = []
    for t in spec:
        if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < num:
            out.append(t)
        elif str(t) in [str(n) for n in names]:
            out.append([str(n) for n in names].index(str(t)))
        else:
            raise ValueError(f"`target_classes` names an unknown class {t!r} (classes: 0..{num - 1}"
                             f"{'; ' + ', '.join(map(str, names)) if names else ''})")
    return list(dict.fromkeys(out))


def _one_model(model: nn.Module, task: Task, data: Any, plan: _Plan) -> tuple[StudyResult, dict[str, Tensor],
                                                                           Tensor, int]:
    """The study on one model: its result, its predictions per condition (``"clean"`` too), the labels and the
    number of classes."""
    from .corruptions import _apply, _seeds

    ys: list[Tensor] = []
    clean_preds: list[Tensor] = []
    adv_preds: dict[int, list[Tensor]] = {i: [] for i in range(len(plan.regular))}
    corr_preds: dict[int, list[Tensor]] = {i: [] for i in range(len(plan.corrs))}
    corr_ys: dict[int, list[Tensor]] = {i: [] for i in range(len(plan.corrs))}
    tgt_preds: dict[tuple[int, int], list[Tensor]] = {}
    targets: list[int] | None = None
    outputs, first = 0, 0
    for batch in attacked_batches(model, task, data, plan.regular, plan.target_fn):
        ys.append(batch.y.detach().cpu())
        clean_preds.append(task.predict(batch.clean_logits).detach().cpu())
        outputs = task.num_groups(batch.clean_logits)
        for i, att in enumerate(batch.attacked):
            adv_preds[i].append(task.predict(att.result.logits).detach().cpu())
        if plan.corrs:
            assert plan.box is not None
            data_range = plan.box.data_range(batch.x)
            for ci, corr in enumerate(plan.corrs):
                extras = {"label": batch.y} if task.spatial_labels and corr.spatial else {}
                frame = 1 if corr.kind == "random" else 0
                xc, moved = _apply(corr, corr.levels[plan.severity - 1], batch.x, extras,
                                   _seeds(plan.seed, ci, frame, first, batch.x.shape[0]), data_range, plan.box)
                corr_preds[ci].append(task.predict(forward(model, xc)).detach().cpu())
                corr_ys[ci].append(moved.get("label", batch.y).detach().cpu())
        if plan.targeted and plan.target_classes is not None:
            if targets is None:
                targets = _targets(plan.target_classes, outputs, _names(plan.class_names, outputs))
            for ai, (_, atk) in enumerate(plan.targeted):
                for t in targets:
                    res = craft(atk, model, batch.x, torch.full_like(batch.y, t))
                    tgt_preds.setdefault((ai, t), []).append(task.predict(res.logits).detach().cpu())
        first += batch.x.shape[0]
    if not ys:
        raise ValueError("`data` is empty")
    y, clean = torch.cat(ys), torch.cat(clean_preds)
    conditions = [_Condition(key(name, atk.budget), torch.cat(adv_preds[i]), {"attack": name, "budget": atk.budget})
                  for i, (name, atk) in enumerate(plan.regular)]
    for ci, corr in enumerate(plan.corrs):
        moved_y = torch.cat(corr_ys[ci])
        conditions.append(_Condition(f"{corr.name} (severity {plan.severity})", torch.cat(corr_preds[ci]),
                                     {"attack": None, "budget": None, "corruption": corr.name,
                                      "severity": plan.severity},
                                     None if torch.equal(moved_y, y) else moved_y))
    if not conditions:
        conditions = [_Condition("clean", None, {"attack": None, "budget": None})]
    result = _BREAKDOWNS[str(task.classwise_view)](task, outputs, y, clean, conditions, plan.class_names)
    preds = {"clean": clean, **{c.label: c.pred for c in conditions if c.pred is not None}}
    if plan.targeted and targets is not None:
        _targeted_rows(result, y, clean, outputs, plan, targets, tgt_preds)
    return result, preds, y, outputs


def _spearman(a: Sequence[float | None], b: Sequence[float | None]) -> float | None:
    """Spearman's ρ of the pairs where both are defined (average ranks for ties); None with < 3 pairs or a
    constant side."""
    pairs = [(float(u), float(v)) for u, v in zip(a, b, strict=True)
             if u is not None and v is not None and not math.isnan(float(u)) and not math.isnan(float(v))]
    if len(pairs) < 3:
        return None

    def ranks(vals: list[float]) -> Tensor:
        t = torch.tensor(vals, dtype=torch.float64)
        r = torch.empty_like(t)
        for i, v in enumerate(vals):
            r[i] = (t < v).sum() + ((t == v).sum() + 1) / 2
        return r

    ra, rb = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / den if den > 0 else None


def _targeted_rows(result: StudyResult, y: Tensor, clean: Tensor, num: int, plan: _Plan, targets: list[int],
                   tgt_preds: dict[tuple[int, int], list[Tensor]]) -> None:
    """Medi et al.'s targeted success per target class (spec 004 §1.2f): rows and ``meta["targeted"]``."""
    names = _names(plan.class_names, num)
    share = cfps(confusion_matrix(y, clean, num))
    result.meta["targeted"] = {}
    for ai, (name, atk) in enumerate(plan.targeted):
        matrix: list[list[float | None]] = [[None] * num for _ in range(num)]
        success: list[float | None] = []
        for t in targets:
            hit = torch.cat(tgt_preds[(ai, t)]) == t
            eligible = y != t
            induced = eligible & (clean != t)
            sr = _num(hit[eligible].double().mean()) if bool(eligible.any()) else None
            success.append(sr)
            for s in range(num):
                rows_s = y == s
                if s != t and bool(rows_s.any()):
                    matrix[s][t] = float(hit[rows_s].double().mean())
            result.rows.append({"attack": name, "budget": atk.budget, "target": names[t],
                                "eligible": int(eligible.sum()), "success": sr,
                                "success_induced": _num(hit[induced].double().mean()) if bool(induced.any()) else None,
                                "cfps_clean": _num(share[t])})
        result.meta["targeted"][key(name, atk.budget)] = {
            "targets": [str(names[t]) for t in targets], "source_target": matrix,
            "spearman_cfps": _spearman([_num(share[t]) for t in targets], success)}


def _vectors(task: Task, num: int, y: Tensor, pred: Tensor) -> dict[str, Tensor]:
    """What the model-to-model similarity compares for one condition: the error pattern (off-diagonal confusion;
    multi-label: the missed → spurious pair matrix), the CFPS and the per-class metric."""
    if task.classwise_view == "labels":
        s = multilabel_stats(y, pred)
        return {"errors": pair_matrix(y, pred).double().reshape(-1), "cfps": s["cfps"], "metric": s["label_accuracy"]}
    if task.classwise_view == "map":
        per_volume = task.confusion(pred, y)  # type: ignore[attr-defined]
        conf = per_volume.sum(0)
        metric = _seg_dice(per_volume).nanmean(0)
    else:
        conf = confusion_matrix(y, pred, num)
        metric = class_stats(conf)["recall"]
    off = ~torch.eye(conf.shape[0], dtype=torch.bool)
    return {"errors": conf.double()[off], "cfps": cfps(conf), "metric": metric}


_SIMILARITY = ("errors", "cfps", "metric", "agreement")
_PREFIXED = ("confusion", "attractors", "attractors_fg", "errors", "per_class", "targeted")


def _combine(task: Task, outs: dict[str, tuple[StudyResult, dict[str, Tensor], Tensor, int]]) -> StudyResult:
    """Several models: rows with a ``model`` column, per-model meta keys prefixed, and the similarity matrices."""
    names = list(outs)
    first = outs[names[0]][0]
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {k: v for k, v in first.meta.items() if k not in _PREFIXED}
    for k in _PREFIXED:
        if any(k in outs[m][0].meta for m in names):
            meta[k] = {f"{m} · {label}": v for m in names for label, v in outs[m][0].meta.get(k, {}).items()}
    for m in names:
        rows += [{"model": m, **r} for r in outs[m][0].rows]
    labels = [lab for lab in outs[names[0]][1] if all(lab in outs[m][1] for m in names)]
    sim: dict[str, dict[str, list[list[float | None]]]] = {d: {} for d in _SIMILARITY}
    for lab in labels:
        vec = {m: _vectors(task, outs[m][3], outs[m][2], outs[m][1][lab]) for m in names}
        for d in _SIMILARITY:
            mat: list[list[float | None]] = []
            for a in names:
                row: list[float | None] = []
                for b in names:
                    if d == "agreement":
                        row.append(float((outs[a][1][lab] == outs[b][1][lab]).double().mean()))
                    else:
                        row.append(cosine(vec[a][d].reshape(-1), vec[b][d].reshape(-1)))
                mat.append(row)
            sim[d][lab] = mat
    meta["models"] = names
    meta["similarity"] = {"models": names, "primary": "errors", "definitions": sim}
    return StudyResult("classwise", rows, meta)


def _names(class_names: Sequence[str] | None, num: int) -> list[Any]:
    if class_names is None:
        return list(range(num))
    if len(class_names) != num:
        raise ValueError(f"`class_names` has {len(class_names)} names for {num} classes")
    return [str(n) for n in class_names]


def _lists(stats: dict[str, Tensor], keys: Sequence[str]) -> dict[str, list[float | None]]:
    return {k: [_num(v) for v in stats[k].tolist()] for k in keys}


def _meta(metric: str, names: list[Any], n: int) -> dict[str, Any]:
    # names in meta are text (axis labels of the report's heatmaps); rows keep an int class when none is given
    return {"metric": metric, "classes": [str(c) for c in names], "n": int(n), "confusion": {}, "attractors": {}, "errors": {},
            "per_class": {}}


def _add(meta: dict[str, Any], label: str, conf: Tensor, share: Tensor, errors: Tensor, names: list[Any],
         per_class: dict[str, list[Any]]) -> None:
    meta["confusion"][label] = conf.tolist()
    meta["attractors"][label] = [str(c) for c in _ranking(share, names)]
    meta["errors"][label] = int(errors)
    meta["per_class"][label] = per_class


_MC_EXTRA = ("attraction", "recall", "ovr_accuracy", "precision")


def _multiclass(task: Task, num: int, y: Tensor, clean: Tensor, conditions: list[_Condition],
                class_names: Sequence[str] | None) -> StudyResult:
    names = _names(class_names, num)
    meta = _meta("recall", names, y.shape[0])
    conf = confusion_matrix(y, clean, num)
    s_clean = class_stats(conf)
    _add(meta, "clean", conf, s_clean["cfps"], s_clean["errors"], names, _lists(s_clean, _MC_EXTRA))
    rows: list[dict[str, Any]] = []
    for cond in conditions:
        s_adv, adv = None, cond.pred
        if adv is not None:
            conf = confusion_matrix(y, adv, num)
            s_adv = class_stats(conf)
            _add(meta, cond.label, conf, s_adv["cfps"], s_adv["errors"], names, _lists(s_adv, _MC_EXTRA))
        for j in range(num):
            rows.append({
                **cond.columns, "class": names[j], "support": int(s_clean["support"][j]),
                "clean": _num(s_clean["recall"][j]), "adv": None if s_adv is None else _num(s_adv["recall"][j]),
                "cfps_clean": _num(s_clean["cfps"][j]), "cfps_adv": None if s_adv is None else _num(s_adv["cfps"][j]),
            })
    return StudyResult("classwise", rows, meta)


def _multilabel(task: Task, num: int, y: Tensor, clean: Tensor, conditions: list[_Condition],
                class_names: Sequence[str] | None) -> StudyResult:
    num = y.shape[1]
    names = _names(class_names, num)
    meta = _meta("label_accuracy", names, y.shape[0])
    meta["confusion_kind"] = "missed (row) -> spurious (column) label pairs"
    meta["threshold"] = getattr(task, "threshold", 0.5)
    extra = ("sensitivity", "specificity")
    s_clean = multilabel_stats(y, clean)
    _add(meta, "clean", pair_matrix(y, clean), s_clean["cfps"], s_clean["fp"].sum() + s_clean["fn"].sum(), names,
         _lists(s_clean, extra))
    yb, cb = y > 0.5, clean > 0.5
    rows: list[dict[str, Any]] = []
    for cond in conditions:
        s_adv, adv = None, cond.pred
        if adv is not None:
            s_adv = multilabel_stats(y, adv)
            ab = adv > 0.5
            per = {**_lists(s_adv, extra), "fp_induced": (~yb & ~cb & ab).sum(0).tolist(),
                   "fn_induced": (yb & cb & ~ab).sum(0).tolist()}
            _add(meta, cond.label, pair_matrix(y, adv), s_adv["cfps"],
                 s_adv["fp"].sum() + s_adv["fn"].sum(), names, per)
        for j in range(num):
            rows.append({
                **cond.columns, "class": names[j], "support": int(s_clean["support"][j]),
                "clean": _num(s_clean["label_accuracy"][j]),
                "adv": None if s_adv is None else _num(s_adv["label_accuracy"][j]),
                "cfps_clean": _num(s_clean["cfps"][j]), "cfps_adv": None if s_adv is None else _num(s_adv["cfps"][j]),
                "cfns_clean": _num(s_clean["cfns"][j]), "cfns_adv": None if s_adv is None else _num(s_adv["cfns"][j]),
            })
    return StudyResult("classwise", rows, meta)


def _segmentation(task: Any, num: int, y: Tensor, clean: Tensor, conditions: list[_Condition],
                  class_names: Sequence[str] | None) -> StudyResult:
    num = task.num_classes
    names = _names(class_names, num)
    meta = _meta("dice", names, y.shape[0])
    meta["background"] = 0
    meta["attractors_fg"] = {}

    def stats(label: str, pred: Tensor, truth: Tensor) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        per_volume = task.confusion(pred, truth)  # (N, C, C), valid voxels only
        conf = per_volume.sum(0)
        s = class_stats(conf)
        fg = cfps(conf[1:, 1:])
        dice = _seg_dice(per_volume).nanmean(0)
        _add(meta, label, conf, s["cfps"], s["errors"], names,
             {**_lists(s, _MC_EXTRA), "cfps_fg": [None, *(_num(v) for v in fg.tolist())]})
        meta["attractors_fg"][label] = [str(c) for c in _ranking(fg, names[1:])]
        return s, fg, dice

    s_clean, fg_clean, dice_clean = stats("clean", clean, y)
    rows: list[dict[str, Any]] = []
    for cond in conditions:
        got = stats(cond.label, cond.pred, y if cond.y is None else cond.y) if cond.pred is not None else None
        for background in ("included", "excluded"):
            for j in range(0 if background == "included" else 1, num):
                if background == "included":
                    c_cfps = _num(s_clean["cfps"][j])
                    a_cfps = None if got is None else _num(got[0]["cfps"][j])
                else:
                    c_cfps = _num(fg_clean[j - 1])
                    a_cfps = None if got is None else _num(got[1][j - 1])
                rows.append({
                    **cond.columns, "background": background, "class": names[j],
                    "support": int(s_clean["support"][j]), "clean": _num(dice_clean[j]),
                    "adv": None if got is None else _num(got[2][j]), "cfps_clean": c_cfps, "cfps_adv": a_cfps,
                })
    return StudyResult("classwise", rows, meta)


#: the breakdown of each ``Task.classwise_view``
_BREAKDOWNS = {"classes": _multiclass, "labels": _multilabel, "map": _segmentation}


# --- the report section -------------------------------------------------------------------------------------------
_CLASSWISE_VALUES = ("class", "support", "clean", "adv", "cfps_clean", "cfps_adv", "cfns_clean", "cfns_adv")


def _confusion_figures(conf: Any, names: Sequence[str] | None, kind: str | None = None) -> list[Any]:
    """Heatmaps of the confusion matrices of a class-wise study, four per figure.

    Classes (``kind`` None): normalised per true class. Label pairs of a multi-label study (``kind`` says
    what rows and columns are): raw counts on one colour scale for all matrices.
    """
    mats = walk_matrices(conf)
    blocks: list[Any] = []
    per_fig = 4
    top = max([1.0] + [float(v or 0) for _, m in mats for row in m for v in row])
    for start in range(0, len(mats), per_fig):
        chunk = mats[start : start + per_fig]
        k = max(len(m) for _, m in chunk)
        size = min(4.6, 1.6 + 0.35 * k)
        fig, axes = grid(len(chunk), per_fig if len(mats) > 1 else 1, size + 0.6, size)
        for ax, (title, m) in zip(axes, chunk, strict=False):
            labels = list(names)[: len(m)] if names and len(names) >= len(m) else [str(j) for j in range(len(m))]
            if kind:
                shown = [[float(v or 0) for v in row] for row in m]
                pair = "missed" in kind and "spurious" in kind
                heatmap(ax, shown, labels, labels, title=pretty_key(title), cmap="Blues", vmin=0.0, vmax=top,
                        digits=0, xlabel="spurious label" if pair else "column",
                        ylabel="missed label" if pair else "row", colorbar=False)
            else:
                shown = []
                for row in m:
                    total = sum(float(v or 0) for v in row)
                    shown.append([float(v or 0) / total if total else math.nan for v in row])
                heatmap(ax, shown, labels, labels, title=pretty_key(title), cmap="Blues", vmin=0.0, vmax=1.0,
                        xlabel="predicted", ylabel="true", colorbar=False)
            off = sum(float(v or 0) for i, row in enumerate(m) for j, v in enumerate(row) if i != j or kind)
            if off == 0:  # nothing to see: say so rather than leave an empty square
                ax.text(0.5, 0.5, "no errors", transform=ax.transAxes, ha="center", va="center", fontsize=10,
                        color="#5b6573", bbox=dict(facecolor="white", edgecolor="none", alpha=0.8))
        fig.tight_layout()
        caption = (f"Counts of {kind}, one colour scale for all panels." if kind else
                   "Confusion matrices normalised per true class (each row sums to 1; rows = true class, columns = "
                   "prediction). Off-diagonal mass under attack shows where the errors go.")
        blocks.append(figure_image(fig, "confusion matrices, clean and attacked", caption))
    return blocks


def _draw_classwise(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    own = study.meta.get("classes")
    # the study's own names, unless it ran without any (indices) and the report has the config's
    plain = own is None or list(own) == [str(i) for i in range(len(own))]
    names = list(class_names) if class_names and plain and (own is None or len(own) == len(class_names)) else own

    def label(c: Any) -> str:
        return str(names[c]) if names and isinstance(c, int) and 0 <= c < len(names) else str(c)
    metric = study_metric(study, "per-class metric")
    per_class = [r for r in study.rows if "target" not in r]  # targeted-success rows are drawn apart
    extra = [c for c in dict.fromkeys(k for r in per_class for k in r) if c not in _CLASSWISE_VALUES]
    groups = group_rows(per_class, extra)
    blocks: list[Any] = []
    has_cfns = any("cfns_adv" in r for r in study.rows)
    if groups:
        keys = list(groups)[:6]
        fig, axes = grid(len(keys) * (2 + has_cfns), 2 + has_cfns, 3.9 if has_cfns else 4.6, 3.0)
        for gi, key in enumerate(keys):
            rows = groups[key]
            cls = [label(r.get("class")) for r in rows]
            title = setting_title(dict(zip(extra, key, strict=True)))
            ax = axes[gi * (2 + has_cfns)]
            bars(ax, cls, [("clean", [r.get("clean") for r in rows]), ("attacked", [r.get("adv") for r in rows])],
                 metric, f"{metric}: {title}")
            ax = axes[gi * (2 + has_cfns) + 1]
            top = max([0.05] + [float(v) for r in rows for v in (r.get("cfps_clean"), r.get("cfps_adv"))
                                if not is_nan(v)])
            bars(ax, cls, [("clean", [r.get("cfps_clean") for r in rows]),
                            ("attacked", [r.get("cfps_adv") for r in rows])],
                  "CFPS", f"CFPS: {title}", (0.0, min(1.0, top * 1.15)))
            if has_cfns:
                ax = axes[gi * 3 + 2]
                top = max([0.05] + [float(v) for r in rows for v in (r.get("cfns_clean"), r.get("cfns_adv"))
                                    if not is_nan(v)])
                bars(ax, cls, [("clean", [r.get("cfns_clean") for r in rows]),
                                ("attacked", [r.get("cfns_adv") for r in rows])],
                      "CFNS", f"CFNS: {title}", (0.0, min(1.0, top * 1.15)))
        legend_top(fig, axes[0])
        more = f" (first 6 of {len(groups)} settings)" if len(groups) > 6 else ""
        blocks.append(figure_image(fig, "per-class metric and CFPS, clean vs attacked",
                                   f"Left: {metric} per class. Right: the Class False Positive Score (CFPS), the share "
                                   "of all errors that land on each class; a class with a high CFPS attracts errors "
                                   "(an easy target for targeted attacks)." + more))
    if "confusion" in study.meta:
        kind = study.meta.get("confusion_kind")
        blocks += _confusion_figures(study.meta["confusion"], names, str(kind) if kind else None)
    attractors = study.meta.get("attractors")
    if attractors:
        items = attractors.items() if isinstance(attractors, Mapping) else enumerate(attractors)
        rows = [{"setting": pretty_key(str(k)), "attractors (most errors first)": " > ".join(map(str, v))
                 if isinstance(v, list) else str(v)} for k, v in items]
        blocks.append(data_table(rows, ["setting", "attractors (most errors first)"], "Classes ranked by CFPS."))
    targeted = [r for r in study.rows if "target" in r]
    if targeted:  # Medi et al. Fig. 5: success per target class next to the target's clean CFPS
        tgroups = group_rows(targeted, [k for k in ("model", "attack", "budget") if any(k in r for r in targeted)])
        fig, axes = grid(min(len(tgroups), 6), 2, 5.0, 3.2)
        for ax, (tkey, rows) in zip(axes, list(tgroups.items())[:6], strict=False):
            bars(ax, [str(r["target"]) for r in rows], [("success", [r.get("success") for r in rows]),
                                                         ("clean CFPS", [r.get("cfps_clean") for r in rows])],
                  "share", " · ".join(str(k) for k in tkey if k is not None))
        legend_top(fig, axes[0])
        spear = study.meta.get("targeted") or {}
        rho = "; ".join(f"{pretty_key(str(k))}: ρ = {fmt(v.get('spearman_cfps'))}" for k, v in spear.items()
                        if isinstance(v, Mapping))
        blocks.append(figure_image(fig, "targeted success per target class",
                                   "Share of the samples of other classes that a targeted attack pushes into each "
                                   "target class, next to that class's clean CFPS (Medi et al.: classes that attract "
                                   "errors are easy targets). Spearman ρ(CFPS, success): " + (rho or "–") + "."))
    sim = study.meta.get("similarity")
    if isinstance(sim, Mapping) and isinstance(sim.get("definitions"), Mapping):
        models = [str(m) for m in sim.get("models") or []]
        primary = sim["definitions"].get(sim.get("primary", "errors")) or {}
        if primary:
            chunk = list(primary.items())[:4]
            fig, axes = grid(len(chunk), 4, max(3.4, 1.4 + 0.7 * len(models)), max(3.0, 1.2 + 0.6 * len(models)))
            for ax, (cond, m) in zip(axes, chunk, strict=False):
                heatmap(ax, m, models, models, title=pretty_key(str(cond)), cmap="viridis", vmin=0.0, vmax=1.0,
                        colorbar=False)
            fig.tight_layout()
            blocks.append(figure_image(fig, "model-to-model cosine similarity of the error patterns",
                                       "Cosine similarity of the models' off-diagonal confusion entries (where their "
                                       "errors go; Medi et al. App. B report 0.76–0.83 between robust CIFAR-10 "
                                       "models)."))
        summary = []
        for d, per_cond in sim["definitions"].items():
            for cond, m in per_cond.items():
                off = [float(v) for i, row in enumerate(m) for j, v in enumerate(row) if i < j and not is_nan(v)]
                summary.append({"definition": d, "condition": pretty_key(str(cond)),
                                "mean over model pairs": mean_of(off)})
        blocks.append(data_table(summary, ["definition", "condition", "mean over model pairs"],
                                 "Model-to-model similarity: errors, CFPS and per-class metric as cosines; agreement = "
                                 "share of equal predictions."))
    blocks.append(raw_table(study.rows, "all rows of the class-wise study"))
    return Section("study-classwise", f"Class-wise robustness (Medi et al.) · {metric}",
                   "Which classes suffer most under attack, and which classes the errors go to. CFPS<sub>j</sub> = "
                   "FP<sub>j</sub> / all errors (sums to 1 over classes).", blocks)


# --- the config entry ---------------------------------------------------------------------------------------------
def _needs_classes(task: Task) -> str | None:
    """Why ``task`` has no class-wise breakdown (``Task.classwise_view`` none of :data:`_BREAKDOWNS`), or None."""
    if task.classwise_view in _BREAKDOWNS:
        return None
    kinds = [c.name for c in registered_task_classes() if c.classwise_view in _BREAKDOWNS]
    return f"classwise needs a task with classes or labels ({', '.join(kinds)})"


@register_study("classwise", draw=_draw_classwise, needs=_needs_classes)
class ClasswiseSpec(StudySpec):
    """Per-class recall / label accuracy / Dice, CFPS, confusion matrices, attractors (Medi et al.).

    ``corruptions`` (names or a suite such as ``xu2021``) at ``severity`` are conditions next to the attacks
    (``bounds``: their data box, default the attacks'); ``target_classes`` (``all`` or a list) runs every
    targeted attack once per target class (multi-class); ``models`` (two or more) runs the study on each and
    adds their model-to-model cosine similarity (Medi et al., App. B)."""

    study: Literal["classwise"]
    class_names: list[str] | None = None
    corruptions: Annotated[list[str], Field(min_length=1)] | str | None = None
    severity: Int = Field(3, ge=1, le=5)
    seed: Int = 0
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None
    target_classes: Literal["all"] | Annotated[list[Annotated[int, Strict(), Field(ge=0)] | str],
                                               Field(min_length=1)] | None = None
    models: Annotated[list[str], Field(min_length=2)] | None = None

    @field_validator("corruptions")
    @classmethod
    def _known_corruptions(cls, names: list[str] | str | None) -> list[str] | str | None:
        from .corruptions import CorruptionsSpec

        return CorruptionsSpec._known(names)  # type: ignore[operator]

    @model_validator(mode="after")
    def _model_or_models(self) -> ClasswiseSpec:
        if self.model is not None and self.models is not None:
            raise PydanticCustomError("classwise_models", "give `model` (one) or `models` (several), not both")
        return self

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        which: nn.Module | dict[str, nn.Module] = (pick_models(models, self.models, "models") if self.models is not None
                                                   else one_model(models, self))
        bounds = data_box(self, attacks, "classwise", required=False) if self.corruptions else None
        return classwise(which, task, data, attacks, class_names=self.class_names, target_fn=target_fn,
                         corruptions=self.corruptions, severity=self.severity, bounds=bounds, seed=self.seed,
                         target_classes=self.target_classes)
