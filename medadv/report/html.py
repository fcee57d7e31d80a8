"""A self-contained HTML report: one ``report.html`` with every table and figure inside it.

:func:`write_html_report` renders an evaluation (:class:`~medadv.results.Results`), the papers' studies
(:class:`~medadv.studies.base.StudyResult`), a few attacked cases (:mod:`medadv.report.cases`) and
explanation-attack pairs into one HTML file: figures are PNGs drawn with matplotlib and embedded as
base64 ``data:`` URIs, the stylesheet is inline, and nothing is loaded from the network, so the file can be
mailed or archived and opens the same anywhere. The page is built from the Jinja2 templates in
``medadv/report/templates`` (``report.html.j2``, ``style.css``).

Sections (each only when there is something to show): key findings, settings, summary table, robustness
curves per attack, per-class results, attack-specific outputs, worst case per ensemble member, gradient-
masking checks, one section per study (class-wise with CFPS and confusion heatmaps, transfer heatmap,
corruption curves, noise baseline, frequency bands, models, feature/label correlation, certified vs.
empirical curves of a smoothed model), cases, saliency.

Example::

    from medadv.report.cases import select_cases
    from medadv.report.html import write_html_report

    res = evaluate(model, task, (x, y), attacks)
    cases = select_cases(model, task, x, y, attacks["pgd@0.0627"], k=2, class_names=TISSUES,
                         axis_names=("sagittal", "coronal", "axial"))
    write_html_report(res, "out/", studies=[classwise(model, task, (x, y), attacks)], cases=cases,
                      class_names=TISSUES)  # -> out/report.html
"""

from __future__ import annotations

import base64
import io
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..results import DETAIL_PREFIX, ENSEMBLE_DETAILS, Results, summary_columns
from .cases import SEG_COLOURS, Case, SaliencyPair, plot_case

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["write_html_report", "render_html_report", "StudyLike"]

#: Okabe-Ito colours (colour-blind safe) for attacks, corruptions and models in line and bar plots
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
MARKERS = "osD^vP*Xh<>"
_METRIC_NAMES = {"correct": "accuracy", "mean_dice": "mean Dice", "label_accuracy": "label accuracy",
                 "exact_match": "exact match", "dice": "Dice", "macro_auc": "macro AUC",
                 "pixel_accuracy": "pixel accuracy", "hd95": "HD95", "miou": "mIoU",
                 "worst-of": "worst-of score (the average of Dice, pixel accuracy and mIoU)"}


@runtime_checkable
class StudyLike(Protocol):
    """What the report reads from a study (:class:`medadv.studies.base.StudyResult` has it)."""

    study: str
    rows: list[dict[str, Any]]
    meta: dict[str, Any]


# --- page blocks (what the template renders) ------------------------------------------------------------------------
@dataclass
class Cell:
    text: str
    cls: str = ""
    title: str = ""


@dataclass
class Table:
    headers: list[Cell]
    rows: list[list[Cell]]
    caption: str = ""
    collapsed: bool = False  # inside a <details> element (long raw tables)
    kind: str = "table"


@dataclass
class Image:
    src: str
    width: int
    height: int
    alt: str
    caption: str = ""
    kind: str = "figure"


@dataclass
class Text:
    paragraphs: list[str]
    cls: str = ""
    kind: str = "text"


@dataclass
class Bullets:
    items: list[str]
    cls: str = ""
    kind: str = "bullets"


@dataclass
class Section:
    id: str
    title: str
    intro: str = ""
    blocks: list[Any] = field(default_factory=list)


# --- formatting -----------------------------------------------------------------------------------------------------
def _h(text: Any) -> str:
    """``text`` escaped for the HTML of ours (findings, intros), where the template does not escape: every user
    string (attack ids, class and model names, titles, paths) goes through it."""
    from markupsafe import escape

    return str(escape(str(text)))


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fmt(v: Any, digits: int = 3) -> str:
    """A cell's text: floats to ``digits`` decimals (significant digits when small), NaN/None as ``–``."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 10 ** -digits or abs(v) >= 1e5):
            return f"{v:.{digits}g}"
        return f"{v:.{digits}f}"
    if isinstance(v, list | tuple):
        return " / ".join(fmt(x, digits) for x in v)
    return str(v)


def fmt_budget(b: Any) -> str:
    """A budget in data units, with its ``k/255`` form when it is one (``0.0314 (8/255)``)."""
    if not _is_num(b):
        return "–" if b is None else str(b)
    k = float(b) * 255
    if 0 < k < 255 and abs(k - round(k)) < 1e-6:
        return f"{float(b):.4g} ({round(k)}/255)"
    return f"{float(b):.4g}"


def metric_label(col: str) -> str:
    """``adv_mean_dice`` -> ``mean Dice (attacked)``, ``clean_correct`` -> ``accuracy (clean)``."""
    for prefix, tag in (("adv_", " (attacked)"), ("clean_", " (clean)")):
        if col.startswith(prefix):
            base = col.removeprefix(prefix)
            return _METRIC_NAMES.get(base, base.replace("_", " ")) + tag
    if col.startswith(DETAIL_PREFIX):
        return col.removeprefix(DETAIL_PREFIX).replace("_", " ")
    return _METRIC_NAMES.get(col, col.replace("_", " "))


def _header(col: str) -> Cell:
    return Cell(metric_label(col), title=col)


def _cell(col: str, v: Any) -> Cell:
    if col == "budget":
        return Cell(fmt_budget(v), "num")
    return Cell(fmt(v), "num" if _is_num(v) or v is None else "")


def _table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str], caption: str = "",
           collapsed: bool = False) -> Table:
    return Table([_header(c) for c in cols], [[_cell(c, r.get(c)) for c in cols] for r in rows], caption, collapsed)


def _plain_table(rows: Sequence[Mapping[str, Any]], caption: str = "", collapsed: bool = True,
                 limit: int = 400) -> Table:
    """Every column of ``rows`` (a study's raw table), at most ``limit`` rows."""
    cols: dict[str, None] = {}
    for r in rows:
        for c in r:
            cols.setdefault(c, None)
    shown = list(rows)[:limit]
    more = f" (first {limit} of {len(rows)} rows)" if len(rows) > limit else ""
    return Table([Cell(c) for c in cols], [[_cell(c, r.get(c)) for c in cols] for r in shown], caption + more,
                 collapsed)


# --- figures --------------------------------------------------------------------------------------------------------
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def figure_image(fig: Figure, alt: str, caption: str = "", dpi: int = 110) -> Image:
    """Embed a matplotlib figure as a base64 PNG (the figure is closed)."""
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    plt.close(fig)
    data = buf.getvalue()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # PNG IHDR
    return Image("data:image/png;base64," + base64.b64encode(data).decode("ascii"), width, height, alt, caption)


def _grid(n: int, ncols: int = 3, w: float = 4.0, h: float = 3.1) -> tuple[Any, list[Any]]:
    plt = _plt()
    ncols = max(1, min(ncols, n))
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _style(ax: Any, xlabel: str = "", ylabel: str = "", title: str = "") -> None:
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _heatmap(ax: Any, m: Sequence[Sequence[Any]], rows: Sequence[str], cols: Sequence[str], *, title: str = "",
             cmap: str = "viridis", vmin: float | None = None, vmax: float | None = None, digits: int = 2,
             xlabel: str = "", ylabel: str = "", colorbar: bool = True) -> None:
    import numpy as np

    a = np.array([[np.nan if _nan(v) else float(v) for v in row] for row in m], dtype=float)
    im = ax.imshow(a, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(a.shape[1]))
    ax.set_yticks(range(a.shape[0]))
    small = max(a.shape) > 8
    ax.set_xticklabels(cols, fontsize=7 if small else 8, rotation=45 if max(map(len, cols), default=0) > 3 else 0,
                       ha="right" if max(map(len, cols), default=0) > 3 else "center")
    ax.set_yticklabels(rows, fontsize=7 if small else 8)
    if max(a.shape) <= 12:
        lo = np.nanmin(a) if vmin is None and np.isfinite(a).any() else (vmin or 0.0)
        hi = np.nanmax(a) if vmax is None and np.isfinite(a).any() else (vmax if vmax is not None else 1.0)
        mid = (lo + hi) / 2
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                if np.isfinite(a[i, j]):
                    if cmap in ("RdBu_r", "RdBu", "seismic", "coolwarm"):  # diverging: dark at both ends
                        dark = abs(a[i, j] - mid) > 0.6 * (hi - mid)
                    elif cmap in ("viridis", "magma", "inferno", "cividis"):  # dark at the low end
                        dark = a[i, j] < mid
                    else:  # sequential light-to-dark (Blues)
                        dark = a[i, j] > mid
                    ax.text(j, i, f"{a[i, j]:.{digits}f}", ha="center", va="center", fontsize=7 if small else 8,
                            color="white" if dark else "black")
    if title:
        ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)


def _family(name: str) -> str:
    return str(name).split("@", 1)[0]


def _key(attack: Any, budget: Any) -> str:
    """``pgd ε=0.0314 (8/255)`` for attack ``pgd`` or ``pgd@0.0314`` at that budget."""
    return str(attack) if budget is None else f"{_family(attack)} ε={fmt_budget(budget)}"


