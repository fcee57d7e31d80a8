"""A self-contained HTML report: one ``report.html`` with every table and figure inside it.

:func:`write_html_report` renders an evaluation (:class:`~medadv.results.Results`), the papers' studies
(:class:`~medadv.studies.base.StudyResult`), a few attacked cases (:mod:`medadv.report.cases`) and
explanation-attack pairs into one HTML file: figures are PNGs drawn with matplotlib and embedded as
base64 ``data:`` URIs, the stylesheet is inline, and nothing is loaded from the network, so the file can be
mailed or archived and opens the same anywhere. The page is built from the Jinja2 templates in
``medadv/report/templates`` (``report.html.j2``, ``style.css``).

Sections (each only when there is something to show): key findings, settings, summary table, robustness
curves per attack, per-class results, attack-specific outputs, worst case per ensemble member, gradient-
masking checks, one section per study, cases, saliency.

This module draws the evaluation's sections and assembles the page; each study's section is drawn by its own
module (the ``draw`` of :func:`medadv.studies.register_study`, looked up in :mod:`medadv.report.sections`, which
``register_study`` fills; a study without one is shown as its rows) from the public building blocks of :mod:`medadv.report.blocks`.

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

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..results import DETAIL_PREFIX, ENSEMBLE_DETAILS, Results, summary_columns
from .blocks import (
    METRIC_NAMES,
    PALETTE,
    Bullets,
    Cell,
    Image,
    Section,
    StudyDrawer,
    StudyLike,
    Table,
    Text,
    bars,
    budget_sort,
    ci95,
    data_table,
    escape,
    family,
    figure_image,
    fmt,
    fmt_budget,
    fmt_ci,
    grid,
    is_nan,
    is_num,
    legend_top,
    mean_of,
    metric_label,
    pyplot,
    raw_table,
    setting_key,
    style_axes,
)
from .cases import SEG_COLOURS, Case, SaliencyPair, plot_case

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: the text a study's case figure may hold (base64 of the PNG; case_meta writes it)
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")

# the building blocks stay importable from here (`from medadv.report.html import fmt, ci95`)
__all__ = ["write_html_report", "render_html_report", "volume_rows", "StudyLike", "fmt", "fmt_budget", "fmt_ci",
           "ci95", "metric_label", "figure_image"]

def _by_family(summary: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Summary rows per attack family (``pgd@0.03`` and ``pgd@0.06`` are both ``pgd``), budgets ascending."""
    out: dict[str, list[Any]] = {}
    for r in summary:
        out.setdefault(family(r["attack"]), []).append(r)
    return {k: sorted(v, key=lambda r: budget_sort(r["budget"])) for k, v in out.items()}


# --- the evaluation (Results) ---------------------------------------------------------------------------------------
def _headline(summary: list[dict[str, Any]]) -> str | None:
    from ..tasks import headline_columns

    for m in headline_columns():  # each registered task kind's headline column
        if any(f"adv_{m}" in r for r in summary):
            return m
    return None


