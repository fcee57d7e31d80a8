"""GAP on the data its generator was trained on vs held-out data (Xu et al. 2021, Tables 1–2, "X" vs "val.").

Xu, Zhang, Li, Liu, Zhang. "Towards evaluating the robustness of deep diagnostic models by adversarial attack",
Medical Image Analysis 2021 (GAP: Poursaeed et al., CVPR 2018). Xu et al. report GAP's accuracy and fooling rate
on "X", the training set the generator was fitted on, and on "val.", a held-out validation set: similar values
mean the generator generalises (spec 000, §2.2 "GAP evaluation protocol").

For each L∞ budget the study builds a fresh :class:`~medadv.attacks.gap.GAP` generator, fits it with
:class:`~medadv.training.GAPTrainer` against the frozen model on the training split (the epoch kept is the
one with the highest fooling rate *on the training split*, Xu et al.'s code's rule on X, so the validation
rows never steer the choice), and reports on both splits the clean and attacked robust metric, the clean and
attacked score-based dataset AUC (spec 000, A9) and, for multi-label tasks, the mean per-label accuracy (Xu et
al.'s multi-label "ACC", Table 2), and the fooling rate (the share of samples whose prediction the perturbation
changes, Xu et al.'s FR). The report section shows them in the paper's Table 1 / 2 layout.

Training data as in :mod:`medadv.studies.defenses`: ``train_data``, or the first ``train_split`` share of
``data`` (the rest is the validation split).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict
from torch import Tensor, nn

from ..config_schema import Budget, DataSection
from ..report.blocks import (
    Section,
    StudyLike,
    Table,
    bars,
    data_table,
    escape,
    figure_image,
    fmt_budget,
    is_num,
    legend_top,
    pyplot,
    study_metric,
)
from ..runtime import model_device
from ..tasks import Task
from ..threats import Box, Linf
from ._common import (
    AttackSpec,
    TargetFn,
    attacked_batches,
    check_model,
    check_task,
    forward,
    gather,
    named_attacks,
    robust_metric,
    split_train_eval,
)
from .base import StudyResult
from .registry import StudySpec, data_box, one_model, register_study

__all__ = ["gap", "GapSpec"]

_SPLITS = ("train", "val")


def _budgets(budgets: Sequence[float] | None, attacks: AttackSpec | None) -> list[float]:
    if budgets is not None:
        out = [float(b) for b in budgets]
    else:
        out = list(dict.fromkeys(float(a.budget) for _, a in named_attacks(attacks) if a.budget is not None))
    if not out:
        raise ValueError("the gap study needs L∞ budgets: give `budgets: [...]` in data units (Xu et al.: 7/255 and "
                         "11/255 on [0, 1] data), or ε-ball attacks whose budgets it takes")
    bad = [b for b in out if not b > 0]
    if bad:
        raise ValueError(f"`budgets` of the gap study must be > 0; got {bad}")
    return out


def _auc_inputs(task: Task, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor] | None:
    """``(scores, labels)`` on the CPU for a dataset AUC: multi-class ``(N, K)`` softmax scores with ``(N,)`` class
    indices, multi-label ``(N, L)`` sigmoid scores with ``(N, L)`` 0/1 labels (the ``scores`` column of
    :meth:`Task.outcome`); ``None`` for a task without per-sample class scores (segmentation) or labels of
    another form (soft, masked): no AUC rather than a wrong one."""
    scores = task.outcome(logits, y).columns.get("scores")
    if not isinstance(scores, Tensor) or scores.ndim != 2:
        return None
    scores, y = scores.detach().double().cpu(), y.detach().cpu()
    if y.ndim == 1 and y.shape[0] == scores.shape[0] and not y.is_floating_point():
        return scores, y.long()
    if y.shape == scores.shape and bool(((y == 0) | (y == 1)).all()):
        return scores, y.double()
    return None


def _dataset_auc(task: Task, logits: Tensor, y: Tensor) -> float | None:
    """Score-based dataset AUC of ``logits`` against ``y`` (spec 000, A9), as :meth:`Results.summary` computes it:
    multi-class, the macro one-vs-rest AUC of the softmax scores; multi-label, the mean of the per-label AUCs.
    ``None`` where :func:`_auc_inputs` has none, or no class / label has both positives and negatives in ``y``."""
    from ..metrics.classification import macro_auc, multiclass_auc

    got = _auc_inputs(task, logits, y)
    if got is None:
        return None
    scores, labels = got
    value = float(multiclass_auc(scores, labels) if labels.ndim == 1 else macro_auc(scores, labels))
    return value if math.isfinite(value) else None


def _rows_of(model: nn.Module, task: Task, atk: Any, x: Tensor, y: Tensor, batch_size: int,
             keep: int = 0) -> tuple[dict[str, Any], dict[str, Tensor] | None]:
    """Clean / attacked robust metric, dataset AUC (and label accuracy, for tasks that have it) and fooling rate
    of a trained GAP on ``(x, y)``; with ``keep > 0`` also the first batch's tensors (at most ``keep`` samples
    kept for the report's cases), else ``None``."""
    data = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)]
    clean, adv, fooled = [], [], []
    logits_c, logits_a, labels = [], [], []
    kept: dict[str, Tensor] | None = None
    for batch in attacked_batches(model, task, data, [("gap", atk)]):
        res = batch.attacked[0].result
        clean.append(robust_metric(task, batch.clean_logits, batch.y))
        adv.append(robust_metric(task, res.logits, batch.y))
        pred = task.predict(batch.clean_logits)
        fooled.append(task.fooled(res.logits, pred, False).reshape(-1).double().cpu())
        # the AUC is a dataset statistic (a ranking of every sample), so the logits of all batches are kept
        logits_c.append(batch.clean_logits.detach().cpu())
        logits_a.append(res.logits.detach().cpu())
        labels.append(batch.y.detach().cpu())
        if keep > 0 and kept is None:
            kept = {"x": batch.x.detach().cpu(), "x_adv": res.x_adv.detach().cpu(), "y": batch.y.detach().cpu(),
                    "clean_logits": batch.clean_logits.detach().cpu(), "adv_logits": res.logits.detach().cpu()}
    c, a = float(torch.cat(clean).mean()), float(torch.cat(adv).mean())
    row: dict[str, Any] = {"clean": c, "adv": a, "drop_points": 100.0 * (c - a),
                           "fooling_rate": float(torch.cat(fooled).mean())}
    lc, la, yy = torch.cat(logits_c), torch.cat(logits_a), torch.cat(labels)
    if _auc_inputs(task, lc, yy) is not None:  # every row of a classification task has the columns
        row.update(auc_clean=_dataset_auc(task, lc, yy), auc_adv=_dataset_auc(task, la, yy))
    # Xu et al.'s multi-label "ACC" (Table 2) is the per-label accuracy, not the exact match of the robust metric
    m_c, m_a = task.metrics(lc, yy), task.metrics(la, yy)
    if "label_accuracy" in m_c and "label_accuracy" in m_a:
        row.update(label_accuracy_clean=float(m_c["label_accuracy"].double().mean()),
                   label_accuracy_adv=float(m_a["label_accuracy"].double().mean()))
    row["n"] = int(x.shape[0])
    return row, kept


