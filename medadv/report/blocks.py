"""The public building blocks of the HTML report: page blocks, formatting and figures.

A study's report section (the ``draw`` of :func:`medadv.studies.register_study`) is built from these and nothing
else: it returns a :class:`Section` whose ``blocks`` are :class:`Table` (:func:`data_table` for chosen columns,
:func:`raw_table` for every column of a study's rows), :class:`Image` (:func:`figure_image` of a matplotlib
figure, drawn with :func:`pyplot`, :func:`grid`, :func:`bars`, :func:`heatmap`, :func:`curve`, :func:`style_axes`,
:func:`legend_top`), :class:`Text` and :class:`Bullets`. Cells are formatted with :func:`fmt` (NaN/None as ``–``),
:func:`fmt_budget` (``0.0314 (8/255)``), :func:`metric_label` (``adv_mean_dice`` -> ``mean Dice (attacked)``),
:func:`ci95` / :func:`fmt_ci` (bootstrap intervals). Section intros and bullet items are HTML of ours: every user
string in them (attack ids, class and model names) goes through :func:`escape`; table cells and titles are
escaped by the template.

Example, the section of a study whose rows are ``{attack, budget, clean, adv}``::

    from medadv.report.blocks import Section, bars, data_table, figure_image, legend_top, pyplot, setting_key

    def draw(study, class_names):
        names = [setting_key(r["attack"], r["budget"]) for r in study.rows]
        fig, ax = pyplot().subplots(figsize=(5, 3))
        bars(ax, names, [("clean", [r["clean"] for r in study.rows]), ("attacked", [r["adv"] for r in study.rows])])
        legend_top(fig, ax)
        return Section("study-mine", "My study", "Clean vs attacked.",
                       [figure_image(fig, "clean vs attacked"), data_table(study.rows, ["attack", "budget", "adv"])])

Plotting stacks (matplotlib, numpy) load on first use.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..results import DETAIL_PREFIX

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["StudyLike", "StudyDrawer", "Cell", "Table", "Image", "Text", "Bullets", "Section", "section", "PALETTE",
           "MARKERS", "METRIC_NAMES", "escape", "is_num", "is_nan", "fmt", "fmt_budget", "fmt_ci", "ci95",
           "metric_label", "header_cell", "value_cell", "data_table", "raw_table", "pyplot", "figure_image", "grid",
           "style_axes", "heatmap", "bars", "curve", "line_style", "legend_top", "family", "setting_key",
           "pretty_key", "setting_title", "group_rows", "mean_of", "budget_sort", "study_metric", "walk_matrices"]

#: Okabe-Ito colours (colour-blind safe) for attacks, corruptions and models in line and bar plots
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
MARKERS = "osD^vP*Xh<>"
#: result columns -> the names a reader knows them by
METRIC_NAMES = {"correct": "accuracy", "mean_dice": "mean Dice", "label_accuracy": "label accuracy",
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
    """One table cell: its text, CSS class (``num``, ``headline``, ``bad`` ...) and hover title."""

    text: str
    cls: str = ""
    title: str = ""


@dataclass
class Table:
    """A table block: header cells, rows of cells, a caption; ``collapsed`` puts it in a ``<details>``."""

    headers: list[Cell]
    rows: list[list[Cell]]
    caption: str = ""
    collapsed: bool = False  # inside a <details> element (long raw tables)
    kind: str = "table"


@dataclass
class Image:
    """A figure block: an embedded PNG (a ``data:`` URI, see :func:`figure_image`) with its size and texts."""

    src: str
    width: int
    height: int
    alt: str
    caption: str = ""
    kind: str = "figure"


@dataclass
class Text:
    """Paragraphs of plain text (escaped by the template)."""

    paragraphs: list[str]
    cls: str = ""
    kind: str = "text"


@dataclass
class Bullets:
    """A bullet list; items may hold markup of ours (every user string through :func:`escape`)."""

    items: list[str]
    cls: str = ""
    kind: str = "bullets"


@dataclass
class Section:
    """One section of the page: an anchor ``id``, a heading, an intro (markup of ours) and its blocks."""

    id: str
    title: str
    intro: str = ""
    blocks: list[Any] = field(default_factory=list)



# --- formatting -----------------------------------------------------------------------------------------------------
def escape(text: Any) -> str:
    """``text`` escaped for the HTML of ours (findings, intros), where the template does not escape: every user
    string (attack ids, class and model names, titles, paths) goes through it."""
    from markupsafe import escape as markup_escape

    return str(markup_escape(str(text)))


def is_num(v: Any) -> bool:
    """A number that is not a bool."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def is_nan(v: Any) -> bool:
    """``None`` or a float NaN: a missing value (drawn as ``–`` or left out)."""
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
    if not is_num(b):
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
            return METRIC_NAMES.get(base, base.replace("_", " ")) + tag
    if col.startswith(DETAIL_PREFIX):
        return col.removeprefix(DETAIL_PREFIX).replace("_", " ")
    return METRIC_NAMES.get(col, col.replace("_", " "))



