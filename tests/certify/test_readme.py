"""The "Certified robustness" guide's example (docs/certification.md) runs as written (tests/test_readme.py runs it
too)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

PAGE = Path(__file__).resolve().parents[2] / "docs" / "certification.md"


def test_certified_robustness_example_runs(tmp_path, monkeypatch):
    text = PAGE.read_text(encoding="utf-8")
    assert text.startswith("# Certified robustness\n"), "docs/certification.md is not the certification guide"
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1 and re.search(r"^assert ", blocks[0], flags=re.M)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(blocks[0], "docs/certification.md", "exec"), {"__name__": "__example__"})
