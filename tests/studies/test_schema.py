"""The ``studies:`` schemas and run_study (what a config section calls)."""

from __future__ import annotations

import pytest

from medadv import FGSM, Linf, MultiClass
from medadv.config_schema import ConfigError
from medadv.studies import STUDY_SPECS, classwise, run_study, validate_studies
from medadv.studies.schema import StudySpec, register_study


def test_every_registered_study_runs_and_is_drawn():
    from medadv.report.html import _STUDIES

    for name, spec in STUDY_SPECS.items():
        assert spec.model_fields["study"].annotation.__args__ == (name,), name  # Literal[name]
        assert spec.run is not StudySpec.run, f"{name} does not define run()"
        assert name in _STUDIES, f"the report has no section for study {name!r}"


def test_register_study_refuses_a_second_class_under_a_taken_name():
    with pytest.raises(ValueError, match="already registered"):
        @register_study("classwise")
        class Other(StudySpec):
            pass
    with pytest.raises(TypeError, match="StudySpec subclass"):
        register_study("x")(int)


def test_title_is_the_report_heading(trained_multiclass, tmp_path):
    from medadv.report import write_html_report

    t = trained_multiclass
    r = run_study("classwise", {"title": "Table 3: class-wise recall"}, t.model, t.task, (t.x, t.y),
                  {"fgsm": FGSM(t.task, Linf(0.1, bounds=(0, 1)))})
    assert r.meta["title"] == "Table 3: class-wise recall"
    html = write_html_report(None, tmp_path, studies=[r]).read_text()
    assert "Table 3: class-wise recall" in html


def test_validate_studies_reports_every_mistake_with_its_place():
    specs = validate_studies(["classwise", {"study": "corruptions", "severities": [1, 5], "suite": ["blur"]}])
    assert [s.study for s in specs] == ["classwise", "corruptions"] and specs[1].severities == [1, 5]
    with pytest.raises(ConfigError) as e:
        validate_studies([{"study": "corruption"}, {"study": "corruptions", "severites": [1]},
                          {"study": "corruptions", "severities": [6], "suite": ["blurr"]},
                          {"study": "noise_baseline", "match": "psnr"}])
    text = str(e.value)
    assert "did you mean 'corruptions'" in text and "studies[0].study" in text
    assert "unknown key `severites`" in text and "did you mean `severities`" in text
    assert "studies[2].severities" in text and "did you mean 'blur'" in text
    assert "studies[3].match" in text


def test_run_study_is_the_function_call(toy_pair, trained_multiclass):
    x, y, a, b = toy_pair
    task = MultiClass()
    atk = {"fgsm": FGSM(task, Linf(0.25, bounds=(0, 1)))}
    t = trained_multiclass
    t_atk = {"fgsm": FGSM(t.task, Linf(0.1, bounds=(0, 1)))}
    assert run_study("classwise", {}, t.model, t.task, (t.x, t.y), t_atk).rows == \
        classwise(t.model, t.task, (t.x, t.y), t_atk).rows
    r = run_study("transfer", {"surrogates": ["B"], "targets": ["A"]}, {"A": a, "B": b}, task, (x, y), atk)
    assert [(row["surrogate"], row["target"], row["adv"]) for row in r.rows] == [("B", "A", 0.75)]
    # the corruptions take the attacks' box unless `bounds` is given
    r = run_study("corruptions", {"suite": ["contrast"], "severities": [1], "frames": 2, "model": "A"},
                  {"A": a, "B": b}, task, (x, y), atk)
    assert r.meta["bounds"] == "(0, 1)"
    assert run_study("models", None, {"A": a, "B": b}, task, (x, y), atk).meta["models"] == ["A", "B"]
    # a single-model study on several models runs on the first (a config's evaluated `model`) unless told
    assert run_study("frequency", {}, {"A": a, "B": b}, task, (x, y), atk).rows == \
        run_study("frequency", {}, a, task, (x, y), atk).rows
    assert run_study("frequency", {"model": "B"}, {"A": a, "B": b}, task, (x, y), atk).rows == \
        run_study("frequency", {}, b, task, (x, y), atk).rows
    with pytest.raises(ValueError, match="did you mean 'B'"):
        run_study("transfer", {"targets": ["b"]}, {"A": a, "B": b}, task, (x, y), atk)
    with pytest.raises(ValueError, match="needs the data box"):
        run_study("corruptions", {}, a, task, (x, y), None)
    with pytest.raises(ValueError, match="did you mean 'classwise'"):
        run_study("clswise", {}, a, task, (x, y), atk)
