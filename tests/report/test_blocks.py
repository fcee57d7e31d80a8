"""The public building blocks of a report section (:mod:`medadv.report.blocks`): what the study modules draw with,
documented, and the only names of :mod:`medadv.report` they import."""

from __future__ import annotations

import ast
import inspect
import math
from pathlib import Path

import medadv.studies
from medadv.report import blocks
from medadv.report.blocks import fmt, fmt_budget, metric_label, raw_table, setting_key


def test_every_public_block_is_documented():
    for name in blocks.__all__:
        obj = getattr(blocks, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert (obj.__doc__ or "").strip(), f"medadv.report.blocks.{name} has no docstring"


def test_study_modules_import_only_public_report_names():
    root = Path(medadv.studies.__path__[0])
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and "report" in (node.module or ""):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports private report names {private} from {node.module}"
                # blocks to draw with, case figures to embed (make_cases, case_meta), and the section registry that
                # register_study fills: the report's public API, nothing of html.py's page assembly
                public = ("report.blocks", "report.cases", "report.sections")
                assert (node.module or "").removeprefix("medadv.") in public, \
                    f"{path.name} imports from {node.module}: a study draws with medadv.report.blocks"


def test_html_keeps_no_study_drawer():
    """html.py dispatches to the registry: no section of a named study is drawn there."""
    source = Path(inspect.getfile(blocks)).with_name("html.py").read_text()
    for name in medadv.studies.available_studies():
        assert f"def _study_{name}(" not in source and f'"{name}": ' not in source, name


def test_formatting():
    assert fmt(math.nan) == fmt(None) == "–" and fmt(0.12345) == "0.123" and fmt(True) == "yes"
    assert fmt([0.5, None]) == "0.500 / –" and fmt(1e-5) == "1e-05"
    assert fmt_budget(8 / 255) == "0.03137 (8/255)" and fmt_budget(0.1) == "0.1" and fmt_budget(None) == "–"
    assert metric_label("adv_mean_dice") == "mean Dice (attacked)" and metric_label("clean_correct") == "accuracy (clean)"
    assert setting_key("pgd@0.0314", 8 / 255) == "pgd ε=0.03137 (8/255)" and setting_key("dag", None) == "dag"
    t = raw_table([{"a": 1, "budget": 0.1}, {"b": None}], "rows", limit=1)
    assert [c.text for c in t.headers] == ["a", "budget", "b"] and len(t.rows) == 1
    assert t.caption == "rows (first 1 of 2 rows)" and t.rows[0][1].text == "0.1"
