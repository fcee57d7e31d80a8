"""Conformance checks of a study: :func:`check_study`.

The check reads only what :func:`medadv.studies.register_study` declares (the spec, ``draw``, ``needs``,
``spatial_dims``, ``single_range``, ``check_options``), so a study defined outside medadv is checked like the
built-in ones. It runs the study at a tiny size (2 samples, one FGSM step, the declared ``check_options``) on every
registered task kind's :meth:`~medadv.tasks.Task.examples`, or checks that it refuses the example in one line
before any work.

Properties (the names in a :class:`~medadv.testing.ConformanceError`): ``config round trip``, ``unknown keys``,
``refusal``, ``runs``, ``caller state``, ``strict JSON``, ``JSON file``, ``report``, ``determinism``.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..tasks import TaskExample, available_tasks
from ..threats import Box, Linf
from ._common import ConformanceError, count_forwards, examples_of, model_state, state_problems

__all__ = ["check_study", "StudyReport", "STUDY_PROPERTIES"]

#: the properties :func:`check_study` checks, in order
STUDY_PROPERTIES = ("config round trip", "unknown keys", "refusal", "runs", "caller state", "strict JSON",
                    "JSON file", "report", "determinism")

#: samples of each example a tiny run uses
SAMPLES = 2


class _Fail(ConformanceError):
    """A property failed (:func:`check_study` prefixes the study, the example and the property)."""


@dataclass
class StudyReport:
    """What :func:`check_study` did: the study, the examples it ran on and the ones refused (with the reason)."""

    study: str
    ran: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    passed: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        refused = "; ".join(f"{k}: {v}" for k, v in self.refused.items()) or "none"
        return (f"check_study({self.study}): {len(self.passed)} checks passed; ran on {', '.join(self.ran) or 'none'}; "
                f"refused {refused}")


# --- the spec ---------------------------------------------------------------------------------------------------
def _round_trip(info: Any) -> None:
    """The tiny spec and the default spec survive YAML: dump (the options as given) → load → validate → equal."""
    import yaml

    from ..config_schema import ConfigError
    from ..studies import validate_study

    for options in ({}, dict(info.check_options)):
        try:
            spec = validate_study({"study": info.name, **options})
        except ConfigError:
            if options:
                raise
            continue  # a study with required options (certify's sigma) has no default spec
        text = yaml.safe_dump(spec.model_dump(mode="json", exclude_unset=True))
        again = validate_study(yaml.safe_load(text))
        if again != spec or again.model_fields_set != spec.model_fields_set:
            raise _Fail(f"the spec {spec!r} comes back from YAML as {again!r}")


def _unknown_keys(info: Any) -> None:
    """A misspelt option and a misspelt study name are refused, each with the right name suggested."""
    from ..config_schema import ConfigError
    from ..studies import StudySpec, validate_study

    own = [k for k in info.spec.model_fields if k not in StudySpec.model_fields and len(k) >= 4]
    key = own[0] if own else "title"
    # two letters swapped (`sevreities`), or one dropped where the swap reads the same or is a field itself
    wrong = key[0] + key[2] + key[1] + key[3:]
    if wrong == key or wrong in info.spec.model_fields:
        wrong = key[0] + key[2:]
    try:
        validate_study({"study": info.name, wrong: 1})
    except ConfigError as e:
        text = str(e)
        if f"`{wrong}`" not in text or f"`{key}`" not in text:
            raise _Fail(f"the misspelt option `{wrong}` is refused without suggesting `{key}`: {text}") from None
    else:
        raise _Fail(f"the misspelt option `{wrong}` is accepted")
    try:
        validate_study({"study": info.name + "s"})
    except ConfigError as e:
        if f"did you mean {info.name!r}" not in str(e):
            raise _Fail(f"the misspelt study {info.name + 's'!r} is refused without suggesting {info.name!r}: "
                        f"{e}") from None
    else:
        raise _Fail(f"the unknown study {info.name + 's'!r} is accepted")


# --- one example ------------------------------------------------------------------------------------------------
def _box(ex: TaskExample) -> Box:
    return ex.box if isinstance(ex.box, Box) else Box(*ex.box)


def _expected_refusal(info: Any, ex: TaskExample) -> str | None:
    """Why the study declares it cannot run on ``ex`` (its ``needs``, ``spatial_dims`` or ``single_range``)."""
    why = info.refusal(ex.task)
    if why is not None:
        return why
    rank = ex.x.ndim - 2
    if info.spatial_dims and rank not in info.spatial_dims:
        return f"{rank}-D inputs (it supports {' or '.join(f'{d}-D' for d in info.spatial_dims)})"
    if info.single_range:
        try:
            _box(ex).data_range(ex.x)
        except ValueError as e:
            return str(e)
    return None


def _jsonable(value: Any, where: str) -> None:
    """Strict JSON: ``None``, bools, ints, finite floats, strings, and lists / string-keyed dicts of them."""
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Fail(f"{where} is {value} (write None: NaN and Inf are not JSON)")
        return
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _jsonable(v, f"{where}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise _Fail(f"{where} has a key {k!r} that is not a string")
            _jsonable(v, f"{where}[{k!r}]")
        return
    raise _Fail(f"{where} is a {type(value).__name__}, not a JSON value")


def _run(info: Any, models: dict[str, nn.Module], ex: TaskExample, data: tuple[Tensor, Tensor],
         attacks: dict[str, Any]) -> Any:
    from ..studies import run_study

    return run_study(info.name, dict(info.check_options), models, ex.task, data, attacks)


def _models(ex: TaskExample) -> dict[str, nn.Module]:
    """Two models (multi-model studies compare them): the example's and a copy of it."""
    return {"model": ex.model, "other": copy.deepcopy(ex.model)}