def gap(
    model: nn.Module,
    task: Task,
    data: Any,
    *,
    budgets: Sequence[float],
    bounds: Box | tuple[float, float] | None,
    train_data: Any = None,
    train_split: float | None = None,
    generator: str | Mapping[str, Any] = "unet",
    universal: bool = False,
    loss: Literal["least_likely", "neg_true_logprob"] = "least_likely",
    per_channel: bool = True,
    output_scale: float = 100.0,
    epochs: int = 10,
    batch_size: int = 16,
    lr: float = 2e-4,
    betas: tuple[float, float] = (0.5, 0.999),
    max_batches: int | None = None,
    seed: int = 0,
    cases: int = 0,
    class_names: Sequence[str] | None = None,
) -> StudyResult:
    """Fit an untargeted GAP generator per budget on the training split; rows for the training and validation splits.

    Args:
        model: the model to fool (frozen, unchanged).
        task, data: as for ``evaluate``.
        budgets: L∞ budgets in data units (Xu et al.'s "L∞ = 7, 11" on 0–255 images: 7/255, 11/255 on [0, 1]).
        bounds: the data box ``(lo, hi)`` in data units (required: GAP clips to it and scales its output by it).
        train_data: a separate training set; else the first ``train_split`` (default 0.5) of ``data`` trains
            and the rest is the validation split.
        generator: architecture name (``"unet"``, ``"resnet"``) or ``{name: unet, ngf: 16, depth: 3, ...}``
            (:func:`medadv.models.generators.build_generator`); ``in_channels`` and ``ndim`` default to the
            data's, ``seed`` to the study's.
        universal, loss, per_channel, output_scale: as for :class:`~medadv.attacks.gap.GAP`.
        epochs, batch_size, lr, betas, max_batches: as for :class:`~medadv.training.GAPTrainer` (Xu et al.:
            Adam 2e-4, 10 epochs, at most 100 batches per epoch).
        seed: seed of the generator's weights, the universal noise and the data order.
        cases: how many validation samples to draw as report figures (GAP images, as Xu et al. show) for the
            largest budget: those of the first validation batch the perturbation changed most
            (``meta["cases"]``, :func:`~medadv.report.cases.case_meta`); 0: none.
        class_names: names of the classes / labels in those figures.

    Returns:
        ``StudyResult("gap")``: rows ``{budget, split, clean, adv, drop_points, fooling_rate, n}`` with ``split``
        ``"train"`` (the generator's training data, Xu's "X") or ``"val"`` (held out); classification tasks add
        ``auc_clean`` / ``auc_adv`` (the dataset AUC of the class scores: macro one-vs-rest for classes, the mean
        of the per-label AUCs for labels; ``None`` where undefined), multi-label tasks ``label_accuracy_clean`` /
        ``label_accuracy_adv`` (the mean per-label accuracy). ``meta["history"]`` holds each budget's per-epoch
        training record; with ``cases``, ``meta["cases"]`` the figures, titled ``"GAP L∞ <budget> · val."``.
    """
    from ..attacks.gap import GAP
    from ..training.gap import GAPTrainer

    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
    if isinstance(cases, bool) or not isinstance(cases, int) or cases < 0:
        raise ValueError(f"`cases` must be an int >= 0 (validation samples drawn as figures), got {cases!r}")
    if bounds is None:
        raise ValueError("the gap study needs the data box: give `bounds: [lo, hi]` (GAP scales and clips to it)")
    box = Box.coerce(bounds)
    budgets = _budgets(budgets, None)
    (x_tr, y_tr), val_data, split_meta = split_train_eval(data, train_data, train_split, batch_size)
    x_val, y_val = gather(val_data)
    task.validate(forward(model, x_tr[:2]), y_tr[:2].to(model_device(model)), "y")
    spec: dict[str, Any] = {"name": generator} if isinstance(generator, str) else dict(generator)
    spec.setdefault("in_channels", int(x_tr.shape[1]))
    spec.setdefault("ndim", int(x_tr.ndim - 2))
    spec.setdefault("seed", int(seed))
    rows: list[dict[str, Any]] = []
    history: dict[str, Any] = {}
    figures: list[dict[str, Any]] = []
    for eps in budgets:
        atk = GAP(task, Linf(eps, bounds=box), dict(spec), universal=universal,
                  input_shape=tuple(x_tr.shape[1:]) if universal else None, per_channel=per_channel, loss=loss,
                  output_scale=output_scale, seed=seed)
        trainer = GAPTrainer(atk, model, epochs=epochs, batch_size=batch_size, lr=lr, betas=betas,
                             max_batches=max_batches, seed=seed)
        trainer.fit(x_tr, y_tr)  # the best epoch is chosen on the training split (x_val left out)
        history[f"{eps:.6g}"] = list(trainer.history)
        for split, (xs, ys) in zip(_SPLITS, ((x_tr, y_tr), (x_val, y_val)), strict=True):
            # the figures: the strongest generator on held-out images (what it was not fitted on)
            draw = cases if split == "val" and eps == max(budgets) else 0
            row, kept = _rows_of(model, task, atk, xs, ys, batch_size, keep=draw)
            rows.append({"budget": eps, "split": split, **row})
            if kept is not None:
                figures = _case_figures(task, kept, draw, f"GAP L∞ {_of_255(eps)} · val.", class_names)
    meta = {"metric": task.robust_metric_name, "budgets": budgets, "generator": spec, "epochs": epochs, "lr": lr,
            "betas": list(betas), "max_batches": max_batches, "universal": universal, "loss": loss, "seed": seed,
            "history": history, "selection": "epoch with the highest fooling rate on the training split",
            "n_val": int(x_val.shape[0]), **split_meta}
    if cases > 0:
        meta["cases"] = figures
    return StudyResult("gap", rows, meta)


