"""A Markdown report of an evaluation: settings, summary table, robustness curve."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ..results import DETAIL_PREFIX, ENSEMBLE_DETAILS, Results, summary_columns
from .plots import headline_metric, plot_robustness_curve

__all__ = ["write_report"]


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, list):
        return " / ".join(_cell(x) for x in v)
    return "" if v is None else str(v)


def _table(rows: list[dict[str, Any]], cols: list[str]) -> list[str]:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return out + [""]


def write_report(results: Results, out_dir: str | os.PathLike, title: str = "medadv robustness report") -> Path:
    """Write ``report.md`` and ``robustness.png`` into ``out_dir``; returns the report path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = results.summary()
    lines = [f"# {title}", ""]
    for k, v in results.meta.items():
        lines.append(f"- **{k}**: {v}")
    lines.append("")
    if summary:
        cols = [c for c in summary_columns(summary) if not c.endswith("_scores") and not c.startswith(DETAIL_PREFIX)]
        lines += _table(summary, cols)
        details = [c for c in summary_columns(summary) if c.startswith(DETAIL_PREFIX) and c not in ENSEMBLE_DETAILS]
        if details:
            # attack-specific outputs (AttackDetails.columns), per-attack means; blank where an attack has none
            rows = [r for r in summary if any(c in r for c in details)]
            lines += ["## Attack-specific outputs", "",
                      "Per-attack means of the per-sample outputs each attack declares (`attack_*` columns).", ""]
            lines += _table(rows, ["attack", "budget", *details, "n"])
        ensemble = results.ensemble_table()
        if ensemble:
            metric = next(c for c in ensemble[0] if c.startswith("robust_"))
            lines += ["## Worst case after each member", "",
                      f"Ensemble attacks (`auto`): the mean {metric.removeprefix('robust_')} after each member, keeping "
                      "per sample the worst case so far; `gain` is how much the member lowered it, `attacked` the "
                      "samples it ran on (those not yet at the floor) and `seconds` its total time.", ""]
            lines += _table(ensemble, ["attack", "budget", "member", metric, "gain", "attacked", "seconds", "n"])
        worst_of = results.worst_of_table()
        if worst_of:
            lines += ["## Worst case of each metric", "",
                      "`auto` on segmentation: each metric's own worst case over the members (`worst_*`) next to the "
                      "example kept, the worst by the selection metric (`adv_*`).", ""]
            lines += _table(worst_of, list(worst_of[0]))
        flags = results.masking_flags()
        lines += ["## Gradient-masking checks", ""]
        if flags:
            lines += ["These checks fired: the robust metric may be overestimated (see `medadv.masking`).", ""]
            lines += _table(flags, ["attack", "budget", "check", "samples", "message"])
        elif ensemble:
            lines += ["No check fired (randomised outputs, probability outputs, zero gradients, black-box beating "
                      "white-box, non-monotone budgets, unbounded attack not reaching the floor).", ""]
        else:
            lines = lines[:-2]
        if any(r["budget"] is not None for r in summary):
            png = plot_robustness_curve(results, out / "robustness.png")
            lines += [f"![robustness curve: {headline_metric(results)} vs budget]({png.name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