def _by_family(summary: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Summary rows per attack family (``pgd@0.03`` and ``pgd@0.06`` are both ``pgd``), budgets ascending."""
    out: dict[str, list[Any]] = {}
    for r in summary:
        out.setdefault(_family(r["attack"]), []).append(r)
    return {k: sorted(v, key=lambda r: _budget_sort(r["budget"])) for k, v in out.items()}


def _groups(rows: Iterable[Mapping[str, Any]], keys: Sequence[str]) -> dict[tuple[Any, ...], list[Any]]:
    out: dict[tuple[Any, ...], list[Any]] = {}
    for r in rows:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return out


def _mean(vals: Iterable[Any]) -> float:
    v = [float(x) for x in vals if not _nan(x)]
    return sum(v) / len(v) if v else float("nan")


# --- the evaluation (Results) ---------------------------------------------------------------------------------------
def _headline(summary: list[dict[str, Any]]) -> str | None:
    from ..tasks import headline_columns

    for m in headline_columns():  # each registered task kind's headline column
        if any(f"adv_{m}" in r for r in summary):
            return m
    return None


def _budget_sort(b: Any) -> float:
    return -1.0 if b is None else float(b)


def _findings(results: Results, summary: list[dict[str, Any]], metric: str | None) -> list[str]:
    """The key findings (HTML of ours; every user string passes :func:`_h`): the clean metric, each attack at
    its largest budget, and the strongest attack among the in-ball attacks of one budget and norm.

    Attacks are ranked only against attacks of the same budget and norm: a non-Lp attack (no budget) or one
    whose measured perturbations left its ε-ball (:meth:`Results.ball_check`) is marked and never ranked."""
    out: list[str] = []
    if metric is None:
        return out
    from ..tasks import lower_is_better

    lower_better = lower_is_better(metric)
    name = _METRIC_NAMES.get(metric, metric)
    balls = results.ball_check()
    clean = _mean(r.get(f"clean_{metric}") for r in summary)
    out.append(f"Clean {_h(name)}: <b>{fmt(clean)}</b> on {max(int(r['n']) for r in summary)} samples.")
    for fam, rows in _by_family(summary).items():
        r = rows[-1]  # the largest budget: the clearest effect
        adv = r.get(f"adv_{metric}")
        if _nan(adv):
            continue
        rel = ""
        if clean and clean > 0:
            change = 100 * (adv - clean) / clean
            rel = f" ({abs(change):.0f}% {'higher' if change > 0 else 'lower'})"
        if _is_num(r.get("changed_fraction")):
            effect = f"; {100 * r['changed_fraction']:.1f}% of voxels changed"
        elif _is_num(r.get("fooled")):
            effect = f"; {100 * r['fooled']:.0f}% of samples fooled"
        else:
            effect = ""
        at = "" if r["budget"] is None else f" at ε = {fmt_budget(r['budget'])}"
        ball = balls.get((r["attack"], r["budget"]))
        mark = "" if ball is None or ball["status"] == "in" else (
            f" <span class='warn'>{_h(Results.ball_note(ball, r['budget']))}: not ranked</span>")
        out.append(f"<b>{_h(fam)}</b>{at}: {_h(name)} {fmt(clean)} → <b>{fmt(adv)}</b>{rel}{effect}.{mark}")
    # the strongest attack: among the in-ball attacks of one norm and budget, at the largest budget where at
    # least two attack families ran (one attack alone is not "strongest" of anything)
    comparable: dict[tuple[str, float], list[tuple[float, str]]] = {}
    for r in summary:
        ball = balls.get((r["attack"], r["budget"]))
        adv = r.get(f"adv_{metric}")
        if ball is None or ball["status"] != "in" or adv is None or _nan(adv):
            continue
        damage = float(adv) if not lower_better else -float(adv)  # the worst: lowest accuracy, largest error
        comparable.setdefault((ball["norm"], float(r["budget"])), []).append((damage, _family(r["attack"])))
    ranked = [(b, norm, entries) for (norm, b), entries in comparable.items()
              if len({fam for _, fam in entries}) >= 2]
    if ranked:
        budget, norm, entries = max(ranked, key=lambda t: (t[0], t[1]))
        damage, fam = min(entries)
        sym = "L∞" if norm == "Linf" else "L2"
        value = abs(damage) if lower_better else damage
        out.append(f"Strongest attack at ε = {fmt_budget(budget)} ({sym}, {len(entries)} attacks at this budget): "
                   f"<b>{_h(fam)}</b> ({_h(name)} {fmt(value)}).")
    flags = results.masking_flags()
    if flags:
        out.append(f"<span class='warn'>{len(flags)} gradient-masking check(s) fired</span>: the robust numbers "
                   "may be too optimistic (see <a href='#masking'>Gradient-masking checks</a>).")
    return out


def _curves(results: Results, summary: list[dict[str, Any]], metric: str, class_names: Sequence[str] | None
            ) -> list[Any]:
    blocks: list[Any] = []
    rows = [r for r in summary if r["budget"] is not None and not _nan(r.get(f"adv_{metric}"))]
    if not rows:
        return blocks
    clean = _mean(r.get(f"clean_{metric}") for r in summary)
    fams = _by_family(rows)
    out_of_ball = {_family(a) for (a, _), e in results.ball_check().items() if e["status"] == "out"}
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.6, 4.0))
    for i, (fam, rs) in enumerate(fams.items()):
        ax.plot([0.0] + [float(r["budget"]) for r in rs], [clean] + [float(r[f"adv_{metric}"]) for r in rs],
                marker="o", color=PALETTE[i % len(PALETTE)], lw=1.8,
                ls=":" if fam in out_of_ball else "-" if i < len(PALETTE) else "--",
                label=fam + (" (left its ε-ball)" if fam in out_of_ball else ""))
    ax.axhline(clean, color="grey", ls="--", lw=1, label="clean")
    _style(ax, "budget ε (data units)", _METRIC_NAMES.get(metric, metric), f"{_METRIC_NAMES.get(metric, metric)} "
           "vs attack budget")
    ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
    ax.legend(fontsize=8, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    from ..tasks import lower_is_better

    blocks.append(figure_image(fig, f"robustness curve: {metric} vs budget, one line per attack",
                               "Each line is one attack; ε = 0 is the clean model. "
                               + ("Higher is worse." if lower_is_better(metric) else "Lower is worse.")))
    # per-class curves (segmentation Dice per class, ...), one panel per attack
    per = "dice" if metric == "mean_dice" else None
    if per and any(isinstance(r.get(f"adv_{per}"), list) for r in rows):
        fig, axes = _grid(len(fams), 3, 3.8, 2.9)
        for ax, (fam, rs) in zip(axes, fams.items(), strict=False):
            k = len(rs[0][f"adv_{per}"])
            names = list(class_names)[:k] if class_names and len(class_names) >= k else [str(j) for j in range(k)]
            for j in _counted(results.meta, k):  # the background only when the mean Dice counts it
                c0 = _mean(r[f"clean_{per}"][j] for r in rs)
                ys = [r[f"adv_{per}"][j] for r in rs]
                if _nan(c0) and all(_nan(y) for y in ys):  # a class the metric leaves out
                    continue
                ax.plot([0.0] + [float(r["budget"]) for r in rs], [c0] + [math.nan if _nan(y) else y for y in ys],
                        marker=".", label=names[j],  # a class has the colour of its label in the case figures
                        color=SEG_COLOURS[(j - 1) % len(SEG_COLOURS)] if j else "#777777")
            _style(ax, "budget ε", _METRIC_NAMES.get(per, per), fam)
            ax.set_ylim(-0.02, 1.02)
        _legend_top(fig, axes[0])
        blocks.append(figure_image(fig, f"per-class {per} vs budget, one panel per attack",
                                   f"{_METRIC_NAMES.get(per, per)} of each class against the budget, one panel per "
                                   "attack: which structure breaks first."))
    return blocks


#: per (attack, budget): per class, the per-sample values clean and attacked (None: undefined for that sample)
PerClass = dict[tuple[Any, Any], tuple[list[list[Any]], list[list[Any]]]]


def _per_class_samples(results: Results, metric: str) -> tuple[str, PerClass]:
    """Per (attack, budget): per-class per-sample clean and attacked values (Dice, recall or per-label
    accuracy); their means are the per-class results, their spread the confidence intervals."""
    out: PerClass = {}
    groups = results.groups()
    first = results.rows[0]
    if isinstance(first.get("adv_dice"), list):
        for key, rows in groups.items():
            k = len(rows[0]["adv_dice"])
            out[key] = ([[r["clean_dice"][j] for r in rows] for j in range(k)],
                        [[r["adv_dice"][j] for r in rows] for j in range(k)])
        return "Dice", out
    if metric == "correct" and "label" in first:
        k = 1 + max(max(int(r["label"]), int(r["clean_pred"]), int(r["adv_pred"])) for r in results.rows)
        for key, rows in groups.items():
            vals: tuple[list[list[Any]], list[list[Any]]] = ([], [])
            for j in range(k):
                sel = [r for r in rows if int(r["label"]) == j]
                vals[0].append([float(r["clean_pred"] == j) for r in sel])
                vals[1].append([float(r["adv_pred"] == j) for r in sel])
            out[key] = vals
        return "recall", out
    if metric == "label_accuracy" and isinstance(first.get("label"), list):
        k = len(first["label"])
        for key, rows in groups.items():
            out[key] = ([[float(r["clean_pred"][j] == r["label"][j]) for r in rows] for j in range(k)],
                        [[float(r["adv_pred"][j] == r["label"][j]) for r in rows] for j in range(k)])
        return "label accuracy", out
    return "", out


def _per_class_values(results: Results, metric: str) -> tuple[str, dict[tuple[Any, Any], tuple[list[float], list[float]]]]:
    """Per (attack, budget): per-class clean and attacked means (Dice, recall or per-label accuracy)."""
    what, samples = _per_class_samples(results, metric)
    return what, {key: ([_mean(v) for v in c], [_mean(v) for v in a]) for key, (c, a) in samples.items()}


def _hd95_samples(results: Results) -> PerClass:
    """Per (attack, budget): per-class per-sample HD95 clean and attacked (rows of ``evaluate(hd95=True)``)."""
    out: PerClass = {}
    for key, rows in results.groups().items():
        if not all(isinstance(r.get("clean_hd95"), list) and isinstance(r.get("adv_hd95"), list) for r in rows):
            continue
        k = len(rows[0]["adv_hd95"])
        out[key] = ([[r["clean_hd95"][j] for r in rows] for j in range(k)],
                    [[r["adv_hd95"][j] for r in rows] for j in range(k)])
    return out


def _counted(meta: Mapping[str, Any], k: int) -> list[int]:
    """The classes a segmentation's mean Dice counts: all but the background (class 0) when the task leaves it
    out (``include_background=False`` in ``meta["task"]``, the task's repr that evaluate records)."""
    return list(range(1, k)) if "include_background=False" in str(meta.get("task", "")) else list(range(k))


def _missed_counts(results: Results, rows: Sequence[Mapping[str, Any]], which: str = "adv",
                   what: str = "missed") -> int | None:
    """How many structures (case × class, over the classes the mean Dice counts) the ``which`` prediction
    ``missed`` (present in the reference, empty in the prediction) or has ``absent`` (empty in both): the
    ``*_missed`` / ``*_absent`` columns of a segmentation; None when the rows have none."""
    col = f"{which}_{what}"
    if not rows or not all(isinstance(r.get(col), list) for r in rows):
        return None
    keep = _counted(results.meta, len(rows[0][col]))
    return sum(bool(r[col][j]) for r in rows for j in keep if j < len(r[col]))


def _hd95_unit(meta: Mapping[str, Any]) -> str:
    """``mm`` when the run read voxel spacings (a config with ``spacing`` or a file source), else a hedge."""
    settings = meta.get("settings")
    if isinstance(settings, Mapping):
        data = settings.get("data")
        if settings.get("spacing") is not None or (isinstance(data, Mapping)
                                                   and data.get("source") in ("files", "datalist", "csv")):
            return "mm"
    return "mm or voxels"


def ci95(values: Iterable[Any], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """A 95 % bootstrap confidence interval of the mean of ``values`` (None/NaN left out; percentile method,
    a fixed seed so the report is reproducible); None for fewer than two values."""
    import numpy as np

    v = np.array([float(x) for x in values if not _nan(x)], dtype=np.float64)
    if v.size < 2:
        return None
    idx = np.random.default_rng(seed).integers(0, v.size, size=(resamples, v.size))
    means = v[idx].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def fmt_ci(ci: tuple[float, float] | None, digits: int = 3) -> str:
    """``0.412–0.530`` (or ``–`` without an interval)."""
    return "–" if ci is None else f"{fmt(ci[0], digits)}–{fmt(ci[1], digits)}"


def _bars(ax: Any, names: Sequence[str], series: Sequence[tuple[str, Sequence[Any]]], ylabel: str = "",
          title: str = "", ylim: tuple[float, float] | None = (0.0, 1.0),
          errors: Sequence[Sequence[tuple[float, float] | None]] | None = None) -> None:
    """Grouped bars, one group per name, one bar per series; ``errors``: per series, per name, an interval
    (e.g. :func:`ci95`) drawn as an error bar."""
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (label, vals) in enumerate(series):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(names))]
        colour = "#999999" if label == "clean" else PALETTE[(i - 1) % len(PALETTE)] if series[0][0] == "clean" \
            else PALETTE[i % len(PALETTE)]
        heights = [0.0 if _nan(v) else float(v) for v in vals]
        ax.bar(xs, heights, width=width, label=label, color=colour)
        if errors is not None and i < len(errors):
            pts = [(x, h, e) for x, h, e, v in zip(xs, heights, errors[i], vals, strict=False)
                   if e is not None and not _nan(v)]
            if pts:
                ax.errorbar([x for x, _, _ in pts], [h for _, h, _ in pts], fmt="none", ecolor="#333333",
                            elinewidth=0.9, capsize=2.5,
                            yerr=[[max(0.0, h - e[0]) for _, h, e in pts], [max(0.0, e[1] - h) for _, h, e in pts]])
    ax.set_xticks(range(len(names)))
    rot = 30 if max(map(len, names), default=0) > 6 or len(names) > 8 else 0
    ax.set_xticklabels(names, rotation=rot, ha="right" if rot else "center", fontsize=8)
    if ylim is not None:
        ax.set_ylim(*ylim)
    _style(ax, "", ylabel, title)
    ax.grid(axis="x", visible=False)


def _legend_top(fig: Any, ax: Any, ncol: int = 6) -> None:
    """One legend for the whole figure (the series of ``ax``), above the panels; then lay the figure out."""
    handles, labels = ax.get_legend_handles_labels()
    rows = math.ceil(len(handles) / ncol) if handles else 0
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(ncol, len(handles)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.08 + 0.22 * rows) / fig.get_figheight()))