def _findings(results: Results, summary: list[dict[str, Any]], metric: str | None) -> list[str]:
    """The key findings (HTML of ours; every user string passes :func:`escape`): the clean metric, each attack at
    its largest budget, and the strongest attack among the in-ball attacks of one budget and norm.

    Attacks are ranked only against attacks of the same budget and norm: a non-Lp attack (no budget) or one
    whose measured perturbations left its ε-ball (:meth:`Results.ball_check`) is marked and never ranked."""
    out: list[str] = []
    if metric is None:
        return out
    from ..tasks import lower_is_better

    lower_better = lower_is_better(metric)
    name = METRIC_NAMES.get(metric, metric)
    balls = results.ball_check()
    clean = mean_of(r.get(f"clean_{metric}") for r in summary)
    out.append(f"Clean {escape(name)}: <b>{fmt(clean)}</b> on {max(int(r['n']) for r in summary)} samples.")
    for fam, rows in _by_family(summary).items():
        r = rows[-1]  # the largest budget: the clearest effect
        adv = r.get(f"adv_{metric}")
        if is_nan(adv):
            continue
        rel = ""
        if clean and clean > 0:
            change = 100 * (adv - clean) / clean
            rel = f" ({abs(change):.0f}% {'higher' if change > 0 else 'lower'})"
        if is_num(r.get("changed_fraction")):
            effect = f"; {100 * r['changed_fraction']:.1f}% of voxels changed"
        elif is_num(r.get("fooled")):
            effect = f"; {100 * r['fooled']:.0f}% of samples fooled"
        else:
            effect = ""
        at = "" if r["budget"] is None else f" at ε = {fmt_budget(r['budget'])}"
        ball = balls.get((r["attack"], r["budget"]))
        mark = "" if ball is None or ball["status"] == "in" else (
            f" <span class='warn'>{escape(Results.ball_note(ball, r['budget']))}: not ranked</span>")
        out.append(f"<b>{escape(fam)}</b>{at}: {escape(name)} {fmt(clean)} → <b>{fmt(adv)}</b>{rel}{effect}.{mark}")
    # the strongest attack: among the in-ball attacks of one norm and budget, at the largest budget where at
    # least two attack families ran (one attack alone is not "strongest" of anything)
    comparable: dict[tuple[str, float], list[tuple[float, str]]] = {}
    for r in summary:
        ball = balls.get((r["attack"], r["budget"]))
        adv = r.get(f"adv_{metric}")
        if ball is None or ball["status"] != "in" or adv is None or is_nan(adv):
            continue
        damage = float(adv) if not lower_better else -float(adv)  # the worst: lowest accuracy, largest error
        comparable.setdefault((ball["norm"], float(r["budget"])), []).append((damage, family(r["attack"])))
    ranked = [(b, norm, entries) for (norm, b), entries in comparable.items()
              if len({fam for _, fam in entries}) >= 2]
    if ranked:
        budget, norm, entries = max(ranked, key=lambda t: (t[0], t[1]))
        damage, fam = min(entries)
        sym = "L∞" if norm == "Linf" else "L2"
        value = abs(damage) if lower_better else damage
        out.append(f"Strongest attack at ε = {fmt_budget(budget)} ({sym}, {len(entries)} attacks at this budget): "
                   f"<b>{escape(fam)}</b> ({escape(name)} {fmt(value)}).")
    flags = results.masking_flags()
    if flags:
        out.append(f"<span class='warn'>{len(flags)} gradient-masking check(s) fired</span>: the robust numbers "
                   "may be too optimistic (see <a href='#masking'>Gradient-masking checks</a>).")
    return out


