"""Transfer (black-box) attacks: crafted on surrogate models, applied to target models (Paschali et al. 2018;
Malik et al. 2024).

Each attack instance is run once per surrogate and batch; the adversarial batch it returns is then fed to
every target. The table has one row per (attack, budget, surrogate, target): the target's clean metric, its
metric on the transferred examples, their drop (``drop_points = 100 (clean − adv)``, Paschali's "% Drop" in
percentage points, and ``drop_pct = 100 (clean − adv) / clean``, the relative drop) and the fooling rate (the
target's ``task.fooled`` on them: untargeted, the prediction left the label; targeted, it reached the target).
When a surrogate is also a target (the same object), that cell is the white-box result. The rows of one attack
are Paschali et al.'s Table 2 block (evaluated model × source model). With ``hd95=True`` (segmentation) each
row also has the target's HD95 clean and on the transferred examples (Malik et al.'s transfer tables: DSC and
HD95).

``meta["summary"]`` gives Paschali et al.'s per-target summary: ``avg`` = the unweighted mean of the
target's adversarial metric over every black-box (attack, budget, surrogate) cell, ``drop_points`` =
``100 · (clean − avg)`` (percentage points, as in their Table 1), ``drop_pct`` the relative drop, and
``avg_all_cells`` / ``drop_points_all_cells`` with the white-box diagonal included (their Table 1's Avg).

With ``noise=`` (Paschali et al.'s Table 1 "Noise" column) every sample also gets one random-noise draw
(Gaussian or Rician, :func:`~medadv.studies.corruptions.match_noise`) whose SSIM (or L2 distance) to the clean
sample equals the mean SSIM of that sample's adversarial examples over every (attack, surrogate): spec 001 §3's
pooled mean, the same for every target. The one noisy batch is evaluated on every target, and the summary
gains each target's ``noise`` metric. With ``cases=k`` the first batch gives report figures of the examples
transferred from one surrogate, drawn with each *target's* predictions (Paschali et al.'s Fig. 2, Malik et
al.'s Figs. 2/7), and with ``noise=`` the noisy image on each target too (``meta["cases"]``,
:func:`~medadv.report.cases.case_meta`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict, model_validator
from torch import Tensor, nn

from ..attack_cache import craft
from ..config_schema import entry_label
from ..metrics.image import ssim
from ..params import closest
from ..report.blocks import (
    Section,
    StudyLike,
    data_table,
    figure_image,
    fmt,
    grid,
    group_rows,
    heatmap,
    is_nan,
    raw_table,
    setting_key,
    study_metric,
)
from ..runtime import model_device
from ..schema_base import _Section
from ..tasks import Task
from ._common import (
    AttackSpec,
    TargetFn,
    batches,
    check_models,
    check_targets,
    check_task,
    forward,
    is_targeted,
    mean,
    named_attacks,
    robust_metric,
    target_for,
)
from .base import StudyResult
from .corruptions import _win, match_noise
from .registry import Int, StudySpec, pick_models, register_study

__all__ = ["transfer", "transfer_summary", "TransferCases"]

#: the noise models of the noise column (Paschali et al.: Gaussian for photographs, Rician for MRI magnitude)
NOISES = ("gaussian", "rician")


def transfer_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target: ``clean``, ``avg`` (mean ``adv`` over its black-box cells: white-box rows, where the surrogate is
    the target itself, are left out), ``drop_points = 100 (clean − avg)`` and ``drop_pct = 100 (clean − avg) /
    clean`` (relative); ``avg_all_cells`` / ``drop_points_all_cells``: the same over every cell including the
    white-box diagonal (Paschali et al.'s Table 1 "Avg" is the plain mean of the 9 Table 2 cells, diagonal
    included)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = out.setdefault(r["target"], {"target": r["target"], "clean": r["clean"], "values": [], "all": []})
        if r["adv"] is not None:
            entry["all"].append(r["adv"])
            if not r.get("white_box", False):
                entry["values"].append(r["adv"])
    table = []
    for entry in out.values():
        vals, every = entry.pop("values"), entry.pop("all")
        avg = sum(vals) / len(vals) if vals else None
        avg_all = sum(every) / len(every) if every else None
        clean = entry["clean"]
        drops = _drops(clean, avg) if avg is not None and clean is not None else \
            {"drop_points": None, "drop_pct": None}
        table.append({**entry, "avg": avg, **drops, "cells": len(vals), "avg_all_cells": avg_all,
                      "drop_points_all_cells": None if avg_all is None or clean is None else 100.0 * (clean - avg_all)})
    return table


def _drops(clean: float, adv: float) -> dict[str, float | None]:
    """``drop_points = 100 (clean − adv)`` (Paschali's "% Drop", percentage points) and ``drop_pct =
    100 (clean − adv) / clean`` (relative drop in percent; ``None`` when ``clean`` is 0)."""
    return {"drop_points": 100.0 * (clean - adv), "drop_pct": 100.0 * (clean - adv) / clean if clean else None}


def _check_hd95(task: Task, hd95: Any, spacing: Any) -> None:
    if not isinstance(hd95, bool):
        raise TypeError(f"`hd95` must be True or False, got {hd95!r}")
    if hd95 and not isinstance(getattr(task, "num_classes", None), int):
        raise ValueError(f"`hd95=True` needs a segmentation task (label maps with `num_classes`), got {task!r}; "
                         "HD95 is a distance between label maps and does not apply to classifiers")
    if spacing is None:
        return
    values = [spacing] if isinstance(spacing, int | float) else spacing
    if isinstance(values, str) or not isinstance(values, Sequence) or not values \
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                       for v in values):
        raise ValueError(f"`spacing` must be a positive number or one positive number per spatial axis (mm), "
                         f"got {spacing!r}")


def _case_hd95(task: Task, logits: Tensor, y: Tensor, spacing: Any) -> Tensor:
    """Per-case HD95 ``(N,)`` on the CPU (float64): the mean over the classes the task's mean Dice counts
    (background only with ``include_background``) of the 95th-percentile Hausdorff distance, in the units of
    ``spacing`` (voxels when ``None``). A class absent from the label is skipped; a class in the label that the
    prediction lost gets the volume diagonal (so erasing an organ is not dropped from the mean: Malik et al.,
    spec 003 ambiguity 4, as :func:`medadv.metrics.attack_success.segmentation_asr`). NaN when no class counts."""
    from ..metrics.attack_success import _hd95_filled

    k = int(getattr(task, "num_classes"))  # noqa: B009 (checked by _check_hd95)
    y = y.to(logits.device)
    pred = task.predict(logits)
    valid = task.valid_mask(y)
    kk = k
    if valid is not None:  # ignored voxels become an extra class k in both maps; its column is dropped
        kk = k + 1
        y = torch.where(valid, y.long(), torch.full_like(y, k).long())
        pred = torch.where(valid, pred, torch.full_like(pred, k))
    hd = _hd95_filled(pred, y.long(), kk, spacing)[:, :k]
    classes = torch.arange(k, device=y.device).reshape(1, -1, *([1] * (y.ndim - 1)))
    present = (y.unsqueeze(1) == classes).flatten(2).any(dim=2).to(hd.device)
    hd = torch.where(present, hd, torch.full_like(hd, math.nan))
    first = 0 if getattr(task, "include_background", True) else 1
    return hd[:, first:].double().nanmean(dim=1).cpu()


def _check_noise(named: list[tuple[str, Any]], noise: Any, match: Any, seed: Any) -> Any:
    """The data box the noise column clips to (the first attack's), after checking the noise options; ``None``
    without ``noise``."""
    if noise is None:
        return None
    if noise not in NOISES:
        c = closest(str(noise), list(NOISES))
        raise ValueError(f"`noise` must be one of {', '.join(map(repr, NOISES))} or None, got {noise!r}"
                         f"{f'; did you mean {c!r}?' if c else ''}")
    if match not in ("ssim", "l2"):
        raise ValueError(f"`match` must be 'ssim' or 'l2', got {match!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"`seed` must be an int, got {seed!r}")
    box = named[0][1].box
    if box.bounds is not None:  # the SSIM needs one data range: a per-channel box without one is refused now
        try:
            box.data_range()
        except ValueError as err:
            raise ValueError(f"`noise` needs one data range (the SSIM's and the noise scale's), but the attacks' "
                             f"data box has per-channel ranges of different widths: {err}") from err
    return box


def _pick_names(given: Sequence[str] | None, known: Sequence[str], what: str, label: Any = None) -> list[str]:
    """The names of ``known`` that ``given`` chooses (all for ``None``); ``label(k)`` is another name ``k`` answers
    to (an attack entry's name without its ``@budget``). An unknown name is refused with the closest one."""
    if given is None:
        return list(known)
    if isinstance(given, str) or not isinstance(given, Sequence) or not given:
        raise TypeError(f"`{what}` must be a non-empty list of names, got {given!r}")
    out: list[str] = []
    for n in given:
        hits = [k for k in known if n == k or (label is not None and n == label(k))]
        if not hits:
            c = closest(str(n), sorted(set(known) | ({label(k) for k in known} if label is not None else set())))
            raise ValueError(f"`{what}` names an unknown {what.split('_')[-1].rstrip('s')} {n!r}"
                             f"{f'; did you mean {c!r}?' if c else ''} (known: {', '.join(known)})")
        out += [k for k in hits if k not in out]
    return out


def _most_changed(task: Task, clean_logits: Tensor, adv_logits: Tensor, k: int) -> list[int]:
    """The ``k`` samples whose prediction ``adv_logits`` changed most (share of changed labels / voxels)."""
    change = task.change_fraction(task.predict(clean_logits), task.predict(adv_logits)).double()
    return torch.argsort(change, descending=True, stable=True)[: max(0, min(k, change.shape[0]))].tolist()


def transfer(
    surrogates: Mapping[str, nn.Module],
    targets: Mapping[str, nn.Module],
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    target_fn: TargetFn | None = None,
    hd95: bool = False,
    spacing: float | Sequence[float] | None = None,
    noise: str | None = None,
    match: str = "ssim",
    seed: int = 0,
    cases: int = 0,
    case_surrogate: str | None = None,
    case_attacks: Sequence[str] | None = None,
    case_targets: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
) -> StudyResult:
    """Surrogate × target table of transferred attacks (Paschali et al. 2018, Tables 1–2; Malik et al. 2024).

    Args:
        surrogates: ``{name: model}`` the attacks are crafted on.
        targets: ``{name: model}`` the adversarial examples are evaluated on (one task for all models).
        task: how to read every model's output.
        data: an ``(x, y)`` pair or an iterable of ``(x, y)`` batches.
        attacks: one attack, a list or a ``{name: attack}`` mapping; each instance is crafted once per surrogate
            and batch and its examples are reused across all targets.
        target_fn: ``target_fn(x, y, clean_logits_of_the_surrogate) -> target`` for targeted attacks.
        hd95: also give each target's HD95 clean and on the transferred examples (segmentation tasks only:
            a task without ``num_classes`` is refused).
        spacing: voxel size for HD95 and the case figures (mm), one number or one per spatial axis; ``None``:
            voxel units (as Malik et al., whose HD95 is in voxels of the resampled grid).
        noise: ``"gaussian"`` or ``"rician"``: Paschali et al.'s noise column. Each sample gets one noise draw
            whose ``match`` quantity equals the mean over every (attack, surrogate) of that sample's adversarial
            examples (:func:`~medadv.studies.corruptions.match_noise`, clipped to the first attack's data box),
            evaluated on every target. ``None``: no noise column.
        match: ``"ssim"`` (Paschali et al.) or ``"l2"``: what the noise matches.
        seed: seed of the noise draws (a private generator; torch's global RNG is not touched).
        cases: how many samples of the first batch to draw per (attack, target) as report figures
            (``meta["cases"]``); 0: none.
        case_surrogate: the surrogate whose examples the figures show (default: the first).
        case_attacks: the attacks drawn (names, an entry's name matching each of its budgets; default: all).
        case_targets: the targets drawn (default: every target that is not the case surrogate itself).
        class_names: names of the classes / labels in the figures.

    Returns:
        ``StudyResult("transfer")``: rows ``{attack, budget, surrogate, target, clean, adv, drop_points, drop_pct,
        fooling_rate, white_box}`` where ``clean``/``adv`` are means of the task's robust metric
        (``meta["metric"]``: accuracy, exact match or mean Dice) over the samples, ``drop_points = 100 (clean −
        adv)`` (points) and ``drop_pct = 100 (clean − adv) / clean`` (relative, percent; ``None`` when clean is 0);
        with ``hd95`` also ``hd95_clean``/``hd95_adv``: the mean over the cases of the per-case HD95
        (:func:`_case_hd95`; units of ``spacing``, ``None`` when undefined for every case).
        ``meta["summary"]`` per target (:func:`transfer_summary`); with ``noise`` each entry also has ``noise``
        (the target's metric on the noisy samples), ``ssim_adv`` / ``ssim_noise`` and ``l2_adv`` / ``l2_noise``
        (means over the samples of the pooled adversarial and of the noise similarity) and ``sigma`` (the mean
        noise scale), and ``meta["noise"]`` says which noise and match ran. With ``cases``: ``meta["cases"]``
        (:func:`~medadv.report.cases.case_meta`), titled ``"<attack> · from <surrogate> · on <target>"`` and
        ``"<Noise> noise, SSIM … · on <target>"``.
    """
    check_task(task)
    _check_hd95(task, hd95, spacing)
    sur, tgt = check_models(surrogates, "surrogates"), check_models(targets, "targets")
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: transfer needs at least one attack")
    check_targets(named, target_fn)
    box = _check_noise(named, noise, match, seed)
    if isinstance(cases, bool) or not isinstance(cases, int) or cases < 0:
        raise ValueError(f"`cases` must be an int >= 0 (samples drawn per attack and target), got {cases!r}")
    c_sur = _pick_names(None if case_surrogate is None else [case_surrogate], list(sur), "case_surrogate")[0]
    c_atk = set(_pick_names(case_attacks, [n for n, _ in named], "case_attacks", entry_label))
    c_tgt = _pick_names(case_targets, list(tgt), "case_targets")
    seen: dict[int, nn.Module] = {}  # one wrapper per model: a surrogate that is a target stays white-box (`is`)
    sur, tgt = ({k: seen.setdefault(id(m), task.logits_model(m)) for k, m in d.items()} for d in (sur, tgt))
    if case_targets is None:  # the figures are of transfer: the case surrogate's own (white-box) cell is left out
        c_tgt = [t for t in c_tgt if tgt[t] is not sur[c_sur]]
    gen = torch.Generator().manual_seed(int(seed))
    clean_metric: dict[str, list[Tensor]] = {t: [] for t in tgt}
    adv_metric: dict[tuple[int, str, str], list[Tensor]] = {}
    fooled: dict[tuple[int, str, str], list[Tensor]] = {}
    clean_hd: dict[str, list[Tensor]] = {t: [] for t in tgt}
    adv_hd: dict[tuple[int, str, str], list[Tensor]] = {}
    noise_metric: dict[str, list[Tensor]] = {t: [] for t in tgt}
    sims: dict[str, list[Tensor]] = {c: [] for c in ("ssim_adv", "ssim_noise", "l2_adv", "l2_noise", "sigma")}
    first: dict[str, Any] | None = None  # what the case figures need of the first batch
    for x, y in batches(data):
        # `rec` records the first batch (on the CPU) for the case figures; None for the other batches
        rec: dict[str, Any] | None = None
        if cases > 0 and first is None:
            rec = first = {"x": x.detach().cpu(), "y": y.detach().cpu(), "clean": {}, "x_adv": {}, "adv": {},
                           "noise": {}}
        for tname, tmodel in tgt.items():
            logits = forward(tmodel, x)
            task.validate(logits, y.to(logits.device), "y")
            clean_metric[tname].append(robust_metric(task, logits, y))
            if rec is not None and tname in c_tgt:
                rec["clean"][tname] = logits.detach().cpu()
            if hd95:
                clean_hd[tname].append(_case_hd95(task, logits, y, spacing))
        ssim_each: list[Tensor] = []  # per sample, one entry per (attack, surrogate): the noise's target
        l2_each: list[Tensor] = []
        for sname, smodel in sur.items():
            dev = model_device(smodel, x.device)
            xs, ys = x.to(dev), y.to(dev)
            s_logits = forward(smodel, xs)
            for i, (aname, atk) in enumerate(named):
                fn = target_for(target_fn, aname)  # one function, or one per attack name
                goal = fn(xs, ys, s_logits) if fn is not None and is_targeted(atk) else ys
                # crafted once, reused for every target (and read back from the run's cache where evaluate() crafted
                # the same samples on this model: the white-box cells)
                x_adv = craft(atk, smodel, xs, goal).x_adv
                if box is not None:
                    xa = x_adv.to(x.device)
                    ssim_each.append(ssim(x, xa, data_range=box.data_range(x), win_size=_win(x)).detach())
                    l2_each.append((xa - x).reshape(x.shape[0], -1).norm(dim=1).detach())
                draw = rec is not None and sname == c_sur and aname in c_atk
                if rec is not None and draw:
                    rec["x_adv"][aname] = x_adv.detach().cpu()
                for tname, tmodel in tgt.items():
                    logits = forward(tmodel, x_adv)
                    adv_metric.setdefault((i, sname, tname), []).append(robust_metric(task, logits, y))
                    hit = task.fooled(logits, goal.to(logits.device), is_targeted(atk))
                    fooled.setdefault((i, sname, tname), []).append(hit.detach().cpu().double())
                    if hd95:
                        adv_hd.setdefault((i, sname, tname), []).append(_case_hd95(task, logits, y, spacing))
                    if rec is not None and draw and tname in c_tgt:
                        rec["adv"][aname, tname] = logits.detach().cpu()
        if box is not None:
            # spec 001 §3: the pooled mean over every (attack, surrogate), so one draw serves every target
            aim = torch.stack(ssim_each if match == "ssim" else l2_each).mean(dim=0)
            x_noise, sigma = match_noise(x, aim, box=box, match=match, noise=str(noise), generator=gen)
            sims["ssim_adv"].append(torch.stack(ssim_each).mean(dim=0).double().cpu())
            sims["l2_adv"].append(torch.stack(l2_each).mean(dim=0).double().cpu())
            sims["ssim_noise"].append(ssim(x, x_noise, data_range=box.data_range(x), win_size=_win(x)).double().cpu())
            sims["l2_noise"].append((x_noise - x).reshape(x.shape[0], -1).norm(dim=1).double().cpu())
            sims["sigma"].append(sigma.detach().double().cpu())
            for tname, tmodel in tgt.items():
                logits = forward(tmodel, x_noise)
                noise_metric[tname].append(robust_metric(task, logits, y))
                if rec is not None and tname in c_tgt:
                    rec["noise"][tname] = logits.detach().cpu()
            if rec is not None:
                rec["x_noise"], rec["ssim_noise"] = x_noise.detach().cpu(), sims["ssim_noise"][-1]
    if not any(clean_metric.values()):
        raise ValueError("`data` is empty")
    clean_mean = {t: float(torch.cat(v).mean()) for t, v in clean_metric.items()}
    rows = []
    for i, (name, atk) in enumerate(named):
        for sname in sur:
            for tname in tgt:
                adv = float(torch.cat(adv_metric[(i, sname, tname)]).mean())
                row: dict[str, Any] = {
                    "attack": name, "budget": atk.budget, "surrogate": sname, "target": tname,
                    "clean": clean_mean[tname], "adv": adv, **_drops(clean_mean[tname], adv),
                    "fooling_rate": float(torch.cat(fooled[(i, sname, tname)]).mean()),
                    "white_box": sur[sname] is tgt[tname],
                }
                if hd95:
                    row["hd95_clean"] = mean(torch.cat(clean_hd[tname]))
                    row["hd95_adv"] = mean(torch.cat(adv_hd[(i, sname, tname)]))
                rows.append(row)
    summary = transfer_summary(rows)
    meta: dict[str, Any] = {"metric": task.robust_metric_name, "surrogates": list(sur), "targets": list(tgt),
                            "summary": summary}
    if box is not None:
        pooled = {c: mean(torch.cat(v)) for c, v in sims.items()}
        for entry in summary:
            entry.update({"noise": mean(torch.cat(noise_metric[entry["target"]])), **pooled})
        meta["noise"] = {"noise": noise, "match": match, "seed": seed}
    if hd95:
        meta["hd95_units"] = "voxels" if spacing is None else "units of `spacing` (mm)"
    if first is not None:
        meta["cases"] = _case_figures(task, first, named, c_sur, c_tgt, cases, noise, match, spacing, class_names)
    return StudyResult("transfer", rows, meta)


def _case_figures(task: Task, first: dict[str, Any], named: list[tuple[str, Any]], surrogate: str,
                  targets: list[str], k: int, noise: str | None, match: str, spacing: Any,
                  class_names: Sequence[str] | None) -> list[dict[str, Any]]:
    """The case figures of the first batch (:func:`~medadv.report.cases.case_meta`): per target, the same ``k``
    samples (those the first drawn attack changed most on that target) under each drawn attack, then under the
    noise, each drawn with that target's predictions."""
    from ..report.cases import case_meta, make_cases

    x, y, out = first["x"], first["y"], []
    drawn = [n for n, _ in named if n in first["x_adv"]]
    budgets = dict(named)
    for t in targets:
        clean = first["clean"][t]
        # one set of samples per target, so that its figures compare the same samples across attacks and noise
        idx = _most_changed(task, clean, first["adv"][drawn[0], t], k) if drawn else \
            _most_changed(task, clean, first["noise"][t], k)
        for a in drawn:
            out += make_cases(task, x, first["x_adv"][a], clean, first["adv"][a, t], y, indices=idx,
                              class_names=class_names, spacing=spacing,
                              title=f"{setting_key(a, budgets[a].budget)} · from {surrogate} · on {t}")
        if noise is not None and t in first["noise"]:
            for i in idx:  # one figure per sample: its own similarity in the title
                what = (f"SSIM {float(first['ssim_noise'][i]):.4f}" if match == "ssim" else
                        f"L2 {float((first['x_noise'][i] - x[i]).norm()):.3g}")
                out += make_cases(task, x, first["x_noise"], clean, first["noise"][t], y, indices=[i],
                                  class_names=class_names, spacing=spacing,
                                  title=f"{noise.capitalize()} noise, {what} (matched in {match.upper()}) · on {t}")
    return case_meta(out)


# --- the report section -------------------------------------------------------------------------------------------
def _table1(study: StudyLike, metric: str) -> Any:
    """Paschali et al.'s Table 1 from ``meta["summary"]``: per evaluated model its clean metric, the noise column,
    the mean over the black-box cells and the drop; ``None`` when the study ran no noise column (the matrix's
    summary columns then say all of it)."""
    summary = [e for e in study.meta.get("summary") or [] if isinstance(e, Mapping)]
    info = study.meta.get("noise")
    if not summary or not isinstance(info, Mapping) or not any("noise" in e for e in summary):
        return None
    kind, match = str(info.get("noise", "")).capitalize(), str(info.get("match", "ssim")).upper()
    table = [{"evaluated model": e.get("target"), f"clean {metric}": e.get("clean"),
              f"noise ({kind}, same {match})": e.get("noise"), "adversarial avg": e.get("avg"),
              "% drop (points)": e.get("drop_points"), "relative drop (%)": e.get("drop_pct"),
              "cells": e.get("cells")} for e in summary]
    first = summary[0]  # the pooled similarities are the same for every target: one noise draw serves all
    caption = (f"Paschali et al.'s Table 1: {metric} on clean data, on random {kind} noise matched per sample in "
               f"{match} to the mean of that sample's adversarial examples over every attack and source, and "
               "averaged over the transferred (black-box) cells of the matrix below; % drop = 100 × (clean − avg) "
               "in percentage points, relative drop = 100 × (clean − avg) / clean. White-box cells (a source that "
               "is the evaluated model itself) are left out: the paper's sources are independently trained "
               f"models. Mean SSIM to the clean samples: adversarial {fmt(first.get('ssim_adv'))}, noise "
               f"{fmt(first.get('ssim_noise'))} (mean σ {fmt(first.get('sigma'))} in data units).")
    return data_table(table, list(table[0]), caption)


def _draw_transfer(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = study_metric(study)
    blocks: list[Any] = []
    table1 = _table1(study, metric)
    if table1 is not None:
        blocks.append(table1)
    groups = group_rows(study.rows, ["attack", "budget"])
    hd_unit = str(study.meta.get("hd95_units") or "voxels")
    for (attack, budget), rows in groups.items():
        surr = list(dict.fromkeys(str(r["surrogate"]) for r in rows))
        targ = list(dict.fromkeys(str(r["target"]) for r in rows))
        val = {(str(r["surrogate"]), str(r["target"])): r for r in rows}
        mats: list[tuple[str, str, str, float | None, float | None]] = [
            ("adv", f"{metric} attacked", "viridis", 0.0, 1.0)]
        if any(not is_nan(r.get("drop_points")) for r in rows):  # Paschali's "% Drop": points, larger is worse
            mats.append(("drop_points", "drop (points: 100 × (clean − attacked))", "magma_r", None, None))
        if any(not is_nan(r.get("fooling_rate")) for r in rows):
            mats.append(("fooling_rate", "fooling rate", "magma", 0.0, 1.0))
        if any(not is_nan(r.get("hd95_adv")) for r in rows):  # Malik et al.: HD95 under transfer
            mats.append(("hd95_adv", f"HD95 attacked ({hd_unit})", "magma_r", None, None))
        fig, axes = grid(len(mats), 2, max(4.4, 1.4 + 0.9 * len(targ)), max(3.0, 1.2 + 0.6 * len(surr)))
        for ax, (col, label, cmap, lo, hi) in zip(axes, mats, strict=False):
            m = [[val.get((s, t), {}).get(col) for t in targ] for s in surr]
            heatmap(ax, m, surr, targ, title=label, cmap=cmap, vmin=lo, vmax=hi, xlabel="target model",
                    ylabel="surrogate (crafted on)")
        fig.suptitle(setting_key(attack, budget), fontsize=10)
        fig.tight_layout()
        white = ("Cells where a model attacks itself are white-box." if any(r.get("white_box") for r in rows) else
                 "No cell is white-box: every source is another network than the models it is applied to.")
        blocks.append(figure_image(fig, f"transfer heatmap {setting_key(attack, budget)}",
                                   "Rows: the model the attack was crafted on; columns: the model it was applied "
                                   f"to. {white}"))
    # Paschali et al.'s Table 2 (rows: the evaluated model; columns: the source model, grouped by attack) with
    # their Table 1 summary (clean, mean over the cells, drop in points and relative)
    targets = list(dict.fromkeys(str(r["target"]) for r in study.rows))
    summary = {str(e.get("target")): e for e in study.meta.get("summary") or [] if isinstance(e, Mapping)}
    matrix: list[dict[str, Any]] = []
    for t in targets:
        sel = [r for r in study.rows if str(r["target"]) == t]
        row: dict[str, Any] = {"evaluated model": t, f"clean {metric}": sel[0].get("clean") if sel else None}
        for r in sel:
            row[f"{setting_key(r['attack'], r['budget'])} · from {r['surrogate']}"] = r.get("adv")
        e = summary.get(t, {})
        row.update({"avg over all cells": e.get("avg_all_cells"), "drop (points)": e.get("drop_points_all_cells"),
                    "avg black-box": e.get("avg"), "black-box drop (points)": e.get("drop_points"),
                    "black-box drop (relative %)": e.get("drop_pct")})
        matrix.append(row)
    if matrix:
        cols = list(dict.fromkeys(k for r in matrix for k in r))
        blocks.append(data_table(matrix, cols, f"{metric} of each evaluated model (rows) on the examples crafted on each "
                                 "source model (columns), per attack (Paschali et al., Table 2); avg and drop in "
                                 "percentage points 100 × (clean − avg), over all cells (their Table 1) and over the "
                                 "black-box cells only, and the relative drop 100 × (clean − avg) / clean."))
    blocks.append(raw_table(study.rows, "all rows of the transfer study"))
    return Section("study-transfer", "Transferability (Paschali, Malik)",
                   "Adversarial examples crafted on one model (surrogate) and applied to another (target): a "
                   "black-box attacker needs only a similar model.", blocks)


# --- the config entry ---------------------------------------------------------------------------------------------
class TransferCases(_Section):
    """``cases:`` of a transfer entry: ``k`` samples of the first batch per (attack, target), crafted on
    ``surrogate`` (default: the first) by ``attacks`` (default: all) and drawn with each of ``targets``'
    predictions (default: every target other than the surrogate itself)."""

    k: Int = Field(1, ge=1, le=8)
    surrogate: str | None = Field(None, min_length=1)
    attacks: Annotated[list[str], Field(min_length=1)] | None = None
    targets: Annotated[list[str], Field(min_length=1)] | None = None


@register_study("transfer", draw=_draw_transfer, check_options={"cases": 1})
class TransferSpec(StudySpec):
    """Surrogate × target table; ``surrogates``/``targets`` name models (default: all of them, both roles).
    ``hd95``: also each target's HD95 clean and transferred (segmentation; Malik et al.), ``spacing``: the voxel
    size for it and the case figures in mm, one number or one per spatial axis (default: voxel units).
    ``noise: gaussian | rician``: Paschali et al.'s noise column, matched per sample in ``match`` (``ssim`` or
    ``l2``) to the mean of the sample's adversarial examples, drawn with ``seed``. ``cases:`` report figures of
    transferred examples on the targets (:class:`TransferCases`; ``cases: 2`` is ``{k: 2}``)."""

    study: Literal["transfer"]
    surrogates: Annotated[list[str], Field(min_length=1)] | None = None
    targets: Annotated[list[str], Field(min_length=1)] | None = None
    hd95: Annotated[bool, Strict()] = False
    spacing: (Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
              | Annotated[list[Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]],
                          Field(min_length=1, max_length=3)]
              | None) = None
    noise: Literal["gaussian", "rician"] | None = None
    match: Literal["ssim", "l2"] = "ssim"
    seed: Int = 0
    cases: TransferCases | None = None

    @model_validator(mode="before")
    @classmethod
    def _cases_count(cls, data: Any) -> Any:
        # `cases: 1` is the short form of `cases: {k: 1}` (as a config's top-level `cases:` is a count)
        if isinstance(data, Mapping) and isinstance(data.get("cases"), int) and not isinstance(data["cases"], bool):
            data = {**data, "cases": {"k": data["cases"]} if data["cases"] else None}  # 0: no figures
        return data

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        c = self.cases
        return transfer(pick_models(models, self.surrogates, "surrogates"), pick_models(models, self.targets, "targets"), task,
                        data, attacks if attacks is not None else {}, target_fn=target_fn, hd95=self.hd95,
                        spacing=self.spacing, noise=self.noise, match=self.match, seed=self.seed,
                        cases=0 if c is None else c.k, case_surrogate=None if c is None else c.surrogate,
                        case_attacks=None if c is None else c.attacks, case_targets=None if c is None else c.targets)
