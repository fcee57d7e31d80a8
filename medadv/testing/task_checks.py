"""Conformance checks of a task kind: :func:`check_task`.

The checks run on the kind's :meth:`~medadv.tasks.Task.examples` (a small model with a batch each) and read only
what :class:`~medadv.tasks.Task` declares, so a kind defined outside medadv is checked like the built-in ones.

Properties (the names in a :class:`~medadv.testing.ConformanceError`): ``examples``, ``traits``, ``validate``, ``loss``,
``outcome``, ``sample columns``, ``robust metric``, ``decide``, ``outcome of a prediction``, ``labels``,
``determinism``, ``collation``, ``config round trip``, ``report case``, ``evaluate``.
"""

from __future__ import annotations

import inspect
import math
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..params import object_settings, stable_hash
from ..tasks import Outcome, Task, TaskExample, available_tasks, task_class, task_family
from ..threats import Box, Linf
from ._common import ConformanceError, examples_of

__all__ = ["check_task", "TaskReport", "TASK_PROPERTIES", "task_config"]


class _Fail(ConformanceError):
    """A property failed (:func:`check_task` prefixes the task, the example and the property)."""


def _close(a: Tensor, b: Tensor) -> bool:
    """Equal values (NaN equal to NaN), floats to a relative 1e-5."""
    if a.shape != b.shape:
        return False
    if a.is_floating_point() or b.is_floating_point():
        return bool(torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6, equal_nan=True))
    return bool(torch.equal(a, b))


def _per_sample(name: str, t: Any, n: int) -> Tensor:
    if not isinstance(t, Tensor):
        raise _Fail(f"`{name}` must be a tensor, got {type(t).__name__}")
    if t.ndim == 0 or t.shape[0] != n:
        raise _Fail(f"`{name}` must have leading dim N={n}, got shape {tuple(t.shape)}")
    return t


@dataclass
class _Ctx:
    """One example with its clean and perturbed outputs (computed once)."""

    ex: TaskExample
    task: Task
    logits: Tensor
    x_adv: Tensor
    adv_logits: Tensor

    @property
    def n(self) -> int:
        return int(self.ex.x.shape[0])


def _perturbed(ex: TaskExample) -> Tensor:
    """``x`` moved by a fixed sign pattern of the example's Linf ε, inside its box (a stand-in for an attack)."""
    box = ex.box if isinstance(ex.box, Box) else Box(*ex.box)
    g = torch.Generator().manual_seed(0)
    sign = torch.randint(0, 2, ex.x.shape, generator=g).to(ex.x.dtype) * 2 - 1
    x_adv = ex.x + float(ex.eps.get("Linf", 0.1)) * sign
    if box.bounds is not None:
        lo, hi = box.lohi(x_adv)
        x_adv = torch.minimum(torch.maximum(x_adv, lo), hi)
    return x_adv


def _context(ex: TaskExample, task: Task) -> _Ctx:
    model = ex.model.eval()
    x_adv = _perturbed(ex)
    with torch.no_grad():
        return _Ctx(ex, task, model(ex.x), x_adv, model(x_adv))


# --- properties ------------------------------------------------------------------------------------------------
def _validate(c: _Ctx) -> None:
    try:
        c.task.validate(c.logits, c.ex.y)
    except (ValueError, TypeError) as e:
        raise _Fail(f"the example's own model output and labels are refused: {e}") from None
    bad = c.ex.y[:-1] if c.n > 1 else c.ex.y.reshape(-1)[:0]
    try:
        c.task.validate(c.logits, bad)
    except (ValueError, TypeError) as e:
        if "`y`" not in str(e):
            raise _Fail(f"a misshaped `y` is refused without naming it: {e}") from None
    else:
        raise _Fail(f"labels of shape {tuple(bad.shape)} for {c.n} outputs are accepted")
    if c.ex.target is not None:
        try:
            c.task.validate(c.logits, c.ex.target, "target")
        except (ValueError, TypeError) as e:
            raise _Fail(f"the example's `target` is refused: {e}") from None