def _largest_budgets(keys: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Per attack family its largest budget (the clearest effect); attacks without budget as they are."""
    last: dict[Any, tuple[Any, Any]] = {}
    for attack, budget in keys:
        fam = _family(attack)
        if fam not in last or _budget_sort(budget) > _budget_sort(last[fam][1]):
            last[fam] = (attack, budget)
    return list(last.values())


def _per_class_section(results: Results, metric: str, class_names: Sequence[str] | None) -> Section | None:
    what, samples = _per_class_samples(results, metric)
    if not samples:
        return None
    vals = {key: ([_mean(v) for v in c], [_mean(v) for v in a]) for key, (c, a) in samples.items()}
    k = len(next(iter(vals.values()))[0])
    names = list(class_names)[:k] if class_names and len(class_names) >= k else [str(j) for j in range(k)]
    # classes the metric leaves out (e.g. the background of a Dice without it) are not drawn
    counted = _counted(results.meta, k) if what == "Dice" else list(range(k))
    keep = [j for j in counted if any(not _nan(v) for c, a in vals.values() for v in (c[j], a[j]))]
    vals = {key: ([c[j] for j in keep], [a[j] for j in keep]) for key, (c, a) in vals.items()}
    cis = {key: ([ci95(c[j]) for j in keep], [ci95(a[j]) for j in keep]) for key, (c, a) in samples.items()}
    hd = _hd95_samples(results)
    hd = {key: ([c[j] for j in keep if j < len(c)], [a[j] for j in keep if j < len(a)]) for key, (c, a) in hd.items()}
    names, k = [names[j] for j in keep], len(keep)
    keys = _largest_budgets(vals)
    fig, axes = _grid(len(keys), 3, min(6.0, max(3.4, 0.45 * k + 1.6)), 2.7)
    for ax, key in zip(axes, keys, strict=False):
        c, a = vals[key]
        _bars(ax, names, [("clean", c), ("attacked", a)], what, _key(*key), errors=list(cis[key]))
    _legend_top(fig, axes[0])
    blocks: list[Any] = [figure_image(fig, f"per-class {what}, clean vs attacked, one panel per attack",
                                      "Bars: the mean over the cases; whiskers: its 95% bootstrap confidence "
                                      "interval (wide when there are few cases).")]
    unit = _hd95_unit(results.meta)
    hd_keys = [key for key in keys if key in hd]
    if hd_keys:
        fig, axes = _grid(len(hd_keys), 3, min(6.0, max(3.4, 0.45 * k + 1.6)), 2.7)
        for ax, key in zip(axes, hd_keys, strict=False):
            hc, ha = hd[key]
            _bars(ax, names, [("clean", [_mean(v) for v in hc]), ("attacked", [_mean(v) for v in ha])],
                  f"HD95 ({unit})", _key(*key), None, errors=[[ci95(v) for v in hc], [ci95(v) for v in ha]])
            ax.set_ylim(bottom=0)
            grp = results.groups().get(key, [])
            if grp and all(isinstance(r.get("adv_missed"), list) for r in grp):
                for pos, j in enumerate(keep):  # a missed structure has no HD95: say so where its bar would be
                    n_missed = sum(bool(r["adv_missed"][j]) for r in grp if j < len(r["adv_missed"]))
                    if n_missed:
                        ax.text(pos, 0, f"missed {n_missed}/{len(grp)}", rotation=90, ha="left", va="bottom",
                                fontsize=7, color="#c00000")
        _legend_top(fig, axes[0])
        blocks.append(figure_image(fig, "per-class HD95, clean vs attacked, one panel per attack",
                                   f"95th-percentile Hausdorff distance ({unit}) per class, mean over the cases with "
                                   "whiskers for its 95% bootstrap interval; lower is better. A case where the class is "
                                   "missing from the prediction (or from the reference) has no HD95 and is left out "
                                   "of the mean and the bar: a structure missed in every case has no bar at all. The "
                                   "table below counts them: missed (in the reference, not predicted) and absent "
                                   "(in neither), clean / attacked."))
    table_rows = []
    groups = results.groups()
    for key in sorted(vals, key=lambda kb: (str(kb[0]), _budget_sort(kb[1]))):
        c, a = vals[key]
        grp = groups.get(key, [])
        counts = what == "Dice" and bool(grp) and all(
            isinstance(r.get(f"{w}_{m}"), list) for r in grp for w in ("clean", "adv") for m in ("missed", "absent"))
        for j in range(k):
            row: dict[str, Any] = {
                "attack": _family(key[0]), "budget": key[1], "class": names[j], f"clean {what}": c[j],
                f"attacked {what}": a[j], "95% CI": fmt_ci(cis[key][1][j]),
                "drop": None if _nan(c[j]) or _nan(a[j]) else c[j] - a[j]}
            if key in hd and j < len(hd[key][0]):
                hc, ha = hd[key][0][j], hd[key][1][j]
                row.update({"clean HD95": _mean(hc), "attacked HD95": _mean(ha), "HD95 CI": fmt_ci(ci95(ha), 2),
                            "HD95 undefined": f"{sum(_nan(v) for v in hc)} / {sum(_nan(v) for v in ha)} of {len(ha)}"})
            if counts:  # missed and absent structures, which no HD95 mean counts (class index keep[j])
                for m in ("missed", "absent"):
                    row[m] = (f"{sum(bool(r['clean_' + m][keep[j]]) for r in grp)} / "
                              f"{sum(bool(r['adv_' + m][keep[j]]) for r in grp)} of {len(grp)}")
            table_rows.append(row)
    caption = f"per-class {what}" + (f" and HD95 ({unit})" if hd_keys else "") + " for every attack and budget"
    blocks.append(_plain_table(table_rows, caption, collapsed=len(table_rows) > 24))
    said = ("<i>95% CI</i> is the 95% bootstrap confidence interval of the attacked mean over the cases"
            + ("; <i>HD95 CI</i> the same for the attacked HD95; <i>HD95 undefined</i> counts the cases without an "
               "HD95 (the class absent from the label or the prediction), clean / attacked; the HD95 means and "
               "bars are over the other cases only" if hd_keys else "")
            + ("; <i>missed</i> counts the cases where the class is in the reference and missing from the "
               "prediction (its Dice is 0; it has no HD95), <i>absent</i> those where it is in neither (Dice 1 by "
               "convention, left out of the mean Dice), clean / attacked"
               if any("missed" in r for r in table_rows) else ""))
    return Section("per-class", "Per-class results",
                   f"Per-class {what}" + (f" and HD95 ({unit})" if hd_keys else "") + ", clean (grey) vs attacked, "
                   "for each attack at its largest budget. A class that loses much more than the others is the weak "
                   f"spot of the model. {said}.", blocks)


# --- volumes (clinical endpoint) ------------------------------------------------------------------------------------
#: the per-class volume columns of a 3-D segmentation with a spacing (:meth:`medadv.tasks.Segmentation.volume_columns`)
VOLUME_COLUMNS = ("ref_volume_ml", "clean_volume_ml", "adv_volume_ml", "volume_change_ml", "volume_change_pct")


def volume_rows(results: Results, class_names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per (attack, budget, foreground class): the mean reference, clean and attacked volume (ml), the mean change
    (ml and % of the clean volume) and a 95 % bootstrap interval of the % change over the cases; ``[]`` when the
    rows have no volume columns (no voxel spacing, or not a 3-D segmentation). Class 0 (the background, the rest of
    the field of view) is left out. Attacks in the order of the results (the colours of the other figures), budgets
    ascending within an attack."""
    groups = results.groups()
    out: list[dict[str, Any]] = []
    order = {f: i for i, f in enumerate(dict.fromkeys(_family(a) for a, _ in groups))}  # as the other figures
    for key in sorted(groups, key=lambda kb: (order[_family(kb[0])], _budget_sort(kb[1]), str(kb[0]))):
        rows = [r for r in groups[key] if isinstance(r.get("adv_volume_ml"), list)]
        if not rows:
            continue
        k = len(rows[0]["adv_volume_ml"])
        names = list(class_names)[:k] if class_names and len(class_names) >= k else [str(j) for j in range(k)]
        for j in range(1, k):
            def col(c: str, rows: list[dict[str, Any]] = rows, j: int = j) -> list[Any]:
                return [r[c][j] if isinstance(r.get(c), list) and j < len(r[c]) else None for r in rows]

            pct = col("volume_change_pct")
            out.append({"attack": key[0], "budget": key[1], "class": names[j],
                        "reference (ml)": _mean(col("ref_volume_ml")), "clean (ml)": _mean(col("clean_volume_ml")),
                        "attacked (ml)": _mean(col("adv_volume_ml")), "change (ml)": _mean(col("volume_change_ml")),
                        "change (%)": _mean(pct), "change % 95% CI": fmt_ci(ci95(pct), 2), "n": len(rows)})
    return out


def _volume_section(results: Results, class_names: Sequence[str] | None) -> Section | None:
    table_rows = volume_rows(results, class_names)
    if not table_rows:
        return None
    blocks: list[Any] = []
    classes = list(dict.fromkeys(r["class"] for r in table_rows))
    budgeted = [r for r in table_rows if _is_num(r["budget"])]
    if budgeted:  # volume change against the budget, one line per attack, one panel per class
        shown = classes[:6]
        fig, axes = _grid(len(shown), 3, 4.2, 3.0)
        fams = list(dict.fromkeys(_family(r["attack"]) for r in budgeted))
        for ax, name in zip(axes, shown, strict=False):
            for i, fam in enumerate(fams):
                rs = sorted((r for r in budgeted if r["class"] == name and _family(r["attack"]) == fam),
                            key=lambda r: _budget_sort(r["budget"]))
                if rs:
                    ax.plot([0.0] + [float(r["budget"]) for r in rs], [0.0] + [r["change (%)"] for r in rs],
                            marker="o", lw=1.6, color=PALETTE[i % len(PALETTE)], label=fam,
                            ls="-" if i < len(PALETTE) else "--")
            ax.axhline(0.0, color="grey", lw=0.8, ls="--")
            _style(ax, "budget ε (data units)", "volume change (%)", str(name))
        _legend_top(fig, axes[0])
        blocks.append(figure_image(fig, "volume change (%) vs budget, one line per attack, one panel per class",
                                   "The mean change of each class's predicted volume, attacked − clean, in % of the "
                                   "clean volume; 0 at ε = 0. Below 0: the attack shrank the structure."))
    shown_rows = [{**r, "attack": _family(r["attack"])} for r in table_rows]  # the budget has its own column
    blocks.append(_table(shown_rows, list(table_rows[0]),
                         "mean volumes over the cases per attack, budget and class", collapsed=len(table_rows) > 24))
    return Section("volumes", "Volumes (clinical endpoint)",
                   "The volume of each predicted structure in ml (voxel count × the voxel volume of each case's "
                   "spacing, mm³ / 1000) — for brain extraction the total intracranial volume (TIV), the clinical "
                   "output — clean and attacked, beside the reference mask's. <i>change</i> is attacked − clean, in "
                   "ml and in % of the clean volume (a case whose clean prediction has none of the class has no %); "
                   "<i>change % 95% CI</i> is the bootstrap interval of the mean % change over the cases.", blocks)


#: the config's sections in the order a reader looks for them; the others follow in their own order
_SETTING_ORDER = ("model", "task", "data", "inference", "threat", "budgets", "attacks", "target", "batch_size",
                  "seed", "hd95", "spacing", "save_adversarial", "studies")
_META_NAMES = {"task": "task (as built)", "config": "config file", "model": "model", "classes": "class names",
               "config_fingerprint": "config fingerprint"}


def _setting_value(key: str, v: Any) -> str:
    """One setting as text: budgets as fractions of 255, mappings as ``key: value`` pairs, lists of
    mappings (attacks, transforms) one entry per line, ``name`` first."""
    if isinstance(v, Mapping):
        items = [(k, x) for k, x in v.items() if x is not None and x != {} and x != []]
        if "name" in v:  # an attack / transform entry: `pgd (steps 10)`
            rest = ", ".join(f"{k} {_setting_value(k, x)}" for k, x in items if k != "name")
            return f"{v['name']}" + (f" ({rest})" if rest else "")
        return ", ".join(f"{k}: {_setting_value(k, x)}" for k, x in items)
    if isinstance(v, list | tuple):
        if key == "budgets":
            return ", ".join(fmt_budget(b) for b in v)
        if any(isinstance(x, Mapping) for x in v):
            return "\n".join(_setting_value(key, x) for x in v)
        return "[" + ", ".join(_setting_value(key, x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:.6g}"
    return fmt(v)


def _settings_table(meta: Mapping[str, Any]) -> Table:
    """The run's settings as a two-column table: the config (``meta["settings"]``) one row per setting, a
    section of several keys one row per key (``model · kwargs``), then the rest of ``meta``."""
    rows: list[tuple[str, str]] = []
    settings = meta.get("settings")
    if isinstance(settings, Mapping):
        keys = [k for k in _SETTING_ORDER if k in settings] + [k for k in settings if k not in _SETTING_ORDER]
        for k in keys:
            v = settings[k]
            if v is None or v == [] or v == {}:
                continue
            if isinstance(v, Mapping) and v.get("name") is None:  # (an entry with a name reads as one value)
                for sub, x in v.items():
                    if x is not None and x != {} and x != []:
                        rows.append((f"{k} · {sub}", _setting_value(sub, x)))
            else:
                rows.append((str(k), _setting_value(str(k), v)))
    for k, v in meta.items():
        if isinstance(settings, Mapping) and (k == "settings" or (k == "model" and "model" in settings) or (
                k == "classes" and isinstance(settings.get("task"), Mapping) and settings["task"].get("class_names"))):
            continue  # the config's rows say it already
        rows.append((_META_NAMES.get(k, str(k)), _setting_value(str(k), v) if not isinstance(v, str) else v))
    return Table([Cell("setting"), Cell("value")], [[Cell(k, "key"), Cell(v, "wrap")] for k, v in rows])


def _spread_figure(results: Results, summary: list[dict[str, Any]], metric: str) -> Image | None:
    """Box plots of the per-case headline metric: clean, then each attack (at every budget when there are
    at most 10 settings, else at its largest); None for a 0/1 metric (accuracy, exact match), whose spread
    the confidence interval says, or with fewer than 3 cases."""
    groups = results.groups()
    values = {key: [float(r[f"adv_{metric}"]) for r in rows if not _nan(r.get(f"adv_{metric}"))]
              for key, rows in groups.items()}
    if not values or max(len(v) for v in values.values()) < 3:
        return None
    if all(v in (0.0, 1.0) for vs in values.values() for v in vs):
        return None
    keys = [(r["attack"], r["budget"]) for rs in _by_family(summary).values() for r in rs]
    if len(keys) > 10:
        keys = _largest_budgets(keys)
    first = next(iter(groups.values()))
    clean = [float(r[f"clean_{metric}"]) for r in first if not _nan(r.get(f"clean_{metric}"))]
    data = [clean] + [values.get(k, []) for k in keys]
    labels = ["clean"] + [_key(*k) for k in keys]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.6, 0.9 + 0.36 * len(data)))
    pos = list(range(len(data), 0, -1))  # clean on top
    style: dict[str, Any] = dict(
        positions=pos, widths=0.6, patch_artist=True, showmeans=True, medianprops=dict(color="#333333"),
        meanprops=dict(marker="D", markerfacecolor="white", markeredgecolor="#333333", markersize=4),
        flierprops=dict(marker=".", markersize=4, alpha=0.6))
    try:  # matplotlib >= 3.10; `vert` is deprecated there
        box = ax.boxplot(data, orientation="horizontal", **style)
    except TypeError:
        box = ax.boxplot(data, vert=False, **style)
    fams = list(dict.fromkeys(_family(k[0]) for k in keys))
    colours = ["#BBBBBB"] + [PALETTE[fams.index(_family(k[0])) % len(PALETTE)] for k in keys]
    for patch, colour in zip(box["boxes"], colours, strict=True):
        patch.set_facecolor(colour)
        patch.set_alpha(0.75)
    for y, vs in zip(pos, data, strict=True):  # every case as a dot: with few cases the box alone misleads
        ax.scatter(vs, [y] * len(vs), s=7, color="#222222", alpha=0.5, zorder=3)
    ax.set_yticks(pos)
    ax.set_yticklabels(labels, fontsize=8)
    name = _METRIC_NAMES.get(metric, metric)
    _style(ax, f"{name} per case", "", f"{name} per case: spread over the {len(clean)} cases")
    ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return figure_image(fig, f"per-case spread of {metric}, clean and per attack",
                        "One box per setting: median (line), mean (diamond), quartiles (box), 1.5 IQR (whiskers), "
                        "each case a dot. A mean can hide a few cases that break completely.")


