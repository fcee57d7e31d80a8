"""A tidy results table: one row per (sample, attack, budget), with summary and export.

Rows are plain dicts of JSON-serialisable values, so a long evaluation can append them to a JSON
Lines file as it goes and resume after a crash without losing or duplicating rows.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["Results", "DETAIL_PREFIX", "ENSEMBLE_COLUMN", "SAVED_PREFIX", "COLUMN_LEGEND", "summary_columns",
           "json_safe", "csv_safe", "BALL_TOLERANCE"]

KEY = ("sample", "attack", "budget")
#: per-sample columns that are identifiers, not quantities: never averaged
ID_COLUMNS = ("case_id", "config", "data", "saved_file")
#: prefix of the columns about the adversarial examples written to files and read back (``save_adversarial``)
SAVED_PREFIX = "saved_"
#: what the outcome columns mean (printed under the summary; in a summary each is the fraction of samples)
COLUMN_LEGEND = {
    "fooled": "the attack's own success test on its output (untargeted: wrong against the label, so samples "
              "already wrong before the attack count; segmentation: mean Dice below the task's dice_threshold, "
              "0.5 by default; targeted: target reached)",
    "changed": "the prediction differs from the clean prediction (segmentation: its mean Dice against the clean "
               "prediction is below the task's dice_threshold, not a single voxel)",
    "dice_to_clean": "mean Dice of the adversarial segmentation against the clean one (1: unchanged)",
    "flipped": "right before the attack and wrong after: the errors the attack caused",
    "flip_rate": "fraction of the labels whose prediction changed",
    "changed_fraction": "fraction of the voxels whose prediction changed",
    "saved_fooled": "the attack's success test on the adversarial example written to a file and read back",
    "saved_still_fooled": "fooled before saving and after reading the file back: the attack survives the file "
                          "format's quantisation",
    "saved_changed": "the prediction of the re-loaded file differs from the clean prediction",
    "saved_linf": "L-inf size of the perturbation as stored in the file (data units)",
    "saved_adv_correct": "the re-loaded file is classified correctly",
    "saved_adv_exact_match": "every label of the re-loaded file is right",
    "saved_adv_mean_dice": "mean Dice of the re-loaded file's segmentation",
}
#: the per-member worst-case metric of an ensemble (``auto``): rows holding it get :meth:`Results.ensemble_table`
ENSEMBLE_COLUMN = "attack_metric_after"
#: detail columns of ``auto`` shown by the ensemble and masking tables instead of the generic means
ENSEMBLE_DETAILS = ("attack_metric_after", "attack_attacked", "attack_seconds", "attack_components", "attack_metric",
                    "attack_worst_of", "attack_worst_of_columns",
                    "attack_masking", "attack_masking_messages")
#: prefix of the columns that hold an attack's declared per-sample outputs (``AttackDetails.columns``)
DETAIL_PREFIX = "attack_"
#: relative excess of a measured perturbation norm over its budget still counted inside the ε-ball (the float32
#: rounding of ``x + δ − x`` on data of large values, e.g. HU, is far below it)
BALL_TOLERANCE = 1e-3


def json_safe(value: Any) -> Any:
    """``value`` with every NaN / ±Inf float (nested in dicts, lists and tuples) replaced by ``None``.

    JSON has no NaN or Infinity: Python's ``json`` writes the bare tokens ``NaN`` / ``Infinity``, which strict
    parsers (JavaScript's ``JSON.parse``, ``jq``, Go, Rust's serde, pandas' ``engine="pyarrow"``) reject, so one
    undefined metric (HD95 of an absent class, an AUC of a constant label) would make the whole file
    unreadable to them. Written as ``null``, it reads back as ``None``, which every summary skips as it skips
    NaN. Tuples become lists (as ``json`` writes them anyway).
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


#: first characters that make a spreadsheet read a cell as a formula (OWASP's CSV-injection list)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value: Any) -> Any:
    """``value`` for a CSV cell: a string a spreadsheet would evaluate (``=HYPERLINK(...)``, ``@SUM``, ``-1+2``)
    gets a leading ``'``, which spreadsheets show as text (results.json keeps every value as it is); numbers and
    other strings are unchanged."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def _dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`json_safe` ``(value)``; ``allow_nan=False`` makes a missed non-finite value an
    error here rather than invalid JSON in a file."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


def _mean(values: Iterable[float | None]) -> float:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(vals) / len(vals) if vals else float("nan")


def _columns(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Every column of ``rows`` in order of first appearance."""
    seen: dict[str, None] = {}
    for r in rows:
        for c in r:
            seen.setdefault(c, None)
    return list(seen)


def _clean_metric(row: dict[str, Any], metric: str) -> float | None:
    if metric == "worst-of":  # auto's selection by the mean of several metrics (segmentation)
        vals = [row.get("clean_" + c) for c in row.get(DETAIL_PREFIX + "worst_of_columns") or []]
        nums = [float(v) for v in vals if v is not None]
        return None if not nums or len(nums) != len(vals) else sum(nums) / len(nums)
    from .tasks import robust_metric_columns

    v = row.get("clean_" + robust_metric_columns().get(metric, metric))
    return None if v is None else float(v)


def summary_columns(table: list[dict[str, Any]]) -> list[str]:
    """The columns of a summary table: the union over its rows, ``attack_*`` columns after the metrics,
    ``n`` last."""
    cols = [c for c in _columns(table) if c != "n"]
    return [c for c in cols if not c.startswith(DETAIL_PREFIX)] + \
        [c for c in cols if c.startswith(DETAIL_PREFIX)] + ["n"]


class Results:
    """Rows of an evaluation. Columns depend on the task; the key is ``(sample, attack, budget)``.

    Common columns: ``sample`` (number in the data's order), ``case_id`` (the case identifier of a
    dictionary batch, else the sample number as a string), ``attack``, ``budget`` (data units, None for
    attacks without an ε-ball), ``config`` (the settings fingerprint), ``data`` (the sample's hash),
    ``linf``, ``l2``, and three outcome columns that answer different questions:

    * ``fooled``: the attack's own success test on its output. Untargeted, it is the task's "wrong"
      test against the label (multi-class: arg-max not the label; multi-label: some label wrong;
      segmentation: mean Dice below the task's threshold), so a sample the model already got wrong
      counts as fooled even if the attack changed nothing; targeted: the target was reached.
    * ``changed``: the adversarial prediction differs from the clean prediction (any class or label;
      segmentation: mean Dice against the clean prediction below the task's ``dice_threshold``, with
      ``changed_fraction`` and ``dice_to_clean`` for the size of the change) — the attack moved the output.
    * ``flipped``: right before the attack and wrong after (the untargeted test against the true label) —
      the errors the attack caused. Untargeted, ``fooled`` minus ``flipped`` are the samples wrong both
      before and after the attack.

    Task-specific metrics are prefixed ``clean_``/``adv_`` (``clean_correct``/``adv_correct``,
    ``*_exact_match``, ``*_mean_dice``, ...); ``clean_pred``, ``adv_pred`` hold the predictions. Runs
    with ``save_adversarial`` add ``saved_*`` columns (:data:`COLUMN_LEGEND`). The per-sample outputs an
    attack declares in its typed details (``AttackDetails.columns``) are prefixed ``attack_`` (DAG:
    ``attack_iterations``, ``attack_fooled_fraction``; saliency attacks: ``attack_map_ssim``,
    ``attack_admissible``, ...); rows of other attacks do not have them.
    """

    def __init__(self, rows: Iterable[dict[str, Any]] = (), meta: dict[str, Any] | None = None) -> None:
        self.rows: list[dict[str, Any]] = list(rows)
        self.meta: dict[str, Any] = dict(meta or {})

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def keys(self) -> set[tuple]:
        return {tuple(r[k] for k in KEY) for r in self.rows}

    def extend(self, rows: Iterable[dict[str, Any]]) -> None:
        self.rows.extend(rows)

    def groups(self) -> dict[tuple[str, Any], list[dict[str, Any]]]:
        out: dict[tuple[str, Any], list[dict[str, Any]]] = {}
        for r in self.rows:
            out.setdefault((r["attack"], r["budget"]), []).append(r)
        return out

    # --- summary ---------------------------------------------------------------------------------------------
    def summary(self) -> list[dict[str, Any]]:
        """One row per (attack, budget): means of the numeric per-sample columns, plus AUCs (``clean_macro_auc``,
        ``adv_macro_auc``: multi-label, the mean of the per-label AUCs; multi-class, the macro one-vs-rest AUC of
        the class scores; a label or class whose AUC is undefined on these rows is left out of the mean).

        Booleans average to fractions; list columns (per class, per label) average element-wise;
        ``None`` (NaN) values are left out of a mean. Attack-specific ``attack_*`` columns are averaged
        over the rows of the attacks that have them.
        """
        from .metrics.classification import macro_auc, multiclass_auc

        table = []
        for (attack, budget), rows in self.groups().items():
            row: dict[str, Any] = {"attack": attack, "budget": budget, "n": len(rows)}
            for col in _columns(rows):
                if col in KEY or col in ID_COLUMNS or col.endswith("_pred") or col.endswith("_scores") \
                        or col == "label":
                    continue
                val = next((r[col] for r in rows if r.get(col) is not None), None)
                if isinstance(val, bool | int | float) or val is None:
                    row[col] = _mean([None if r.get(col) is None else float(r[col]) for r in rows])
                elif isinstance(val, list) and val and all(isinstance(v, int | float) or v is None for v in val):
                    present = [r[col] for r in rows if isinstance(r.get(col), list) and len(r[col]) == len(val)]
                    cols = list(zip(*present, strict=True))
                    row[col] = [_mean([None if v is None else float(v) for v in c]) for c in cols]
            if "clean_scores" in rows[0] and "label" in rows[0] and isinstance(rows[0]["label"], list):
                labels = torch.tensor([r["label"] for r in rows], dtype=torch.float64)
                for which in ("clean", "adv"):
                    scores = torch.tensor([r[f"{which}_scores"] for r in rows], dtype=torch.float64)
                    row[f"{which}_macro_auc"] = float(macro_auc(scores, labels))
            elif "clean_scores" in rows[0] and isinstance(rows[0].get("label"), int) \
                    and isinstance(rows[0]["clean_scores"], list):
                # multi-class: macro one-vs-rest AUC of the class scores (a class absent from the labels is skipped)
                idx = torch.tensor([r["label"] for r in rows], dtype=torch.long)
                for which in ("clean", "adv"):
                    scores = torch.tensor([r[f"{which}_scores"] for r in rows], dtype=torch.float64)
                    row[f"{which}_macro_auc"] = float(multiclass_auc(scores, idx))
            table.append(row)
        return table

    # --- worst-case ensembles (``auto``) ------------------------------------------------------------------------
    def ensemble_table(self) -> list[dict[str, Any]]:
        """Per (attack, budget) of an ensemble (rows with ``attack_metric_after``, e.g. ``auto``), one row per
        member in order (after a ``(clean)`` row): the mean robust metric after it, how much it lowered the metric (``gain``), the
        samples it attacked (those not yet at the floor) and its total time in seconds."""
        table = []
        for (attack, budget), rows in self.groups().items():
            rows = [r for r in rows if isinstance(r.get(ENSEMBLE_COLUMN), list)]
            if not rows:
                continue
            names = rows[0].get(DETAIL_PREFIX + "components") or []
            metric = rows[0].get(DETAIL_PREFIX + "metric") or "metric"
            k = len(rows[0][ENSEMBLE_COLUMN])
            clean = _mean([_clean_metric(r, metric) for r in rows])
            table.append({"attack": attack, "budget": budget, "member": "(clean)", f"robust_{metric}": clean,
                          "gain": None, "attacked": None, "seconds": None, "n": len(rows)})
            previous = clean
            for j in range(k):
                after = _mean([r[ENSEMBLE_COLUMN][j] for r in rows])
                table.append({
                    "attack": attack, "budget": budget, "member": names[j] if j < len(names) else str(j),
                    f"robust_{metric}": after, "gain": previous - after,
                    "attacked": sum(bool(r[DETAIL_PREFIX + "attacked"][j]) for r in rows),
                    "seconds": sum(float(r[DETAIL_PREFIX + "seconds"][j] or 0.0) for r in rows),
                    "n": len(rows),
                })
                previous = after
        return table

    def worst_of_table(self) -> list[dict[str, Any]]:
        """Per (attack, budget) of an ensemble that records per-metric worst cases (``auto`` on segmentation): the
        mean of each metric's own worst case over the members (``worst_<column>``, possibly from different
        members) next to the mean of the example kept (``adv_<column>``, the worst by the selection metric)."""
        table = []
        for (attack, budget), rows in self.groups().items():
            rows = [r for r in rows if isinstance(r.get(DETAIL_PREFIX + "worst_of"), list)]
            if not rows:
                continue
            names = rows[0].get(DETAIL_PREFIX + "worst_of_columns") or []
            row: dict[str, Any] = {"attack": attack, "budget": budget, "selected by": rows[0].get(DETAIL_PREFIX + "metric")}
            for i, c in enumerate(names):
                row[f"worst_{c}"] = _mean(r[DETAIL_PREFIX + "worst_of"][i] for r in rows)
                row[f"adv_{c}"] = _mean(r.get(f"adv_{c}") for r in rows)
            row["n"] = len(rows)
            table.append(row)
        return table

    def masking_flags(self) -> list[dict[str, Any]]:
        """The gradient-masking flags of the table (:mod:`medadv.masking`): per (attack, budget), each check
        that fired on some batch (with the number of samples in those batches and its explanation), and the
        robust metric of an attack not falling as the budget grows."""
        from .masking import monotone_flags

        out: list[dict[str, Any]] = []
        for (attack, budget), rows in self.groups().items():
            seen: dict[str, dict[str, Any]] = {}
            for r in rows:
                ids = r.get(DETAIL_PREFIX + "masking") or []
                messages = r.get(DETAIL_PREFIX + "masking_messages") or [""] * len(ids)
                for check, message in zip(ids, messages, strict=False):
                    entry = seen.setdefault(check, {"attack": attack, "budget": budget, "check": check,
                                                    "samples": 0, "message": message})
                    entry["samples"] += 1
            out.extend(seen.values())
        for flag in monotone_flags(self):
            out.append({"attack": flag.attack, "budget": None, "check": flag.check, "samples": None,
                        "message": flag.message})
        return out

    def norm_of(self, attack: str) -> str | None:
        """The threat class (``"Linf"``, ``"L2"``) of ``attack``'s budget: :func:`~medadv.evaluate` records it in
        ``meta["norms"]`` (None: an attack on the data box only); a config run's ``threat.norm`` for tables
        written before that; else None (unknown)."""
        norms = self.meta.get("norms")
        if isinstance(norms, dict) and attack in norms:
            return norms[attack]
        settings = self.meta.get("settings")
        threat = settings.get("threat") if isinstance(settings, dict) else None
        norm = threat.get("norm") if isinstance(threat, dict) else None
        return {"linf": "Linf", "l2": "L2"}.get(str(norm).lower()) if norm is not None else None

    def ball_check(self) -> dict[tuple[str, Any], dict[str, Any]]:
        """Per (attack, budget): whether every measured perturbation lies in the attack's ε-ball.

        Each entry: ``norm`` (``"Linf"``/``"L2"``; ``"Linf"`` when unknown, the one norm whose excess means
        an excess under both, as L∞ <= L2), ``max_norm`` (the largest measured perturbation in it, data units)
        and ``status``: ``"in"``, ``"out"`` (some row exceeds the budget by more than
        :data:`BALL_TOLERANCE` relative, e.g. an attack whose renormalisation leaves the ball) or
        ``"no ball"`` (no budget: an attack declaring a non-Lp threat, such as a quantisation). Attacks of
        ``"out"`` and ``"no ball"`` are not comparable with Lp attacks at a budget: reports never rank them.
        """
        out: dict[tuple[str, Any], dict[str, Any]] = {}
        for (attack, budget), rows in self.groups().items():
            norm = self.norm_of(attack) or "Linf"
            col = "l2" if norm == "L2" else "linf"
            vals = [float(r[col]) for r in rows if isinstance(r.get(col), int | float)]
            worst = max(vals) if vals else None
            if budget is None:
                status = "no ball"
            elif worst is not None and worst > float(budget) * (1 + BALL_TOLERANCE) + 1e-12:
                status = "out"
            else:
                status = "in"
            out[(attack, budget)] = {"norm": norm, "max_norm": worst, "status": status}
        return out

    @staticmethod
    def ball_note(entry: dict[str, Any], budget: Any) -> str:
        """The ε-ball status in words: ``in``, ``OUT of the ε-ball (max L∞ 4052 > ε 8)``, ``no ε-ball (not an
        Lp threat)``."""
        if entry["status"] == "no ball":
            return "no ε-ball (not an Lp threat)"
        if entry["status"] == "out":
            sym = "L∞" if entry["norm"] == "Linf" else "L2"
            return f"OUT of the ε-ball (max {sym} {entry['max_norm']:.4g} > ε {float(budget):.4g})"
        return "in"

    def detail_columns(self) -> list[str]:
        """The attack-specific (``attack_*``) columns present in the table, in order of appearance."""
        return [c for c in _columns(self.rows) if c.startswith(DETAIL_PREFIX)]

    def format_summary(self, columns: list[str] | None = None, digits: int = 3) -> str:
        """The summary as aligned text (lists are shown element-wise).

        By default: one table of the metric columns of every attack, then, if any attack declared
        per-sample outputs, a second table of their per-attack means (the ``attack_*`` columns, ``-`` for
        an attack without that column). ``columns`` gives one table of exactly those columns.
        """
        table = self.summary()
        if not table:
            return "(no results)"

        def fmt(v: Any) -> str:
            if isinstance(v, float):
                return "nan" if math.isnan(v) else f"{v:.{digits}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{digits}f}"
            if isinstance(v, list):
                return "[" + " ".join(fmt(x) for x in v) + "]"
            return "-" if v is None else str(v)

        def block(rows: list[dict[str, Any]], cols: list[str]) -> str:
            cells = [[fmt(r.get(c)) for c in cols] for r in rows]
            widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
            lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
            lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
            return "\n".join(lines)

        if columns is not None:
            return block(table, columns)
        cols = summary_columns(table)
        details = [c for c in cols if c.startswith(DETAIL_PREFIX)]
        saved = [c for c in cols if c.startswith(SAVED_PREFIX)]
        out = block(table, [c for c in cols if c not in details and c not in saved])
        legend = self.legend([c for c in cols if c not in saved])
        if legend:
            out += "\n\n" + legend
        if saved:
            rows = [r for r in table if any(c in r for c in saved)]
            out += "\n\nadversarial examples saved to files, read back and re-predicted:\n" + block(
                rows, ["attack", "budget", "fooled", *saved, "n"])
            out += "\n\n" + self.legend(saved)
        details = [c for c in details if c not in ENSEMBLE_DETAILS]
        if details:
            rows = [r for r in table if any(c in r for c in details)]
            out += "\n\nattack-specific outputs (means):\n" + block(rows, ["attack", "budget", *details, "n"])
        ensemble = self.ensemble_table()
        if ensemble:
            metric = next(c for c in ensemble[0] if c.startswith("robust_"))
            out += "\n\nworst case after each member (ensemble):\n" + block(
                ensemble, ["attack", "budget", "member", metric, "gain", "attacked", "seconds"])
        flags = self.masking_flags()
        if flags:
            out += "\n\ngradient-masking checks that fired (the evaluation may overestimate robustness):\n"
            out += "\n".join(f"- {f['attack']} @ {fmt(f['budget'])}: {f['check']}: {f['message']}" for f in flags)
        return out

    @staticmethod
    def legend(columns: Iterable[str]) -> str:
        """One line per outcome column among ``columns`` saying what it means (:data:`COLUMN_LEGEND`); the
        summary shows each as the fraction of samples."""
        cols = [c for c in columns if c in COLUMN_LEGEND]
        if not cols:
            return ""
        width = max(map(len, cols))
        return "\n".join(f"{c.ljust(width)}  {COLUMN_LEGEND[c]}" for c in cols)

    def __str__(self) -> str:
        return self.format_summary()

    # --- export ----------------------------------------------------------------------------------------------
    def to_json(self, path: str | os.PathLike) -> None:
        """Write the table atomically: a crash mid-write leaves the previous file, never a truncated one.

        NaN / ±Inf values are written as ``null`` (:func:`json_safe`: the file stays valid, strict JSON) and
        read back by :meth:`from_json` as ``None``, which the summaries treat as NaN (left out of means).
        """
        from .safe_io import write_text

        # a temporary file renamed over `path`, never written through a link (issue 28)
        write_text(path, _dumps({"meta": self.meta, "rows": self.rows}, indent=1))

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> Results:
        try:
            data = json.loads(Path(path).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:  # the file's name, not only "line 1 column 1"
            raise ValueError(f"{path}: not a results file written by Results.to_json (not valid JSON: {e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError(f"{path}: not a results file written by Results.to_json (no list of `rows`)")
        return cls(data["rows"], data.get("meta"))

    def to_csv(self, path: str | os.PathLike) -> None:
        from .safe_io import open_output

        cols = _columns(self.rows)
        with open_output(path, "w", newline="") as fh:  # atomic, never through a link (issue 28)
            w = csv.DictWriter(fh, fieldnames=[csv_safe(c) for c in cols])
            w.writeheader()
            for r in self.rows:
                # list cells as JSON (NaN as null, as in results.json); scalar NaN stays csv's "nan"; text cells
                # a spreadsheet would run as a formula start with ' (csv_safe)
                w.writerow({csv_safe(k): _dumps(v) if isinstance(v, list | dict) else csv_safe(v)
                            for k, v in r.items()})

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    # --- incremental log -----------------------------------------------------------------------------------------
    @classmethod
    def read_log(cls, path: str | os.PathLike) -> Results:
        """Rows from a JSON Lines log; a truncated last line (crash mid-write) is dropped.

        A row repeated with the same key, settings fingerprint (``config``) and sample data hash (``data``) is
        kept once; rows of the same key from other settings or other data are all kept (``evaluate`` picks
        those of its own settings and data).
        """
        rows, seen = [], set()
        p = Path(path)
        if p.is_file():
            for i, line in enumerate(p.read_text().splitlines(), 1):
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(r, dict) or any(c not in r for c in KEY):  # not a row evaluate() wrote
                    lacks = ", ".join(c for c in KEY if not isinstance(r, dict) or c not in r)
                    raise ValueError(f"{p}, line {i}: not a row of medadv's log (it lacks {lacks}); medadv resumes only "
                                     "from its own logs: remove the line, or give another output folder")
                k = (*(r[c] for c in KEY), r.get("config"), r.get("data"))
                if k not in seen:
                    seen.add(k)
                    rows.append(r)
        return cls(rows)

    @staticmethod
    def append_log(path: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> None:
        """Append ``rows`` to a JSON Lines log, one strict-JSON object per line (NaN / ±Inf as ``null``, as in
        :meth:`to_json`), flushed to disk."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        # a crash mid-write can leave a partial line: start a fresh line if needed
        needs_newline = False
        if p.is_file() and p.stat().st_size > 0:
            with open(p, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                needs_newline = fh.read(1) != b"\n"
        from .safe_io import open_output

        with open_output(p, "a") as fh:  # O_NOFOLLOW, a regular file of one link, flushed to disk (issue 28)
            if needs_newline:
                fh.write("\n")
            for r in rows:
                fh.write(_dumps(r) + "\n")
