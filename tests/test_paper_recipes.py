"""Each paper's recipe (``examples/papers/*.yaml``) runs end to end at its smallest size, and its report has a
section for every table and figure the recipe names (the CI smoke of the recipes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from markupsafe import escape

from medadv.cli import main
from medadv.config import load_config

PAPERS = Path(__file__).resolve().parents[1] / "examples" / "papers"
RECIPES = sorted(PAPERS.glob("*.yaml"))
#: the smallest size: a few samples, one epoch, two attack steps, one severity
SMALL = {"n": 6, "epochs": 1, "steps": 2, "queries": 20, "max_samples": 3, "max_points": 60, "pairs": 4,
         "generator_epochs": 1}


def shrink(value: Any, key: str = "") -> Any:
    """The recipe at its smallest size (numbers capped by :data:`SMALL`; lists of severities cut to one)."""
    if isinstance(value, dict):
        out = {k: shrink(v, k) for k, v in value.items()}
        if "train" in out and isinstance(out["train"], dict) and "data" in out["train"]:
            out["train"]["data"]["n"] = min(out["train"]["data"].get("n", 24), 24)
        return out
    if isinstance(value, list):
        items = [shrink(v, key) for v in value]
        return items[:1] if key == "severities" else items
    if key in SMALL and isinstance(value, int) and not isinstance(value, bool):
        return min(value, SMALL[key])
    return value


def test_there_is_one_recipe_per_paper():
    stems = {p.stem for p in RECIPES}
    for paper in ("paschali2018", "xu2021", "zhang2024", "malik2024", "medi2024"):
        assert paper in stems, f"examples/papers/{paper}.yaml is missing"


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_runs_small_and_its_report_shows_every_table(recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDADV_CACHE", str(tmp_path / "cache"))
    raw = yaml.safe_load(recipe.read_text())
    assert load_config(recipe)["report"]["title"], "a recipe names its paper in report.title"
    small = shrink(raw)
    small["output"] = str(tmp_path / "out")
    small["cases"] = min(small.get("cases", 0), 1)
    path = tmp_path / recipe.name
    path.write_text(yaml.safe_dump(small, sort_keys=False))
    assert main(["evaluate", str(path), "--no-progress"]) == 0
    html = (tmp_path / "out" / "report.html").read_text()
    titles = [s["title"] for s in small.get("studies", []) if isinstance(s, dict) and s.get("title")]
    titles.append(small["report"]["results"])
    for t in titles:
        assert str(escape(t)) in html, f"the report has no section titled {t!r}"
    assert "Could not draw this study" not in html
    for i, s in enumerate(small.get("studies", [])):
        name = s if isinstance(s, str) else s["study"]
        rows = json.loads((tmp_path / "out" / f"study_{i}_{name}.json").read_text())["rows"]
        assert rows, f"study {name} has no rows"