def _scatter_columns() -> tuple[str, ...]:
    """The per-sample columns drawn clean vs attacked (one dot per case): every registered task kind's
    ``scatter_columns`` declaration (regression: its largest error), in registration order."""
    from ..tasks import registered_task_classes

    return tuple(dict.fromkeys(c for cls in registered_task_classes() for c in cls.scatter_columns))


def _scatter_figures(results: Results, summary: list[dict[str, Any]]) -> list[Image]:
    """Per declared scatter column present in the rows: the attacked value against the clean one, per case, one
    colour per attack (at its largest budget), and the diagonal where the attack changed nothing."""
    keys = _largest_budgets((r["attack"], r["budget"]) for rs in _by_family(summary).values() for r in rs)
    groups = results.groups()
    out = []
    for col in _scatter_columns():
        series = []
        for k in keys:
            pts = [(float(r[f"clean_{col}"]), float(r[f"adv_{col}"])) for r in groups.get(k, [])
                   if _is_num(r.get(f"clean_{col}")) and _is_num(r.get(f"adv_{col}"))]
            if pts:
                series.append((k, pts))
        if not series:
            continue
        plt = _plt()
        fig, ax = plt.subplots(figsize=(5.4, 4.6))
        top = max(max(max(p) for p in pts) for _, pts in series)
        ax.plot([0.0, top], [0.0, top], color="grey", ls="--", lw=1, label="unchanged")
        for j, (k, pts) in enumerate(series):
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, alpha=0.7, color=PALETTE[j % len(PALETTE)],
                       label=_key(*k))
        name = metric_label(col)
        _style(ax, f"clean {name}", f"attacked {name}", f"{name} per case: clean vs attacked")
        ax.legend(fontsize=7, frameon=False)
        fig.tight_layout()
        out.append(figure_image(fig, f"{col} per case, clean vs attacked",
                                "One dot per case and attack (at its largest budget); on the dashed diagonal the "
                                "attack changed nothing, the farther off it the more it moved the case."))
    return out


def _results_sections(results: Results, class_names: Sequence[str] | None) -> list[Section]:
    summary = results.summary()
    if not summary:
        return []
    metric = _headline(summary)
    sections: list[Section] = []
    findings = _findings(results, summary, metric)
    if findings:
        sections.append(Section("findings", "Key findings", "", [Bullets(findings, "findings")]))
    if results.meta:
        sections.append(Section("settings", "Settings", "", [_settings_table(results.meta)]))

    cols = [c for c in summary_columns(summary) if not c.startswith(DETAIL_PREFIX)]
    cols = [c for c in cols if not any(isinstance(r.get(c), list) for r in summary)]  # per-class: own section
    rows = [r for rs in _by_family(summary).values() for r in rs]
    # the compact table: the headline metric clean and attacked, its change, how much changed, the size of
    # the perturbation; every other mean column is in the full table below it
    compact: list[dict[str, Any]] = []
    groups = results.groups()
    balls = results.ball_check()
    for r in rows:
        row = {"attack": _family(r["attack"]), "budget": r["budget"]}
        if metric:
            c, a = r.get(f"clean_{metric}"), r.get(f"adv_{metric}")
            row.update({f"clean_{metric}": c, f"adv_{metric}": a,
                        f"adv_{metric}_ci95": fmt_ci(ci95(x.get(f"adv_{metric}")
                                                          for x in groups.get((r["attack"], r["budget"]), []))),
                        "change": None if _nan(c) or _nan(a) else a - c})
        if isinstance(r.get("clean_hd95"), list) and isinstance(r.get("adv_hd95"), list):
            # over the classes the mean Dice counts (HD95 is computed for the background too)
            keep = _counted(results.meta, len(r["clean_hd95"]))
            row.update({f"{w}_hd95": _mean(r[f"{w}_hd95"][j] for j in keep if j < len(r[f"{w}_hd95"]))
                        for w in ("clean", "adv")})
        missed = _missed_counts(results, groups.get((r["attack"], r["budget"]), []))
        if missed is not None:  # structures HD95 cannot count (missing from the prediction), in their own column
            row["missed"] = missed
        change = r.get("volume_change_pct")
        if isinstance(change, list) and len(change) == 2:  # one structure (brain extraction: TIV): its volume change
            row["volume_change_pct"] = change[1]
        for col in ("changed_fraction", "changed", "fooled", "linf", "n"):
            # `changed` (any voxel) says little next to the share of changed voxels: in the full table
            if col in r and not (col == "changed" and "changed_fraction" in r):
                row[col] = r[col]
        ball = balls.get((r["attack"], r["budget"]))
        if ball is not None:
            row["ε-ball"] = Results.ball_note(ball, r["budget"])
        compact.append(row)
    ccols = list(dict.fromkeys(k for r in compact for k in r))
    table = _table(compact, ccols, "Means over the samples (budget ε in data units; hover a column name for its "
                   "key in results.json).")
    for i, h in enumerate(table.headers):
        if h.title in (f"clean_{metric}", f"adv_{metric}"):  # the headline columns stand out
            h.cls = "headline"
            for trow in table.rows:
                trow[i].cls += " headline"
        if h.title == "change":
            for trow in table.rows:
                trow[i].cls += " neg" if trow[i].text.startswith("-") else ""
    for h in table.headers:  # short headers: the table should fit the page
        if h.title.endswith("_ci95"):
            h.text = "95% CI"
        elif h.title in ("clean_hd95", "adv_hd95"):
            h.text = "HD95 clean" if h.title == "clean_hd95" else "HD95 attacked"
        elif h.title == "volume_change_pct":
            h.text = "volume Δ %"
    glossary = {"changed_fraction": "the share of voxels whose label the attack changed",
                "changed": "the share of samples whose prediction changed",
                "fooled": "the share of samples the attack counts as fooled (the task's test)",
                "linf": "the largest change of one input value",
                "missed": "the number of structures (case × class counted by the mean Dice) present in the "
                          "reference and missing from the attacked prediction; HD95 is undefined for them and its "
                          "means leave them out, so they are counted here",
                "ε-ball": "whether every perturbation stayed within the attack's budget (an attack that leaves it, "
                          "or one with no ε-ball at all, is not comparable with the others and is never ranked)",
                f"adv_{metric}_ci95": "the 95% bootstrap confidence interval of the attacked mean over the cases",
                "volume_change_pct": "the mean change of the structure's predicted volume, attacked − clean, in % "
                                     "of the clean volume (see the volumes section)",
                "clean_hd95": f"the 95th-percentile Hausdorff distance in {_hd95_unit(results.meta)}, mean over the "
                              "classes and cases (lower is better; see the per-class results)"}
    shown = {h.title: h.text for h in table.headers}
    said = "; ".join(f"<i>{shown.get(k, metric_label(k))}</i> is {v}" for k, v in glossary.items() if k in ccols)
    blocks: list[Any] = [table]
    spread = _spread_figure(results, summary, metric) if metric else None
    if spread is not None:
        blocks.append(spread)
    blocks += _scatter_figures(results, summary)
    blocks.append(_table(rows, cols, "every mean column, per attack and budget", collapsed=True))
    sections.append(Section("summary", "Summary", f"Clean vs attacked {metric_label(metric or 'metric')} for every "
                            f"attack and budget; <i>change</i> is attacked − clean. {said}.", blocks))
    if metric:
        curves = _curves(results, summary, metric, class_names)
        if curves:
            sections.append(Section("curves", "Robustness curves",
                                    "How fast the model breaks as the attacker is allowed a larger perturbation.",
                                    curves))
        per = _per_class_section(results, metric, class_names)
        if per is not None:
            sections.append(per)
    volumes = _volume_section(results, class_names)
    if volumes is not None:
        sections.append(volumes)
    details = [c for c in summary_columns(summary) if c.startswith(DETAIL_PREFIX) and c not in ENSEMBLE_DETAILS]
    if details:
        drows = [r for r in rows if any(c in r for c in details)]
        sections.append(Section("attack-outputs", "Attack-specific outputs",
                                "Per-attack means of what each attack reports about itself (its declared "
                                "per-sample outputs).", [_table(drows, ["attack", "budget", *details, "n"])]))
    ensemble = results.ensemble_table()
    if ensemble:
        m = next(c for c in ensemble[0] if c.startswith("robust_"))
        sections.append(Section("ensemble", "Worst case after each ensemble member",
                                f"For ensemble attacks (<code>auto</code>): the mean {metric_label(m.removeprefix('robust_'))} "
                                "after each member, keeping per sample the worst case so far; <i>gain</i> is how "
                                "much the member lowered it, <i>attacked</i> the samples it ran on.",
                                [_table(ensemble, ["attack", "budget", "member", m, "gain", "attacked", "seconds",
                                                   "n"])]))
    worst_of = results.worst_of_table()
    if worst_of:
        sections.append(Section("worst-of", "Worst case of each metric",
                                "For <code>auto</code> on segmentation: the mean of each metric's own worst case "
                                "over the members (<i>worst_…</i>, possibly from different members, as a paper "
                                "reporting each metric's worst case does) next to the example kept, the worst by "
                                "the selection metric (<i>adv_…</i>).",
                                [_table(worst_of, list(worst_of[0]))]))
    flags = results.masking_flags()
    if flags:
        sections.append(Section("masking", "Gradient-masking checks",
                                "<span class='warn'>These checks fired: the attacks may have failed for a reason "
                                "other than robustness, so the robust metric may be overestimated.</span>",
                                [_table(flags, ["attack", "budget", "check", "samples", "message"])]))
    elif ensemble:
        sections.append(Section("masking", "Gradient-masking checks",
                                "No check fired (randomised outputs, probability outputs, zero gradients, "
                                "black-box beating white-box, non-monotone budgets, unbounded attack not "
                                "reaching the floor)."))
    return sections


