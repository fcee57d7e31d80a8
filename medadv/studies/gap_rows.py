"""GAP on the data its generator was trained on vs held-out data (Xu et al. 2021, Tables 1–2, "X" vs "val.").

Xu, Zhang, Li, Liu, Zhang. "Towards evaluating the robustness of deep diagnostic models by adversarial attack",
Medical Image Analysis 2021 (GAP: Poursaeed et al., CVPR 2018). Xu et al. report GAP's accuracy and fooling rate
on "X", the training set the generator was fitted on, and on "val.", a held-out validation set: similar values
mean the generator generalises (spec 000, §2.2 "GAP evaluation protocol").

For each L∞ budget the study builds a fresh :class:`~medadv.attacks.gap.GAP` generator, fits it with
:class:`~medadv.training.GAPTrainer` against the frozen model on the training split (the epoch kept is the
one with the highest fooling rate *on the training split*, Xu et al.'s code's rule on X, so the validation
rows never steer the choice), and reports on both splits the clean and attacked robust metric and the
fooling rate (the share of samples whose prediction the perturbation changes, Xu et al.'s FR).

Training data as in :mod:`medadv.studies.defenses`: ``train_data``, or the first ``train_split`` share of
``data`` (the rest is the validation split).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict
from torch import Tensor, nn

from ..config_schema import Budget, DataSection
from ..report.html import (
    Section,
    StudyLike,
    _bars,
    _legend_top,
    _plt,
    _study_metric,
    _table,
    figure_image,
    fmt_budget,
    study_section,
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
from .schema import StudySpec, _box, _one, register_study

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


def _rows_of(model: nn.Module, task: Task, atk: Any, x: Tensor, y: Tensor, batch_size: int) -> dict[str, Any]:
    """Clean / attacked robust metric and fooling rate of a trained GAP on ``(x, y)``."""
    data = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)]
    clean, adv, fooled = [], [], []
    for batch in attacked_batches(model, task, data, [("gap", atk)]):
        res = batch.attacked[0].result
        clean.append(robust_metric(task, batch.clean_logits, batch.y))
        adv.append(robust_metric(task, res.logits, batch.y))
        pred = task.predict(batch.clean_logits)
        fooled.append(task.fooled(res.logits, pred, False).reshape(-1).double().cpu())
    c, a = float(torch.cat(clean).mean()), float(torch.cat(adv).mean())
    return {"clean": c, "adv": a, "drop_points": 100.0 * (c - a), "fooling_rate": float(torch.cat(fooled).mean()),
            "n": int(x.shape[0])}


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

    Returns:
        ``StudyResult("gap")``: rows ``{budget, split, clean, adv, drop_points, fooling_rate, n}`` with ``split``
        ``"train"`` (the generator's training data, Xu's "X") or ``"val"`` (held out); ``meta["history"]`` holds
        each budget's per-epoch training record.
    """
    from ..attacks.gap import GAP
    from ..training.gap import GAPTrainer

    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
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
    for eps in budgets:
        atk = GAP(task, Linf(eps, bounds=box), dict(spec), universal=universal,
                  input_shape=tuple(x_tr.shape[1:]) if universal else None, per_channel=per_channel, loss=loss,
                  output_scale=output_scale, seed=seed)
        trainer = GAPTrainer(atk, model, epochs=epochs, batch_size=batch_size, lr=lr, betas=betas,
                             max_batches=max_batches, seed=seed)
        trainer.fit(x_tr, y_tr)  # the best epoch is chosen on the training split (x_val left out)
        history[f"{eps:.6g}"] = list(trainer.history)
        for split, (xs, ys) in zip(_SPLITS, ((x_tr, y_tr), (x_val, y_val)), strict=True):
            rows.append({"budget": eps, "split": split, **_rows_of(model, task, atk, xs, ys, batch_size)})
    meta = {"metric": task.robust_metric_name, "budgets": budgets, "generator": spec, "epochs": epochs, "lr": lr,
            "betas": list(betas), "max_batches": max_batches, "universal": universal, "loss": loss, "seed": seed,
            "history": history, "selection": "epoch with the highest fooling rate on the training split",
            "n_val": int(x_val.shape[0]), **split_meta}
    return StudyResult("gap", rows, meta)


# --- the config entry -------------------------------------------------------------------------------------------
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]


@register_study("gap")
class GapSpec(StudySpec):
    """GAP fitted on a training split, fooling rate on it vs held-out data (Xu et al. 2021): :func:`gap`.

    ``budgets``: L∞ budgets in data units (``[7/255, 11/255]``; default the config's ``budgets``); ``bounds``:
    the data box (default: the attacks' box); ``train`` / ``train_split`` as in the ``defenses`` study;
    ``generator``, ``universal``, ``loss``, ``per_channel``, ``output_scale``: GAP's; ``epochs``, ``batch_size``,
    ``lr``, ``betas``, ``max_batches``: GAPTrainer's."""

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

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        if self.train is not None and self.train_split is not None:
            raise ValueError("give either `train` (a training data source) or `train_split`, not both")
        train_data = None
        if self.train is not None:
            train_data = self.load(self.train, task, batch_size=self.batch_size, seed=self.seed)
        box = _box(self, attacks, "gap", required=True)
        return gap(_one(models, self), task, data, budgets=_budgets(self.budgets, attacks),
                   bounds=box if box is None or isinstance(box, Box) else (box[0], box[1]), train_data=train_data,
                   train_split=self.train_split, generator=self.generator, universal=self.universal, loss=self.loss,
                   per_channel=self.per_channel, output_scale=self.output_scale, epochs=self.epochs,
                   batch_size=self.batch_size, lr=self.lr, betas=(self.betas[0], self.betas[1]),
                   max_batches=self.max_batches, seed=self.seed)


# --- the report section -----------------------------------------------------------------------------------------
@study_section("gap")
def _study_gap(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = _study_metric(study)
    rows = study.rows
    budgets = list(dict.fromkeys(r.get("budget") for r in rows))
    names = [f"L∞ {fmt_budget(b)}" for b in budgets]
    by = {(r.get("budget"), r.get("split")): r for r in rows}
    series: list[tuple[str, Sequence[Any]]] = []
    for split, label in (("train", "fooling rate, train (X)"), ("val", "fooling rate, validation")):
        series.append((label, [by.get((b, split), {}).get("fooling_rate") for b in budgets]))
    for split, label in (("train", f"attacked {metric}, train (X)"), ("val", f"attacked {metric}, validation")):
        series.append((label, [by.get((b, split), {}).get("adv") for b in budgets]))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(budgets) + 3), 3.8))
    _bars(ax, names, series, "", "GAP: training split vs held-out split", (0.0, 1.0))
    _legend_top(fig, ax, 2)
    meta = study.meta
    intro = (f"A GAP generator per budget, trained on {meta.get('train')} ({meta.get('epochs')} epochs; epoch kept: "
             f"{meta.get('selection')}), evaluated on that training split (Xu et al.'s “X”) and on "
             f"{meta.get('n_val')} held-out samples. Close values mean the perturbation generalises beyond the "
             "images it was fitted on.")
    return Section("study-gap", f"GAP on training vs validation data (Xu et al.) · {metric}", intro,
                   [figure_image(fig, "GAP fooling rate and attacked metric on training and validation data"),
                    _table(rows, list(dict.fromkeys(k for r in rows for k in r)))])
