"""Hostile strings in every report output (issue 28 item 10): every user string field that reaches a report
(attack ids, class names, model names, study titles, data paths, case ids, the report title) carries each
payload of a set (an HTML script tag and an event-handler tag, a Markdown link and image, a ``|`` pipe, a
newline, a spreadsheet formula, matplotlib math), and every output is checked by the rules of its format:

* ``report.html``: the value appears HTML-escaped where it is shown, never raw (no markup of its own);
* ``report.md``: the value appears Markdown-escaped (:func:`~medadv.report.markdown.md_escape`), never raw;
* ``results.csv``: no text cell starts a formula (``= + - @``), and the value is there with the ``'`` prefix;
* the figures (``robustness.png`` and every figure embedded in report.html): each text holding the value is
  drawn literally (no math parsing, which fails on ``$\\frac$``) and holds the whole value.

The kinds are generated: payload × field × output, the outputs being the text files the CLI writes
(:data:`medadv.cli.OUTPUT_FILES`, each needing a checker here) plus the figures. Each payload runs one real
evaluation (a tiny CNN, 4 samples) with every field carrying it, tagged per field, and the outputs are
read once per payload.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from markupsafe import escape

from medadv.attacks import FGSM, PGD
from medadv.cli import OUTPUT_FILES
from medadv.evaluation import evaluate
from medadv.report import worst_cases, write_html_report, write_report
from medadv.report.markdown import md_escape
from medadv.results import csv_safe
from medadv.studies.base import StudyResult
from medadv.tasks import MultiClass
from medadv.threats import Linf

PAYLOADS = {
    "script": "<script>alert(1)</script>",
    "onerror": "<img src=x onerror=alert(1)>",
    "md-link": "[click](javascript:alert(1))",
    "md-image": "![x](http://evil.example/x.png)",
    "pipe": "a | b | c",
    "newline": "line1\nline2",
    "formula": '=HYPERLINK("http://evil.example","x")',
    "math": "$\\frac$ $x_{$",
}

#: field -> (tag appended to the payload, outputs where the field is shown)
FIELDS = {
    "attack id": ("QATK", {"report.html", "report.md", "results.csv", "figures"}),
    "class name": ("QCLS", {"report.html", "report.md", "figures"}),
    "model name": ("QMOD", {"report.html", "report.md", "figures"}),
    "study title": ("QSTU", {"report.html"}),
    "data path": ("QDAT", {"report.html", "report.md"}),
    "case id": ("QCAS", {"report.html", "results.csv", "figures"}),
    "report title": ("QTTL", {"report.html", "report.md"}),
}
#: the text outputs of a run checked here; JSON outputs hold values as data (strict JSON escapes them)
CHECKED = ("report.html", "report.md", "results.csv")
JSON_OUTPUTS = ("run.json", "results.json", "log.jsonl")
OUTPUTS = (*CHECKED, "figures")


def value(payload: str, field: str) -> str:
    """The field's value: the payload first (a formula must start the cell), then the field's tag."""
    return PAYLOADS[payload] + FIELDS[field][0]


@dataclass
class Run:
    files: dict[str, str]
    texts: list[tuple[str, bool]]  # every text drawn in a figure: (string, parsed as math)


_RUNS: dict[str, Run] = {}


def _run(payload: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    """One real evaluation with every field carrying ``payload``; its outputs, and every text of its figures."""
    if payload in _RUNS:
        return _RUNS[payload]
    import matplotlib.figure
    import matplotlib.text

    texts: list[tuple[str, bool]] = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig: Any, *args: Any, **kwargs: Any) -> Any:
        texts.extend((t.get_text(), bool(t.get_parse_math())) for t in fig.findobj(matplotlib.text.Text))
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    v = {f: value(payload, f) for f in FIELDS}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 3)).eval()
    task = MultiClass()
    x, y = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    data = [{"image": x[i:i + 2], "label": y[i:i + 2], "case_id": [f"{v['case id']}{i + j}" for j in range(2)]}
            for i in (0, 2)]
    threat = Linf(0.1, bounds=(0.0, 1.0))
    attacks = {f"{v['attack id']}@0.1": FGSM(task, threat), "pgd@0.1": PGD(task, threat, steps=1)}
    classes = [f"{v['class name']}{j}" for j in range(3)]
    settings = {"model": {"builder": "small_cnn"}, "data": {"source": "npz", "path": v["data path"] + ".npz"},
                "task": {"type": "multiclass", "class_names": classes}}
    res = evaluate(model, task, data, attacks, meta={"model": v["model name"], "settings": settings,
                                                     "classes": classes})
    study = StudyResult("models", [{"model": m, "clean": 0.9 - 0.1 * i, "attack": "pgd", "budget": 0.1,
                                    "adv": 0.2 + 0.1 * i} for i, m in enumerate((v["model name"], "other"))],
                        {"metric": "accuracy", "title": v["study title"]})
    cases = worst_cases(model, task, data, attacks, res, k=1, class_names=classes)
    out = tmp / payload
    out.mkdir(parents=True)
    res.to_csv(out / "results.csv")
    write_report(res, out, title=v["report title"])
    write_html_report(res, out, studies=[study], cases=cases, class_names=classes, title=v["report title"])
    files = {name: (out / name).read_text(encoding="utf-8") for name in CHECKED}
    _RUNS[payload] = Run(files, texts)
    return _RUNS[payload]


@pytest.fixture
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> Any:
    return lambda payload: _run(payload, tmp_path_factory.getbasetemp() / "hostile_report", monkeypatch)


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def check_html(text: str, v: str, shown: bool) -> None:
    safe = str(escape(v))
    if safe != v:  # characters with a meaning in HTML: never raw
        assert v not in text, "raw in report.html"
    if shown:
        assert safe in text, "not shown (escaped) in report.html"


def check_md(text: str, v: str, shown: bool) -> None:
    safe = md_escape(v)
    if safe != v:
        assert v not in text, "raw in report.md"
    for line in text.splitlines():  # a table row stays one row: its cells as many as the header's
        if line.startswith("|") and FIELDS["attack id"][0] in line:
            assert line.count(" | ") - line.count("\\| ") >= 1
    if shown:
        assert safe in text, "not shown (escaped) in report.md"


def check_csv(text: str, v: str, shown: bool) -> None:
    cells = [c for row in csv.reader(io.StringIO(text)) for c in row]
    formulas = [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r") and not _number(c)]
    assert not formulas, f"results.csv cells a spreadsheet runs as formulas: {formulas[:3]}"
    if shown:
        assert any(c.startswith(csv_safe(v)) for c in cells), "not in results.csv"


def check_figures(texts: list[tuple[str, bool]], v: str, shown: bool) -> None:
    tag = v[-4:]
    mine = [(t, math_) for t, math_ in texts if tag in t]
    assert not [t for t, math_ in mine if math_], "a figure parses the value as math"
    if shown:
        assert any(v in t for t, _ in mine), f"not drawn whole in a figure: {[t for t, _ in mine][:3]}"


CHECKS = {"report.html": check_html, "report.md": check_md, "results.csv": check_csv}


def test_every_text_output_of_a_run_has_a_checker():
    """A new output file of the CLI gets an escaping check here (or is JSON, which escapes by construction)."""
    assert set(OUTPUT_FILES) - set(JSON_OUTPUTS) == set(CHECKS) | {"robustness.png"}


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("field", list(FIELDS))
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_user_string_is_escaped_in_every_output(payload: str, field: str, output: str, run: Any) -> None:
    r = run(payload)
    v = value(payload, field)
    shown = output in FIELDS[field][1]
    if output == "figures":
        check_figures(r.texts, v, shown)
    else:
        CHECKS[output](r.files[output], v, shown)


def test_the_suite_counts_its_kinds():
    assert len(PAYLOADS) * len(FIELDS) * len(OUTPUTS) >= 150


@pytest.mark.filterwarnings("ignore::UserWarning")  # random weights: what is checked is the escaping
def test_a_config_run_escapes_its_attack_id_class_names_and_title(tmp_path, capsys):
    """The issue's path in: a config's attack ``id`` with a script tag (rendered raw in "Key findings" before),
    class names and the report title, through ``medadv evaluate`` to report.html, report.md and results.csv."""
    import numpy as np
    import yaml

    from medadv.cli import main

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x=rng.random((4, 1, 8, 8), dtype=np.float32), y=rng.integers(0, 3, 4))
    script, formula = PAYLOADS["script"], PAYLOADS["formula"]
    cfg = {"model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 3, "width": 4}},
           "task": {"type": "multiclass", "class_names": [script + "A", "b|c", "d\ne"]},
           "data": {"source": "npz", "path": "data.npz"}, "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
           "budgets": [0.05], "attacks": [{"name": "fgsm", "id": script}, {"name": "pgd", "id": formula, "steps": 1}],
           "report": {"title": PAYLOADS["md-image"]}, "batch_size": 2, "output": "out"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(path), "--no-progress"]) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    html = (out / "report.html").read_text(encoding="utf-8")
    findings = html.split('id="findings"')[1].split("</section>")[0]
    assert str(escape(script)) in findings and script not in html
    md = (out / "report.md").read_text(encoding="utf-8")
    assert script not in md and md_escape(script) in md and "b\\|c" in md and "d\\\\ne" in md
    check_csv((out / "results.csv").read_text(encoding="utf-8"), formula, shown=True)