def _loss(c: _Ctx) -> None:
    logits = c.logits.detach().clone().requires_grad_(True)
    y = c.task.to_target(c.ex.y, logits)
    element = c.task.element_loss(logits, y)
    _per_sample("element_loss", element, c.n)
    if not torch.isfinite(element).all():
        raise _Fail("element_loss holds NaN/Inf on the example")
    loss = c.task.loss(logits, y)
    if tuple(loss.shape) != (c.n,):
        raise _Fail(f"loss must be per sample ({c.n},), got {tuple(loss.shape)}")
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    if not torch.isfinite(grad).all() or not bool(grad.abs().sum() > 0):
        raise _Fail("the loss gives no finite, non-zero gradient w.r.t. the logits (attacks follow it)")


def _outcome(c: _Ctx) -> Outcome:
    out = c.task.outcome(c.logits, c.ex.y)
    if not isinstance(out, Outcome):
        raise _Fail(f"outcome() must return an Outcome, got {type(out).__name__}")
    pred = c.task.predict(c.logits)
    if tuple(pred.shape) != tuple(c.ex.y.shape):
        raise _Fail(f"predict() must be shaped like y {tuple(c.ex.y.shape)}, got {tuple(pred.shape)}")
    if not _close(out.pred, pred):
        raise _Fail("outcome().pred differs from predict()")
    if tuple(out.wrong.shape) != (c.n,) or out.wrong.dtype != torch.bool:
        raise _Fail(f"outcome().wrong must be ({c.n},) bool, got {tuple(out.wrong.shape)} {out.wrong.dtype}")
    for k, v in out.columns.items():
        _per_sample(f"outcome().columns[{k!r}]", v, c.n)
    cls = type(c.task)
    for what, col in (("headline", cls.headline), ("robust_metric_column", cls.robust_metric_column),
                      ("tiebreak_column", cls.tiebreak_column)):
        if col is not None and col not in out.columns:
            raise _Fail(f"the declared {what} {col!r} is not a metric column ({', '.join(out.columns)})")
    return out


def _check_outcome(c: _Ctx) -> None:
    _outcome(c)


def _traits(c: _Ctx) -> None:
    """The kind's trait groups hold values their consumers accept (each consumer reads them without checking)."""
    from ..certify.smoothing import FAMILIES
    from ..data.sources import LABEL_SOURCES
    from ..report.cases import CASE_VIEWS
    from ..tasks.base import TOOLKITS, TaskTraits

    tr = c.task.traits
    if not isinstance(tr, TaskTraits):
        raise _Fail(f"`traits` must be a TaskTraits (Task.traits.but(...)), got {type(tr).__name__}")
    allowed: list[tuple[str, Any, tuple[Any, ...]]] = [
        ("labels.label_source", tr.labels.label_source, (None, *LABEL_SOURCES)),
        ("report.case_view", tr.report.case_view, (None, *(v for v in CASE_VIEWS if v != "image"))),
        ("report.classwise_view", tr.report.classwise_view, (None, "classes", "labels", "map")),
        ("certify.family", tr.certify.family, (None, *FAMILIES)),
        ("attacks.auto_runner", tr.attacks.auto_runner, ("engine", "pyautoattack")),
    ]
    for where, value, options in allowed:
        if value not in options:
            raise _Fail(f"traits.{where} is {value!r}, not one of {', '.join(map(repr, options))}")
    unknown = set(tr.toolkits.adapters) - set(TOOLKITS)
    if unknown:
        raise _Fail(f"traits.toolkits.adapters names {sorted(unknown)}, not adapters ({', '.join(TOOLKITS)})")
    for version, spec in tr.attacks.auto_versions.items():
        extra = set(spec.get("attacks", ())) - set(tr.attacks.auto_members)
        if extra:
            raise _Fail(f"traits.attacks.auto_versions[{version!r}] runs {sorted(extra)}, not in auto_members")
    if tr.metrics.class_dice:  # what segmentation_asr, certified_dice and the toolkits' criteria read
        missing = [a for a in ("num_classes", "include_background", "dice", "safe_labels", "one_hot",
                               "dice_threshold", "target_fraction") if not hasattr(c.task, a)]
        if missing:
            raise _Fail(f"traits.metrics.class_dice is declared, but the task has no {', '.join(missing)}")


