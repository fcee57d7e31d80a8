"""Every ```python block of the README runs as written (the adapters section has its own test)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
ADAPTERS = re.compile(r"<!-- adapters:begin -->.*?<!-- adapters:end -->", re.S)


def _blocks() -> list[str]:
    text = ADAPTERS.sub("", README.read_text())
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_examples():
    assert len(_blocks()) >= 1


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    torch.manual_seed(0)
    exec(compile(_blocks()[index], f"README-example-{index}", "exec"), {"__name__": "__example__"})
