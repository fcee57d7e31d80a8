"""The toolkit examples of the documentation (docs/adapters.md) run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "adapters.md"
BEGIN, END = "<!-- adapters:begin -->", "<!-- adapters:end -->"


def _blocks() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "docs/adapters.md lost its toolkit-adapters section markers"
    text = text[text.index(BEGIN) : text.index(END)]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_every_toolkit_has_an_example():
    code = "\n".join(_blocks())
    for toolkit in ("art", "foolbox", "torchattacks", "robustbench"):
        assert re.search(rf"medadv\.adapters(\.| import ){toolkit}\b", code), toolkit


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_example_runs(index):
    torch.manual_seed(0)
    # each example ends by checking its own result (an AssertionError fails the test)
    assert re.search(r"^assert ", _blocks()[index], flags=re.M), "the example must assert what it shows"
    exec(compile(_blocks()[index], f"adapters-example-{index}", "exec"), {"__name__": "__example__"})


def test_docs_support_matrix_is_generated_from_the_tables():
    # the docs page's matrix is rendered from the adapters' SUPPORT tables (python -m medadv.adapters.support)
    from medadv.adapters.support import readme_section

    assert readme_section() in PAGE.read_text(encoding="utf-8"), (
        "docs/adapters.md's support matrix is stale: run `python -m medadv.adapters.support docs/adapters.md`")
