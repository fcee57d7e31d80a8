"""The ```python blocks of the README run as written; blocks of one section share a namespace.

(The toolkit-adapters section between its markers has its own test, tests/adapters/test_docs.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
ADAPTERS = re.compile(r"<!-- adapters:begin -->.*?<!-- adapters:end -->", re.S)


def _sections() -> list[tuple[str, str]]:
    text = ADAPTERS.sub("", README.read_text())
    out = []
    for chunk in re.split(r"\n(?=## )", text):
        blocks = re.findall(r"```python\n(.*?)```", chunk, flags=re.S)
        if blocks:
            out.append((chunk.splitlines()[0].lstrip("# ").strip(), "\n".join(blocks)))
    return out


def test_readme_has_examples():
    assert len(_sections()) >= 4


@pytest.mark.parametrize("title,code", _sections(), ids=[t for t, _ in _sections()])
def test_readme_section_runs(title, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files (checkpoints) write them here
    torch.manual_seed(0)
    # each example ends by checking its own result (an AssertionError fails the test)
    assert re.search(r"^assert ", code, flags=re.M), "the example must assert what it shows"
    exec(compile(code, f"README: {title}", "exec"), {"__name__": "__example__"})