def header_cell(col: str) -> Cell:
    """A header cell: the column's reader name (:func:`metric_label`), its key as the hover title."""
    return Cell(metric_label(col), title=col)


def value_cell(col: str, v: Any) -> Cell:
    """A value cell: budgets with :func:`fmt_budget`, everything else with :func:`fmt`; numbers right-aligned."""
    if col == "budget":
        return Cell(fmt_budget(v), "num")
    return Cell(fmt(v), "num" if is_num(v) or v is None else "")


def data_table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str], caption: str = "",
               collapsed: bool = False) -> Table:
    """The columns ``cols`` of ``rows`` as a :class:`Table` (headers through :func:`metric_label`)."""
    return Table([header_cell(c) for c in cols], [[value_cell(c, r.get(c)) for c in cols] for r in rows], caption,
                 collapsed)


def raw_table(rows: Sequence[Mapping[str, Any]], caption: str = "", collapsed: bool = True,
              limit: int = 400) -> Table:
    """Every column of ``rows`` (a study's raw table), at most ``limit`` rows."""
    cols: dict[str, None] = {}
    for r in rows:
        for c in r:
            cols.setdefault(c, None)
    shown = list(rows)[:limit]
    more = f" (first {limit} of {len(rows)} rows)" if len(rows) > limit else ""
    return Table([Cell(c) for c in cols], [[value_cell(c, r.get(c)) for c in cols] for r in shown], caption + more,
                 collapsed)



# --- figures --------------------------------------------------------------------------------------------------------
def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, imported on first use (the report needs no display)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def figure_image(fig: Figure, alt: str, caption: str = "", dpi: int = 110) -> Image:
    """Embed a matplotlib figure as a base64 PNG (the figure is closed)."""
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    plt.close(fig)
    data = buf.getvalue()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # PNG IHDR
    return Image("data:image/png;base64," + base64.b64encode(data).decode("ascii"), width, height, alt, caption)


def grid(n: int, ncols: int = 3, w: float = 4.0, h: float = 3.1) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels in rows of ``ncols`` (each ``w`` × ``h`` inches): ``(fig, the n axes)``."""
    plt = pyplot()
    ncols = max(1, min(ncols, n))
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def style_axes(ax: Any, xlabel: str = "", ylabel: str = "", title: str = "") -> None:
    """The report's look of a panel: small labels, a light grid, no top/right spines."""
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def heatmap(ax: Any, m: Sequence[Sequence[Any]], rows: Sequence[str], cols: Sequence[str], *, title: str = "",
            cmap: str = "viridis", vmin: float | None = None, vmax: float | None = None, digits: int = 2,
            xlabel: str = "", ylabel: str = "", colorbar: bool = True) -> None:
    """Draw matrix ``m`` (``None``/NaN: blank) on ``ax`` with row and column labels; values written in the cells
    of matrices up to 12 × 12, in a colour that stays readable on the colour map."""
    import numpy as np

    a = np.array([[np.nan if is_nan(v) else float(v) for v in row] for row in m], dtype=float)
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



def family(name: str) -> str:
    """The attack family of an entry name: ``pgd@0.03`` -> ``pgd``."""
    return str(name).split("@", 1)[0]


def setting_key(attack: Any, budget: Any) -> str:
    """``pgd ε=0.0314 (8/255)`` for attack ``pgd`` or ``pgd@0.0314`` at that budget."""
    return str(attack) if budget is None else f"{family(attack)} ε={fmt_budget(budget)}"



def group_rows(rows: Iterable[Mapping[str, Any]], keys: Sequence[str]) -> dict[tuple[Any, ...], list[Any]]:
    """``rows`` grouped by their values of ``keys`` (a missing key: ``None``), groups in first-seen order."""
    out: dict[tuple[Any, ...], list[Any]] = {}
    for r in rows:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return out


def mean_of(vals: Iterable[Any]) -> float:
    """The mean of the values that are not ``None``/NaN (NaN when none is left)."""
    v = [float(x) for x in vals if not is_nan(x)]
    return sum(v) / len(v) if v else float("nan")



def budget_sort(b: Any) -> float:
    """A sort key of budgets: ``None`` (no budget) first."""
    return -1.0 if b is None else float(b)



