"""The documentation site is checked like code: it builds in strict mode, covers the public API, and renders.

``mkdocs build --strict`` fails on any warning: a link to a missing page or anchor, an API reference
(``::: name``) that cannot be resolved, a public name without a docstring (docs/_hooks/api_pages.py warns), a
snippet of the README that moved. The built index page and the API page of ``PGD`` are then opened in headless
Chromium (served from 127.0.0.1: nothing outside this machine is reached; Chromium is required, as for the report's
browser test) and must show the search box, the theme's styles and PGD's docstring.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
from mkdocs.structure.files import Files
from PIL import Image

import medadv

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the site's API-page generator, and the report browser test's way of starting Chromium offline (one copy of each)
api_pages = _load(ROOT / "docs" / "_hooks" / "api_pages.py", "_medadv_docs_api_pages")
browser = _load(ROOT / "tests" / "report" / "test_browser.py", "_medadv_report_browser")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    # no -q: with it mkdocs stops counting warnings, and --strict passes a build that warned
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    proc = mkdocs_build(ROOT / "mkdocs.yml", out)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return out


def test_every_public_name_has_a_docstring():
    # a class's __doc__ is its own (never inherited), so a subclass without one is caught
    missing = [n for n in medadv.__all__ if not (getattr(medadv, n).__doc__ or "").strip()]
    assert not missing, f"public names without a docstring: {missing}"
    assert api_pages.missing_docstrings() == []


def test_a_public_name_without_a_docstring_is_a_build_warning(monkeypatch, caplog, tmp_path):
    def undocumented():  # no docstring
        return None

    monkeypatch.setattr(medadv, "__all__", [*medadv.__all__, "undocumented"])
    monkeypatch.setattr(medadv, "undocumented", undocumented, raising=False)
    assert api_pages.missing_docstrings() == ["undocumented"]
    config = SimpleNamespace(site_dir=str(tmp_path), use_directory_urls=True,
                             plugins=SimpleNamespace(_current_plugin="test"))
    with caplog.at_level("WARNING", logger="mkdocs.hooks.api_pages"):
        files = api_pages.on_files(Files([]), config)
    assert "api/undocumented.md" in {f.src_uri for f in files}  # a new public name gets its page
    # a warning of a "mkdocs." logger is what --strict turns into a failed build
    assert [r.name for r in caplog.records] == ["mkdocs.hooks.api_pages"]
    assert "medadv.undocumented" in caplog.records[0].getMessage()


def test_site_builds_strict_with_an_api_page_for_each_public_name(site):
    pages = {p.name for p in (site / "api").iterdir() if p.is_dir()} - {"adapters"}
    assert pages == set(medadv.__all__)  # exactly: a removed name loses its page
    for name in medadv.__all__:
        text = (site / "api" / name / "index.html").read_text(encoding="utf-8")
        first = (getattr(medadv, name).__doc__ or "").strip().splitlines()[0]
        words = re.findall(r"[A-Za-z]{4,}", first)[:3]  # the docstring's first words are on the page
        assert all(w in text for w in words), (name, words)
    adapters = {p.name for p in (site / "api" / "adapters").iterdir()}
    assert adapters == set(api_pages.ADAPTER_MODULES)
    art = (site / "api" / "adapters" / "art" / "index.html").read_text(encoding="utf-8")
    assert 'id="adapters.art.ARTClassifier"' in art and 'id="adapters.art.ARTSegmenter"' in art
    # the attacks guide lists every registered attack (generated from the registry at build time)
    from medadv.attacks.base import available_attacks

    attacks = (site / "attacks" / "index.html").read_text(encoding="utf-8")
    assert "registered-attacks" not in attacks
    assert all(f"<td><code>{name}</code></td>" in attacks for name in available_attacks())
    # the guides are there, their Sphinx roles rendered as code, nothing fetched from elsewhere
    for page in ("evaluate", "auto", "adapters", "studies", "certification", "pytest-plugin", "real-models",
                 "attacks", "extending"):
        assert (site / page / "index.html").is_file(), page
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"""(src|href)=["']https?://(?!squidfunk\.github\.io)""", text), page
        assert ":class:<code>" not in text, page