def _check_example(info: Any, ex: TaskExample, report: StudyReport, wanted: set[str]) -> None:
    from ..report.blocks import Section
    from ..report.html import render_html_report
    from ..studies import StudyResult

    subject = f"check_study({info.name}): {ex.key}"
    x, y = ex.x[:SAMPLES].clone(), ex.y[:SAMPLES].clone()
    attacks = {"fgsm": _fgsm(ex)}
    models = _models(ex)
    why = _expected_refusal(info, ex)

    def fail(prop: str, what: str) -> ConformanceError:
        return ConformanceError(f"{subject}: {prop}: {what}")

    if why is not None:  # the study must refuse, in one line, before any forward of a model
        with ExitStack() as stack:
            calls = [stack.enter_context(count_forwards(m)) for m in models.values()]
            try:
                _run(info, models, ex, (x, y), attacks)
            except (ValueError, TypeError) as e:
                text = str(e)
                if not text or "\n" in text:
                    raise fail("refusal", f"the refusal is not one line: {text!r}") from None
                if any(calls):
                    raise fail("refusal", f"the study ran its models ({sum(map(len, calls))} forwards) before "
                                          f"refusing ({text})") from None
            except Exception as e:  # noqa: BLE001 -- any other error is no clear refusal
                raise fail("refusal", f"refused with {type(e).__name__} (expected a one-line ValueError or "
                                      f"TypeError): {e}") from e
            else:
                raise fail("refusal", f"the study declares it cannot run here ({why}) but ran")
        report.refused[ex.key] = why
        report.passed.append(f"{ex.key}: refusal")
        return

    before = {n: model_state(m) for n, m in models.items()}
    xs, ys = x.clone(), y.clone()
    try:
        result = _run(info, models, ex, (x, y), attacks)
    except Exception as e:  # noqa: BLE001 -- a crash of a supported setting is the failure
        raise fail("runs", f"{type(e).__name__}: {e} (declare what the study needs with register_study(needs=, "
                           "spatial_dims=, single_range=) if it cannot run here)") from e
    if not isinstance(result, StudyResult) or result.study != info.name:
        raise fail("runs", f"run_study must return StudyResult({info.name!r}, ...), got {result!r}")
    if not isinstance(result.rows, list) or not all(isinstance(r, dict) for r in result.rows):
        raise fail("runs", "`rows` must be a list of dicts")
    report.passed.append(f"{ex.key}: runs")
    if "caller state" in wanted:
        for n, m in models.items():
            problems = state_problems(before[n], model_state(m))
            if problems:
                raise fail("caller state", f"model {n!r}: {'; '.join(problems)}")
        if not (torch.equal(x, xs) and torch.equal(y, ys)):
            raise fail("caller state", "the caller's data tensors were modified")
        report.passed.append(f"{ex.key}: caller state")
    if "strict JSON" in wanted:
        try:
            _jsonable(result.rows, "rows")
            json.dumps(result.rows, allow_nan=False)
            json.dumps(result.to_dict(), allow_nan=False)
        except _Fail as e:
            raise fail("strict JSON", str(e)) from None
        except (TypeError, ValueError) as e:
            raise fail("strict JSON", f"json.dumps(allow_nan=False) fails: {e}") from None
        report.passed.append(f"{ex.key}: strict JSON")
    shown = [result]
    if "JSON file" in wanted:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"study_{info.name}.json"
            result.to_json(path)
            back = StudyResult.from_json(path)
        if back.to_dict() != result.to_dict():
            raise fail("JSON file", "the study read back from its JSON file differs from the result")
        shown.append(back)  # the report of a finished run draws the study from its file
        report.passed.append(f"{ex.key}: JSON file")
    if "report" in wanted:
        for one in shown:
            if info.draw is not None:
                try:
                    sec = info.draw(one, None)
                except Exception as e:  # noqa: BLE001 -- the drawer's own error, named
                    raise fail("report", f"the drawer fails on the study's rows: {type(e).__name__}: {e}") from e
                if not isinstance(sec, Section) or not sec.blocks:
                    raise fail("report", f"the drawer must return a Section with blocks, got {sec!r}")
            html = render_html_report(None, studies=[one])
            if 'class="card" id="study-' not in html or "Could not draw" in html:
                raise fail("report", "the report section could not be drawn")
        report.passed.append(f"{ex.key}: report")
    if "determinism" in wanted:  # the studies keep no resume state: a second run with the same seed is equal
        again = _run(info, models, ex, (x, y), attacks)
        if json.dumps(again.to_dict()["rows"], sort_keys=True) != json.dumps(result.to_dict()["rows"], sort_keys=True):
            raise fail("determinism", "a second run with the same options and seed gives other rows")
        report.passed.append(f"{ex.key}: determinism")
    report.ran.append(ex.key)