def ci95(values: Iterable[Any], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """A 95 % bootstrap confidence interval of the mean of ``values`` (None/NaN left out; percentile method,
    a fixed seed so the report is reproducible); None for fewer than two values."""
    import numpy as np

    v = np.array([float(x) for x in values if not is_nan(x)], dtype=np.float64)
    if v.size < 2:
        return None
    idx = np.random.default_rng(seed).integers(0, v.size, size=(resamples, v.size))
    means = v[idx].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def fmt_ci(ci: tuple[float, float] | None, digits: int = 3) -> str:
    """``0.412–0.530`` (or ``–`` without an interval)."""
    return "–" if ci is None else f"{fmt(ci[0], digits)}–{fmt(ci[1], digits)}"


def bars(ax: Any, names: Sequence[str], series: Sequence[tuple[str, Sequence[Any]]], ylabel: str = "",
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
        heights = [0.0 if is_nan(v) else float(v) for v in vals]
        ax.bar(xs, heights, width=width, label=label, color=colour)
        if errors is not None and i < len(errors):
            pts = [(x, h, e) for x, h, e, v in zip(xs, heights, errors[i], vals, strict=False)
                   if e is not None and not is_nan(v)]
            if pts:
                ax.errorbar([x for x, _, _ in pts], [h for _, h, _ in pts], fmt="none", ecolor="#333333",
                            elinewidth=0.9, capsize=2.5,
                            yerr=[[max(0.0, h - e[0]) for _, h, e in pts], [max(0.0, e[1] - h) for _, h, e in pts]])
    ax.set_xticks(range(len(names)))
    rot = 30 if max(map(len, names), default=0) > 6 or len(names) > 8 else 0
    ax.set_xticklabels(names, rotation=rot, ha="right" if rot else "center", fontsize=8)
    if ylim is not None:
        ax.set_ylim(*ylim)
    style_axes(ax, "", ylabel, title)
    ax.grid(axis="x", visible=False)



def legend_top(fig: Any, ax: Any, ncol: int = 6) -> None:
    """One legend for the whole figure (the series of ``ax``), above the panels; then lay the figure out."""
    handles, labels = ax.get_legend_handles_labels()
    rows = math.ceil(len(handles) / ncol) if handles else 0
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(ncol, len(handles)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.08 + 0.22 * rows) / fig.get_figheight()))



def line_style(i: int) -> dict[str, Any]:
    """The ``i``-th series' colour, marker and line style: colour, marker and dash all vary, so that 9+ series
    (corruptions, attacks) stay apart."""
    return dict(marker=MARKERS[i % len(MARKERS)], color=PALETTE[i % len(PALETTE)], ls="-" if i < len(PALETTE) else "--")


def curve(ax: Any, xs: Sequence[Any], ys: Sequence[Any], i: int, label: str, ms: float = 5) -> None:
    """One line of a line plot in the ``i``-th series' style (:func:`line_style`)."""
    ax.plot(xs, ys, **line_style(i), label=label, ms=ms)


def section(id: str, title: str, intro: str = "", blocks: Sequence[Any] = ()) -> Section:
    """A :class:`Section` (``intro`` is markup of ours: pass user strings through :func:`escape`)."""
    return Section(id, title, intro, list(blocks))


def study_metric(study: StudyLike, default: str = "metric") -> str:
    """The reader name of a study's metric (``meta["metric"]``), or ``default``."""
    m = study.meta.get("metric")
    return METRIC_NAMES.get(str(m), str(m)) if m else default


def walk_matrices(obj: Any, prefix: str = "") -> list[tuple[str, list[list[Any]]]]:
    """Every matrix (list of equal-length lists) in a nested dict, with its dotted key."""
    if isinstance(obj, Mapping):
        out = []
        for k, v in obj.items():
            out += walk_matrices(v, f"{prefix} · {k}" if prefix else str(k))
        return out
    if isinstance(obj, list) and obj and all(isinstance(r, list) for r in obj):
        return [(prefix, obj)]
    return []


def pretty_key(key: str) -> str:
    """A study's condition key as a reader wants it: ``pgd@0.1@0.1`` or ``pgd@0.1`` -> ``pgd ε=0.1``."""
    parts = str(key).split("@")
    if len(parts) >= 2:
        try:
            return setting_key(parts[0], float(parts[-1]))
        except ValueError:
            pass
    return str(key)



def setting_title(values: Mapping[str, Any]) -> str:
    """The title of one setting of a study: ``pgd ε=0.0314 (8/255)`` plus any other key (``background: no``)."""
    parts = [setting_key(values["attack"], values.get("budget"))] if values.get("attack") is not None else []
    parts += [f"{k}: {fmt(v)}" for k, v in values.items() if k not in ("attack", "budget") and v is not None]
    return " · ".join(parts) or "all"


#: draws the report section of one study: ``draw(study, class_names) -> Section``
StudyDrawer = Callable[[StudyLike, "Sequence[str] | None"], Section]