def _sample_columns(c: _Ctx) -> None:
    clean = c.task.outcome(c.logits, c.ex.y)
    adv = c.task.outcome(c.adv_logits, c.ex.y)
    cols = c.task.sample_columns(c.ex.y, clean, adv)
    for k, v in cols.items():
        _per_sample(f"sample_columns()[{k!r}]", v, c.n)
    missing = [k for k in ("changed", "flipped", *(f"{p}_{m}" for m in clean.columns for p in ("clean", "adv")))
               if k not in cols]
    if missing:
        raise _Fail(f"sample_columns() lacks {missing}")
    for k in ("changed", "flipped"):
        if cols[k].dtype != torch.bool or cols[k].ndim != 1:
            raise _Fail(f"sample_columns()[{k!r}] must be (N,) bool, got {tuple(cols[k].shape)} {cols[k].dtype}")
    frac = c.task.change_fraction(clean.pred, adv.pred)
    if tuple(frac.shape) != (c.n,) or not bool(((frac >= 0) & (frac <= 1)).all()):
        raise _Fail(f"change_fraction() must be ({c.n},) in [0, 1], got {frac}")


def _robust_metric(c: _Ctx) -> None:
    cls = type(c.task)
    for logits in (c.logits, c.adv_logits):
        m = c.task.robust_metric(logits, c.ex.y)
        if tuple(m.shape) != (c.n,) or not m.is_floating_point():
            raise _Fail(f"robust_metric() must be ({c.n},) float, got {tuple(m.shape)} {m.dtype}")
        if not torch.isfinite(m).all():
            raise _Fail(f"robust_metric() holds NaN/Inf: {m.tolist()}")
        if bool((m < c.task.metric_floor).any()):
            raise _Fail(f"robust_metric() {m.tolist()} goes below metric_floor={c.task.metric_floor}")
        if cls.robust_metric_binary and not bool(((m == 0) | (m == 1)).all()):
            raise _Fail(f"robust_metric_binary is declared but robust_metric() is {m.tolist()}")
        col = cls.robust_metric_column
        if col is not None:
            stored = c.task.outcome(logits, c.ex.y).columns[col]
            if not _close(stored.to(torch.float64).reshape(c.n, -1).mean(dim=1), m.double()):
                raise _Fail(f"the column {col!r} ({stored.tolist()}) is not robust_metric() ({m.tolist()})")
    floor = c.task.metric_floor
    if not (isinstance(floor, int | float) and math.isfinite(float(floor))):
        raise _Fail(f"metric_floor must be a finite number, got {floor!r}")


def _decide(c: _Ctx) -> None:
    goals = [(c.ex.y, False)] + ([] if c.ex.target is None else [(c.ex.target, True)])
    for logits in (c.logits, c.adv_logits):
        for y, targeted in goals:
            pred, fooled = c.task.decide(logits, y, targeted)
            if not _close(pred, c.task.predict(logits)):
                raise _Fail(f"decide(targeted={targeted}) gives another prediction than predict()")
            ref = c.task.fooled(logits, y, targeted)
            if tuple(fooled.shape) != (c.n,) or fooled.dtype != torch.bool or not torch.equal(fooled, ref):
                raise _Fail(f"decide(targeted={targeted}) gives fooled={fooled.tolist()}, fooled() {ref.tolist()}")
        if not torch.equal(c.task.outcome(logits, c.ex.y).wrong, c.task.fooled(logits, c.ex.y)):
            raise _Fail("outcome().wrong differs from the untargeted fooled()")


def _outcome_of_pred(c: _Ctx) -> None:
    for logits in (c.logits, c.adv_logits):
        full = c.task.outcome(logits, c.ex.y)
        got = c.task.outcome_of_pred(full.pred, c.ex.y)
        if got is None:
            return
        if not torch.equal(got.wrong, full.wrong):
            raise _Fail("outcome_of_pred().wrong differs from outcome().wrong")
        for k, v in got.columns.items():
            if k in full.columns and not _close(v.double(), full.columns[k].double()):
                raise _Fail(f"outcome_of_pred() column {k!r} differs from outcome()'s")
    note = c.task.case_note(c.ex.y[0], c.task.predict(c.logits)[0], c.task.predict(c.adv_logits)[0])
    if not isinstance(note, str):
        raise _Fail(f"case_note() must return a string, got {type(note).__name__}")


