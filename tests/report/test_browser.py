"""report.html in a real browser: headless Chromium renders it; the DOM and the screenshot must show the
tables and figures, decoded and not blank.

Chromium is required (Debian: ``apt-get install -y chromium``; ``.ci/run`` installs it). Without it this test
FAILS, it is never skipped: a report nobody checked in a browser is not a checked report.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

WIDTH = 1280
# run after load (images decoded): record what the browser laid out, for the screenshot checks
PROBE = """<script>window.addEventListener('load', () => {
  const box = e => { const r = e.getBoundingClientRect();
    return [r.left + scrollX, r.top + scrollY, r.width, r.height]; };
  const inner = e => { const r = e.getBoundingClientRect();  // inside the border: the picture itself
    return [r.left + scrollX + e.clientLeft, r.top + scrollY + e.clientTop, e.clientWidth, e.clientHeight]; };
  const out = {width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
    images: [...document.images].map(i => ({box: inner(i), natural: [i.naturalWidth, i.naturalHeight],
                                           complete: i.complete, alt: i.alt})),
    tables: [...document.querySelectorAll('table')].map(t => ({box: box(t), visible: t.offsetParent !== null,
                                                              rows: t.rows.length})),
    sections: [...document.querySelectorAll('section.card h2')].map(h => h.textContent)};
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  pre.style.display = 'none'; document.body.appendChild(pre);
});</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is needed to check report.html in a real browser, and none was found on PATH. "
                "Install it: `apt-get install -y chromium` (Debian/Ubuntu; .ci/run does this), then rerun.")


def run_chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    # no network: the background-networking flags keep Chromium from trying (and waiting on) closed hosts
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
           "--no-first-run", "--disable-quic", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--force-device-scale-factor=1", f"--user-data-dir={profile}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return proc


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[str, int] = {}
        self.srcs: list[str] = []
        self.links: list[str] = []
        self.probe = ""
        self._in_probe = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag in ("img", "script", "iframe", "source", "video", "audio") and a.get("src") is not None:
            self.srcs.append(a["src"])
        if tag == "link" and a.get("href"):
            self.links.append(a["href"])
        self._in_probe = tag == "pre" and a.get("id") == "probe"

    def handle_data(self, data):
        if self._in_probe:
            self.probe += data

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_probe = False


@pytest.fixture(scope="module")
def rendered(full_report, tmp_path_factory):
    """DOM (with the layout probe) and a full-page screenshot of the report."""
    return render(full_report, tmp_path_factory.mktemp("browser"))


@pytest.fixture(scope="module")
def rendered_cli(cli_report, tmp_path_factory):
    """The same for the report ``medadv evaluate`` wrote (NIfTI volumes, HD95, class names)."""
    return render(cli_report / "report.html", tmp_path_factory.mktemp("browser_cli"))