def _curves(results: Results, summary: list[dict[str, Any]], metric: str, class_names: Sequence[str] | None
            ) -> list[Any]:
    blocks: list[Any] = []
    rows = [r for r in summary if r["budget"] is not None and not is_nan(r.get(f"adv_{metric}"))]
    if not rows:
        return blocks
    clean = mean_of(r.get(f"clean_{metric}") for r in summary)
    fams = _by_family(rows)
    out_of_ball = {family(a) for (a, _), e in results.ball_check().items() if e["status"] == "out"}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.6, 4.0))
    for i, (fam, rs) in enumerate(fams.items()):
        ax.plot([0.0] + [float(r["budget"]) for r in rs], [clean] + [float(r[f"adv_{metric}"]) for r in rs],
                marker="o", color=PALETTE[i % len(PALETTE)], lw=1.8,
                ls=":" if fam in out_of_ball else "-" if i < len(PALETTE) else "--",
                label=fam + (" (left its ε-ball)" if fam in out_of_ball else ""))
    ax.axhline(clean, color="grey", ls="--", lw=1, label="clean")
    style_axes(ax, "budget ε (data units)", METRIC_NAMES.get(metric, metric), f"{METRIC_NAMES.get(metric, metric)} "
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
        fig, axes = grid(len(fams), 3, 3.8, 2.9)
        for ax, (fam, rs) in zip(axes, fams.items(), strict=False):
            k = len(rs[0][f"adv_{per}"])
            names = list(class_names)[:k] if class_names and len(class_names) >= k else [str(j) for j in range(k)]
            for j in _counted(results.meta, k):  # the background only when the mean Dice counts it
                c0 = mean_of(r[f"clean_{per}"][j] for r in rs)
                ys = [r[f"adv_{per}"][j] for r in rs]
                if is_nan(c0) and all(is_nan(y) for y in ys):  # a class the metric leaves out
                    continue
                ax.plot([0.0] + [float(r["budget"]) for r in rs], [c0] + [math.nan if is_nan(y) else y for y in ys],
                        marker=".", label=names[j],  # a class has the colour of its label in the case figures
                        color=SEG_COLOURS[(j - 1) % len(SEG_COLOURS)] if j else "#777777")
            style_axes(ax, "budget ε", METRIC_NAMES.get(per, per), fam)
            ax.set_ylim(-0.02, 1.02)
        legend_top(fig, axes[0])
        blocks.append(figure_image(fig, f"per-class {per} vs budget, one panel per attack",
                                   f"{METRIC_NAMES.get(per, per)} of each class against the budget, one panel per "
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
    return what, {key: ([mean_of(v) for v in c], [mean_of(v) for v in a]) for key, (c, a) in samples.items()}


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


def _largest_budgets(keys: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Per attack family its largest budget (the clearest effect); attacks without budget as they are."""
    last: dict[Any, tuple[Any, Any]] = {}
    for attack, budget in keys:
        fam = family(attack)
        if fam not in last or budget_sort(budget) > budget_sort(last[fam][1]):
            last[fam] = (attack, budget)
    return list(last.values())


def _per_class_section(results: Results, metric: str, class_names: Sequence[str] | None) -> Section | None:
    what, samples = _per_class_samples(results, metric)
    if not samples:
        return None
    vals = {key: ([mean_of(v) for v in c], [mean_of(v) for v in a]) for key, (c, a) in samples.items()}
    k = len(next(iter(vals.values()))[0])
    names = list(class_names)[:k] if class_names and len(class_names) >= k else [str(j) for j in range(k)]
    # classes the metric leaves out (e.g. the background of a Dice without it) are not drawn
    counted = _counted(results.meta, k) if what == "Dice" else list(range(k))
    keep = [j for j in counted if any(not is_nan(v) for c, a in vals.values() for v in (c[j], a[j]))]
    vals = {key: ([c[j] for j in keep], [a[j] for j in keep]) for key, (c, a) in vals.items()}
    cis = {key: ([ci95(c[j]) for j in keep], [ci95(a[j]) for j in keep]) for key, (c, a) in samples.items()}
    hd = _hd95_samples(results)
    hd = {key: ([c[j] for j in keep if j < len(c)], [a[j] for j in keep if j < len(a)]) for key, (c, a) in hd.items()}
    names, k = [names[j] for j in keep], len(keep)
    keys = _largest_budgets(vals)
    fig, axes = grid(len(keys), 3, min(6.0, max(3.4, 0.45 * k + 1.6)), 2.7)
    for ax, key in zip(axes, keys, strict=False):
        c, a = vals[key]
        bars(ax, names, [("clean", c), ("attacked", a)], what, setting_key(*key), errors=list(cis[key]))
    legend_top(fig, axes[0])
    blocks: list[Any] = [figure_image(fig, f"per-class {what}, clean vs attacked, one panel per attack",
                                      "Bars: the mean over the cases; whiskers: its 95% bootstrap confidence "
                                      "interval (wide when there are few cases).")]
    unit = _hd95_unit(results.meta)
    hd_keys = [key for key in keys if key in hd]
    if hd_keys:
        fig, axes = grid(len(hd_keys), 3, min(6.0, max(3.4, 0.45 * k + 1.6)), 2.7)
        for ax, key in zip(axes, hd_keys, strict=False):
            hc, ha = hd[key]
            bars(ax, names, [("clean", [mean_of(v) for v in hc]), ("attacked", [mean_of(v) for v in ha])],
                 f"HD95 ({unit})", setting_key(*key), None, errors=[[ci95(v) for v in hc], [ci95(v) for v in ha]])
            ax.set_ylim(bottom=0)
            grp = results.groups().get(key, [])
            if grp and all(isinstance(r.get("adv_missed"), list) for r in grp):
                for pos, j in enumerate(keep):  # a missed structure has no HD95: say so where its bar would be
                    n_missed = sum(bool(r["adv_missed"][j]) for r in grp if j < len(r["adv_missed"]))
                    if n_missed:
                        ax.text(pos, 0, f"missed {n_missed}/{len(grp)}", rotation=90, ha="left", va="bottom",
                                fontsize=7, color="#c00000")
        legend_top(fig, axes[0])
        blocks.append(figure_image(fig, "per-class HD95, clean vs attacked, one panel per attack",
                                   f"95th-percentile Hausdorff distance ({unit}) per class, mean over the cases with "
                                   "whiskers for its 95% bootstrap interval; lower is better. A case where the class is "
                                   "missing from the prediction (or from the reference) has no HD95 and is left out "
                                   "of the mean and the bar: a structure missed in every case has no bar at all. The "
                                   "table below counts them: missed (in the reference, not predicted) and absent "
                                   "(in neither), clean / attacked."))
    table_rows = []
    groups = results.groups()
    for key in sorted(vals, key=lambda kb: (str(kb[0]), budget_sort(kb[1]))):
        c, a = vals[key]
        grp = groups.get(key, [])
        counts = what == "Dice" and bool(grp) and all(
            isinstance(r.get(f"{w}_{m}"), list) for r in grp for w in ("clean", "adv") for m in ("missed", "absent"))
        for j in range(k):
            row: dict[str, Any] = {
                "attack": family(key[0]), "budget": key[1], "class": names[j], f"clean {what}": c[j],
                f"attacked {what}": a[j], "95% CI": fmt_ci(cis[key][1][j]),
                "drop": None if is_nan(c[j]) or is_nan(a[j]) else c[j] - a[j]}
            if key in hd and j < len(hd[key][0]):
                hc, ha = hd[key][0][j], hd[key][1][j]
                row.update({"clean HD95": mean_of(hc), "attacked HD95": mean_of(ha), "HD95 CI": fmt_ci(ci95(ha), 2),
                            "HD95 undefined": f"{sum(is_nan(v) for v in hc)} / {sum(is_nan(v) for v in ha)} of {len(ha)}"})
            if counts:  # missed and absent structures, which no HD95 mean counts (class index keep[j])
                for m in ("missed", "absent"):
                    row[m] = (f"{sum(bool(r['clean_' + m][keep[j]]) for r in grp)} / "
                              f"{sum(bool(r['adv_' + m][keep[j]]) for r in grp)} of {len(grp)}")
            table_rows.append(row)
    caption = f"per-class {what}" + (f" and HD95 ({unit})" if hd_keys else "") + " for every attack and budget"
    blocks.append(raw_table(table_rows, caption, collapsed=len(table_rows) > 24))
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
    order = {f: i for i, f in enumerate(dict.fromkeys(family(a) for a, _ in groups))}  # as the other figures
    for key in sorted(groups, key=lambda kb: (order[family(kb[0])], budget_sort(kb[1]), str(kb[0]))):
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
                        "reference (ml)": mean_of(col("ref_volume_ml")), "clean (ml)": mean_of(col("clean_volume_ml")),
                        "attacked (ml)": mean_of(col("adv_volume_ml")), "change (ml)": mean_of(col("volume_change_ml")),
                        "change (%)": mean_of(pct), "change % 95% CI": fmt_ci(ci95(pct), 2), "n": len(rows)})
    return out


def _volume_section(results: Results, class_names: Sequence[str] | None) -> Section | None:
    table_rows = volume_rows(results, class_names)
    if not table_rows:
        return None
    blocks: list[Any] = []
    classes = list(dict.fromkeys(r["class"] for r in table_rows))
    budgeted = [r for r in table_rows if is_num(r["budget"])]
    if budgeted:  # volume change against the budget, one line per attack, one panel per class
        shown = classes[:6]
        fig, axes = grid(len(shown), 3, 4.2, 3.0)
        fams = list(dict.fromkeys(family(r["attack"]) for r in budgeted))
        for ax, name in zip(axes, shown, strict=False):
            for i, fam in enumerate(fams):
                rs = sorted((r for r in budgeted if r["class"] == name and family(r["attack"]) == fam),
                            key=lambda r: budget_sort(r["budget"]))
                if rs:
                    ax.plot([0.0] + [float(r["budget"]) for r in rs], [0.0] + [r["change (%)"] for r in rs],
                            marker="o", lw=1.6, color=PALETTE[i % len(PALETTE)], label=fam,
                            ls="-" if i < len(PALETTE) else "--")
            ax.axhline(0.0, color="grey", lw=0.8, ls="--")
            style_axes(ax, "budget ε (data units)", "volume change (%)", str(name))
        legend_top(fig, axes[0])
        blocks.append(figure_image(fig, "volume change (%) vs budget, one line per attack, one panel per class",
                                   "The mean change of each class's predicted volume, attacked − clean, in % of the "
                                   "clean volume; 0 at ε = 0. Below 0: the attack shrank the structure."))
    shown_rows = [{**r, "attack": family(r["attack"])} for r in table_rows]  # the budget has its own column
    blocks.append(data_table(shown_rows, list(table_rows[0]),
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
    values = {key: [float(r[f"adv_{metric}"]) for r in rows if not is_nan(r.get(f"adv_{metric}"))]
              for key, rows in groups.items()}
    if not values or max(len(v) for v in values.values()) < 3:
        return None
    if all(v in (0.0, 1.0) for vs in values.values() for v in vs):
        return None
    keys = [(r["attack"], r["budget"]) for rs in _by_family(summary).values() for r in rs]
    if len(keys) > 10:
        keys = _largest_budgets(keys)
    first = next(iter(groups.values()))
    clean = [float(r[f"clean_{metric}"]) for r in first if not is_nan(r.get(f"clean_{metric}"))]
    data = [clean] + [values.get(k, []) for k in keys]
    labels = ["clean"] + [setting_key(*k) for k in keys]
    plt = pyplot()
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
    fams = list(dict.fromkeys(family(k[0]) for k in keys))
    colours = ["#BBBBBB"] + [PALETTE[fams.index(family(k[0])) % len(PALETTE)] for k in keys]
    for patch, colour in zip(box["boxes"], colours, strict=True):
        patch.set_facecolor(colour)
        patch.set_alpha(0.75)
    for y, vs in zip(pos, data, strict=True):  # every case as a dot: with few cases the box alone misleads
        ax.scatter(vs, [y] * len(vs), s=7, color="#222222", alpha=0.5, zorder=3)
    ax.set_yticks(pos)
    ax.set_yticklabels(labels, fontsize=8)
    name = METRIC_NAMES.get(metric, metric)
    style_axes(ax, f"{name} per case", "", f"{name} per case: spread over the {len(clean)} cases")
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
                   if is_num(r.get(f"clean_{col}")) and is_num(r.get(f"adv_{col}"))]
            if pts:
                series.append((k, pts))
        if not series:
            continue
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(5.4, 4.6))
        top = max(max(max(p) for p in pts) for _, pts in series)
        ax.plot([0.0, top], [0.0, top], color="grey", ls="--", lw=1, label="unchanged")
        for j, (k, pts) in enumerate(series):
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, alpha=0.7, color=PALETTE[j % len(PALETTE)],
                       label=setting_key(*k))
        name = metric_label(col)
        style_axes(ax, f"clean {name}", f"attacked {name}", f"{name} per case: clean vs attacked")
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
        row = {"attack": family(r["attack"]), "budget": r["budget"]}
        if metric:
            c, a = r.get(f"clean_{metric}"), r.get(f"adv_{metric}")
            row.update({f"clean_{metric}": c, f"adv_{metric}": a,
                        f"adv_{metric}_ci95": fmt_ci(ci95(x.get(f"adv_{metric}")
                                                          for x in groups.get((r["attack"], r["budget"]), []))),
                        "change": None if is_nan(c) or is_nan(a) else a - c})
        if isinstance(r.get("clean_hd95"), list) and isinstance(r.get("adv_hd95"), list):
            # over the classes the mean Dice counts (HD95 is computed for the background too)
            keep = _counted(results.meta, len(r["clean_hd95"]))
            row.update({f"{w}_hd95": mean_of(r[f"{w}_hd95"][j] for j in keep if j < len(r[f"{w}_hd95"]))
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
    table = data_table(compact, ccols, "Means over the samples (budget ε in data units; hover a column name for its "
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
    blocks.append(data_table(rows, cols, "every mean column, per attack and budget", collapsed=True))
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
                                "per-sample outputs).", [data_table(drows, ["attack", "budget", *details, "n"])]))
    ensemble = results.ensemble_table()
    if ensemble:
        m = next(c for c in ensemble[0] if c.startswith("robust_"))
        sections.append(Section("ensemble", "Worst case after each ensemble member",
                                f"For ensemble attacks (<code>auto</code>): the mean {metric_label(m.removeprefix('robust_'))} "
                                "after each member, keeping per sample the worst case so far; <i>gain</i> is how "
                                "much the member lowered it, <i>attacked</i> the samples it ran on.",
                                [data_table(ensemble, ["attack", "budget", "member", m, "gain", "attacked", "seconds",
                                            "n"])]))
    worst_of = results.worst_of_table()
    if worst_of:
        sections.append(Section("worst-of", "Worst case of each metric",
                                "For <code>auto</code> on segmentation: the mean of each metric's own worst case "
                                "over the members (<i>worst_…</i>, possibly from different members, as a paper "
                                "reporting each metric's worst case does) next to the example kept, the worst by "
                                "the selection metric (<i>adv_…</i>).",
                                [data_table(worst_of, list(worst_of[0]))]))
    flags = results.masking_flags()
    if flags:
        sections.append(Section("masking", "Gradient-masking checks",
                                "<span class='warn'>These checks fired: the attacks may have failed for a reason "
                                "other than robustness, so the robust metric may be overestimated.</span>",
                                [data_table(flags, ["attack", "budget", "check", "samples", "message"])]))
    elif ensemble:
        sections.append(Section("masking", "Gradient-masking checks",
                                "No check fired (randomised outputs, probability outputs, zero gradients, "
                                "black-box beating white-box, non-monotone budgets, unbounded attack not "
                                "reaching the floor)."))
    return sections


# --- studies: the dispatch to each study's drawer (medadv.studies.register_study) --------------------------------------------------------------------------------------------------
def _study_generic(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    return Section(f"study-{study.study}", f"Study: {study.study}", "",
                   [raw_table(study.rows, f"rows of the {study.study} study", collapsed=False)])


def _drawer(name: str) -> StudyDrawer:
    """The registered drawer of study ``name`` (its ``register_study(..., draw=)``); the raw rows without one."""
    # the report's own registry, which register_study fills (the report lies below the studies: no import of them)
    from .sections import section_drawer

    return section_drawer(name) or _study_generic


def _study_section(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    fn = _drawer(study.study)
    try:
        sec = fn(study, class_names)
    except (KeyError, TypeError, ValueError, IndexError) as err:  # rows not per the conventions: show them raw
        sec = _study_generic(study, class_names)
        sec.intro = (f"<span class='warn'>Could not draw this study's figures ({type(err).__name__}: {escape(err)}); its rows "
                     "are shown as they are.</span>")
    notes = study.meta.get("notes") if isinstance(study.meta, Mapping) else None
    shown = {i for b in sec.blocks if isinstance(b, Bullets) for i in b.items}
    extra = [escape(n) for n in notes or () if escape(n) not in shown]
    if extra:  # what the numbers depend on (VAFA's renormalisation): said in every study that ran it
        sec.blocks.insert(0, Bullets(extra, "warn"))
    note = study.meta.get("note") if isinstance(study.meta, Mapping) else None
    if isinstance(note, str) and note:  # the config's `note:` (a recipe's reading against the paper), escaped
        sec.blocks.insert(0, Text([note]))
    if isinstance(study.meta, Mapping) and "cases" in study.meta:  # a study's own case figures (case_meta)
        sec.blocks += _study_cases(study.meta["cases"])
    title = study.meta.get("title") if isinstance(study.meta, Mapping) else None
    if title:  # a config's `title:` (a paper's "Table 2"): the heading, with the study's own name after it
        sec.title = f"{title} — {sec.title}"
    return sec


def _study_cases(entries: Any) -> list[Any]:
    """One figure per entry of a study's ``meta["cases"]`` (:func:`~medadv.report.cases.case_meta`), after the
    study's own blocks; entries that are not ``{title, png, width, height}`` with base64 PNG text are counted in a
    warning instead (the page never embeds anything else)."""
    items = entries if isinstance(entries, list) else [entries]
    blocks: list[Any] = []
    bad = 0
    for e in items:
        ok = (isinstance(e, Mapping) and isinstance(e.get("png"), str) and _BASE64.fullmatch(e["png"]) is not None
              and all(isinstance(e.get(k), int) and not isinstance(e.get(k), bool) and e[k] > 0
                      for k in ("width", "height")))
        if not ok:
            bad += 1
            continue
        blocks.append(Image("data:image/png;base64," + e["png"], e["width"], e["height"],
                            f"case: {e.get('title') or ''}", str(e.get("note") or "")))
    if bad:
        blocks.append(Bullets([f"{bad} case figure(s) of this study could not be shown: not an image entry "
                               "{title, note, png, width, height}."], "warn"))
    return blocks


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
    # intros and findings hold a little markup of ours (<b>, <i>, links) with every user string escaped (escape);
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
