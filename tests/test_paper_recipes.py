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


#: what each paper's table needs in its study's JSON (issue 32): for every entry of a study in a recipe, the row
#: columns (``rows``), the ``meta`` keys, the keys of each ``meta["summary"]`` entry, the values a column must take
#: (``values``: all of them present), and for transfer that no cell is white-box (the paper's sources are trained
#: apart from the evaluated models)
#: A key is a study's name (every entry of it) or an entry's index in the recipe's ``studies:``.
PAPER_COLUMNS: dict[str, dict[str | int, dict[str, Any]]] = {
    "xu2021": {"gap": {"rows": ["auc_clean", "auc_adv", "fooling_rate"], "meta": ["cases"]},
               "corruptions": {"rows": ["model"], "meta": ["rfp", "reference"],
                               "values": {"model": ["densenet", "resnet", "cnn"]}},
               "correlation": {"meta": ["layer", "noise"]}},
    "xu2021_multilabel": {"gap": {"rows": ["auc_clean", "auc_adv", "label_accuracy_clean", "label_accuracy_adv"],
                                  "meta": ["cases"]}},
    "paschali2018": {"transfer": {"summary": ["noise", "ssim_adv", "ssim_noise", "sigma"], "black_box": True,
                                  "values": {"attack": ["fgsm", "deepfool", "jsma"]}},
                     "correlation": {"meta": ["layer", "noise"]}},
    "paschali2018_segmentation": {"transfer": {"summary": ["noise", "ssim_noise"], "meta": ["cases"],
                                               "black_box": True}},
    "malik2024": {"transfer": {"meta": ["cases"]},
                  "models": {"rows": ["hd95_clean", "hd95_adv", "asr_h"],
                             "values": {"model": ["unet", "unetr", "swinunetr"], "attack": ["noise"]}},
                  "frequency": {"meta": ["band_ranges"]}},
    "zhang2024": {"saliency": {"rows": ["auc_clean", "auc_adv"]}, 0: {"meta": ["note"]}, 1: {"meta": ["note"]},
                  2: {"rows": ["surrogate"]},
                  "reader_study": {"values": {"attack": ["prediction", "relevance-gradient"]}}},
    "medi2024": {2: {"values": {"model": ["densenet", "resnet", "cnn", "densenet-at", "resnet-trades"]}}},
}


def check_paper_columns(recipe: str, studies: list[Any], out: Path) -> None:
    """The study JSONs of a smoke run hold what :data:`PAPER_COLUMNS` asks of the recipe."""
    need = PAPER_COLUMNS.get(recipe, {})
    seen: set[str | int] = set()
    for i, s in enumerate(studies):
        name = s if isinstance(s, str) else s["study"]
        for key in (name, i):
            if key in need:
                seen.add(key)
                _check_entry(recipe, i, name, json.loads((out / f"study_{i}_{name}.json").read_text()), need[key])
    assert seen == set(need), f"{recipe}: no study entry for {sorted(map(str, set(need) - seen))}"


def _check_entry(recipe: str, i: int, name: str, data: dict[str, Any], want: dict[str, Any]) -> None:
    """One study entry's JSON against its :data:`PAPER_COLUMNS` wants."""
    rows, meta = data["rows"], data["meta"]
    for col in want.get("rows", []):
        assert all(col in r for r in rows), f"{recipe}: study {i} ({name}) rows lack {col!r}"
    for key in want.get("meta", []):
        assert meta.get(key), f"{recipe}: study {i} ({name}) has no meta[{key!r}]"
    for key in want.get("summary", []):
        summary = meta.get("summary") or []
        assert summary and all(key in e for e in summary), f"{recipe}: study {i} ({name}) summary lacks {key!r}"
    for col, values in want.get("values", {}).items():
        got = {str(r.get(col)).split("@")[0] for r in rows}
        assert set(values) <= got, f"{recipe}: study {i} ({name}) {col} has {sorted(got)}, not all of {values}"
    if want.get("black_box"):
        assert not any(r.get("white_box") for r in rows), f"{recipe}: study {i} ({name}) has white-box cells"


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
    check_paper_columns(recipe.stem, small.get("studies", []), tmp_path / "out")