# --- studies --------------------------------------------------------------------------------------------------------
_CLASSWISE_VALUES = ("class", "support", "clean", "adv", "cfps_clean", "cfps_adv", "cfns_clean", "cfns_adv")


def _study_metric(study: StudyLike, default: str = "metric") -> str:
    m = study.meta.get("metric")
    return _METRIC_NAMES.get(str(m), str(m)) if m else default


def _walk_matrices(obj: Any, prefix: str = "") -> list[tuple[str, list[list[Any]]]]:
    """Every matrix (list of equal-length lists) in a nested dict, with its dotted key."""
    if isinstance(obj, Mapping):
        out = []
        for k, v in obj.items():
            out += _walk_matrices(v, f"{prefix} · {k}" if prefix else str(k))
        return out
    if isinstance(obj, list) and obj and all(isinstance(r, list) for r in obj):
        return [(prefix, obj)]
    return []


def _pretty_key(key: str) -> str:
    """A study's condition key as a reader wants it: ``pgd@0.1@0.1`` or ``pgd@0.1`` -> ``pgd ε=0.1``."""
    parts = str(key).split("@")
    if len(parts) >= 2:
        try:
            return _key(parts[0], float(parts[-1]))
        except ValueError:
            pass
    return str(key)


def _confusion_figures(conf: Any, names: Sequence[str] | None, kind: str | None = None) -> list[Any]:
    """Heatmaps of the confusion matrices of a class-wise study, four per figure.

    Classes (``kind`` None): normalised per true class. Label pairs of a multi-label study (``kind`` says
    what rows and columns are): raw counts on one colour scale for all matrices.
    """
    mats = _walk_matrices(conf)
    blocks: list[Any] = []
    per_fig = 4
    top = max([1.0] + [float(v or 0) for _, m in mats for row in m for v in row])
    for start in range(0, len(mats), per_fig):
        chunk = mats[start : start + per_fig]
        k = max(len(m) for _, m in chunk)
        size = min(4.6, 1.6 + 0.35 * k)
        fig, axes = _grid(len(chunk), per_fig if len(mats) > 1 else 1, size + 0.6, size)
        for ax, (title, m) in zip(axes, chunk, strict=False):
            labels = list(names)[: len(m)] if names and len(names) >= len(m) else [str(j) for j in range(len(m))]
            if kind:
                shown = [[float(v or 0) for v in row] for row in m]
                pair = "missed" in kind and "spurious" in kind
                _heatmap(ax, shown, labels, labels, title=_pretty_key(title), cmap="Blues", vmin=0.0, vmax=top,
                         digits=0, xlabel="spurious label" if pair else "column",
                         ylabel="missed label" if pair else "row", colorbar=False)
            else:
                shown = []
                for row in m:
                    total = sum(float(v or 0) for v in row)
                    shown.append([float(v or 0) / total if total else math.nan for v in row])
                _heatmap(ax, shown, labels, labels, title=_pretty_key(title), cmap="Blues", vmin=0.0, vmax=1.0,
                         xlabel="predicted", ylabel="true", colorbar=False)
            off = sum(float(v or 0) for i, row in enumerate(m) for j, v in enumerate(row) if i != j or kind)
            if off == 0:  # nothing to see: say so rather than leave an empty square
                ax.text(0.5, 0.5, "no errors", transform=ax.transAxes, ha="center", va="center", fontsize=10,
                        color="#5b6573", bbox=dict(facecolor="white", edgecolor="none", alpha=0.8))
        fig.tight_layout()
        caption = (f"Counts of {kind}, one colour scale for all panels." if kind else
                   "Confusion matrices normalised per true class (each row sums to 1; rows = true class, columns = "
                   "prediction). Off-diagonal mass under attack shows where the errors go.")
        blocks.append(figure_image(fig, "confusion matrices, clean and attacked", caption))
    return blocks


def _setting(values: Mapping[str, Any]) -> str:
    """The title of one setting of a study: ``pgd ε=0.0314 (8/255)`` plus any other key (``background: no``)."""
    parts = [_key(values["attack"], values.get("budget"))] if values.get("attack") is not None else []
    parts += [f"{k}: {fmt(v)}" for k, v in values.items() if k not in ("attack", "budget") and v is not None]
    return " · ".join(parts) or "all"