def _labels(c: _Ctx) -> None:
    parsed = c.task.parse_labels(c.ex.y.clone(), c.ex.x)
    if not _close(parsed, c.ex.y) or parsed.dtype != c.ex.y.dtype:
        raise _Fail(f"parse_labels() changes the example's own labels ({c.ex.y.dtype} -> {parsed.dtype})")


def _rows(c: _Ctx, logits: Tensor, adv_logits: Tensor, y: Tensor, target: Tensor | None) -> dict[str, Tensor]:
    """Every per-sample quantity of one batch, by name."""
    t = c.task
    clean, adv = t.outcome(logits, y), t.outcome(adv_logits, y)
    out = {f"outcome.{k}": v for k, v in clean.columns.items()}
    out.update({"outcome.wrong": clean.wrong, "predict": t.predict(logits), "loss": t.loss(logits, t.to_target(y, logits)),
                "robust_metric": t.robust_metric(logits, y), "fooled": t.fooled(logits, y)})
    out.update({f"sample_columns.{k}": v for k, v in t.sample_columns(y, clean, adv).items()})
    if target is not None:
        out["fooled(targeted)"] = t.fooled(adv_logits, target, True)
    return out


def _determinism(c: _Ctx) -> None:
    first = _rows(c, c.logits, c.adv_logits, c.ex.y, c.ex.target)
    again = _rows(c, c.logits, c.adv_logits, c.ex.y, c.ex.target)
    for k, v in first.items():
        if not _close(v, again[k]):
            raise _Fail(f"{k} differs between two calls on the same output")


def _collation(c: _Ctx) -> None:
    """The rows of the batch equal the rows of the single-sample batches (no quantity mixes samples)."""
    batch = _rows(c, c.logits, c.adv_logits, c.ex.y, c.ex.target)
    for i in range(c.n):
        s = slice(i, i + 1)
        target = None if c.ex.target is None else c.ex.target[s]
        one = _rows(c, c.logits[s], c.adv_logits[s], c.ex.y[s], target)
        for k, v in batch.items():
            if k not in one:
                raise _Fail(f"{k} is missing for a single-sample batch")
            if not _close(v[s], one[k]):
                raise _Fail(f"{k} of sample {i} in a batch of {c.n} ({v[s].tolist()}) differs from its own "
                            f"single-sample batch ({one[k].tolist()})")


def task_config(task: Task) -> dict[str, Any]:
    """The ``task:`` section that builds ``task``: ``type`` (the registered name, or the class by dotted path) and
    each ``__init__`` parameter, read back from the attribute of the same name (or ``<name>_name`` / ``_<name>``
    when that name is a method). Raises ``ValueError`` for a parameter that cannot be read back."""
    cls = type(task)
    registered = task_family(task) == getattr(cls, "name", None) and cls.name in available_tasks() \
        and task_class(cls.name) is cls
    cfg: dict[str, Any] = {"type": cls.name if registered else f"{cls.__module__}:{cls.__qualname__}"}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name == "self" or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        if p.name == "outputs" and not task.outputs_declared:
            continue  # the base Task's option, left undeclared: the config leaves it out too (checked outputs)
        for attr in (p.name, f"{p.name}_name", f"_{p.name}"):
            v = getattr(task, attr, inspect.Parameter.empty)
            if v is not inspect.Parameter.empty and not callable(v):
                cfg[p.name] = v
                break
        else:
            raise ValueError(f"parameter `{p.name}` of {cls.__name__} cannot be read back from the task: store it as "
                             f"the attribute `{p.name}`")
    return cfg