def _case_figures(task: Task, kept: Mapping[str, Tensor], k: int, title: str,
                  class_names: Sequence[str] | None) -> list[dict[str, Any]]:
    """The ``k`` samples of one batch the perturbation changed most, as report figures (``meta["cases"]``)."""
    from ..report.cases import case_meta, make_cases

    return case_meta(make_cases(task, kept["x"], kept["x_adv"], kept["clean_logits"], kept["adv_logits"],
                                kept["y"], k=min(k, int(kept["x"].shape[0])), class_names=class_names, title=title))


# --- the report section -----------------------------------------------------------------------------------------
def _of_255(b: Any) -> str:
    """A budget as Xu et al. write it: ``7/255`` when it is a whole number of 255ths, else its value."""
    if not is_num(b):
        return str(b)
    k = float(b) * 255
    return f"{round(k)}/255" if abs(k - round(k)) < 1e-6 else f"{float(b):.4g}"


def _paper_table(rows: Sequence[Mapping[str, Any]], metric: str) -> Table | None:
    """Xu et al.'s Table 1 / 2 layout of the GAP columns: rows ACC (multi-label: the label accuracy), AUC and FR;
    a clean column per split, then one column per (budget, split). ``None`` for rows without the AUC columns
    (a task without class scores, or rows written before they existed)."""
    if not any("auc_clean" in r for r in rows):
        return None
    labelwise = any("label_accuracy_clean" in r for r in rows)
    acc_c, acc_a = ("label_accuracy_clean", "label_accuracy_adv") if labelwise else ("clean", "adv")
    by = {(r.get("budget"), r.get("split")): r for r in rows}
    budgets = list(dict.fromkeys(r.get("budget") for r in rows))
    shown = {"train": "X", "val": "val."}
    clean = {s: next((r for r in rows if r.get("split") == s), {}) for s in _SPLITS}
    cols: list[tuple[str, Mapping[str, Any], str, str]] = [
        (f"clean · {shown[s]}", clean[s], acc_c, "auc_clean") for s in _SPLITS]
    cols += [(f"GAP L∞ {_of_255(b)} · {shown[s]}", by.get((b, s), {}), acc_a, "auc_adv")
             for b in budgets for s in _SPLITS]
    acc_name = "ACC (label accuracy)" if labelwise else f"ACC ({metric})"
    table = [{"metric": acc_name, **{c: r.get(a) for c, r, a, _ in cols}},
             {"metric": "AUC", **{c: r.get(u) for c, r, _, u in cols}},
             {"metric": "FR", **{c: (None if c.startswith("clean") else r.get("fooling_rate")) for c, r, _, _ in cols}}]
    caption = ("Xu et al.'s Table 1 / 2 layout. ACC: " + ("the mean per-label accuracy (multi-label)" if labelwise
               else "the accuracy") + "; AUC: the score-based dataset AUC (macro one-vs-rest for classes, mean of the "
               "per-label AUCs for labels; spec 000, A9); FR: the share of samples whose prediction the perturbation "
               "changes. X: the generator's training split; val.: held out.")
    return data_table(table, ["metric", *(c for c, _, _, _ in cols)], caption)


