"""Robustness curves from a :class:`~medadv.results.Results` table (matplotlib, no display needed)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from ..results import Results

__all__ = ["headline_metric", "plot_robustness_curve", "literal_text"]


@contextlib.contextmanager
def literal_text() -> Iterator[None]:
    """Draw every text of the figures made inside as the literal string: matplotlib would read ``$...$`` in an
    attack id, a class name or a title as math (and fail on ``$\\frac$``); the reports use no math."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False}):
        yield


def headline_metric(results: Results) -> str:
    """The adversarial metric column plotted and reported for this table's task."""
    if not results.rows:
        raise ValueError("`results` is empty")
    from ..tasks import headline_columns

    cols = tuple("adv_" + c for c in headline_columns())  # each registered task kind's headline column
    for col in cols:
        if col in results.rows[0]:
            return col
    raise ValueError(f"no known metric column in results (expected one of {cols})")


def _family(name: str) -> str:
    return name.split("@", 1)[0]


def plot_robustness_curve(results: Results, path: str | os.PathLike, metric: str | None = None) -> Path:
    """Metric vs budget, one line per attack family (attack names ``family@budget`` are grouped).

    The clean value is drawn as a dashed line. Returns the written file's path.
    """
    import matplotlib

    matplotlib.use("Agg")
    metric = metric or headline_metric(results)
    with literal_text():  # attack names are user strings
        return _plot_curve(results, Path(path), metric)


def _plot_curve(results: Results, out: Path, metric: str) -> Path:
    import matplotlib.pyplot as plt

    clean_col = metric.replace("adv_", "clean_", 1)
    summary = [r for r in results.summary() if r["budget"] is not None]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    families: dict[str, list[tuple[float, float]]] = {}
    balls = results.ball_check()
    out_of_ball = {_family(a) for (a, _), e in balls.items() if e["status"] == "out"}
    for r in summary:
        families.setdefault(_family(r["attack"]), []).append((r["budget"], r[metric]))
    for fam, pts in sorted(families.items()):
        pts.sort()
        label = fam + (" (left its ε-ball)" if fam in out_of_ball else "")
        ax.plot([0.0] + [p[0] for p in pts], [summary[0][clean_col]] + [p[1] for p in pts], marker="o", label=label,
                ls=":" if fam in out_of_ball else "-")
    if summary:
        ax.axhline(summary[0][clean_col], color="grey", ls="--", lw=1, label="clean")
    ax.set_xlabel("budget ε (data units)")
    ax.set_ylabel(metric.replace("adv_", "").replace("_", " "))
    ax.set_title("robustness curve")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    from ..safe_io import save_figure

    save_figure(fig, out, dpi=120)  # matplotlib would open the path itself, following a link (issue 28)
    plt.close(fig)
    return out