def _study_classwise(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    own = study.meta.get("classes")
    # the study's own names, unless it ran without any (indices) and the report has the config's
    plain = own is None or list(own) == [str(i) for i in range(len(own))]
    names = list(class_names) if class_names and plain and (own is None or len(own) == len(class_names)) else own

    def label(c: Any) -> str:
        return str(names[c]) if names and isinstance(c, int) and 0 <= c < len(names) else str(c)
    metric = _study_metric(study, "per-class metric")
    per_class = [r for r in study.rows if "target" not in r]  # targeted-success rows are drawn apart
    extra = [c for c in dict.fromkeys(k for r in per_class for k in r) if c not in _CLASSWISE_VALUES]
    groups = _groups(per_class, extra)
    blocks: list[Any] = []
    has_cfns = any("cfns_adv" in r for r in study.rows)
    if groups:
        keys = list(groups)[:6]
        fig, axes = _grid(len(keys) * (2 + has_cfns), 2 + has_cfns, 3.9 if has_cfns else 4.6, 3.0)
        for gi, key in enumerate(keys):
            rows = groups[key]
            cls = [label(r.get("class")) for r in rows]
            title = _setting(dict(zip(extra, key, strict=True)))
            ax = axes[gi * (2 + has_cfns)]
            _bars(ax, cls, [("clean", [r.get("clean") for r in rows]), ("attacked", [r.get("adv") for r in rows])],
                  metric, f"{metric}: {title}")
            ax = axes[gi * (2 + has_cfns) + 1]
            top = max([0.05] + [float(v) for r in rows for v in (r.get("cfps_clean"), r.get("cfps_adv"))
                                if not _nan(v)])
            _bars(ax, cls, [("clean", [r.get("cfps_clean") for r in rows]),
                            ("attacked", [r.get("cfps_adv") for r in rows])],
                  "CFPS", f"CFPS: {title}", (0.0, min(1.0, top * 1.15)))
            if has_cfns:
                ax = axes[gi * 3 + 2]
                top = max([0.05] + [float(v) for r in rows for v in (r.get("cfns_clean"), r.get("cfns_adv"))
                                    if not _nan(v)])
                _bars(ax, cls, [("clean", [r.get("cfns_clean") for r in rows]),
                                ("attacked", [r.get("cfns_adv") for r in rows])],
                      "CFNS", f"CFNS: {title}", (0.0, min(1.0, top * 1.15)))
        _legend_top(fig, axes[0])
        more = f" (first 6 of {len(groups)} settings)" if len(groups) > 6 else ""
        blocks.append(figure_image(fig, "per-class metric and CFPS, clean vs attacked",
                                   f"Left: {metric} per class. Right: the Class False Positive Score (CFPS), the share "
                                   "of all errors that land on each class; a class with a high CFPS attracts errors "
                                   "(an easy target for targeted attacks)." + more))
    if "confusion" in study.meta:
        kind = study.meta.get("confusion_kind")
        blocks += _confusion_figures(study.meta["confusion"], names, str(kind) if kind else None)
    attractors = study.meta.get("attractors")
    if attractors:
        items = attractors.items() if isinstance(attractors, Mapping) else enumerate(attractors)
        rows = [{"setting": _pretty_key(str(k)), "attractors (most errors first)": " > ".join(map(str, v))
                 if isinstance(v, list) else str(v)} for k, v in items]
        blocks.append(_table(rows, ["setting", "attractors (most errors first)"], "Classes ranked by CFPS."))
    targeted = [r for r in study.rows if "target" in r]
    if targeted:  # Medi et al. Fig. 5: success per target class next to the target's clean CFPS
        tgroups = _groups(targeted, [k for k in ("model", "attack", "budget") if any(k in r for r in targeted)])
        fig, axes = _grid(min(len(tgroups), 6), 2, 5.0, 3.2)
        for ax, (tkey, rows) in zip(axes, list(tgroups.items())[:6], strict=False):
            _bars(ax, [str(r["target"]) for r in rows], [("success", [r.get("success") for r in rows]),
                                                         ("clean CFPS", [r.get("cfps_clean") for r in rows])],
                  "share", " · ".join(str(k) for k in tkey if k is not None))
        _legend_top(fig, axes[0])
        spear = study.meta.get("targeted") or {}
        rho = "; ".join(f"{_pretty_key(str(k))}: ρ = {fmt(v.get('spearman_cfps'))}" for k, v in spear.items()
                        if isinstance(v, Mapping))
        blocks.append(figure_image(fig, "targeted success per target class",
                                   "Share of the samples of other classes that a targeted attack pushes into each "
                                   "target class, next to that class's clean CFPS (Medi et al.: classes that attract "
                                   "errors are easy targets). Spearman ρ(CFPS, success): " + (rho or "–") + "."))
    sim = study.meta.get("similarity")
    if isinstance(sim, Mapping) and isinstance(sim.get("definitions"), Mapping):
        models = [str(m) for m in sim.get("models") or []]
        primary = sim["definitions"].get(sim.get("primary", "errors")) or {}
        if primary:
            chunk = list(primary.items())[:4]
            fig, axes = _grid(len(chunk), 4, max(3.4, 1.4 + 0.7 * len(models)), max(3.0, 1.2 + 0.6 * len(models)))
            for ax, (cond, m) in zip(axes, chunk, strict=False):
                _heatmap(ax, m, models, models, title=_pretty_key(str(cond)), cmap="viridis", vmin=0.0, vmax=1.0,
                         colorbar=False)
            fig.tight_layout()
            blocks.append(figure_image(fig, "model-to-model cosine similarity of the error patterns",
                                       "Cosine similarity of the models' off-diagonal confusion entries (where their "
                                       "errors go; Medi et al. App. B report 0.76–0.83 between robust CIFAR-10 "
                                       "models)."))
        summary = []
        for d, per_cond in sim["definitions"].items():
            for cond, m in per_cond.items():
                off = [float(v) for i, row in enumerate(m) for j, v in enumerate(row) if i < j and not _nan(v)]
                summary.append({"definition": d, "condition": _pretty_key(str(cond)),
                                "mean over model pairs": _mean(off)})
        blocks.append(_table(summary, ["definition", "condition", "mean over model pairs"],
                             "Model-to-model similarity: errors, CFPS and per-class metric as cosines; agreement = "
                             "share of equal predictions."))
    blocks.append(_plain_table(study.rows, "all rows of the class-wise study"))
    return Section("study-classwise", f"Class-wise robustness (Medi et al.) · {metric}",
                   "Which classes suffer most under attack, and which classes the errors go to. CFPS<sub>j</sub> = "
                   "FP<sub>j</sub> / all errors (sums to 1 over classes).", blocks)


def _study_transfer(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = _study_metric(study)
    blocks: list[Any] = []
    groups = _groups(study.rows, ["attack", "budget"])
    hd_unit = str(study.meta.get("hd95_units") or "voxels")
    for (attack, budget), rows in groups.items():
        surr = list(dict.fromkeys(str(r["surrogate"]) for r in rows))
        targ = list(dict.fromkeys(str(r["target"]) for r in rows))
        val = {(str(r["surrogate"]), str(r["target"])): r for r in rows}
        mats: list[tuple[str, str, str, float | None, float | None]] = [
            ("adv", f"{metric} attacked", "viridis", 0.0, 1.0)]
        if any(not _nan(r.get("drop_points")) for r in rows):  # Paschali's "% Drop": points, larger is worse
            mats.append(("drop_points", "drop (points: 100 × (clean − attacked))", "magma_r", None, None))
        if any(not _nan(r.get("fooling_rate")) for r in rows):
            mats.append(("fooling_rate", "fooling rate", "magma", 0.0, 1.0))
        if any(not _nan(r.get("hd95_adv")) for r in rows):  # Malik et al.: HD95 under transfer
            mats.append(("hd95_adv", f"HD95 attacked ({hd_unit})", "magma_r", None, None))
        fig, axes = _grid(len(mats), 2, max(4.4, 1.4 + 0.9 * len(targ)), max(3.0, 1.2 + 0.6 * len(surr)))
        for ax, (col, label, cmap, lo, hi) in zip(axes, mats, strict=False):
            m = [[val.get((s, t), {}).get(col) for t in targ] for s in surr]
            _heatmap(ax, m, surr, targ, title=label, cmap=cmap, vmin=lo, vmax=hi, xlabel="target model",
                     ylabel="surrogate (crafted on)")
        fig.suptitle(_key(attack, budget), fontsize=10)
        fig.tight_layout()
        blocks.append(figure_image(fig, f"transfer heatmap {_key(attack, budget)}",
                                   "Rows: the model the attack was crafted on; columns: the model it was applied "
                                   "to. The diagonal is the white-box attack."))
    # Paschali et al.'s Table 2 (rows: the evaluated model; columns: the source model, grouped by attack) with
    # their Table 1 summary (clean, mean over the cells, drop in points and relative)
    targets = list(dict.fromkeys(str(r["target"]) for r in study.rows))
    summary = {str(e.get("target")): e for e in study.meta.get("summary") or [] if isinstance(e, Mapping)}
    matrix: list[dict[str, Any]] = []
    for t in targets:
        sel = [r for r in study.rows if str(r["target"]) == t]
        row: dict[str, Any] = {"evaluated model": t, f"clean {metric}": sel[0].get("clean") if sel else None}
        for r in sel:
            row[f"{_key(r['attack'], r['budget'])} · from {r['surrogate']}"] = r.get("adv")
        e = summary.get(t, {})
        row.update({"avg over all cells": e.get("avg_all_cells"), "drop (points)": e.get("drop_points_all_cells"),
                    "avg black-box": e.get("avg"), "black-box drop (points)": e.get("drop_points"),
                    "black-box drop (relative %)": e.get("drop_pct")})
        matrix.append(row)
    if matrix:
        cols = list(dict.fromkeys(k for r in matrix for k in r))
        blocks.append(_table(matrix, cols, f"{metric} of each evaluated model (rows) on the examples crafted on each "
                             "source model (columns), per attack (Paschali et al., Table 2); avg and drop in "
                             "percentage points 100 × (clean − avg), over all cells (their Table 1) and over the "
                             "black-box cells only, and the relative drop 100 × (clean − avg) / clean."))
    blocks.append(_plain_table(study.rows, "all rows of the transfer study"))
    return Section("study-transfer", "Transferability (Paschali, Malik)",
                   "Adversarial examples crafted on one model (surrogate) and applied to another (target): a "
                   "black-box attacker needs only a similar model.", blocks)


def _study_corruptions(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = _study_metric(study)
    groups = _groups(study.rows, ["corruption"])
    has_flip = any(not _nan(r.get("flip_probability")) for r in study.rows)
    fig, axes = _grid(1 + has_flip, 2, 5.4, 3.8)
    clean = _mean(r.get("metric_clean") for r in study.rows)
    for i, ((name,), rows) in enumerate(groups.items()):
        rows = sorted(rows, key=lambda r: float(r["severity"]))
        # colour, marker and line style all vary, so that 9+ corruptions stay apart
        style = dict(marker=MARKERS[i % len(MARKERS)], color=PALETTE[i % len(PALETTE)],
                     ls="-" if i < len(PALETTE) else "--", label=name, ms=5)
        axes[0].plot([r["severity"] for r in rows], [r.get("metric") for r in rows], **style)
        if has_flip:
            axes[1].plot([r["severity"] for r in rows], [r.get("flip_probability") for r in rows], **style)
    if not _nan(clean):
        axes[0].axhline(clean, color="grey", ls=":", lw=1.2, label="clean")
    _style(axes[0], "severity", metric, f"{metric} vs corruption severity")
    if has_flip:
        _style(axes[1], "severity", "flip probability", "flip probability vs severity")
        axes[1].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xticks(sorted({int(r["severity"]) for r in study.rows}))
    fig.set_figheight(fig.get_figheight() + 0.25 * math.ceil((len(groups) + 1) / 5))
    _legend_top(fig, axes[0], 5)
    blocks: list[Any] = [figure_image(fig, "corruption curves: metric and flip probability vs severity")]
    if has_flip:  # Xu et al. report the FP per type and their mean
        units = {str(c.get("name")): str(c.get("unit", "")) for c in study.meta.get("suite") or []
                 if isinstance(c, Mapping)}
        per = [{"corruption": name, "mean flip probability": _mean(r.get("flip_probability") for r in rows),
                f"mean {metric}": _mean(r.get("metric") for r in rows), "level unit": units.get(str(name), "")}
               for (name,), rows in groups.items()]
        per.append({"corruption": "mean of all", "mean flip probability": _mean(r["mean flip probability"] for r in per),
                    f"mean {metric}": _mean(r[f"mean {metric}"] for r in per), "level unit": ""})
        blocks.append(_table(per, list(per[0]), "Flip probability and metric averaged over the severities run."))
    rfp = study.meta.get("rfp") if isinstance(study.meta, Mapping) else None
    if rfp:  # Xu et al.'s Table 4: each model's flip probability relative to the first model's
        blocks.append(_table(rfp, ["model", "flip_probability", "rfp"],
                             f"Relative flip probability: each model's mean flip probability over every corruption "
                             f"and severity, divided by that of {rfp[0]['model']} (Xu et al., Table 4)."))
    blocks.append(_plain_table(study.rows, "all rows of the corruption study"))
    return Section("study-corruptions", "Common corruptions (Xu et al.)",
                   "Natural image degradations at five severities. The flip probability is the share of samples "
                   "whose prediction the corruption changes.", blocks)


def _study_noise_baseline(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = _study_metric(study)
    rows = study.rows
    names = [_key(r.get("attack"), r.get("budget")) for r in rows]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows) + 2), 3.6))
    match = str(study.meta.get("match") or "ssim").upper()
    series = [("clean", [r.get("clean_metric") for r in rows])] if any("clean_metric" in r for r in rows) else []
    series += [("adversarial", [r.get("adv_metric") for r in rows]),
               (f"random noise, same {match}", [r.get("noise_metric") for r in rows])]
    _bars(ax, names, series, metric, "adversarial vs matched random noise", None)
    _legend_top(fig, ax)
    return Section("study-noise-baseline", "Adversarial vs random noise (Paschali)",
                   f"Random noise scaled to the same image similarity ({_h(match)}) as each adversarial example: the gap "
                   "shows the damage is specific to the adversarial direction, not to the amount of noise.",
                   [figure_image(fig, "adversarial vs matched noise bars"),
                    _table(rows, list(dict.fromkeys(k for r in rows for k in r)))])


def _study_frequency(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = _study_metric(study, "value")
    groups = _groups(study.rows, ["attack", "budget"])
    bands = list(dict.fromkeys(str(r["band"]) for r in study.rows))
    series = []
    for (attack, budget), rows in groups.items():
        by = {str(r["band"]): r.get("value") for r in rows}
        series.append((_key(attack, budget), [by.get(b) for b in bands]))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(bands) * max(1, len(series)) / 2 + 2), 3.6))
    _bars(ax, bands, series, metric, "attack restricted to a frequency band", None)
    _legend_top(fig, ax, 3)
    notes = study.meta.get("notes") if isinstance(study.meta, Mapping) else None  # e.g. VAFA's renormalisation
    return Section("study-frequency", "Frequency bands (Malik et al.)",
                   "The perturbation filtered to low or high spatial frequencies: which band carries the attack.",
                   ([Bullets([_h(n) for n in notes], "warn")] if notes else [])
                   + [figure_image(fig, "frequency band bars"), _plain_table(study.rows, "all rows", collapsed=False)])


def _study_models(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = _study_metric(study)
    rows = study.rows
    settings = list(dict.fromkeys((r.get("attack"), r.get("budget")) for r in rows))
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    markers = "osD^vP*X"
    for si, s in enumerate(settings):
        for mi, m in enumerate(models):
            sel = [r for r in rows if (r.get("attack"), r.get("budget")) == s and str(r["model"]) == m]
            if sel:
                ax.scatter([sel[0].get("clean")], [sel[0].get("adv")], color=PALETTE[si % len(PALETTE)],
                           marker=markers[mi % len(markers)], s=50, label=_key(*s) if mi == 0 else None)
                ax.annotate(m, (float(sel[0].get("clean") or 0), float(sel[0].get("adv") or 0)), fontsize=7,
                            xytext=(4, 3), textcoords="offset points")
    vals = [float(v) for r in rows for v in (r.get("clean"), r.get("adv")) if v is not None and not _nan(v)]
    if vals and min(vals) >= 0 and max(vals) <= 1:  # a [0, 1] metric: the whole square and the no-loss diagonal
        ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="no loss under attack")
        ax.set_xlim(0, 1.02)
        ax.set_ylim(0, 1.02)
        ax.set_aspect("equal")
    _style(ax, f"clean {metric}", f"attacked {metric}", "generalisation vs robustness")
    ax.legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    pivot = []
    for m in models:
        row: dict[str, Any] = {"model": m, f"clean {metric}": next((r.get("clean") for r in rows
                                                                   if str(r["model"]) == m), None)}
        for s in settings:
            row[_key(*s)] = next((r.get("adv") for r in rows if str(r["model"]) == m
                                  and (r.get("attack"), r.get("budget")) == s), None)
        pivot.append(row)
    blocks: list[Any] = [figure_image(fig, "clean vs attacked metric per model"),
                         _table(pivot, list(pivot[0]) if pivot else [], f"attacked {metric} per model and attack")]
    blocks.extend(_models_cosine(study.meta.get("cosine")))
    return Section("study-models", "Models: generalisation vs robustness (Paschali)",
                   "Several models on the same data and attacks: a better clean score does not imply robustness.",
                   blocks)