def render(report: Path, work: Path):
    """Render ``report`` (with the probe) in headless Chromium: ``(dom, layout, screenshot, report)``."""
    page = work / "report.html"
    page.write_text(report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    url = page.as_uri()
    # the same width as the screenshot below, so that the boxes the probe records are where the pixels are
    dom_text = run_chromium([f"--window-size={WIDTH},2000", "--virtual-time-budget=5000", "--dump-dom", url],
                            work / "profile-dom").stdout
    dom = _Dom()
    dom.feed(dom_text)
    assert dom.probe, "the layout probe did not run: the page did not finish loading in Chromium"
    layout = json.loads(dom.probe)
    height = int(layout["height"])
    assert 2000 < height < 40000, height
    shot = work / "shot.png"
    run_chromium([f"--window-size={WIDTH},{height}", "--virtual-time-budget=5000", f"--screenshot={shot}", url],
                 work / "profile-shot")
    img = np.asarray(Image.open(shot).convert("RGB")).astype(np.float64)
    assert img.shape[:2] == (height, WIDTH), img.shape
    return dom, layout, img, report


def _crop(img: np.ndarray, box: list[float]) -> np.ndarray:
    x, y, w, h = (int(round(v)) for v in box)
    return img[max(y, 0) : y + h, max(x, 0) : x + w]


def test_dom_has_the_sections_tables_and_figures_and_nothing_external(rendered):
    dom, layout, _, _ = rendered
    titles = " | ".join(layout["sections"])
    for name in ("Key findings", "Summary", "Robustness curves", "Per-class results", "Class-wise robustness",
                 "Transferability", "Common corruptions", "Adversarial vs random noise", "Frequency bands",
                 "Models", "Feature and label correlation", "Cases"):
        assert name in titles, f"section {name!r} missing; sections: {titles}"
    visible = [t for t in layout["tables"] if t["visible"]]
    assert len(visible) >= 6 and all(t["rows"] >= 2 for t in visible), layout["tables"]
    # every figure is an embedded PNG the browser decoded; the only script is the test's own probe
    assert len(layout["images"]) >= 14
    broken = [i["alt"] for i in layout["images"] if not (i["complete"] and min(i["natural"]) > 100)]
    assert not broken, f"figures the browser could not decode: {broken}"
    assert dom.srcs and all(s.startswith("data:image/png;base64,") for s in dom.srcs), [s[:40] for s in dom.srcs]
    assert dom.links == [] and dom.tags.get("script", 0) == 1 and dom.tags.get("style", 0) == 1
    assert layout["width"] <= WIDTH, f"the page scrolls sideways ({layout['width']} px wide)"


@pytest.fixture(params=["full", "cli"])
def any_rendered(request):
    """Each rendered report: the one with every kind of section, and the one `medadv evaluate` wrote."""
    return request.getfixturevalue("rendered" if request.param == "full" else "rendered_cli")


def test_the_evaluate_report_shows_cases_hd95_and_class_names_in_the_browser(rendered_cli):
    dom, layout, _, report = rendered_cli
    titles = " | ".join(layout["sections"])
    for name in ("Key findings", "Settings", "Summary", "Robustness curves", "Per-class results", "Cases"):
        assert name in titles, f"section {name!r} missing; sections: {titles}"
    cases = [i for i in layout["images"] if i["alt"].startswith("case: ")]
    assert len(cases) == 4, [i["alt"] for i in layout["images"]]  # 2 volumes x (fgsm, pgd)
    assert all(i["complete"] and min(i["natural"]) > 500 for i in cases)
    assert any(i["alt"] == "per-class HD95, clean vs attacked, one panel per attack" for i in layout["images"])
    text = report.read_text(encoding="utf-8")
    assert "organ A" in text and "organ B" in text and "HD95 attacked" in text
    assert layout["width"] <= WIDTH, f"the page scrolls sideways ({layout['width']} px wide)"


def test_screenshot_figures_are_drawn_and_match_the_embedded_pngs(any_rendered):
    dom, layout, img, _ = any_rendered
    assert len(dom.srcs) == len(layout["images"])
    for src, meta in zip(dom.srcs, layout["images"], strict=True):
        x, y, w, h = meta["box"]
        assert w > 200 and h > 150 and x >= 0 and x + w <= WIDTH + 1, (meta["alt"], meta["box"])
        region = _crop(img, meta["box"])
        grey = region.mean(axis=2)
        ink = (grey < 200).mean()  # share of clearly dark pixels: axes, text, data (a blank PNG has none)
        assert grey.std() > 8 and ink > 0.008, f"figure {meta['alt']!r} looks blank (std {grey.std():.1f}, ink {ink:.3f})"
        # what is on screen is the embedded figure (scaled to its box), not something else or a broken image
        # (compared at a quarter of the size: the browser's resampling may shift thin lines by a pixel)
        small = (max(1, region.shape[1] // 4), max(1, region.shape[0] // 4))
        png = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("L")
        ref = np.asarray(png.resize(small, Image.BOX), dtype=np.float64)
        seen = np.asarray(Image.fromarray(grey.astype(np.uint8)).resize(small, Image.BOX), dtype=np.float64)
        corr = np.corrcoef(ref.ravel(), seen.ravel())[0, 1]
        assert corr > 0.8, f"figure {meta['alt']!r} on screen differs from its PNG (correlation {corr:.2f})"


def test_screenshot_tables_are_drawn(any_rendered):
    _, layout, img, _ = any_rendered
    for t in [t for t in layout["tables"] if t["visible"]]:
        region = _crop(img, t["box"]).mean(axis=2)
        assert region.size and region.std() > 10 and (region < 128).mean() > 0.005, t


def test_screenshot_header_and_background(rendered):
    _, _, img, _ = rendered
    head = img[:60, :400].reshape(-1, 3).mean(axis=0)
    assert head[2] > head[0] + 20, f"the dark-blue page header is missing (mean colour {head})"
    page_bg = img[-5:, :].reshape(-1, 3).mean(axis=0)
    assert (page_bg > 230).all(), page_bg
