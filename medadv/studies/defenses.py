"""Defenses compared under the same attacks (Xu et al. 2021, Table 5): one trained copy per training strategy.

Xu, Zhang, Li, Liu, Zhang. "Towards evaluating the robustness of deep diagnostic models by adversarial attack",
Medical Image Analysis 2021, Table 5: the natural model ("None" on clean images, "Attack" under PGD), standard
(Madry) adversarial training, MPAdvT and MAAdvT, all evaluated under the same attack.

For every strategy the study takes a fresh deep copy of the given model (``init="copy"``: its weights, so the
strategy *fine-tunes* the given model, the practical choice on a CPU; ``init="reset"``: every submodule's
``reset_parameters()`` under the study's seed, i.e. training from scratch as Xu et al. do), trains it on the
training data with that strategy, then attacks it white-box with every attack and reports the task's robust
metric (accuracy / exact match / mean Dice) clean and attacked. The caller's model is never modified.

Strategies are named by their :class:`~medadv.defenses.base.TrainingStrategy` ``name`` (``pgd_at``,
``mpadvt``, ``maadvt``, ``trades``, ``vaft``, ``gaussian``, and any subclass defined later: the names are read
from the class hierarchy, not from a list kept here) plus ``none``: plain training on clean data with the same
recipe (optimiser, epochs, data order), the control that isolates the adversarial part. ``{name: none,
epochs: 0}`` is the given model unchanged (with ``init="copy"``): Xu et al.'s "None"/"Attack" rows.

Training data: ``train_data`` (an ``(x, y)`` pair or any batches; the study's evaluation then runs on the whole
``data``), or else the first ``train_split`` share of ``data``'s samples trains and the rest evaluates (no
shuffling: shuffle the data first if it is ordered by class). The training split is held in memory.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict, field_validator, model_validator
from pydantic_core import PydanticCustomError
from torch import Tensor, nn

from ..config_schema import Budget, DataSection
from ..defenses.strategies import NONE, build_strategy, label_of, normalize_entry, strategy_classes
from ..report.blocks import (
    Section,
    StudyLike,
    bars,
    data_table,
    escape,
    figure_image,
    legend_top,
    pyplot,
    setting_key,
    study_metric,
)
from ..runtime import model_device
from ..tasks import Task
from ..threats import Box, Linf, Threat
from ._common import (
    AttackSpec,
    TargetFn,
    add_notes,
    attacked_batches,
    check_model,
    check_task,
    forward,
    gather,
    named_attacks,
    renormalization_notes,
    robust_metric,
    split_train_eval,
)
from .base import StudyResult
from .registry import StudySpec, data_box, one_model, register_study

__all__ = ["defenses", "strategy_classes", "build_strategy", "DefensesSpec", "split_train_eval", "gather"]

# --- data -------------------------------------------------------------------------------------------------------
# --- the model copies -------------------------------------------------------------------------------------------
def initial_copy(model: nn.Module, init: str, seed: int) -> nn.Module:
    """A deep copy of ``model``: its weights (``"copy"``) or re-initialised under ``seed`` (``"reset"``).

    ``"reset"`` calls every submodule's ``reset_parameters()`` with the global RNG forked and seeded (the
    caller's random stream is untouched); a submodule with parameters of its own and no ``reset_parameters``
    cannot be re-initialised soundly and is refused."""
    if init not in ("copy", "reset"):
        raise ValueError(f"`init` must be 'copy' or 'reset'; got {init!r}")
    net = copy.deepcopy(model)
    if init == "copy":
        return net
    for name, m in net.named_modules():
        if any(True for _ in m.parameters(recurse=False)) and not callable(getattr(m, "reset_parameters", None)):
            raise ValueError(f"`init: reset` cannot re-initialise submodule {name or '(root)'!r} "
                             f"({type(m).__name__}): it has parameters and no reset_parameters(); use `init: copy`")
    dev = model_device(net)
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        torch.manual_seed(int(seed))
        for m in net.modules():
            reset = getattr(m, "reset_parameters", None)
            if callable(reset):
                reset()
    return net


def _train(net: nn.Module, task: Task, strategy: Any, x: Tensor, y: Tensor, *, epochs: int, lr: float,
           batch_size: int, seed: int) -> list[float]:
    from ..defenses.trainer import AdversarialTrainer
    from ..training.supervised import SupervisedFitter

    if epochs == 0:
        return []
    dev = model_device(net, x.device)
    # dropout and other draws of the training come from the global RNG: forked and seeded, so the same seed gives
    # the same copy (and the same rows) and the caller's random stream is not advanced
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        torch.manual_seed(int(seed))
        if strategy is None:
            fitter: Any = SupervisedFitter(net, task, torch.optim.Adam(net.parameters(), lr=lr), epochs=epochs,
                                           batch_size=batch_size, seed=seed, desc="train[none]")
            history = fitter.run(x, y, dev)
        else:
            history = AdversarialTrainer(net, task, strategy, epochs=epochs, batch_size=batch_size, lr=lr,
                                         seed=seed).fit(x, y)
    net.eval()
    return [float(h) for h in history]


# --- the study --------------------------------------------------------------------------------------------------
DEFAULT_STRATEGIES: tuple[str, ...] = (NONE, "pgd_at", "mpadvt", "maadvt")  # Xu et al.'s Table 5 rows


def defenses(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    strategies: Sequence[str | Mapping[str, Any]] = DEFAULT_STRATEGIES,
    train_data: Any = None,
    train_split: float | None = None,
    init: Literal["copy", "reset"] = "copy",
    epochs: int = 3,
    lr: float = 1e-3,
    batch_size: int = 16,
    eps: float | None = None,
    bounds: Box | tuple[float, float] | None = None,
    seed: int = 0,
    target_fn: TargetFn | None = None,
) -> StudyResult:
    """Train one copy of ``model`` per strategy, attack each with every attack (Xu et al. 2021, Table 5).

    Args:
        model: the natural model (left unchanged; copies are trained).
        task, data, attacks, target_fn: as for ``evaluate``; the attacks are crafted on each trained copy.
        strategies: names or ``{name: ..., id: ..., epochs: ..., lr: ..., eps: ..., **strategy parameters}``
            (``none`` for clean training; see :func:`strategy_classes`). ``id`` labels the rows (two entries of
            one strategy need distinct ids); ``epochs``/``lr`` override the study's for that entry.
        train_data: a separate training set (``(x, y)`` or batches); else ``train_split`` of ``data`` trains.
        train_split: share of ``data``'s samples, taken from the front, that trains (default 0.5 without
            ``train_data``); the rest evaluates.
        init: ``"copy"`` (fine-tune the given weights) or ``"reset"`` (re-initialise, train from scratch).
        epochs: passes over the training data (0: no training).
        lr: Adam learning rate.
        batch_size: training minibatch size (and the evaluation batches of a ``train_split``).
        eps: training ε in data units for strategies with a fixed ball (PGD-AT, MAAdvT, TRADES); default the
            first ε-ball attack's ε (Xu et al. train and test at 4/255), with that attack's norm.
        bounds: the data box ``(lo, hi)`` in data units for MPAdvT / VAFT and a given ``eps`` (default: the
            attacks' box).
        seed: seed of the data order, of every strategy's random draws and of ``init="reset"``.

    Returns:
        ``StudyResult("defenses")``: rows ``{strategy, attack, budget, clean, adv, drop_points}`` (the task's
        robust metric, ``meta["metric"]``, averaged over the evaluation samples; ``drop_points = 100 (clean −
        adv)``); ``meta["training"]`` holds each strategy's settings and per-epoch training loss,
        ``meta["notes"]`` notes on the attacks (VAFA's renormalisation).
    """
    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the defenses study compares the strategies under attack")
    for k, v, low in (("epochs", epochs, 0), ("batch_size", batch_size, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"`{k}` must be an integer >= {low}; got {v!r}")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not lr > 0:
        raise ValueError(f"`lr` must be a number > 0; got {lr!r}")
    known = strategy_classes()
    entries = [normalize_entry(e, known) for e in strategies]
    if not entries:
        raise ValueError("`strategies` is empty")
    labels = [label_of(e) for e in entries]
    dup = sorted({n for n in labels if labels.count(n) > 1})
    if dup:
        raise ValueError(f"`strategies` has two entries labelled {dup[0]!r}: give them distinct `id`s")
    if init == "reset":
        untrained = [label_of(e) for e in entries if int(e.get("epochs", epochs)) == 0]
        if untrained:
            raise ValueError(f"`init: reset` with 0 epochs for {untrained} evaluates an untrained network; give "
                             "epochs >= 1 or use `init: copy`")
    ball = next((a.threat for _, a in named if isinstance(getattr(a, "threat", None), Threat)), None)
    box = Box.coerce(bounds) if bounds is not None else named[0][1].box
    threat = ball
    if eps is not None:
        threat = (type(ball) if ball is not None else Linf)(float(eps), bounds=ball.box if ball is not None else box)
    (x_tr, y_tr), eval_data, split_meta = split_train_eval(data, train_data, train_split, batch_size)
    task.validate(forward(model, x_tr[:2]), y_tr[:2].to(model_device(model)), "y")

    rows: list[dict[str, Any]] = []
    training: dict[str, Any] = {}
    for entry, label in zip(entries, labels, strict=True):
        strategy = build_strategy(entry, threat=threat, box=box)
        n_epochs = int(entry.get("epochs", epochs))
        net = initial_copy(model, init, seed)
        loss = _train(net, task, strategy, x_tr, y_tr, epochs=n_epochs, lr=float(entry.get("lr", lr)),
                      batch_size=batch_size, seed=seed)
        training[label] = {"strategy": entry["name"], "repr": "clean training" if strategy is None else repr(strategy),
                           "epochs": n_epochs, "lr": float(entry.get("lr", lr)), "loss": loss}
        clean: list[Tensor] = []
        adv: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
        for batch in attacked_batches(net, task, eval_data, named, target_fn):
            clean.append(robust_metric(task, batch.clean_logits, batch.y))
            for i, att in enumerate(batch.attacked):
                adv[i].append(robust_metric(task, att.result.logits, batch.y))
        if not clean:
            raise ValueError("`data` is empty: nothing to evaluate")
        c = float(torch.cat(clean).mean())
        for i, (aname, atk) in enumerate(named):
            a = float(torch.cat(adv[i]).mean())
            rows.append({"strategy": label, "attack": aname, "budget": atk.budget, "clean": c, "adv": a,
                         "drop_points": 100.0 * (c - a)})
    meta: dict[str, Any] = {"metric": task.robust_metric_name, "strategies": labels, "init": init, "epochs": epochs,
                            "lr": lr, "batch_size": batch_size, "seed": seed, "training": training,
                            "train_eps": None if threat is None else threat.eps, **split_meta}
    add_notes(meta, renormalization_notes(named))
    return StudyResult("defenses", rows, meta)


# --- the report section -----------------------------------------------------------------------------------------
def _draw_defenses(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = study_metric(study)
    rows = study.rows
    strategies = list(dict.fromkeys(str(r["strategy"]) for r in rows))
    settings = list(dict.fromkeys((r.get("attack"), r.get("budget")) for r in rows))
    by = {(str(r["strategy"]), r.get("attack"), r.get("budget")): r for r in rows}
    clean = [next((r.get("clean") for r in rows if str(r["strategy"]) == s), None) for s in strategies]
    series: list[tuple[str, Sequence[Any]]] = [("clean", clean)]
    for s in settings:
        series.append((setting_key(*s), [by.get((st, *s), {}).get("adv") for st in strategies]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.5, 0.9 * len(strategies) * len(series) / 2 + 2.5), 3.8))
    bars(ax, strategies, series, metric, "training strategy: clean vs attacked", None)
    legend_top(fig, ax, 4)
    meta = study.meta
    train = meta.get("train")
    intro = (f"One copy of the model per training strategy ({'fine-tuned from the given weights' if meta.get('init') == 'copy' else 'trained from scratch'}, "
             f"{escape(meta.get('epochs'))} epochs, Adam lr {escape(meta.get('lr'))}; training data: "
             f"{escape(train)}), each attacked white-box: {escape(metric)} clean and under every attack (Xu et al. "
             "2021, Table 5). <code>none</code> is clean training with the same recipe.")
    # meta["notes"] (a VAFA renormalisation, naming the config's attack ids) are shown, escaped, by the report's
    # study-section dispatch above every study's blocks
    blocks: list[Any] = [figure_image(fig, "clean and attacked metric per training strategy"),
               data_table(rows, list(dict.fromkeys(k for r in rows for k in r)))]
    return Section("study-defenses", f"Defenses (Xu et al. Table 5) · {metric}", intro, blocks)


# --- the config entry -------------------------------------------------------------------------------------------
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]


@register_study("defenses", draw=_draw_defenses,
                check_options={"strategies": [{"name": "none", "epochs": 1}], "epochs": 1})
class DefensesSpec(StudySpec):
    """Training strategies compared under the config's attacks (Xu et al. 2021, Table 5): :func:`defenses`.

    ``strategies``: names or mappings (``{name: pgd_at, steps: 4}``, ``{name: none, epochs: 0}``); ``train``: a
    separate training set, a ``data:``-style mapping (file paths relative to the working directory), else
    ``train_split`` (default 0.5) of the data trains; ``init``: ``copy`` (fine-tune) or ``reset`` (from
    scratch); ``eps``: the training ε in data units (default: the first ε-ball attack's); ``bounds``: the data
    box (default: the attacks' box)."""

    study: Literal["defenses"]
    strategies: Annotated[list[Any], Field(min_length=1)] = list(DEFAULT_STRATEGIES)
    train: DataSection | None = None
    train_split: Annotated[float, Strict(), Field(gt=0.0, lt=1.0)] | None = None
    init: Literal["copy", "reset"] = "copy"
    epochs: Int = Field(3, ge=0)
    lr: Number = Field(1e-3, gt=0.0)
    batch_size: Int = Field(16, ge=1)
    eps: Budget | None = None
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None
    seed: Int = 0

    @field_validator("strategies")
    @classmethod
    def _known_strategies(cls, value: list[Any]) -> list[Any]:
        known = strategy_classes()
        out = []
        for i, entry in enumerate(value):
            try:
                out.append(normalize_entry(entry, known))
            except ValueError as e:
                raise PydanticCustomError("strategy", "entry [{i}]: {why}", {"i": i, "why": str(e)}) from None
        labels = [label_of(e) for e in out]
        dup = sorted({n for n in labels if labels.count(n) > 1})
        if dup:
            raise PydanticCustomError("strategy", "has two entries labelled {n}: give them distinct `id`s",
                                      {"n": repr(dup[0])})
        return out

    @model_validator(mode="after")
    def _one_training_set(self) -> DefensesSpec:
        if self.train is not None and self.train_split is not None:
            raise PydanticCustomError("train_split", "give either `train` (a training data source) or `train_split` "
                                      "(a share of the data), not both")
        return self

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        train_data = None
        if self.train is not None:
            train_data = self.load(self.train, task, batch_size=self.batch_size, seed=self.seed)
        box = data_box(self, attacks, "defenses", required=False)
        return defenses(one_model(models, self), task, data, attacks if attacks is not None else {},
                        strategies=self.strategies, train_data=train_data, train_split=self.train_split,
                        init=self.init, epochs=self.epochs, lr=self.lr, batch_size=self.batch_size, eps=self.eps,
                        bounds=box if box is None or isinstance(box, Box) else (box[0], box[1]), seed=self.seed,
                        target_fn=target_fn)
