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
from typing import Any

import torch
from torch import Tensor, nn

from ..attacks.base import Attack
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
                    res = atk(model, batch.x, torch.full_like(batch.y, t))
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
