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
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..tasks import Task, registered_task_classes
from ._common import AttackSpec, TargetFn, attacked_batches, check_model, check_task, key, named_attacks
from .base import StudyResult

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


def classwise(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: AttackSpec | None,
    *,
    class_names: Sequence[str] | None = None,
    target_fn: TargetFn | None = None,
) -> StudyResult:
    """Per-class robustness clean vs under each attack, with CFPS, confusion matrices and attractors.

    Args:
        model: the classifier or segmenter (mode and parameters are left as they were).
        task: :class:`~medadv.tasks.MultiClass`, :class:`~medadv.tasks.MultiLabel` or
            :class:`~medadv.tasks.Segmentation`.
        data: an ``(x, y)`` pair or an iterable of ``(x, y)`` batches.
        attacks: one attack, a list or a ``{name: attack}`` mapping (as for ``evaluate``); ``None`` or empty:
            clean statistics only (rows with ``attack=None``).
        class_names: names of the classes / labels (default: their indices).
        target_fn: ``target_fn(x, y, clean_logits) -> target`` for targeted attacks.

    Returns:
        ``StudyResult("classwise")`` with one row per (attack, budget, class): ``support`` (samples, positives or
        voxels of the class), ``clean``/``adv`` (recall, per-label accuracy or Dice: ``meta["metric"]``),
        ``cfps_clean``/``cfps_adv``; multi-label adds ``cfns_clean``/``cfns_adv``; segmentation has a
        ``background`` column: ``"included"`` rows (every class, CFPS over the whole voxel confusion) and
        ``"excluded"`` rows (foreground classes, CFPS with background's row and column dropped).
        ``meta``: ``classes``, ``metric``, ``confusion`` (``{"clean": M, "<attack>@<budget>": M}``; multi-label: the
        missed → spurious label-pair matrix), ``attractors`` (class names by decreasing CFPS per condition;
        segmentation also ``attractors_fg``), ``errors`` (E per condition), ``n``, and ``per_class``: per condition,
        lists over the classes of the other quantities (``attraction``, ``recall``, ``ovr_accuracy``,
        ``precision``; multi-label ``sensitivity``, ``specificity``, ``fp_induced``/``fn_induced`` = labels switched
        on / off by the attack where the clean prediction was right).
    """
    check_model(model)
    check_task(task)
    named = named_attacks(attacks)
    if task.classwise_view not in _BREAKDOWNS:
        kinds = [c.name for c in registered_task_classes() if c.classwise_view in _BREAKDOWNS]
        raise TypeError(f"classwise needs a task with classes or labels ({', '.join(kinds)}), got {task!r}")
    ys: list[Tensor] = []
    clean_preds: list[Tensor] = []
    adv_preds: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
    outputs = 0
    for batch in attacked_batches(model, task, data, named, target_fn):
        ys.append(batch.y.detach().cpu())
        clean_preds.append(task.predict(batch.clean_logits).detach().cpu())
        outputs = task.num_groups(batch.clean_logits)
        for i, att in enumerate(batch.attacked):
            adv_preds[i].append(task.predict(att.result.logits).detach().cpu())
    if not ys:
        raise ValueError("`data` is empty")
    y, clean = torch.cat(ys), torch.cat(clean_preds)
    conditions: list[tuple[str | None, float | None, Tensor | None]] = (
        [(name, atk.budget, torch.cat(adv_preds[i])) for i, (name, atk) in enumerate(named)] or [(None, None, None)])
    breakdown = _BREAKDOWNS[task.classwise_view]
    return breakdown(task, outputs, y, clean, conditions, class_names)


Condition = tuple[str | None, float | None, Tensor | None]


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