def _draw_gap(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = study_metric(study)
    rows = study.rows
    budgets = list(dict.fromkeys(r.get("budget") for r in rows))
    names = [f"L∞ {fmt_budget(b)}" for b in budgets]
    by = {(r.get("budget"), r.get("split")): r for r in rows}
    series: list[tuple[str, Sequence[Any]]] = []
    for split, label in (("train", "fooling rate, train (X)"), ("val", "fooling rate, validation")):
        series.append((label, [by.get((b, split), {}).get("fooling_rate") for b in budgets]))
    for split, label in (("train", f"attacked {metric}, train (X)"), ("val", f"attacked {metric}, validation")):
        series.append((label, [by.get((b, split), {}).get("adv") for b in budgets]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(budgets) + 3), 3.8))
    bars(ax, names, series, "", "GAP: training split vs held-out split", (0.0, 1.0))
    legend_top(fig, ax, 2)
    meta = study.meta
    intro = (f"A GAP generator per budget, trained on {escape(meta.get('train'))} ({escape(meta.get('epochs'))} "
             f"epochs; epoch kept: {escape(meta.get('selection'))}), evaluated on that training split (Xu et al.'s "
             f"“X”) and on {escape(meta.get('n_val'))} held-out samples. Close values mean the perturbation "
             "generalises beyond the images it was fitted on.")
    blocks: list[Any] = []
    paper = _paper_table(rows, metric)
    if paper is not None:
        blocks.append(paper)
    blocks += [figure_image(fig, "GAP fooling rate and attacked metric on training and validation data"),
               data_table(rows, list(dict.fromkeys(k for r in rows for k in r)))]
    return Section("study-gap", f"GAP on training vs validation data (Xu et al.) · {metric}", intro, blocks)