def _models_cosine(cos: Any) -> list[Any]:
    """Heatmaps of the models study's cross-model cosine similarities (Medi et al., Fig. 7): per condition, the
    per-class recall vectors and the error patterns, models × models."""
    if not isinstance(cos, Mapping) or not cos.get("conditions") or not cos.get("models"):
        return []
    names = [str(m) for m in cos["models"]]
    panels = [(cond, kind) for cond in cos["conditions"] for kind in ("recall", "errors")
              if isinstance(cos.get(kind), Mapping) and cos[kind].get(cond) is not None]
    if not panels:
        return []
    side = max(3.2, 1.2 + 0.7 * len(names))
    fig, axes = _grid(len(panels), 2, side + 1.0, side)
    what = {"recall": "per-class recall", "errors": "error pattern (off-diagonal confusion)"}
    for ax, (cond, kind) in zip(axes, panels, strict=False):
        name, _, budget = str(cond).rpartition("@")
        try:
            label = _key(name, float(budget)) if name else str(cond)
        except ValueError:
            label = str(cond)
        _heatmap(ax, cos[kind][cond], names, names, title=f"{label}: {what[kind]}", cmap="viridis", vmin=0.0,
                 vmax=1.0, xlabel="model", ylabel="model")
    fig.tight_layout()
    return [figure_image(fig, "cosine similarity of class-wise vectors between models",
                         "Cosine similarity of two models' class-wise vectors (Medi et al., App. B): per-class "
                         "recall, and the error pattern (which class is mistaken for which; multi-label: missed and "
                         "spurious findings per label). Attacked: each model on its own adversarial examples. "
                         "Blank: undefined (a vector of zeros).")]




def _study_correlation(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    blocks: list[Any] = []
    emb = study.meta.get("embedding")
    embs = study.meta.get("embeddings")
    if isinstance(embs, Mapping) and embs:  # train / clean / noisy / adversarial, one panel per method
        from matplotlib.lines import Line2D

        colours = {"train": "#BBBBBB", "clean": PALETTE[0], "noisy": PALETTE[2], "adv": PALETTE[1]}
        shown = {"train": "train (control)", "clean": "clean", "noisy": "noise, same norm", "adv": "adversarial"}
        fig, axes = _grid(len(embs), 2, 5.0, 4.2)
        for ax, (method, e) in zip(axes, embs.items(), strict=False):
            groups = e.get("groups") or {}
            labels = e.get("labels") or {}
            tops = sorted({str(v) for vs in labels.values() for v in vs})[:4]
            for g in ("train", "clean", "noisy", "adv"):
                pts = groups.get(g) or []
                labs = [str(v) for v in labels.get(g, [])]
                for mi, lab in enumerate(tops + ["other"]):
                    sel = [p for p, q in zip(pts, labs or ["other"] * len(pts), strict=False)
                           if (q == lab) or (lab == "other" and q not in tops)]
                    if sel:
                        ax.scatter([p[0] for p in sel], [p[1] for p in sel], s=12 if g == "train" else 18,
                                   marker=MARKERS[mi % len(MARKERS)], color=colours[g],
                                   alpha=0.45 if g == "train" else 0.85, linewidths=0)
            ex = e.get("explained")
            note = f" ({100 * sum(ex):.0f}% of the variance)" if ex else ""
            _style(ax, "axis 1", "axis 2", f"{'PCA' if method == 'pca' else 't-SNE'}{note}")
        handles = [Line2D([], [], ls="", marker="o", color=colours[g], label=shown[g])
                   for g in ("train", "clean", "noisy", "adv") if any(g in (e.get("groups") or {}) for e in embs.values())]
        first = next(iter(embs.values()))
        tops = sorted({str(v) for vs in (first.get("labels") or {}).values() for v in vs})[:4]
        handles += [Line2D([], [], ls="", marker=MARKERS[i % len(MARKERS)], color="#444444", label=f"label {t}")
                    for i, t in enumerate(tops)]
        fig.legend(handles=handles, loc="upper center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / fig.get_figheight()))
        what = f" of layer {study.meta['layer']}" if study.meta.get("layer") else ""
        under = f" under {_pretty_key(study.meta['attack'])}" if study.meta.get("attack") else ""
        blocks.append(figure_image(fig, f"PCA and t-SNE of the features{what}{under}",
                                   "Features of the groups embedded jointly (colour: group; marker: label). Xu et al. "
                                   "(Fig. 7): adversarial samples leave their class among the training features, "
                                   "noise of the same norm (the control) does not."))
        sep = study.meta.get("separation") or []
        if sep:
            blocks.append(_table(sep, ["space", "pair", "centroid_distance", "knn_separability"],
                                 "Per space and pair of groups: distance between centroids (over the clean spread) "
                                 "and kNN separability (0.5: mixed, 1: separated)."))
        probe = study.meta.get("probe") or []
        if probe:
            blocks.append(_table(probe, ["space", "group", "knn_label_accuracy"],
                                 "kNN probe: the share of test samples whose nearest training features carry "
                                 "their label."))
    elif isinstance(emb, Mapping) and emb.get("clean"):
        plt = _plt()
        fig, ax = plt.subplots(figsize=(7.2, 4.6))
        from matplotlib.lines import Line2D

        clean_pts, adv_pts = emb["clean"], emb.get("adv") or []
        labels = [str(v) for v in (emb.get("labels") or ["all"] * len(clean_pts))]
        # the 7 most frequent labels (or label sets) get a colour, the rest are grey "other"
        counts: dict[str, int] = {}
        for lab in labels:
            counts[lab] = counts.get(lab, 0) + 1
        top = sorted(counts, key=lambda c: -counts[c])[:7]
        colour = {c: PALETTE[i] for i, c in enumerate(top)}
        if len(adv_pts) == len(clean_pts):  # where each sample moved
            for p, q in zip(clean_pts, adv_pts, strict=True):
                ax.plot([p[0], q[0]], [p[1], q[1]], color="#999999", lw=0.5, alpha=0.35, zorder=1)
        for pts, marker in ((clean_pts, "o"), (adv_pts, "x")):
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=22, zorder=2, alpha=0.9,
                       c=[colour.get(lab, "#BBBBBB") for lab in labels[: len(pts)]])
        handles = [Line2D([], [], ls="", marker="s", color=colour[c], label=c) for c in top]
        if len(counts) > len(top):
            handles.append(Line2D([], [], ls="", marker="s", color="#BBBBBB", label="other"))
        handles += [Line2D([], [], ls="", marker="o", color="#444444", label="clean"),
                    Line2D([], [], ls="", marker="x", color="#444444", label="attacked")]
        what = f" of layer {study.meta['layer']}" if study.meta.get("layer") else ""
        under = f" under {_pretty_key(study.meta['attack'])}" if study.meta.get("attack") else ""
        _style(ax, "component 1", "component 2", f"feature embedding{what}{under}")
        ax.legend(handles=handles, fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5),
                  title="label", title_fontsize=7)
        fig.tight_layout()
        blocks.append(figure_image(fig, "2-D projection of clean and adversarial feature embeddings",
                                   "2-D projection of the features. Circles: clean samples; crosses: the same samples "
                                   "attacked (a grey line joins the two), coloured by true label. Attacked samples "
                                   "that land in another label's cluster are read by the model as that label."))
    co = study.meta.get("cooccurrence")
    if isinstance(co, Mapping) and co.get("clean"):
        names = list(co.get("labels") or class_names or [str(j) for j in range(len(co["clean"]))])
        mats = [("clean", co["clean"])] + ([("attacked", co["adv"])] if co.get("adv") else [])
        if co.get("adv"):
            mats.append(("attacked − clean", [[(float(a or 0) - float(b or 0)) for a, b in zip(ra, rb, strict=False)]
                                              for ra, rb in zip(co["adv"], co["clean"], strict=False)]))
        size = min(4.8, 1.8 + 0.35 * len(names))
        fig, axes = _grid(len(mats), 3, size + 0.8, size)
        vmax = max([1e-9] + [abs(float(v or 0)) for _, m in mats[:2] for row in m for v in row])
        dmax = max([1e-9] + [abs(float(v)) for row in mats[-1][1] for v in row]) if len(mats) == 3 else 1.0
        for ax, (title, m) in zip(axes, mats, strict=False):
            diff = title.startswith("attacked −")
            integer = all(float(v or 0).is_integer() for row in m for v in row)
            _heatmap(ax, m, names, names, title=title, cmap="RdBu_r" if diff else "viridis",
                     vmin=-dmax if diff else 0.0, vmax=dmax if diff else vmax, digits=0 if integer else 2)
        fig.tight_layout()
        blocks.append(figure_image(fig, "label co-occurrence, clean vs attacked",
                                   "How often two labels are predicted together; the attack changes which labels "
                                   "appear together."))
    if study.rows:
        blocks.append(_plain_table(study.rows, "all rows of the correlation study"))
    return Section("study-correlation", "Feature and label correlation (Xu et al.)",
                   "Where attacked samples land in the model's feature space, and how labels co-occur.", blocks)


CERTIFY_RULE = ("certified ≤ empirical must hold at every radius (a certificate is a lower bound on the robust "
                "metric of the smoothed model); a violation would mean a bug")