def _config(c: _Ctx) -> None:
    import yaml

    from ..config import build_task

    try:
        cfg = task_config(c.task)
    except ValueError as e:
        raise _Fail(str(e)) from None
    schema = type(c.task).config_schema()
    if "type" not in getattr(schema, "model_fields", {}):
        raise _Fail(f"config_schema() {schema!r} has no `type` field")
    loaded = yaml.safe_load(yaml.safe_dump(cfg))
    built = build_task(loaded, allow_code=True)
    if repr(built) != repr(c.task):
        raise _Fail(f"the config {cfg} builds {built!r}, not {c.task!r}")
    if stable_hash(object_settings(built)) != stable_hash(object_settings(c.task)):
        raise _Fail(f"the config {cfg} builds a task with other settings: {object_settings(built)} "
                    f"vs {object_settings(c.task)}")
    if cfg["type"] in available_tasks():
        from ..tasks import get_task

        again = get_task(cfg["type"], **{k: v for k, v in loaded.items() if k != "type"})
        if repr(again) != repr(c.task):
            raise _Fail(f"get_task({cfg['type']!r}, ...) builds {again!r}, not {c.task!r}")


def _report_case(c: _Ctx) -> None:
    from ..report.cases import make_cases, plot_case

    cases = make_cases(c.task, c.ex.x, c.x_adv, c.logits, c.adv_logits, c.ex.y, k=1, title="check_task")
    if len(cases) != 1:
        raise _Fail(f"make_cases(k=1) gave {len(cases)} cases")
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "case.png"
        fig = plot_case(cases[0], path)
        plt.close(fig)
        if not path.is_file() or path.stat().st_size == 0:
            raise _Fail("plot_case() wrote no PNG")


def _evaluate(c: _Ctx) -> None:
    from ..attacks.fgsm import FGSM
    from ..evaluation import evaluate

    box = c.ex.box if isinstance(c.ex.box, Box) else Box(*c.ex.box)
    attack = FGSM(c.task, Linf(float(c.ex.eps.get("Linf", 0.1)), bounds=box))
    res = evaluate(c.ex.model, c.task, (c.ex.x, c.ex.y), {"fgsm": attack})
    rows = res.rows
    if len(rows) != c.n:
        raise _Fail(f"evaluate() gave {len(rows)} rows for {c.n} samples")
    cls = type(c.task)
    for col in (cls.headline, cls.robust_metric_column):
        if col is not None and any(f"{p}_{col}" not in r for r in rows for p in ("clean", "adv")):
            raise _Fail(f"the result rows lack clean_{col} / adv_{col}")
    res.summary()


#: the properties, in the order they run
TASK_PROPERTIES: dict[str, Callable[[_Ctx], None]] = {
    "traits": _traits,
    "validate": _validate,
    "loss": _loss,
    "outcome": _check_outcome,
    "sample columns": _sample_columns,
    "robust metric": _robust_metric,
    "decide": _decide,
    "outcome of a prediction": _outcome_of_pred,
    "labels": _labels,
    "determinism": _determinism,
    "collation": _collation,
    "config round trip": _config,
    "report case": _report_case,
    "evaluate": _evaluate,
}


@dataclass
class TaskReport:
    """What :func:`check_task` checked: ``passed`` (``"<example>: <property>"``) and ``skipped`` (example -> why)."""

    task: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"check_task({self.task}): {len(self.passed)} checks passed"]
        return "\n".join(lines + [f"  skipped {k}: {v}" for k, v in self.skipped.items()])


def _examples(cls: type[Task], given: Iterable[TaskExample] | None, subject: str) -> list[TaskExample]:
    if given is not None:
        return list(given)
    try:
        exs = examples_of(cls, fresh=True)
    except NotImplementedError as e:
        raise ConformanceError(f"{subject}: examples: {e}") from None
    if not exs or not all(isinstance(e, TaskExample) for e in exs):
        raise ConformanceError(f"{subject}: examples: examples() must return a non-empty list of TaskExample")
    keys = [e.key for e in exs]
    if len(set(keys)) != len(keys):
        raise ConformanceError(f"{subject}: examples: the keys {keys} are not unique")
    again = examples_of(cls, fresh=True)
    for a, b in zip(exs, again, strict=True):
        if not (torch.equal(a.x, b.x) and torch.equal(a.y, b.y)):
            raise ConformanceError(f"{subject}: examples: examples() gives other data on a second call (seed it)")
    for one in exs:
        if not isinstance(one.task, cls):
            raise ConformanceError(f"{subject}: examples: the {one.key} example's task is {one.task!r}, not a "
                                   f"{cls.__name__}")
    return exs