# --- the config entry -------------------------------------------------------------------------------------------
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]


def _needs_gap(task: Task) -> str | None:
    """Why GAP cannot attack ``task``, or None: its loss needs class scores (a least-likely class), and its
    generator rewrites every input channel (a task with channels that must not change, e.g. prompt codes)."""
    if not task.class_scores:
        return "GAP's loss needs class scores (a least-likely class), and this task's outputs are values"
    fixed = task.fixed_input_channels()
    if fixed:
        return (f"GAP's generator rewrites every input channel, and the last {fixed} input channels of this task "
                "must not change")
    return None


@register_study("gap", draw=_draw_gap, needs=_needs_gap,
                check_options={"epochs": 1, "budgets": [0.1], "max_batches": 1,
                               "generator": {"name": "resnet", "ngf": 4}, "cases": 1})
class GapSpec(StudySpec):
    """GAP fitted on a training split, fooling rate on it vs held-out data (Xu et al. 2021): :func:`gap`.

    ``budgets``: L∞ budgets in data units (``[7/255, 11/255]``; default the config's ``budgets``); ``bounds``:
    the data box (default: the attacks' box); ``train`` / ``train_split`` as in the ``defenses`` study;
    ``generator``, ``universal``, ``loss``, ``per_channel``, ``output_scale``: GAP's; ``epochs``, ``batch_size``,
    ``lr``, ``betas``, ``max_batches``: GAPTrainer's; ``cases``: validation samples of the largest budget drawn
    as figures in the section."""

    study: Literal["gap"]
    budgets: Annotated[list[Budget], Field(min_length=1)] | None = None
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None
    train: DataSection | None = None
    train_split: Annotated[float, Strict(), Field(gt=0.0, lt=1.0)] | None = None
    generator: str | dict[str, Any] = "unet"
    universal: Annotated[bool, Strict()] = False
    loss: Literal["least_likely", "neg_true_logprob"] = "least_likely"
    per_channel: Annotated[bool, Strict()] = True
    output_scale: Number = Field(100.0, gt=0.0)
    epochs: Int = Field(10, ge=1)
    batch_size: Int = Field(16, ge=1)
    lr: Number = Field(2e-4, gt=0.0)
    betas: Annotated[list[Annotated[float, Strict(), Field(ge=0.0, lt=1.0)]], Field(min_length=2, max_length=2)] \
        = [0.5, 0.999]
    max_batches: Annotated[int, Strict(), Field(ge=1)] | None = None
    seed: Int = 0
    #: validation samples of the largest budget drawn as figures in the section (GAP images); kept
    #: small: each is a PNG in the study's JSON
    cases: Int = Field(0, ge=0, le=8)

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        if self.train is not None and self.train_split is not None:
            raise ValueError("give either `train` (a training data source) or `train_split`, not both")
        train_data = None
        if self.train is not None:
            train_data = self.load(self.train, task, batch_size=self.batch_size, seed=self.seed)
        box = data_box(self, attacks, "gap", required=True)
        return gap(one_model(models, self), task, data, budgets=_budgets(self.budgets, attacks),
                   bounds=box if box is None or isinstance(box, Box) else (box[0], box[1]), train_data=train_data,
                   train_split=self.train_split, generator=self.generator, universal=self.universal, loss=self.loss,
                   per_channel=self.per_channel, output_scale=self.output_scale, epochs=self.epochs,
                   batch_size=self.batch_size, lr=self.lr, betas=(self.betas[0], self.betas[1]),
                   max_batches=self.max_batches, seed=self.seed, cases=self.cases)
