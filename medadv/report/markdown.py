"""A Markdown report of an evaluation: settings, summary table, robustness curve."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ..results import DETAIL_PREFIX, ENSEMBLE_DETAILS, Results, summary_columns
from .plots import headline_metric, plot_robustness_curve

__all__ = ["write_report", "md_escape"]

#: characters with a meaning inside a Markdown line (emphasis, code, links and images, tables, HTML, headings'
#: closing #, GitHub's $ math and ~ strike-through): backslash-escaped
_MD_PUNCT = frozenset("\\`*_[]|#$~!")
#: HTML-significant characters: written as entities (they work in every Markdown flavour, a backslash does not)
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def md_escape(text: Any) -> str:
    """``text`` as literal Markdown inline text: a cell, a heading or a list item shows exactly these characters.

    Markdown punctuation is backslash-escaped, ``& < >`` become entities (so ``<script>`` is text, not HTML),
    and line breaks and other control characters are shown as visible escapes (``\\n``), so a value can
    neither end a table row or a heading nor start a block of its own.
    """
    out = []
    text = str(text)
    for i, ch in enumerate(text):
        if ch == "_" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum():
            out.append(ch)  # inside a word `_` never opens emphasis (CommonMark): column names stay readable
        elif ch in _MD_ENTITIES:
            out.append(_MD_ENTITIES[ch])
        elif ch in _MD_PUNCT:
            out.append("\\" + ch)
        elif ch in "\n\r\t":
            out.append("\\\\" + {"\n": "n", "\r": "r", "\t": "t"}[ch])
        elif ord(ch) < 32 or ord(ch) == 127 or ch in "\u0085\u2028\u2029":
            out.append(f"\\\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, list):
        return " / ".join(_cell(x) for x in v)
    return "" if v is None else md_escape(v)


def _table(rows: list[dict[str, Any]], cols: list[str]) -> list[str]:
    out = ["| " + " | ".join(md_escape(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return out + [""]


def _missed(results: Results, rows: list[dict[str, Any]]) -> dict[str, str]:
    """``missed`` / ``absent`` structure counts of a segmentation's rows, clean / attacked, over the classes the
    mean Dice counts (as the HTML report)."""
    from .html import _missed_counts

    out = {}
    for m in ("missed", "absent"):
        counts = [_missed_counts(results, rows, w, m) for w in ("clean", "adv")]
        if all(c is not None for c in counts):
            out[m] = " / ".join(map(str, counts))
    return out


def write_report(results: Results, out_dir: str | os.PathLike, title: str = "medadv robustness report") -> Path:
    """Write ``report.md`` and ``robustness.png`` into ``out_dir``; returns the report path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = results.summary()
    lines = [f"# {md_escape(title)}", ""]
    from .html import _setting_value

    for k, v in results.meta.items():  # values as the HTML report's settings show them (no Python reprs)
        lines.append(f"- **{md_escape(k)}**: {md_escape(v if isinstance(v, str) else _setting_value(str(k), v))}")
    lines.append("")
    if summary:
        cols = [c for c in summary_columns(summary) if not c.endswith("_scores") and not c.startswith(DETAIL_PREFIX)]
        balls = results.ball_check()
        groups = results.groups()
        # an attack that left its ε-ball or has none is marked (not comparable with the others at a budget); a
        # segmentation's missed structures are counted (HD95 is undefined for them and its means leave them out)
        summary = [{**r, "ε-ball": Results.ball_note(balls[(r["attack"], r["budget"])], r["budget"]),
                    **_missed(results, groups[(r["attack"], r["budget"])])} for r in summary]
        cols += [c for c in ("missed", "absent") if any(c in r for r in summary)] + ["ε-ball"]
        lines += _table(summary, cols)
        if any("missed" in r for r in summary):
            lines += ["`missed`: structures (case × class counted by the mean Dice) in the reference and missing "
                      "from the prediction, clean / attacked; `absent`: in neither. HD95 is undefined for both, and the "
                      "`*_hd95` means leave them out; `*_missed` / `*_absent` hold them per class.", ""]
        from .html import volume_rows

        names = results.meta.get("classes")
        vols = volume_rows(results, names if isinstance(names, list) else None)
        if vols:  # the clinical endpoint (TIV for brain extraction): per attack, budget and structure
            lines += ["## Volumes", "",
                      "Predicted volume of each structure in ml (voxel count × the voxel volume of each case's spacing), "
                      "reference, clean and attacked, means over the cases; `change` is attacked − clean, in ml and in % "
                      "of the clean volume.", ""]
            lines += _table(vols, list(vols[0]))
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
    from ..safe_io import write_text

    write_text(path, "\n".join(lines))  # atomic, never through a link (issue 28)
    return path