def _fgsm(ex: TaskExample) -> Any:
    from ..attacks import get_attack

    return get_attack("fgsm", ex.task, Linf(float(ex.eps.get("Linf", 0.1)), bounds=ex.box))


def check_study(study: str, *, kinds: Iterable[str] | None = None, examples: Iterable[TaskExample] | None = None,
                properties: Iterable[str] | None = None) -> StudyReport:
    """Run the study contract on every registered task kind's examples.

    Args:
        study: a registered study name (:func:`medadv.studies.available_studies`).
        kinds: task kinds whose :meth:`~medadv.tasks.Task.examples` to use (default: every registered kind).
        examples: :class:`~medadv.tasks.TaskExample` s to use instead of the kinds' examples.
        properties: a subset of :data:`STUDY_PROPERTIES` (default: all).

    Checks: the spec of the study's ``check_options`` (and the default spec) comes back equal from YAML; a
    misspelt option and a misspelt study name are refused with the right name suggested; on every example (the
    first 2 samples, an FGSM attack at the example's L∞ ε) the study either refuses what it declares it cannot
    run on (``needs``, ``spatial_dims``, ``single_range`` of :func:`~medadv.studies.register_study`) with a
    one-line ``ValueError``/``TypeError`` before any forward of a model, or it runs and: leaves the models and the
    data tensors as it found them, gives rows of strict JSON (no NaN), survives its JSON file, draws its report
    section (no "Could not draw"), and gives equal rows when run again (studies keep no resume state: the same
    seed must give the same rows).

    Returns a :class:`StudyReport`; raises :class:`~medadv.testing.ConformanceError`
    (``"check_study(<study>): <example>: <property>: <what failed>"``).
    """
    from ..studies import get_study

    info = get_study(study)
    wanted = list(STUDY_PROPERTIES) if properties is None else list(properties)
    unknown = [p for p in wanted if p not in STUDY_PROPERTIES]
    if unknown:
        raise ValueError(f"`properties` has unknown properties {unknown}; known: {', '.join(STUDY_PROPERTIES)}")
    names = available_tasks() if kinds is None else list(kinds)
    if examples is not None:
        exs = list(examples)
        if not exs or not all(isinstance(e, TaskExample) for e in exs):
            raise TypeError("`examples` must be a non-empty iterable of TaskExample")
    report = StudyReport(info.name)
    for prop, fn in (("config round trip", _round_trip), ("unknown keys", _unknown_keys)):
        if prop in wanted:
            try:
                fn(info)
            except _Fail as e:
                raise ConformanceError(f"check_study({info.name}): spec: {prop}: {e}") from None
            report.passed.append(f"spec: {prop}")
    from ..attack_cache import suspended

    # no attack-once cache of a caller's run: the determinism re-run must craft again, not read the first run back
    with torch.random.fork_rng(devices=[]), suspended():
        torch.manual_seed(0)
        todo = exs if examples is not None else [e for k in names for e in examples_of(k)]
        for ex in todo:
            _check_example(info, ex, report, set(wanted))
    return report
