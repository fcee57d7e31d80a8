"""report.html: self-contained, every section drawn from the right numbers, text escaped."""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

import medadv.report.html as H
from medadv.report.blocks import heatmap, mean_of
from medadv.report.cases import damage
from medadv.report.html import ci95, fmt, fmt_budget, fmt_ci, render_html_report, write_html_report
from medadv.results import Results
from medadv.studies.base import StudyResult


class Page(HTMLParser):
    """Tables (rows of cell texts) and image sources per section id."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[list[str]]]] = {}
        self.images: dict[str, list[str]] = {}
        self.alts: dict[str, list[str]] = {}
        self.tags: dict[str, int] = {}
        self.attrs: list[tuple[str, str]] = []
        self.section = ""
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.attrs += [(k, v or "") for k, v in attrs]
        if tag == "section":
            self.section = a.get("id", "")
        elif tag == "table":
            self.tables.setdefault(self.section, []).append([])
        elif tag == "tr":
            self.tables[self.section][-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.setdefault(self.section, []).append(a["src"])
            self.alts.setdefault(self.section, []).append(a.get("alt") or "")

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self.section][-1][-1].append("".join(self._cell).strip())
            self._cell = None


def _drawing_modules(name: str) -> list:
    """The report's modules that draw with block ``name``: html.py and each study module (its section's drawer)."""
    import importlib
    import pkgutil

    import medadv.studies

    mods = [H] + [importlib.import_module(f"medadv.studies.{m.name}")
                  for m in pkgutil.iter_modules(medadv.studies.__path__)]
    return [m for m in mods if hasattr(m, name)]


def _records(table: list[list[str]]) -> list[dict[str, str]]:
    return [dict(zip(table[0], row, strict=True)) for row in table[1:]]


@pytest.fixture
def figures(monkeypatch):
    """The matplotlib figures the report embeds, by alt text (recorded before they are closed)."""
    seen: dict[str, object] = {}
    original = H.figure_image

    def record(fig, alt, caption="", dpi=110):
        seen[alt] = [[(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines]
                     for ax in fig.axes]
        return original(fig, alt, caption, dpi)

    for mod in _drawing_modules("figure_image"):
        monkeypatch.setattr(mod, "figure_image", record)
    return seen


@pytest.fixture
def heatmaps(monkeypatch):
    seen: list[tuple[str, np.ndarray, list[str], list[str]]] = []
    original = heatmap

    def record(ax, m, rows, cols, **kw):
        seen.append((kw.get("title", ""), np.array(m, dtype=float), list(rows), list(cols)))
        return original(ax, m, rows, cols, **kw)

    for mod in _drawing_modules("heatmap"):
        monkeypatch.setattr(mod, "heatmap", record)
    return seen


def test_the_file_is_self_contained(full_report):
    text = full_report.read_text(encoding="utf-8")
    page = Page(text)
    assert page.tags.get("script", 0) == 0 and page.tags.get("link", 0) == 0 and page.tags["style"] == 1
    srcs = [s for v in page.images.values() for s in v]
    assert len(srcs) >= 14
    for s in srcs:
        assert s.startswith("data:image/png;base64,")
        img = Image.open(io.BytesIO(base64.b64decode(s.split(",", 1)[1])))
        img.verify()
    for name, value in page.attrs:  # nothing points outside the file
        assert not re.match(r"(https?:|//|file:)", value), (name, value[:80])
        if name == "href":
            assert value.startswith("#"), value


def test_summary_and_findings_use_the_results_numbers(seg3d_results):
    page = Page(render_html_report(seg3d_results))
    summary = {(r["attack"], r["budget"]): r for r in seg3d_results.summary()}
    table = _records(page.tables["summary"][0])
    assert len(table) == len(summary) == 4
    for row in table:
        attack = next(a for (a, b) in summary if a.startswith(row["attack"] + "@") and fmt_budget(b) == row["budget"])
        s = summary[(attack, next(b for (a, b) in summary if a == attack))]
        assert row["mean Dice (clean)"] == f"{s['clean_mean_dice']:.3f}"
        assert row["mean Dice (attacked)"] == f"{s['adv_mean_dice']:.3f}"
        assert row["change"] == f"{s['adv_mean_dice'] - s['clean_mean_dice']:.3f}"
        assert row["n"] == "4"
    text = render_html_report(seg3d_results)
    # ranked among the attacks of the largest budget (issue 28: only attacks of the same budget compare)
    top = max(b for _, b in summary)
    worst = min((r for r in summary.values() if r["budget"] == top), key=lambda r: r["adv_mean_dice"])
    assert (f"Strongest attack at ε = {fmt_budget(top)} (L∞, 2 attacks at this budget): "
            f"<b>{worst['attack'].split('@')[0]}</b>") in text
    # the full table (collapsed) has every summary column, per-class lists excepted
    full = page.tables["summary"][1][0]
    assert "pixel accuracy (attacked)" in full and "Dice (attacked)" not in full


def test_curves_and_per_class_figures_of_a_segmentation(seg3d_results, figures):
    render_html_report(seg3d_results, class_names=["background", "organ A", "organ B"])
    summary = seg3d_results.summary()
    (curve,) = figures["robustness curve: mean_dice vs budget, one line per attack"]
    lines = {label: (x, y) for label, x, y in curve}
    pgd = sorted((r["budget"], r["adv_mean_dice"]) for r in summary if r["attack"].startswith("pgd@"))
    assert lines["pgd"][0] == [0.0] + [b for b, _ in pgd]
    np.testing.assert_allclose(lines["pgd"][1][1:], [v for _, v in pgd])
    per_class = figures["per-class dice vs budget, one panel per attack"]
    # the classes the mean Dice counts (the task leaves the background out), under their names
    assert "include_background=False" in seg3d_results.meta["task"]
    assert [label for label, _, _ in per_class[0]] == ["organ A", "organ B"]


def test_per_class_recall_of_a_multiclass_table():
    rows = []
    # class 0: 4 samples, 3 right clean, 1 right attacked; class 1: 2 samples, both right clean, 0 attacked
    for i, (label, cp, ap) in enumerate([(0, 0, 0), (0, 0, 1), (0, 0, 1), (0, 1, 1), (1, 1, 0), (1, 1, 0)]):
        rows.append({"sample": i, "attack": "pgd@0.03", "budget": 0.03, "label": label, "clean_pred": cp,
                     "adv_pred": ap, "clean_correct": cp == label, "adv_correct": ap == label, "fooled": cp != ap})
    page = Page(render_html_report(Results(rows), class_names=["benign", "malignant"]))
    table = _records(page.tables["per-class"][0])
    assert [(r["class"], r["clean recall"], r["attacked recall"]) for r in table] == [
        ("benign", "0.750", "0.250"), ("malignant", "1.000", "0.000")]
    findings = " ".join(page.tables.get("findings", [[]])[0][0]) if page.tables.get("findings") else ""
    assert findings == ""  # findings are a list, not a table
    text = render_html_report(Results(rows))
    assert "accuracy 0.833 → <b>0.167</b> (80% lower)" in text


def test_ensemble_table_and_masking_flags_are_shown():
    rows = [{"sample": i, "attack": "auto", "budget": 0.03, "clean_correct": True, "adv_correct": i == 0,
             "attack_metric_after": [1.0 if i == 0 else 0.0, 1.0 if i == 0 else 0.0],
             "attack_attacked": [True, i == 0], "attack_seconds": [0.5, 0.25], "attack_components": ["apgd-ce", "fab"],
             "attack_metric": "accuracy", "attack_masking": ["zero-gradients"] if i == 1 else [],
             "attack_masking_messages": ["the gradient is zero on some samples"] if i == 1 else []}
            for i in range(2)]
    results = Results(rows)
    page = Page(render_html_report(results))
    ensemble = _records(page.tables["ensemble"][0])
    assert [r["member"] for r in ensemble] == ["(clean)", "apgd-ce", "fab"]
    assert ensemble[1]["robust accuracy"] == "0.500" and ensemble[1]["gain"] == "0.500"
    flags = _records(page.tables["masking"][0])
    assert flags[0]["check"] == "zero-gradients" and flags[0]["message"] == "the gradient is zero on some samples"
    assert "gradient-masking check(s) fired" in render_html_report(results)


def test_study_figures_follow_the_row_conventions(studies, figures, heatmaps):
    page = Page(render_html_report(None, studies=studies))
    for sid in ("study-classwise", "study-transfer", "study-corruptions", "study-noise-baseline", "study-frequency",
                "study-models", "study-correlation"):
        assert page.images.get(sid), f"no figure in {sid}"
    # class-wise: confusion matrices normalised per true class, in class order
    conf: dict[str, np.ndarray] = {}
    for title, m, _, _ in heatmaps:  # the class-wise study is drawn first
        conf.setdefault(title, m)
    np.testing.assert_allclose(conf["clean"], np.array([[7, 1, 0, 0], [0, 8, 0, 0], [1, 0, 6, 1], [0, 0, 1, 7]]) / 8)
    np.testing.assert_allclose(conf["pgd ε=0.0314"].sum(1), 1.0)  # the title reads the key "pgd@0.0314"
    attractors = _records(page.tables["study-classwise"][0])
    assert attractors[0] == {"setting": "pgd ε=0.0314", "attractors (most errors first)": "cat > dog > bird > deer"}
    # transfer: rows = surrogate, columns = target; the diagonal is the white-box attack
    _, m, rows, cols = next(h for h in heatmaps if h[0] == "accuracy attacked")
    assert rows == cols == ["cnn", "resnet", "unet"]
    np.testing.assert_allclose(np.diag(m), 0.1)
    assert m[0, 1] == pytest.approx(0.45) and m[2, 0] == pytest.approx(0.7)
    # corruptions: one line per corruption, metric against severity
    (metric_ax, flip_ax) = figures["corruption curves: metric and flip probability vs severity"]
    blur = next(line for line in metric_ax if line[0] == "blur")
    assert blur[1] == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(blur[2], [0.9 - 0.08 * s * 1.6 for s in range(1, 6)])
    np.testing.assert_allclose(next(line for line in flip_ax if line[0] == "blur")[2],
                               [0.04 * s * 1.6 for s in range(1, 6)])
    # correlation: clean, attacked and their difference
    co = {title: m for title, m, _, _ in heatmaps}  # the correlation study is drawn last
    np.testing.assert_allclose(co["attacked − clean"], np.array([[4, 5, 3], [5, 9, 2], [3, 2, 6]])
                               - np.array([[10, 2, 1], [2, 8, 0], [1, 0, 5]]))
    models = _records(page.tables["study-models"][0])
    assert [(r["model"], r["clean accuracy"]) for r in models] == [("cnn", "0.900"), ("resnet", "0.950"),
                                                                   ("vit", "0.850")]


def test_text_is_escaped_and_odd_studies_are_shown_raw():
    odd = StudyResult("classwise", [{"attack": "pgd", "clean": "<b>x</b>"}], {})  # no class column
    unknown = StudyResult("my_study", [{"what": "<script>alert(1)</script>", "value": 0.5}])
    text = render_html_report(None, studies=[odd, unknown], title="<script>alert('t')</script>")
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&lt;b&gt;x&lt;/b&gt;" in text
    page = Page(text)
    assert _records(page.tables["study-my_study"][0]) == [{"what": "<script>alert(1)</script>", "value": "0.500"}]
    assert "Could not draw this study" in text or page.images.get("study-classwise")


def test_inputs_are_checked_and_an_empty_report_says_so(tmp_path):
    with pytest.raises(TypeError, match="Results"):
        render_html_report([{"attack": "x"}])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="StudyResult"):
        render_html_report(None, studies=[{"study": "x"}])  # type: ignore[list-item]
    path = write_html_report(None, tmp_path / "new" / "dir")
    assert path == tmp_path / "new" / "dir" / "report.html"
    assert "Nothing to report" in path.read_text()
    assert not list(path.parent.glob(".*tmp"))


def test_budgets_read_as_fractions_of_255():
    assert fmt_budget(8 / 255) == "0.03137 (8/255)"
    assert fmt_budget(0.05) == "0.05"
    assert fmt_budget(None) == "–"
    assert H.fmt(float("nan")) == "–" and H.fmt(1e-6) == "1e-06" and H.fmt(0.12345) == "0.123"
    assert mean_of([None, float("nan"), 1.0]) == 1.0


def test_saliency_pairs_ready_figures_and_a_table_without_known_metrics():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from medadv.report.cases import SaliencyPair

    x = torch.rand(2, 1, 12, 12)
    pair = SaliencyPair(x, x + 0.01, torch.rand(2, 12, 12), torch.rand(2, 12, 12), title="Gradient, relevance attack")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    rows = [{"sample": 0, "attack": "my_attack", "budget": None, "clean_custom": 0.5, "adv_custom": 0.25}]
    page = Page(render_html_report(Results(rows), cases=[fig], saliency=[pair]))
    assert len(page.images["saliency"]) == 1 and len(page.images["cases"]) == 1
    assert _records(page.tables["summary"][0]) == [{"attack": "my_attack", "budget": "–", "n": "1",
                                                    "ε-ball": "no ε-ball (not an Lp threat)"}]
    assert _records(page.tables["summary"][1])[0]["custom (attacked)"] == "0.250"
    assert "curves" not in page.tables and "curves" not in page.images  # no budget, no curve


# --- the report of `medadv evaluate`: cases, HD95, class names, spread, settings ------------------------------------
def _mean_of(values):
    v = [float(x) for x in values if x is not None]
    return sum(v) / len(v)


def test_the_evaluate_report_shows_cases_hd95_and_class_names(cli_report):
    from medadv.tasks import Segmentation

    rows = json.loads((cli_report / "results.json").read_text())["rows"]
    page = Page((cli_report / "report.html").read_text(encoding="utf-8"))
    # cases: per attack at its largest budget, the 2 volumes with the largest Dice drop, named by their file
    task = Segmentation(3)
    expected = []
    for attack in ("fgsm@0.0627451", "pgd@0.0627451"):
        mine = sorted((r for r in rows if r["attack"] == attack), key=lambda r: r["sample"])
        worst = sorted(mine, key=lambda r: damage(task, r), reverse=True)[:2]
        assert worst[0]["clean_mean_dice"] - worst[0]["adv_mean_dice"] >= max(
            r["clean_mean_dice"] - r["adv_mean_dice"] for r in mine) - 1e-12
        expected += [f"case: {attack.split('@')[0]} ε=0.06275 (16/255) · case {r['case_id']} (sample {r['sample']})"
                     for r in worst]
    assert page.alts["cases"] == expected
    for src in page.images["cases"]:
        img = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert img.size[0] > 800 and img.size[1] > 700  # 3 slices x 5 panels
    # per class: the class names (background left out, as the Dice leaves it out), Dice and HD95 from the rows
    table = _records(page.tables["per-class"][0])
    assert {r["class"] for r in table} == {"organ A", "organ B"}
    assert page.alts["per-class"] == ["per-class Dice, clean vs attacked, one panel per attack",
                                      "per-class HD95, clean vs attacked, one panel per attack"]
    assert "per-class Dice and HD95 (mm) for every attack" in (cli_report / "report.html").read_text(encoding="utf-8")
    for r in table:
        j = ["background", "organ A", "organ B"].index(r["class"])
        attack = next(a for a in {x["attack"] for x in rows}
                      if a.startswith(r["attack"] + "@") and fmt_budget(next(x["budget"] for x in rows
                                                                               if x["attack"] == a)) == r["budget"])
        mine = [x for x in rows if x["attack"] == attack]
        assert r["attacked Dice"] == fmt(_mean_of(x["adv_dice"][j] for x in mine))
        assert r["clean HD95"] == fmt(_mean_of(x["clean_hd95"][j] for x in mine))
        assert r["attacked HD95"] == fmt(_mean_of(x["adv_hd95"][j] for x in mine))
        undefined = sum(x["adv_hd95"][j] is None for x in mine)
        assert r["HD95 undefined"].endswith(f"/ {undefined} of {len(mine)}")
        assert r["95% CI"] == fmt_ci(ci95(x["adv_dice"][j] for x in mine))
        assert r["HD95 CI"] == fmt_ci(ci95(x["adv_hd95"][j] for x in mine), 2)
    # summary: HD95 over the two organs, the CI of the attacked mean Dice, and a box plot of the per-case spread
    summary = _records(page.tables["summary"][0])
    pgd = next(r for r in summary if r["attack"] == "pgd" and "16/255" in r["budget"])
    mine = [x for x in rows if x["attack"] == "pgd@0.0627451"]
    assert pgd["HD95 attacked"] == fmt(_mean_of([_mean_of(x["adv_hd95"][j] for x in mine) for j in (1, 2)]))
    lo, hi = ci95(x["adv_mean_dice"] for x in mine)
    assert pgd["95% CI"] == fmt_ci((lo, hi)) and lo <= float(pgd["mean Dice (attacked)"]) <= hi
    assert page.alts["summary"] == ["per-case spread of mean_dice, clean and per attack"]
    # settings: one readable row per setting, no Python or JSON blobs
    settings = {r["setting"]: r["value"] for r in _records(page.tables["settings"][0])}
    assert settings["task · class_names"] == "[background, organ A, organ B]"
    assert settings["budgets"] == "0.01569 (4/255), 0.06275 (16/255)"
    assert settings["attacks"].split("\n") == ["fgsm", "pgd (steps 3)"]
    assert settings["model · builder"] == "small_unet" and settings["hd95"] == "yes"
    # (a pairing rule's pattern, `{id}`, is no blob)
    assert not any("{" in v or "'" in v for k, v in settings.items() if k not in ("task (as built)", "data · pair"))


def test_spread_and_intervals_of_few_or_binary_cases():
    assert ci95([0.5]) is None and fmt_ci(None) == "–"
    lo, hi = ci95([0.0, 1.0, 1.0, 1.0])
    assert 0.0 <= lo < 0.75 < hi <= 1.0
    assert ci95([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2))
    # 0/1 accuracy: its spread is the interval, no box plot
    rows = [{"sample": i, "attack": "pgd", "budget": 0.03, "label": 0, "clean_pred": 0, "adv_pred": i % 2,
             "clean_correct": True, "adv_correct": i % 2 == 0} for i in range(6)]
    page = Page(render_html_report(Results(rows)))
    assert "summary" not in page.images
    assert _records(page.tables["summary"][0])[0]["95% CI"] == fmt_ci(ci95([1, 0, 1, 0, 1, 0]))


def test_demo_output_report_draws_the_worst_crops_and_training_shows_progress(tmp_path, capsys):
    from medadv.data.mni152 import TISSUE_CLASSES
    from medadv.demo import DemoConfig, run_demo, write_demo_outputs

    cfg = DemoConfig(patch=16, spacing_mm=4, n_train=4, n_test=3, epochs=2, batch_size=2, channels=(4, 8),
                     budgets=(8 / 255,), steps=2)
    out = run_demo(cfg, cache=tmp_path / "cache", progress=True, echo=lambda *_: None)
    err = capsys.readouterr().err
    # the training step and the attacks show tqdm bars with their elapsed time and ETA ([00:01<00:02, ...])
    assert re.search(r"train UNet: +\d+%.*\| \d+/2 \[\d\d:\d\d<\d\d:\d\d", err), err[-500:]
    assert re.search(r"evaluate: +\d+%.*\[\d\d:\d\d<\d\d:\d\d", err), err[-500:]
    paths = write_demo_outputs(out, tmp_path / "out")
    assert [p.name for p in paths] == ["results.json", "results.csv", "report.md", "report.html"]
    page = Page(paths[-1].read_text(encoding="utf-8"))
    res = out["results"]
    strongest = min(res.summary(), key=lambda r: r["adv_mean_dice"])["attack"]
    rows = sorted((r for r in res.rows if r["attack"] == strongest), key=lambda r: r["sample"])
    worst = sorted(rows, key=lambda r: damage(out["task"], r), reverse=True)[:2]
    fam = strongest.split("@")[0]
    assert page.alts["cases"] == [f"case: {fam} ε=0.03137 (8/255) · case {r['sample']}" for r in worst]
    per_class = {r["class"] for r in _records(page.tables["per-class"][0])}
    assert per_class == set(TISSUE_CLASSES[1:])  # the tissue names; the background the Dice leaves out is not shown
