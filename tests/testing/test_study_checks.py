""":func:`medadv.testing.check_study` catches what it claims to, naming the failed property: a study registered in
this file (one module-level class and its function, as in docs/extending.md) is checked like the built-in ones, and
broken variants of it fail with the property that broke."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Literal

import pytest
import torch

from medadv.report.blocks import Section, data_table
from medadv.studies import StudyResult, available_studies, get_study, register_study, run_study
from medadv.studies.registry import _REGISTRY as REGISTRY
from medadv.studies.registry import Int, StudySpec, one_model
from medadv.testing import ConformanceError, check_study

_CALLS: dict[str, Any] = {"nan": False, "noisy": False, "touch": False, "refuse_late": False}


def drift(model: torch.nn.Module, task: Any, data: Any, attacks: Any, *, shift: int = 1) -> StudyResult:
    """A tiny study: the clean robust metric of ``model`` and of the inputs shifted by ``shift``/10."""
    x, y = data
    if _CALLS["refuse_late"]:
        model(x)  # work done before the refusal
        raise ValueError("refused only after running the model")
    with torch.no_grad():
        clean = task.robust_metric(model(x), y).double().mean().item()
        moved = task.robust_metric(model((x + shift / 10).clamp(0, 1)), y).double().mean().item()
    if _CALLS["noisy"]:
        moved += torch.rand(()).item()  # not seeded: a second run differs
    if _CALLS["touch"]:
        x.add_(0.0).mul_(0.5)  # writes into the caller's tensor
    return StudyResult("drift", [{"shift": shift, "clean": clean, "adv": math.nan if _CALLS["nan"] else moved}],
                       {"metric": task.robust_metric_name})


def draw_drift(study: Any, class_names: Any) -> Section:
    """The drift study's section: its rows."""
    return Section("study-drift", "Drift", "", [data_table(study.rows, ["shift", "clean", "adv"])])


def classes_only(task: Any) -> str | None:
    """Refuse a task without class scores."""
    return None if task.class_scores else "drift compares class scores"


@pytest.fixture
def drift_study() -> Iterator[str]:
    @register_study("drift", draw=draw_drift, needs=classes_only, spatial_dims=(2,), check_options={"shift": 2})
    class DriftSpec(StudySpec):
        """Clean metric against inputs shifted by ``shift``/10 (a test study)."""

        study: Literal["drift"]
        shift: Int = 1

        def run(self, models, task, data, attacks, target_fn):
            return drift(one_model(models, self), task, data, attacks, shift=self.shift)

    try:
        yield "drift"
    finally:
        REGISTRY.pop("drift", None)
        for k in _CALLS:
            _CALLS[k] = False


def test_a_study_defined_here_is_registered_run_and_checked(drift_study):
    assert "drift" in available_studies() and get_study("drift").summary.startswith("Clean metric")
    report = check_study("drift", kinds=["multiclass", "regression", "segmentation"])
    assert report.ran == ["multiclass", "seg2d"]
    assert set(report.refused) == {"regression", "regression3d", "seg3d"}
    assert report.refused["regression"] == "drift compares class scores"
    assert "3-D inputs" in report.refused["seg3d"]
    assert "spec: config round trip" in report.passed and "spec: unknown keys" in report.passed
    with pytest.raises(ValueError, match="did you mean 'drift'"):
        get_study("drfit")


@pytest.mark.parametrize("flaw, prop", [("nan", "strict JSON"), ("noisy", "determinism"), ("touch", "caller state")])
def test_a_broken_study_fails_the_property_that_broke(drift_study, flaw, prop):
    _CALLS[flaw] = True
    with pytest.raises(ConformanceError, match=f"check_study\\(drift\\): multiclass: {prop}: "):
        check_study("drift", kinds=["multiclass"])


def _single_range() -> None:
    """Declare the drift study in need of one data range (seg2d's box has none); the study itself enforces it."""
    REGISTRY["drift"] = type(REGISTRY["drift"])("drift", REGISTRY["drift"].spec, draw_drift, None, (), True,
                                                {"shift": 2})


def test_a_refusal_after_work_fails(drift_study):
    _single_range()
    _CALLS["refuse_late"] = True
    with pytest.raises(ConformanceError, match="seg2d: refusal: the study ran its models"):
        check_study("drift", kinds=["segmentation"])


def test_a_declared_refusal_that_runs_fails(drift_study):
    _single_range()
    with pytest.raises(ConformanceError, match="seg2d: refusal: .* but ran"):
        check_study("drift", kinds=["segmentation"])


def test_a_drawer_that_fails_is_named(drift_study):
    def broken(study: Any, class_names: Any) -> Section:
        raise KeyError("shift")

    REGISTRY["drift"] = type(REGISTRY["drift"])("drift", REGISTRY["drift"].spec, broken, None, (), False,
                                                {"shift": 2})
    with pytest.raises(ConformanceError, match="multiclass: report: the drawer fails .*KeyError"):
        check_study("drift", kinds=["multiclass"])


def test_run_study_refuses_an_unsupported_task_before_any_work(drift_study):
    from medadv.tasks import task_class

    ex = task_class("regression").examples(0)[0]
    calls: list[int] = []
    ex.model.register_forward_pre_hook(lambda m, a: calls.append(1))
    with pytest.raises(ValueError, match="^the drift study does not support Regression.*: drift compares class scores$"):
        run_study("drift", {}, ex.model, ex.task, (ex.x, ex.y), None)
    assert calls == []


def test_check_study_refuses_bad_arguments():
    with pytest.raises(ValueError, match="did you mean 'classwise'"):
        check_study("classwize")
    with pytest.raises(ValueError, match="`properties` has unknown properties"):
        check_study("frequency", properties=["speed"])
