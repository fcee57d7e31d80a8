"""Every config in examples/ runs end to end (data written at first use, tiny settings): per-case rows, HD95 in mm."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest
import yaml

from medadv.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CONFIGS = ("seg3d_nifti.yaml", "multilabel_png.yaml", "whole_volume.yaml")


def _prepare_module():
    spec = importlib.util.spec_from_file_location("medadv_examples_prepare", EXAMPLES / "prepare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A copy of examples/ whose data/ the example's own prepare.py wrote (quick: few cases, one epoch)."""
    out = tmp_path_factory.mktemp("examples")
    _prepare_module().prepare(out / "data", quick=True)
    return out


def _run(folder: Path, name: str, **over) -> list[dict]:
    cfg = yaml.safe_load((EXAMPLES / name).read_text())
    for entry in cfg["attacks"]:  # tiny: two steps
        if isinstance(entry, dict) and "steps" in entry:
            entry["steps"] = 2
    cfg.update(over)
    path = folder / name
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path)]) == 0
    assert main(["evaluate", str(path), "--no-progress"]) == 0
    return json.loads((folder / cfg["output"] / "results.json").read_text())["rows"]


def _hd95_values(rows: list[dict]) -> list[float]:
    return [v for r in rows for k in ("clean_hd95", "adv_hd95") for v in r[k] if v is not None and math.isfinite(v)]


def test_every_example_config_validates_as_shipped(folder, capsys):
    for name in CONFIGS:
        (folder / name).write_text((EXAMPLES / name).read_text())
        assert main(["validate", str(folder / name)]) == 0, capsys.readouterr().err
    assert (EXAMPLES / ".gitignore").read_text().split() == ["data/", "results/"]


def test_seg3d_nifti_example_per_case_rows_and_hd95_in_mm(folder):
    rows = _run(folder, "seg3d_nifti.yaml", budgets=["4/255"], attacks=["fgsm", {"name": "pgd", "steps": 2}])
    files = sorted(p.name for p in (folder / "data" / "seg3d" / "images").glob("*.nii.gz"))
    assert len(files) == 2
    for attack in ("fgsm@0.0156863", "pgd@0.0156863"):
        assert [r["case_id"] for r in rows if r["attack"] == attack] == files
    values = _hd95_values(rows)
    # 2 mm voxels: a non-zero surface distance is at least 2 mm (in voxels it could be 1)
    assert values and all(v == 0 or v >= 2.0 - 1e-6 for v in values) and any(v >= 2.0 for v in values)
    # report.html: the crops each attack damaged most (named by file, slices named from the NIfTI affine), HD95
    # per tissue in mm, the tissue names of the config
    html = (folder / "results" / "seg3d_nifti" / "report.html").read_text(encoding="utf-8")
    for attack in ("fgsm", "pgd"):
        assert html.count(f'alt="case: {attack} ε=0.01569 (4/255) · case mni152_right_') == 2
    assert "per-class HD95, clean vs attacked" in html and "HD95 (mm)" in html and ">HD95 attacked</th>" in html
    for tissue in ("grey matter", "white matter", "other brain"):
        assert f">{tissue}</td>" in html


def test_multilabel_png_example_reads_the_csv_labels(folder):
    rows = _run(folder, "multilabel_png.yaml", budgets=["4/255"])
    with (folder / "data" / "png" / "labels.csv").open() as f:
        table = {r.pop("image"): [float(v) for v in r.values()] for r in csv.DictReader(f)}
    assert len(table) == 8
    pgd = [r for r in rows if r["attack"].startswith("pgd")]
    assert [r["case_id"] for r in pgd] == list(table)  # CSV order, ids from the file names
    assert all(r["label"] == table[r["case_id"]] and len(r["clean_scores"]) == 5 for r in pgd)


def test_whole_volume_example_runs_through_sliding_windows(folder):
    rows = _run(folder, "whole_volume.yaml")
    (row,) = rows
    assert row["case_id"] == "mni152_4mm" and row["linf"] <= 4 / 255 + 1e-6
    # quick mode writes the template at 4 mm (cropped to the head: about 40 x 48 x 41 voxels, 8 windows of 32^3)
    values = _hd95_values(rows)
    assert values and all(v == 0 or v >= 4.0 - 1e-6 for v in values)