def _fits(task: Task, ex: TaskExample) -> bool:
    with torch.no_grad():
        logits = ex.model.eval()(ex.x)
    try:
        task.validate(logits, ex.y)
    except (ValueError, TypeError):
        return False
    return True


def check_task(task: str | type[Task] | Task, *, examples: Iterable[TaskExample] | None = None,
               properties: Iterable[str] | None = None) -> TaskReport:
    """Run the task contract on the kind's examples.

    Args:
        task: a registered kind name, a :class:`~medadv.tasks.Task` subclass (registered or not) or an instance
            (checked on the examples its ``validate`` accepts, in place of the examples' own task).
        examples: :class:`~medadv.tasks.TaskExample` s to use instead of the class's ``examples()``.
        properties: a subset of :data:`TASK_PROPERTIES` (default: all).

    Checks, per example: the trait groups hold values their consumers accept (label form, case and class-wise
    views, smoothing family, toolkit adapters, ``auto``'s versions within its members, per-class Dice with the
    attributes it needs); ``validate`` accepts the example and refuses misshaped labels naming ``y``; the loss is per
    sample with a finite gradient; ``outcome`` gives ``predict``'s prediction, an ``(N,)`` bool ``wrong`` and per-sample
    columns that include the declared ``headline``, ``robust_metric_column`` and ``tiebreak_column``;
    ``sample_columns`` has ``changed``, ``flipped`` and every ``clean_``/``adv_`` pair, with leading dim N;
    ``robust_metric`` is ``(N,)`` float, finite, at least ``metric_floor``, 0/1 when declared binary and equal to its
    column; ``decide`` agrees with ``predict``/``fooled`` (untargeted and, with the example's target, targeted);
    ``outcome_of_pred`` agrees with ``outcome``; ``parse_labels`` keeps the example's labels; every quantity is
    deterministic and a batch's rows equal those of its single-sample batches; the config built from the task
    (``type`` and its ``__init__`` parameters) through :meth:`~medadv.tasks.Task.config_schema` gives an equal task;
    a report case renders to a PNG; :func:`~medadv.evaluate` runs with FGSM.

    Returns a :class:`TaskReport`; raises :class:`~medadv.testing.ConformanceError`
    (``"check_task(<task>): <example>: <property>: <what failed>"``).
    """
    if isinstance(task, Task):
        cls: type[Task] = type(task)
        instance: Task | None = task
    else:
        cls = task_class(task) if isinstance(task, str) else task
        instance = None
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"check_task() takes a task kind name, Task class or instance, got {task!r}")
    wanted = list(TASK_PROPERTIES) if properties is None else list(properties)
    unknown = [p for p in wanted if p not in TASK_PROPERTIES]
    if unknown:
        raise ValueError(f"unknown properties {unknown}; known: {', '.join(TASK_PROPERTIES)}")
    subject = f"check_task({instance!r})" if instance is not None else f"check_task({cls.__name__})"
    report = TaskReport(subject[len("check_task("):-1])
    with torch.random.fork_rng(devices=[]):
        exs = _examples(cls, examples, subject)
        used = 0
        for ex in exs:
            t = ex.task
            if instance is not None:
                if not _fits(instance, ex):
                    report.skipped[ex.key] = f"{instance!r} does not fit the example's model output and labels"
                    continue
                t = instance
            used += 1
            ctx = _context(ex, t)
            for prop in wanted:
                try:
                    TASK_PROPERTIES[prop](ctx)
                except _Fail as e:
                    raise ConformanceError(f"{subject}: {ex.key}: {prop}: {e}") from None
                except ConformanceError:
                    raise
                except Exception as e:  # noqa: BLE001 -- a crash is a failure of the property, named as such
                    raise ConformanceError(f"{subject}: {ex.key}: {prop}: {type(e).__name__}: {e}") from e
                report.passed.append(f"{ex.key}: {prop}")
        if not used:
            raise ConformanceError(f"{subject}: examples: no example fits the task; pass examples=[TaskExample(...)]")
    return report

