"""Robustness curves from a :class:`~medadv.results.Results` table (matplotlib, no display needed)."""

from __future__ import annotations

import os
from pathlib import Path

from ..results import Results

__all__ = ["headline_metric", "plot_robustness_curve"]


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
    import matplotlib.pyplot as plt

    metric = metric or headline_metric(results)
    clean_col = metric.replace("adv_", "clean_", 1)
    summary = [r for r in results.summary() if r["budget"] is not None]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    families: dict[str, list[tuple[float, float]]] = {}
    for r in summary:
        families.setdefault(_family(r["attack"]), []).append((r["budget"], r[metric]))
    for fam, pts in sorted(families.items()):
        pts.sort()
        ax.plot([0.0] + [p[0] for p in pts], [summary[0][clean_col]] + [p[1] for p in pts], marker="o", label=fam)
    if summary:
        ax.axhline(summary[0][clean_col], color="grey", ls="--", lw=1, label="clean")
    ax.set_xlabel("budget ε (data units)")
    ax.set_ylabel(metric.replace("adv_", "").replace("_", " "))
    ax.set_title("robustness curve")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