def _minimal_site(tmp_path: Path, page: str, plugins: str) -> subprocess.CompletedProcess:
    """A one-page site with this project's validation rules (and plugins), built strict."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(page)
    validation = re.search(r"\nvalidation:\n(?:  .*\n)+", (ROOT / "mkdocs.yml").read_text())
    assert validation is not None, "mkdocs.yml has no `validation:` section"
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: t\ndocs_dir: {docs}\n{plugins}{validation.group(0)}")
    return mkdocs_build(config, tmp_path / "site")


def test_a_broken_link_fails_the_strict_build(tmp_path):
    proc = _minimal_site(tmp_path, "# t\n\n[the guide](evaluat.md)\n", "")
    assert proc.returncode != 0 and "evaluat.md" in proc.stderr + proc.stdout


def test_a_broken_api_reference_fails_the_strict_build(tmp_path):
    plugins = f"plugins:\n  - mkdocstrings:\n      handlers:\n        python:\n          paths: [{ROOT}]\n"
    proc = _minimal_site(tmp_path, "# t\n\n::: medadv.attacks.pgd.PDG\n", plugins)
    assert proc.returncode != 0 and "medadv.attacks.pgd.PDG" in proc.stderr + proc.stdout


# --- in a browser ---------------------------------------------------------------------------------------------
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def served(site) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1 (material's search loads its index with fetch, which file:// blocks)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Text(HTMLParser):
    """The DOM's visible text and the attributes of its ``input`` elements."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.inputs: list[dict[str, str | None]] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._skip += 1
        if tag == "input":
            self.inputs.append(dict(attrs))

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def _render(url: str, work: Path, name: str) -> tuple[_Text, np.ndarray]:
    dom_text = browser.run_chromium(["--window-size=1280,1000", "--virtual-time-budget=5000", "--dump-dom", url],
                                    work / f"profile-{name}-dom").stdout
    dom = _Text()
    dom.feed(dom_text)
    shot = work / f"{name}.png"
    browser.run_chromium(["--window-size=1280,1000", "--virtual-time-budget=5000", f"--screenshot={shot}", url],
                         work / f"profile-{name}-shot")
    return dom, np.asarray(Image.open(shot).convert("RGB")).astype(np.int64)


def _check_page(dom: _Text, shot: np.ndarray) -> str:
    search = [i for i in dom.inputs if i.get("data-md-component") == "search-query"]
    assert search and search[0].get("placeholder") == "Search", dom.inputs
    # the theme's stylesheet applied: the header bar is drawn in the primary colour, the page below is white
    header, body = shot[5:40, 300:900].reshape(-1, 3), shot[300:900].reshape(-1, 3)
    assert (np.abs(header - header.mean(0)).max() < 60 and header.mean(0).sum() < 3 * 160
            and header.mean(0)[2] > header.mean(0)[0] + 40), header.mean(0)  # indigo: blue over red
    assert (body == 255).all(1).mean() > 0.5, "the page below the header is not mostly white"
    return re.sub(r"\s+", " ", "".join(dom.text))


def test_index_and_pgd_pages_render_in_chromium(served, tmp_path):
    dom, shot = _render(f"{served}/", tmp_path, "index")
    text = _check_page(dom, shot)
    assert "Getting started" in text and "pip install -q -c constraints.txt" in text
    assert (shot[60:1000, 250:1000] < 128).all(-1).mean() > 0.01, "no text drawn on the index page"

    dom, shot = _render(f"{served}/api/PGD/", tmp_path, "pgd")
    text = _check_page(dom, shot)
    first = re.sub(r"\s+", " ", (medadv.PGD.__doc__ or "").strip().splitlines()[0])
    assert first in text, "the PGD page does not show its docstring's first line"
    assert "step_size" in text and "random_start" in text  # its parameters, from the docstring
