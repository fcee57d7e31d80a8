"""StudyResult: the JSON-able container every study returns (the HTML report reads it)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from medadv.studies import StudyResult


def test_json_round_trip_converts_tensors_and_nan(tmp_path):
    r = StudyResult("classwise", [{"attack": "pgd", "budget": 0.03, "clean": torch.tensor(0.5), "adv": math.nan}],
                    {"confusion": {"clean": torch.tensor([[1, 2], [3, 4]])}, "classes": ("a", "b")})
    path = tmp_path / "study.json"
    r.to_json(path)
    raw = json.loads(path.read_text())  # valid JSON: NaN written as null
    assert raw["rows"][0]["adv"] is None and raw["rows"][0]["clean"] == 0.5
    back = StudyResult.from_json(path)
    assert back.study == "classwise"
    assert back.meta["confusion"]["clean"] == [[1, 2], [3, 4]] and back.meta["classes"] == ["a", "b"]
    assert back.rows == [{"attack": "pgd", "budget": 0.03, "clean": 0.5, "adv": None}]


def test_column_and_markdown():
    r = StudyResult("transfer", [{"surrogate": "a", "target": "b", "adv": 0.25}, {"surrogate": "b", "target": "a"}])
    assert r.column("adv") == [0.25, None]
    with pytest.raises(KeyError, match="no column 'ad'"):
        r.column("ad")
    md = r.to_markdown()
    assert md.splitlines()[0] == "### transfer"
    assert "| surrogate | target | adv |" in md and "| a | b | 0.2500 |" in md and "| b | a |  |" in md


def test_importing_the_studies_loads_no_optional_stack():
    probe = ("import sys, medadv.studies\n"
             "print([m for m in ('monai', 'matplotlib', 'sklearn', 'scipy', 'captum', 'pandas') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_meta_keys_name_each_attack_and_budget_once():
    from medadv.studies._common import key

    assert key("pgd", 0.1) == "pgd@0.1" and key("dag", None) == "dag"
    assert key("pgd@0.1", 0.1) == "pgd@0.1"  # a config's entry names already carry the budget
