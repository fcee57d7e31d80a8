"""The ``studies:`` schemas and run_study (what a config section calls)."""

from __future__ import annotations

import re

import pytest

from medadv import FGSM, Linf, MultiClass
from medadv.config_schema import ConfigError
from medadv.studies import STUDY_SPECS, available_studies, classwise, get_study, run_study, validate_studies
from medadv.studies.schema import StudySpec, register_study


def test_every_registered_study_declares_its_schema_and_its_report_section():
    """Each registered study's spec names it (``Literal[name]``), defines run() and brings its drawer; that each one
    runs is tests/studies/test_check_study.py (check_study over every study x task kind)."""
    from medadv.report.html import _drawer, _study_generic

    assert list(STUDY_SPECS) and sorted(STUDY_SPECS) == available_studies()
    for name, spec in STUDY_SPECS.items():
        if not spec.__module__.startswith("medadv.studies."):
            continue  # a study registered by user code (a docs example run in this session)
        assert spec.model_fields["study"].annotation.__args__ == (name,), name  # Literal[name]
        assert spec.run is not StudySpec.run, f"{name} does not define run()"
        info = get_study(name)
        assert info.spec is spec and info.draw is not None, f"the report has no section for study {name!r}"
        assert _drawer(name) is info.draw
    assert _drawer("no_such_study") is _study_generic  # an unknown study's rows are shown raw


def test_the_registry_is_filled_from_the_package_contents():
    """Every public module of medadv.studies is imported by the package, and every StudySpec subclass defined in one
    is registered (no hand-kept list to forget); the names are looked up with a did-you-mean."""
    import importlib
    import pkgutil

    import medadv.studies as pkg

    defined = set()
    for m in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"medadv.studies.{m.name}")
        defined |= {v for v in vars(mod).values()
                    if isinstance(v, type) and issubclass(v, StudySpec) and v is not StudySpec}
    assert defined == {s for s in STUDY_SPECS.values() if s.__module__.startswith("medadv.studies.")}
    with pytest.raises(ValueError, match="unknown study 'tranfser'; did you mean 'transfer'"):
        get_study("tranfser")


def test_the_config_does_not_import_the_studies():
    """The studies build their data with medadv.config's builders, so medadv.config must never import a study (the
    config <-> studies cycle of issue 30); tests/test_layout.py checks every room, this names the one that was."""
    import ast
    from pathlib import Path

    import medadv.config as pkg

    for path in Path(pkg.__path__[0]).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [f"{'.' * node.level}{node.module or ''}"]
                names += [f"{'.' * node.level}{node.module + '.' if node.module else ''}{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for n in names:
                assert "studies" not in n.split("."), f"medadv/config/{path.name} imports {n}"


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


def test_the_studies_guide_lists_every_registered_study():
    """docs/studies.md describes each study in prose: its table must name every study of the registry, and no other."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "studies.md").read_text(encoding="utf-8")
    table = page[page.index("| study | what | paper |"):].split("\n\n", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.M))
    mine = {n for n, s in STUDY_SPECS.items() if s.__module__.startswith("medadv.studies.")}
    assert listed == mine, f"missing from docs/studies.md: {sorted(mine - listed)}; not studies: {sorted(listed - mine)}"
