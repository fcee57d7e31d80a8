"""benchmarks/gpu.py runs end to end (``--smoke``: tiny sizes, one repeat) and reports every row of issue 18, item 6.

Speed is never asserted here (benchmarks/README.md): only that the script still runs and that its table has a
value or an explicit "n/a" for each of the rows 1 to 10, so it cannot silently rot.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_benchmark_smoke_has_every_row(tmp_path):
    out = tmp_path / "gpu.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--smoke", "--device", "cpu",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert "GPU figures unmeasured in this run" in text or "cuda" in text.lower()
    rows: dict[int, list[list[str]]] = {}
    for line in text.splitlines():
        m = re.match(r"^\|\s*(\d+)\s*\|", line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.setdefault(int(m.group(1)), []).append(cells)
    assert set(rows) == set(range(1, 11)), sorted(rows)
    for num, entries in rows.items():
        for cells in entries:
            assert len(cells) == 8, (num, cells)
            value, ratio = cells[3], cells[5]  # the medadv cell, the ratio cell
            assert value, f"row {num} has no value: {cells}"
            assert ratio == "" or ratio.startswith("n/a") or re.fullmatch(r"\d+\.\d+×", ratio), (num, ratio)
    # rows that run on every device have numbers, not n/a
    for num in (1, 3, 4, 5, 9, 10):
        assert all(not e[3].startswith("n/a") for e in rows[num]), rows[num]


def test_certify_benchmark_smoke_has_every_table(tmp_path):
    """benchmarks/certify.py ``--smoke``: three tasks, natural and noise-trained rows, a certified/auto pair at each
    of the three radii and the certified ≤ empirical check (never the numbers: the smoke sizes are meaningless)."""
    out = tmp_path / "certify.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "certify.py"), "--smoke", "--output", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MEDADV_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text.count("\n## ") == 3
    rows = [line for line in text.splitlines() if line.startswith("| natural |") or line.startswith("| noise |")]
    assert len(rows) == 6
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 11 and all(re.fullmatch(r"\d\.\d{3} / \d\.\d{3}", c) for c in cells[4:7]), cells
        assert cells[-1] in ("yes", "NO")


def test_sea_benchmark_without_the_reference_says_so_and_runs_auto(tmp_path):
    """benchmarks/sea_bench.py ``--quick`` with no ``MEDADV_SEA_ROOT``: one plain line saying SEA is not run, and the
    table of ``auto`` (the three metrics at the budget) still printed."""
    env = {k: v for k, v in os.environ.items() if k != "MEDADV_SEA_ROOT"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sea_bench.py"), "--quick", "--models", "seg2d",
                           "--eps", "4", "--selections", "worst-of"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**env, "MEDADV_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MEDADV_SEA_ROOT is not set: SEA is not run" in done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 4/255 |")]
    assert [r.split(" | ")[1] for r in rows] == ["mean_dice", "pixel_accuracy", "miou"]
    assert all(r.split(" | ")[3] == "—" for r in rows)  # no SEA column without the reference


@pytest.mark.skipif(not Path("/usr/share/mricron/templates/ch2.nii.gz").is_file(),
                    reason="Debian mricron-data not installed (apt-get install mricron-data)")
def test_real_models_benchmark_smoke_has_its_rows_and_names_the_machine(tmp_path):
    """benchmarks/real_models.py ``--smoke`` (deepbet bbox 32³, one step, ε 4, Colin27): a row per attack and the
    control, VAFA, the certify line and the machine (never the numbers: 32³ is below deepbet's working size)."""
    out = tmp_path / "real_models.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "real_models.py"), "--smoke", "--output",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| colin27")]
    attacks = [r[2] for r in rows if len(r) == 10]
    assert attacks == ["pgd", "volume", "noise", "vafa"], attacks
    for r in (r for r in rows if len(r) == 10 and r[2] != "vafa"):
        assert float(r[8]) <= float(r[3]) + 1e-3  # measured L∞ within ε (grey levels)
    assert "CPU cores" in text and "no GPU was lent" in text and "certified Dice→ref" in text
