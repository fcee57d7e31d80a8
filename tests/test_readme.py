"""The ```python blocks of the README and of the documentation pages (docs/*.md) run as written.

Each page is cut at its ``## `` headings; the blocks of one section share a namespace (a later block may use what an
earlier one built). The toolkit-adapters section between its markers has its own test, tests/adapters/test_docs.py.
The README links only to files that exist.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
ADAPTERS = re.compile(r"<!-- adapters:begin -->.*?<!-- adapters:end -->", re.S)


def _sections(page: Path) -> list[tuple[str, str]]:
    """``(title, code)`` of each section of ``page`` that has ```python blocks (title: the page's stem + heading)."""
    text = ADAPTERS.sub("", page.read_text(encoding="utf-8"))
    out = []
    for chunk in re.split(r"\n(?=## )", text):
        blocks = re.findall(r"```python\n(.*?)```", chunk, flags=re.S)
        if blocks:
            heading = chunk.lstrip("\n").splitlines()[0].lstrip("# ").strip()
            out.append((f"{page.relative_to(ROOT)}: {heading}", "\n".join(blocks)))
    return out


SECTIONS = [s for page in PAGES for s in _sections(page)]


def test_every_page_with_code_is_collected():
    # the README keeps one example (the package page's), the guides hold the rest
    assert [t for t, _ in _sections(README)] == ["README.md: Example"]
    pages = {t.split(":", 1)[0] for t, _ in SECTIONS}
    assert {"docs/attacks.md", "docs/auto.md", "docs/certification.md", "docs/extending.md",
            "docs/pytest-plugin.md", "docs/studies.md"} <= pages, pages
    assert len(SECTIONS) >= 12


@pytest.mark.parametrize("title,code", SECTIONS, ids=[t for t, _ in SECTIONS])
def test_section_runs(title, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files (checkpoints, reports) write them here
    torch.manual_seed(0)
    # each example ends by checking its own result (an AssertionError fails the test)
    assert re.search(r"^assert ", code, flags=re.M), "the example must assert what it shows"
    # run as a real module, as a reader's script would: pydantic (a study's options) and dataclasses resolve a
    # class's annotations through sys.modules[cls.__module__]
    module = types.ModuleType("__example__")
    monkeypatch.setitem(sys.modules, "__example__", module)
    exec(compile(code, title, "exec"), module.__dict__)


def _relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code is not a link
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, flags=re.M)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_links_exist():
    links = _relative_links(README)
    assert len(links) >= 10, links  # the README is the package page: it links to the guides
    missing = [t for t in links if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](docs/nope.md) [b](https://example.org) [c](#here)\n```\n[d](not/a/link.md)\n```\n")
    assert _relative_links(page) == ["docs/nope.md"]


def test_ci_runs_the_readme_test_command():
    # .ci/run installs and tests exactly as the README tells a new user to (the docs extra included: CI builds the site)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = re.search(r'^python3 -m venv .*pip install -q -c constraints\.txt -e "\.\[test,docs\]" && pytest -q$', ci,
                        flags=re.M)
    assert command is not None, ".ci/run lost its install-and-test line"
    assert f"```bash\n{command.group(0)}\n```" in README.read_text(encoding="utf-8")