def _multiclass(task: Task, num: int, y: Tensor, clean: Tensor, conditions: list[Condition],
                class_names: Sequence[str] | None) -> StudyResult:
    names = _names(class_names, num)
    meta = _meta("recall", names, y.shape[0])
    conf = confusion_matrix(y, clean, num)
    s_clean = class_stats(conf)
    _add(meta, "clean", conf, s_clean["cfps"], s_clean["errors"], names, _lists(s_clean, _MC_EXTRA))
    rows: list[dict[str, Any]] = []
    for name, budget, adv in conditions:
        s_adv = None
        if adv is not None:
            conf = confusion_matrix(y, adv, num)
            s_adv = class_stats(conf)
            _add(meta, key(str(name), budget), conf, s_adv["cfps"], s_adv["errors"], names, _lists(s_adv, _MC_EXTRA))
        for j in range(num):
            rows.append({
                "attack": name, "budget": budget, "class": names[j], "support": int(s_clean["support"][j]),
                "clean": _num(s_clean["recall"][j]), "adv": None if s_adv is None else _num(s_adv["recall"][j]),
                "cfps_clean": _num(s_clean["cfps"][j]), "cfps_adv": None if s_adv is None else _num(s_adv["cfps"][j]),
            })
    return StudyResult("classwise", rows, meta)


def _multilabel(task: Task, num: int, y: Tensor, clean: Tensor, conditions: list[Condition],
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
    for name, budget, adv in conditions:
        s_adv = None
        if adv is not None:
            s_adv = multilabel_stats(y, adv)
            ab = adv > 0.5
            per = {**_lists(s_adv, extra), "fp_induced": (~yb & ~cb & ab).sum(0).tolist(),
                   "fn_induced": (yb & cb & ~ab).sum(0).tolist()}
            _add(meta, key(str(name), budget), pair_matrix(y, adv), s_adv["cfps"],
                 s_adv["fp"].sum() + s_adv["fn"].sum(), names, per)
        for j in range(num):
            rows.append({
                "attack": name, "budget": budget, "class": names[j], "support": int(s_clean["support"][j]),
                "clean": _num(s_clean["label_accuracy"][j]),
                "adv": None if s_adv is None else _num(s_adv["label_accuracy"][j]),
                "cfps_clean": _num(s_clean["cfps"][j]), "cfps_adv": None if s_adv is None else _num(s_adv["cfps"][j]),
                "cfns_clean": _num(s_clean["cfns"][j]), "cfns_adv": None if s_adv is None else _num(s_adv["cfns"][j]),
            })
    return StudyResult("classwise", rows, meta)


def _segmentation(task: Any, num: int, y: Tensor, clean: Tensor, conditions: list[Condition],
                  class_names: Sequence[str] | None) -> StudyResult:
    num = task.num_classes
    names = _names(class_names, num)
    meta = _meta("dice", names, y.shape[0])
    meta["background"] = 0
    meta["attractors_fg"] = {}

    def stats(label: str, pred: Tensor) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        per_volume = task.confusion(pred, y)  # (N, C, C), valid voxels only
        conf = per_volume.sum(0)
        s = class_stats(conf)
        fg = cfps(conf[1:, 1:])
        dice = _seg_dice(per_volume).nanmean(0)
        _add(meta, label, conf, s["cfps"], s["errors"], names,
             {**_lists(s, _MC_EXTRA), "cfps_fg": [None, *(_num(v) for v in fg.tolist())]})
        meta["attractors_fg"][label] = [str(c) for c in _ranking(fg, names[1:])]
        return s, fg, dice

    s_clean, fg_clean, dice_clean = stats("clean", clean)
    rows: list[dict[str, Any]] = []
    for name, budget, adv in conditions:
        got = stats(key(str(name), budget), adv) if adv is not None else None
        for background in ("included", "excluded"):
            for j in range(0 if background == "included" else 1, num):
                if background == "included":
                    c_cfps = _num(s_clean["cfps"][j])
                    a_cfps = None if got is None else _num(got[0]["cfps"][j])
                else:
                    c_cfps = _num(fg_clean[j - 1])
                    a_cfps = None if got is None else _num(got[1][j - 1])
                rows.append({
                    "attack": name, "budget": budget, "background": background, "class": names[j],
                    "support": int(s_clean["support"][j]), "clean": _num(dice_clean[j]),
                    "adv": None if got is None else _num(got[2][j]), "cfps_clean": c_cfps, "cfps_adv": a_cfps,
                })
    return StudyResult("classwise", rows, meta)


#: the breakdown of each ``Task.classwise_view``
_BREAKDOWNS = {"classes": _multiclass, "labels": _multilabel, "map": _segmentation}