def _study_certify(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    """Certified vs. empirical curve of one smoothed model (:func:`medadv.studies.certify.certify`)."""
    metric = _study_metric(study)
    meta = study.meta
    curve = sorted((r for r in study.rows if r.get("kind") == "curve"), key=lambda r: float(r["radius"]))
    if not curve:
        raise KeyError("no curve rows")
    radii = [float(r["radius"]) for r in curve]
    has_emp = any(_is_num(r.get("empirical")) for r in curve)
    bad = [r for r in curve if r.get("violation")]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.2, 3.9))
    ax.plot(radii, [r.get("certified") for r in curve], marker="o", color=PALETTE[0], label="certified (smoothed)")
    attack = str(meta.get("empirical") or "auto")
    if has_emp:
        ax.plot(radii, [r.get("empirical") for r in curve], marker="s", ls="--", color=PALETTE[1],
                label=f"empirical: {attack} on the smoothed model")
        ax.fill_between(radii, [r.get("certified") for r in curve], [r.get("empirical") for r in curve],
                        color=PALETTE[1], alpha=0.08, lw=0)
    for r in bad:
        ax.plot([r["radius"]], [r.get("certified")], marker="X", ms=12, color="#c00000", ls="none",
                label="violation: certified > empirical" if r is bad[0] else None)
    _style(ax, "L2 radius (data units)", metric, f"{metric} of the smoothed model (σ = {fmt(meta.get('sigma'))})")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(radii)
    ax.legend(fontsize=8, loc="lower left", frameon=False)
    fig.tight_layout()
    intro = (f"Gaussian randomized smoothing (Cohen et al. 2019), σ = {_h(fmt(meta.get('sigma')))}, "
             f"n0 = {_h(meta.get('n0'))}, n = {_h(meta.get('n'))}, α = {_h(fmt(meta.get('alpha')))} "
             f"({_h(meta.get('correction'))}"
             f"{'' if meta.get('tau') is None else ', τ = ' + _h(fmt(meta.get('tau')))}): the <b>certified</b> "
             f"{_h(metric)} "
             "at each L2 radius, abstentions as errors (radius 0: the smoothed model's certified clean metric)")
    if has_emp:
        intro += (f", and the <b>empirical</b> {_h(metric)} of the same smoothed model under <code>{_h(attack)}</code> "
                  f"in the L2 ball of that radius, run on the average over {_h(meta.get('draws'))} fixed noise draws "
                  "(Salman et al. 2019) and scored by the smoothed model's majority vote")
    intro += f". <b>{CERTIFY_RULE}.</b>"
    blocks: list[Any] = []
    if bad:
        blocks.append(Bullets([f"<b>VIOLATION at r = {fmt(r['radius'])}</b>: certified {fmt(r.get('certified'))} &gt; "
                               f"empirical {fmt(r.get('empirical'))} (a bug, or the α event / Monte Carlo error of "
                               "the smoothed prediction)" for r in bad], "bad"))
    elif has_emp:
        blocks.append(Text([f"certified ≤ empirical holds at every radius ({len(curve)} radii checked)."]))
    blocks.append(figure_image(fig, "certified and empirical robustness curves of the smoothed model"))
    cols = ["radius", "certified", "empirical", "gap", "violation", "predict_abstain"]
    table = _table(curve, [c for c in cols if any(c in r for r in curve)],
                   "curve rows; predict_abstain: share of elements where PREDICT's test would abstain")
    for row, r in zip(table.rows, curve, strict=True):
        if r.get("violation"):
            for cell in row:
                cell.cls = (cell.cls + " bad").strip()
    blocks.append(table)
    if meta.get("masking"):
        blocks.append(Bullets([f"gradient-masking check on the surrogate: {_h(m)}" for m in meta["masking"]], "warn"))
    others = [r for r in study.rows if r.get("kind") != "curve"]
    if others:
        blocks.append(_plain_table(others, "per-sample (and per-label) rows: certified radius, abstentions, "
                                   "certified share of the elements at each radius"))
    return Section("study-certify", f"Certified robustness (randomized smoothing) · {metric}", intro, blocks)


def _study_saliency(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    """Model × method SSIM heatmaps per attack (Zhang et al. Tables 1–2) and the rows."""
    matrix = study.meta["ssim"]
    methods = list(study.meta.get("explanations") or [])
    models = list(matrix)
    attacks = list(dict.fromkeys(a for m in matrix.values() for a in m))
    blocks: list[Any] = []
    if models and methods and attacks:
        plt = _plt()
        fig, axes = plt.subplots(1, len(attacks), figsize=(max(4.0, 1.1 * len(methods) + 2) * len(attacks),
                                                           1.0 + 0.6 * len(models)), squeeze=False)
        for ax, a in zip(axes[0], attacks, strict=True):
            m = [[matrix[mo].get(a, {}).get(e) for e in methods] for mo in models]
            _heatmap(ax, m, models, methods, title=f"SSIM(clean map, attacked map) · {a}", vmin=0.0, vmax=1.0)
        fig.tight_layout()
        blocks.append(figure_image(fig, "saliency SSIM per model and method",
                                   "1 = the attack left the map as it was; low = the map moved"))
    cols = ["model", "explanation", "attack", "budget", "ssim", "spearman", "topk", "changed", "psc"]
    if any(r.get("ssim_target") is not None for r in study.rows):
        cols.append("ssim_target")
    blocks.append(_table(study.rows, cols, "mean over the samples; changed: fraction whose prediction changed; "
                         "ssim_target: SSIM of the attacked map to the attack's target map; psc: correlation of the prediction's "
                         "and the map's change over the images (Zhang et al.)"))
    return Section("study-saliency", "Explanations under attack, model × method (Zhang et al.)",
                   "Each method explains the class of the clean prediction on the clean and on the attacked input; "
                   "a prediction attack shows how fragile the maps are (Table 1), an attack on the explanation how "
                   "far a map can be moved while the prediction holds (Table 2).", blocks)


def _study_generic(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    return Section(f"study-{study.study}", f"Study: {study.study}", "",
                   [_plain_table(study.rows, f"rows of the {study.study} study", collapsed=False)])


StudyDrawer = Callable[[StudyLike, "Sequence[str] | None"], Section]

#: study name -> the function drawing its report section (:func:`study_section` adds one)
_STUDIES: dict[str, StudyDrawer] = {
    "classwise": _study_classwise, "transfer": _study_transfer, "corruptions": _study_corruptions,
    "noise_baseline": _study_noise_baseline, "frequency": _study_frequency, "models": _study_models,
    "correlation": _study_correlation, "certify": _study_certify, "saliency": _study_saliency}


def study_section(name: str) -> Callable[[StudyDrawer], StudyDrawer]:
    """Decorator: ``fn(study, class_names) -> Section`` draws the report section of study ``name`` (a study
    registered with :func:`medadv.studies.schema.register_study`; without a drawer its rows are shown raw)."""
    def deco(fn: StudyDrawer) -> StudyDrawer:
        _STUDIES[name] = fn
        return fn
    return deco


def _study_section(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    fn = _STUDIES.get(study.study, _study_generic)
    try:
        sec = fn(study, class_names)
    except (KeyError, TypeError, ValueError, IndexError) as err:  # rows not per the conventions: show them raw
        sec = _study_generic(study, class_names)
        sec.intro = (f"<span class='warn'>Could not draw this study's figures ({type(err).__name__}: {_h(err)}); its rows "
                     "are shown as they are.</span>")
    notes = study.meta.get("notes") if isinstance(study.meta, Mapping) else None
    shown = {i for b in sec.blocks if isinstance(b, Bullets) for i in b.items}
    extra = [_h(n) for n in notes or () if _h(n) not in shown]
    if extra:  # what the numbers depend on (VAFA's renormalisation): said in every study that ran it
        sec.blocks.insert(0, Bullets(extra, "warn"))
    title = study.meta.get("title") if isinstance(study.meta, Mapping) else None
    if title:  # a config's `title:` (a paper's "Table 2"): the heading, with the study's own name after it
        sec.title = f"{title} — {sec.title}"
    return sec


# --- cases and saliency ---------------------------------------------------------------------------------------------
def _case_section(cases: Sequence[Case | Figure]) -> Section:
    blocks = []
    for c in cases:
        if isinstance(c, Case):
            blocks.append(figure_image(plot_case(c), f"case: {c.title}"))
        else:
            blocks.append(figure_image(c, "case figure"))
    return Section("cases", "Cases",
                   "The samples the attacks damaged most (largest drop of the robust metric; each figure names its "
                   "attack and budget): the clean and the attacked image through the same grey window (a CT "
                   "window for data in HU, else the 1–99 % range; <code>report: {window: ...}</code> sets one), the "
                   "perturbation (amplified: its colour range is stretched to its largest value, so an invisible "
                   "change becomes visible; the colour bar gives its scale in data units), and the prediction "
                   "before and after. Voxels are drawn to scale when the spacing is known. Volumes show three "
                   "orthogonal slices through the voxel whose prediction changed most (crosshair).", blocks)


def _saliency_section(pairs: Sequence[SaliencyPair | Figure]) -> Section:
    blocks = []
    for p in pairs:
        if isinstance(p, SaliencyPair):
            blocks.append(figure_image(p.figure(), f"saliency pair: {p.title}"))
        else:
            blocks.append(figure_image(p, "saliency figure"))
    return Section("saliency", "Explanations under attack",
                   "Explanation maps before and after an attack on the explanation: the prediction can stay the "
                   "same while the map moves.", blocks)


# --- the page -------------------------------------------------------------------------------------------------------
def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    return env


def render_html_report(
    results: Results | None = None,
    *,
    studies: Sequence[StudyLike] = (),
    cases: Sequence[Case | Figure] = (),
    saliency: Sequence[SaliencyPair | Figure] = (),
    title: str = "medadv robustness report",
    class_names: Sequence[str] | None = None,
    results_title: str | None = None,
) -> str:
    """The report as an HTML string (see :func:`write_html_report`)."""
    from markupsafe import Markup

    if results is not None and not isinstance(results, Results):
        raise TypeError(f"`results` must be a medadv Results table or None, got {type(results).__name__}")
    for s in studies:
        if not isinstance(s, StudyLike):
            raise TypeError(f"each study must have .study, .rows and .meta (a StudyResult), got {type(s).__name__}")
    class_names = class_names or (results.meta.get("classes") if results is not None else None)
    from .plots import literal_text

    with literal_text():  # attack ids, class names and titles drawn in figures are user strings
        sections = _sections(results, studies, cases, saliency, class_names, results_title)
    # intros and findings hold a little markup of ours (<b>, <i>, links) with every user string escaped (_h);
    # table cells and titles are escaped by the template
    for sec in sections:
        sec.intro = Markup(sec.intro)  # type: ignore[assignment]
        for b in sec.blocks:
            if isinstance(b, Bullets):
                b.items = [Markup(i) for i in b.items]
    from .. import __version__ as version

    return str(_environment().get_template("report.html.j2").render(
        title=title, sections=sections, version=version,
        n_figures=sum(isinstance(b, Image) for s in sections for b in s.blocks)))


def _sections(results: Results | None, studies: Sequence[StudyLike], cases: Sequence[Case | Figure],
              saliency: Sequence[SaliencyPair | Figure], class_names: Sequence[str] | None,
              results_title: str | None) -> list[Section]:
    sections: list[Section] = []
    if results is not None and len(results):
        sections += _results_sections(results, class_names)
        for sec in sections:
            if results_title and sec.id in ("summary", "curves"):  # a paper's "Table 1": the evaluation's tables
                sec.title = f"{results_title} — {sec.title}"
    sections += [_study_section(s, class_names) for s in studies]
    seen: dict[str, int] = {}
    for sec in sections:  # two studies of one kind (e.g. class-wise of two models): distinct anchors
        seen[sec.id] = seen.get(sec.id, 0) + 1
        if seen[sec.id] > 1:
            sec.id, sec.title = f"{sec.id}-{seen[sec.id]}", f"{sec.title} ({seen[sec.id]})"
    if cases:
        sections.append(_case_section(cases))
    if saliency:
        sections.append(_saliency_section(saliency))
    return sections


def write_html_report(
    results: Results | None,
    out_dir: str | os.PathLike,
    *,
    studies: Sequence[StudyLike] = (),
    cases: Sequence[Case | Figure] = (),
    saliency: Sequence[SaliencyPair | Figure] = (),
    title: str = "medadv robustness report",
    results_title: str | None = None,
    class_names: Sequence[str] | None = None,
    filename: str = "report.html",
) -> Path:
    """Write one self-contained ``report.html`` into ``out_dir`` and return its path.

    Args:
        results: the evaluation table (:func:`medadv.evaluation.evaluate`), or None for a report of
            studies only.
        out_dir: the folder (created if needed); typically the one holding ``report.md``.
        studies: :class:`~medadv.studies.base.StudyResult` objects (any object with ``study``, ``rows``
            and ``meta``), each drawn per its study's row conventions; an unknown study or rows that do not
            follow them are shown as a table.
        cases: :class:`~medadv.report.cases.Case` objects (:func:`~medadv.report.cases.select_cases`) or
            ready matplotlib figures.
        saliency: :class:`~medadv.report.cases.SaliencyPair` objects or ready figures.
        title: the page title.
        results_title: the heading put before the evaluation's summary and curves (a paper's "Table 1").
        class_names: names of the classes / labels / tissues (default ``results.meta["classes"]``, else
            indices).
        filename: the file name inside ``out_dir``.
    """
    html = render_html_report(results, studies=studies, cases=cases, saliency=saliency, title=title,
                              results_title=results_title,
                              class_names=class_names)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    from ..safe_io import write_text

    write_text(path, html)  # atomic, never through a link (issue 28)
    return path
