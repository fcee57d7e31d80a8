"""The README's "Certified robustness" example runs as written (the whole-README test runs it too)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_certified_robustness_example_runs(tmp_path, monkeypatch):
    text = README.read_text()
    section = re.search(r"\n## Certified robustness\n(.*?)(?=\n## |\n<!-- adapters:begin -->)", text, flags=re.S)
    assert section is not None, "README has no '## Certified robustness' section"
    blocks = re.findall(r"```python\n(.*?)```", section.group(1), flags=re.S)
    assert len(blocks) == 1 and re.search(r"^assert ", blocks[0], flags=re.M)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(blocks[0], "README: Certified robustness", "exec"), {"__name__": "__example__"})
