"""``auto`` (AutoEvaluation) vs its own components and PGD-100×5 on real offline data, CPU.

Three trained models on real anatomy (no download):

* ``multilabel``: ``small_cnn`` on :func:`medadv.data.brain_patches.brain_patches` (Colin27 T1 + AAL
  macro-regions, 8 labels), natural training; evaluated on held-out test patches the model gets exactly
  right (robust metric: exact match);
* ``seg3d``: the 3-D MONAI UNet of ``medadv demo`` (:func:`medadv.demo.build_demo_model`, cached in the
  demo's cache) on its held-out MNI152 tissue crops (right hemisphere; robust metric: mean Dice);
* ``seg2d``: a 2-D MONAI UNet trained here on axial slices of the same MNI152 tissue crops (left
  hemisphere for training, right for testing; robust metric: mean Dice).

For each model and L∞ budget (box [0, 1]) it measures: (a) the clean metric; (b) medadv PGD with 100 steps
and 5 restarts; (c) every component of ``auto`` ``version="standard"`` run alone on all samples
(``version="custom", attacks=[c]``), with its time; (d) ``auto`` itself (per-sample metric, total time,
per-component time and samples attacked); (e) checks: per sample and on average, ``auto`` ≤ every single
component and ≤ PGD-100×5 (violations counted and listed), the metric after each component, and, for
segmentation, ``auto`` with ``progressive_radius=True`` against the default (off); (f) the cost of ``auto``
against the sum of the single components: the wall-time ratio and the work ratio (the share of (sample,
member) pairs ``auto`` attacked, plain and weighted by each member's time alone), and the largest per-sample
difference between ``auto`` and the minimum over the single-component runs.

Trained models are cached under medadv's user cache (``$MEDADV_CACHE`` or ``~/.cache/medadv``,
sub-folder ``bench_auto``; the 3-D UNet in ``demo``) and loaded with ``weights_only=True``.

Run: ``OMP_NUM_THREADS=1 python benchmarks/auto_bench.py [--quick] [--task multilabel|seg3d|seg2d|all]``.
Prints Markdown tables (copied into ``benchmarks/auto.md``); ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from medadv.attacks.pgd import PGD
from medadv.data.brain_patches import brain_patches
from medadv.data.mni152 import TISSUE_CLASSES, tissue_patches
from medadv.models import cache_dir, fit_supervised, load_checkpoint, save_checkpoint, small_cnn, small_unet
from medadv.tasks import MultiLabel, Segmentation, Task
from medadv.threats import Linf

BOUNDS = (0.0, 1.0)
TOL = 1e-6  # a per-sample difference above this counts (metrics are float32 ratios)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- models and data
@dataclass
class Bench:
    name: str
    title: str
    model: nn.Module
    task: Task
    x: Tensor
    y: Tensor
    eps: list[float]
    segmentation: bool
    setup: str
    extra: dict[str, Any] = field(default_factory=dict)


def _cached(tag: str, model: nn.Module, train) -> float | None:
    """Load ``model`` from the bench cache, or train it with ``train()`` (returns the final loss) and cache it."""
    path = cache_dir("bench_auto") / f"{tag}.pt"
    if path.is_file():
        payload = load_checkpoint(path, model)  # weights_only=True
        log(f"  loaded {path}")
        return payload.get("final_loss")
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        final = float(train())
    save_checkpoint(path, model, final_loss=final)
    log(f"  trained in {time.perf_counter() - t0:.0f} s (final loss {final:.3f}); cached at {path}")
    return final


def multilabel_bench(n: int, quick: bool) -> Bench:
    crops, epochs = (8, 8) if quick else (24, 20)
    t0 = time.perf_counter()
    train = brain_patches(split="train", crops_per_slice=crops, seed=0)
    test = brain_patches(split="test", crops_per_slice=crops, seed=0)
    task = MultiLabel()
    n_labels = len(train.label_names)
    torch.manual_seed(0)
    model = small_cnn(1, n_labels, width=16)
    tag = f"multilabel_cnn16_c{crops}_e{epochs}_seed0"
    _cached(tag, model, lambda: fit_supervised(model, task, train.x, train.y, epochs=epochs, batch_size=32,
                                               lr=3e-3, seed=0)[-1])
    model.eval()
    with torch.no_grad():
        em = task.robust_metric(model(test.x), test.y)
    # the test patches the model gets exactly right (the others are already at the metric's floor), in a
    # seeded random order
    order = torch.randperm(len(test), generator=torch.Generator().manual_seed(0))
    keep = order[em[order] > 0.5][:n]
    setup = (f"`brain_patches` ({train.source}), 32×32 patches at 2 mm, {n_labels} labels; `small_cnn(1, "
             f"{n_labels}, width=16)` trained naturally ({epochs} epochs, Adam 3e-3, batch 32) on {len(train)} "
             f"training patches; clean exact match on all {len(test)} test patches {float(em.mean()):.3f}; "
             f"evaluated on {len(keep)} test patches it gets exactly right (seeded random choice)")
    log(f"multilabel: {setup} ({time.perf_counter() - t0:.0f} s)")
    return Bench("multilabel", "Multi-label CNN on brain_patches (exact match)", model, task, test.x[keep],
                 test.y[keep], [2 / 255, 4 / 255], False, setup)


def seg3d_bench(n: int, quick: bool) -> Bench:
    from medadv.demo import DemoConfig, build_demo_model

    cfg = DemoConfig(n_train=8, epochs=2) if quick else DemoConfig()
    t0 = time.perf_counter()
    cache = cache_dir("bench_auto") if quick else None  # the full run shares `medadv demo`'s cached model
    model = build_demo_model(cfg, cache=cache, progress=False, echo=log)
    task = Segmentation(len(TISSUE_CLASSES), include_background=False)
    x, y = tissue_patches(n, cfg.patch, cfg.spacing_mm, split="test", seed=cfg.seed + 1)
    setup = (f"the UNet of `medadv demo` (MONAI UNet, channels {cfg.channels}, {cfg.epochs} epochs on "
             f"{cfg.n_train} left-hemisphere MNI152 crops); {n} test crops {cfg.patch}³ at {cfg.spacing_mm} mm "
             f"from the right hemisphere (the demo's test seed); `Segmentation(4, include_background=False)`")
    log(f"seg3d: {setup} ({time.perf_counter() - t0:.0f} s)")
    return Bench("seg3d", "3-D UNet of `medadv demo` on MNI152 tissue (mean Dice)", model, task, x, y,
                 [2 / 255, 4 / 255], True, setup)


def _slices(n_crops: int, split: str, seed: int, per_crop: int) -> tuple[Tensor, Tensor]:
    """Axial slices of 3-D MNI152 tissue crops (32³ at 2 mm): ``x (n, 1, 32, 32)``, ``y (n, 32, 32)``."""
    x3, y3 = tissue_patches(n_crops, 32, 2, split=split, seed=seed)
    idx = torch.linspace(4, 27, per_crop).round().long()  # slices spread through the crop (last axis = z)
    x = x3[:, :, :, :, idx].permute(0, 4, 1, 2, 3).reshape(-1, 1, 32, 32).contiguous()
    y = y3[:, :, :, idx].permute(0, 3, 1, 2).reshape(-1, 32, 32).contiguous()
    return x, y


def seg2d_bench(n: int, quick: bool) -> Bench:
    n_crops, epochs = (16, 2) if quick else (96, 30)
    t0 = time.perf_counter()
    x_tr, y_tr = _slices(n_crops, "train", 0, 4)
    task = Segmentation(len(TISSUE_CLASSES), include_background=False)
    torch.manual_seed(0)
    channels = (16, 32, 64)
    model = small_unet(1, len(TISSUE_CLASSES), ndim=2, channels=channels)
    tag = f"seg2d_unet_c{'-'.join(map(str, channels))}_n{n_crops}_e{epochs}_seed0"
    _cached(tag, model, lambda: fit_supervised(model, task, x_tr, y_tr, epochs=epochs, batch_size=16, lr=5e-3,
                                               seed=0)[-1])
    model.eval()
    # one slice per test crop (distinct crops), the middle one
    x3, y3 = tissue_patches(n, 32, 2, split="test", seed=1)
    x, y = x3[..., 16].contiguous(), y3[..., 16].contiguous()
    setup = (f"MONAI UNet 2-D (channels {channels}) trained {epochs} epochs (Adam 5e-3, batch 16) on "
             f"{len(x_tr)} axial 32×32 slices (2 mm) of {n_crops} left-hemisphere MNI152 tissue crops; {n} test "
             f"slices (the middle axial slice of {n} right-hemisphere crops); `Segmentation(4, "
             f"include_background=False)`")
    log(f"seg2d: {setup} ({time.perf_counter() - t0:.0f} s)")
    return Bench("seg2d", "2-D UNet on MNI152 tissue slices (mean Dice)", model, task, x, y,
                 [2 / 255, 4 / 255], True, setup)


BUILDERS = {"multilabel": multilabel_bench, "seg3d": seg3d_bench, "seg2d": seg2d_bench}


# ----------------------------------------------------------------------------------------------------- attacks
def auto_class():
    try:
        from medadv.attacks.auto import AutoEvaluation
    except ImportError as err:  # auto.py not there yet: (a) and (b) only
        log(f"medadv.attacks.auto is not importable ({err}); running the clean and PGD parts only")
        return None
    return AutoEvaluation


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def metric_of(task: Task, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    with torch.no_grad():
        return task.robust_metric(model(x), y).float()


def run_auto(Auto, b: Bench, eps: float, kw: dict[str, Any], **over: Any):
    params = dict(kw)
    params.update(over)
    if not b.segmentation:
        params.pop("progressive_radius", None)
    atk = Auto(b.task, Linf(eps, bounds=BOUNDS), **params)
    res, sec = timed(lambda: atk(b.model, b.x, b.y))
    return res, sec


def _comp_seconds(det: Any) -> list[float]:
    """Per-component wall time: ``seconds`` is ``(N, K)`` (a member's time split over its samples) or a list."""
    sec = det.seconds
    if isinstance(sec, Tensor) and sec.ndim == 2:
        return [float(v) for v in sec.sum(0)]
    return [float(v) for v in sec]


def _source(det: Any) -> Tensor:
    """The member whose example is kept, per sample (-1: none)."""
    return det.source if hasattr(det, "source") else det.broken_by


def _flags(det: Any) -> list[str]:
    return list(getattr(det, "masking", None) or getattr(det, "flags", None) or [])


def fmt_eps(eps: float) -> str:
    return f"{eps * 255:g}/255"


def violations(a: Tensor, ref: Tensor) -> list[int]:
    return [int(i) for i in torch.nonzero(a > ref + TOL).flatten()]


def bench_eps(b: Bench, eps: float, args, Auto) -> dict[str, Any]:
    quick = args.quick
    task, model, x, y = b.task, b.model, b.x, b.y
    out: dict[str, Any] = {"eps": eps}
    clean = metric_of(task, model, x, y)
    out["clean"] = clean
    pgd_steps, pgd_restarts = (10, 2) if quick else (100, 5)
    pgd = PGD(task, Linf(eps, bounds=BOUNDS), steps=pgd_steps, restarts=pgd_restarts, seed=0)
    res, sec = timed(lambda: pgd(model, x, y))
    out["pgd"] = task.robust_metric(res.logits, y).float()
    out["pgd_s"] = sec
    out["pgd_name"] = f"PGD-{pgd_steps}×{pgd_restarts}"
    log(f"  {b.name} ε={fmt_eps(eps)}: clean {float(clean.mean()):.4f}, {out['pgd_name']} "
        f"{float(out['pgd'].mean()):.4f} ({sec:.1f} s)")
    if Auto is None:
        return out

    kw: dict[str, Any] = {"version": "standard", "seed": 0, "checks": args.checks}
    if quick:
        kw.update(steps=5, queries=50)
    # (d) auto itself
    res, sec = run_auto(Auto, b, eps, kw)
    det = res.details
    comps = list(det.components)
    final = det.metric_after[:, -1].float() if det.metric_after.shape[1] else clean
    out.update(auto=final, auto_s=sec, components=comps, metric_after=det.metric_after.float(),
               attacked=det.attacked, source=_source(det), comp_s=_comp_seconds(det), flags=_flags(det),
               auto_logits_metric=task.robust_metric(res.logits, y).float())
    log(f"  auto standard: {float(final.mean()):.4f} in {sec:.1f} s; components {comps}; "
        f"seconds {[round(s, 1) for s in out['comp_s']]}; flags {out['flags']}")
    # (c) each component alone on all samples
    single: dict[str, Tensor] = {}
    single_s: dict[str, float] = {}
    for k, c in enumerate(comps):
        # auto seeds member k with seed + k: the same seed here, so a difference is auto's, not the start's
        r, s = run_auto(Auto, b, eps, {**kw, "version": "custom", "attacks": [c], "checks": False, "seed": k})
        single[c] = r.details.metric_after[:, -1].float()
        single_s[c] = s
        log(f"    alone {c}: {float(single[c].mean()):.4f} in {s:.1f} s")
    out.update(single=single, single_s=single_s)
    out["work_pairs"], out["work_weighted"] = work_ratio(out["attacked"], comps, single_s)
    out["wall_ratio"] = sec / sum(single_s.values())
    log(f"  work ratio {out['work_pairs']:.2f} of the pairs, {out['work_weighted']:.2f} time-weighted; wall "
        f"ratio {out['wall_ratio']:.2f}")
    # (e) progressive radius on (segmentation; the default is off)
    if b.segmentation:
        r, s = run_auto(Auto, b, eps, {**kw, "checks": False}, progressive_radius=True)
        out.update(prog=r.details.metric_after[:, -1].float(), prog_after=r.details.metric_after.float(),
                   prog_s=s)
        log(f"  auto, progressive radius on: {float(out['prog'].mean()):.4f} in {s:.1f} s")
    return out


def work_ratio(attacked: Tensor, comps: list[str], single_s: dict[str, float]) -> tuple[float, float]:
    """Timing-noise-free view of the saving: the share of (sample, member) pairs ``auto`` attacked, and the
    same weighted by each member's per-sample cost when run alone."""
    n = attacked.shape[0]
    weighted = sum(float(attacked[:, k].float().sum()) / n * single_s[c] for k, c in enumerate(comps))
    return float(attacked.float().mean()), weighted / sum(single_s.values())


# ------------------------------------------------------------------------------------------------------ report
def report(b: Bench, rows: list[dict[str, Any]], quick: bool) -> str:
    lines = [f"## {b.title}\n", f"Setup: {b.setup}.\n", f"Samples: {b.x.shape[0]}, input {tuple(b.x.shape[1:])}. "
             f"Metric: `{type(b.task).__name__}.robust_metric` ({b.task.robust_metric_name}), per sample, "
             f"then averaged; lower is a stronger attack.\n"]
    pgd_name = rows[0]["pgd_name"]
    has_auto = "auto" in rows[0]
    head = f"| ε | clean | {pgd_name} | {pgd_name} time (s) |"
    sep = "|---|---|---|---|"
    if has_auto:
        head += " auto | auto time (s) | auto ≤ PGD: violations | auto ≤ every component: violations | flags |"
        sep += "---|---|---|---|---|"
    lines += [head, sep]
    for r in rows:
        cells = [fmt_eps(r["eps"]), f"{float(r['clean'].mean()):.4f}", f"{float(r['pgd'].mean()):.4f}",
                 f"{r['pgd_s']:.1f}"]
        if has_auto:
            v_pgd = violations(r["auto"], r["pgd"])
            v_comp = sorted({i for c in r["single"] for i in violations(r["auto"], r["single"][c])})
            cells += [f"{float(r['auto'].mean()):.4f}", f"{r['auto_s']:.1f}", str(len(v_pgd)), str(len(v_comp)),
                      ", ".join(map(str, r["flags"])) or "none"]
        lines.append("| " + " | ".join(cells) + " |")
    if not has_auto:
        return "\n".join(lines) + "\n"
    for r in rows:
        e = fmt_eps(r["eps"])
        comps, after, attacked = r["components"], r["metric_after"], r["attacked"]
        lines += [f"\n### ε = {e}: metric after each component of `auto` (standard)\n",
                  "| # | component | mean metric after (auto) | lowered by | samples attacked | worst case kept "
                  "| time in auto (s) "
                  "| alone: mean metric | alone: time (s) | auto > alone: samples |"
                  + (" after, progressive radius on |" if "prog" in r else ""),
                  "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if "prog" in r else "")]
        prev = float(r["clean"].mean())
        for k, c in enumerate(comps):
            now = float(after[:, k].mean())
            cell = [str(k + 1), f"`{c}`", f"{now:.4f}", f"{prev - now:.4f}", f"{int(attacked[:, k].sum())}",
                    f"{int((r['source'] == k).sum())}", f"{r['comp_s'][k]:.1f}", f"{float(r['single'][c].mean()):.4f}", f"{r['single_s'][c]:.1f}",
                    str(len(violations(r['auto'], r['single'][c])))]
            if "prog" in r:
                cell.append(f"{float(r['prog_after'][:, k].mean()):.4f}")
            lines.append("| " + " | ".join(cell) + " |")
            prev = now
        best_single = torch.stack([r["single"][c] for c in comps]).min(0).values
        union = torch.minimum(best_single, r["pgd"])
        sum_single = sum(r["single_s"].values())
        lines += [
            "",
            f"- clean {float(r['clean'].mean()):.4f} → auto {float(r['auto'].mean()):.4f}; {r['pgd_name']} "
            f"{float(r['pgd'].mean()):.4f}; min over the single components per sample "
            f"{float(best_single.mean()):.4f}; min over single components and PGD {float(union.mean()):.4f}.",
            f"- cost: auto {r['auto_s']:.1f} s wall (components {sum(r['comp_s']):.1f} s) vs the components alone "
            f"on all samples {sum_single:.1f} s: ratio **{r['auto_s'] / sum_single:.2f}** (components only "
            f"{sum(r['comp_s']) / sum_single:.2f}); {r['pgd_name']} {r['pgd_s']:.1f} s. Work ratio (no timing "
            f"noise): auto attacked {r['work_pairs']:.2f} of the (sample, member) pairs, {r['work_weighted']:.2f} when "
            f"weighted by each member's time alone.",
            f"- per-sample identity: max |auto − min over single components| = "
            f"{float((r['auto'] - best_single).abs().max()):.2e}; auto's returned `x_adv` re-scored: max |Δ| "
            f"{float((r['auto_logits_metric'] - r['auto']).abs().max()):.2e}.",
        ]
        if "prog" in r:
            lines.append(f"- progressive radius on: auto {float(r['prog'].mean()):.4f} (off, the default: "
                         f"{float(r['auto'].mean()):.4f}) in {r['prog_s']:.1f} s; samples where on is worse "
                         f"than off: {len(violations(r['prog'], r['auto']))}, better: "
                         f"{len(violations(r['auto'], r['prog']))}.")
        bad = []
        for i in violations(r["auto"], r["pgd"]):
            bad.append(f"sample {i}: auto {float(r['auto'][i]):.4f} > {r['pgd_name']} {float(r['pgd'][i]):.4f}")
        for c in comps:
            for i in violations(r["auto"], r["single"][c]):
                bad.append(f"sample {i}: auto {float(r['auto'][i]):.4f} > `{c}` alone {float(r['single'][c][i]):.4f}")
        if bad:
            lines.append("- **violations**: " + "; ".join(bad) + ".")
        else:
            lines.append("- no violation: per sample, auto ≤ PGD and ≤ every component alone.")
    return "\n".join(lines) + "\n"


def to_jsonable(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v.tolist()
    if isinstance(v, dict):
        return {str(k): to_jsonable(w) for k, w in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_jsonable(w) for w in v]
    return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: few samples, few steps")
    ap.add_argument("--task", default="all", choices=[*BUILDERS, "all"])
    ap.add_argument("--n", type=int, default=None, help="samples per task (default 32 / 32 / 8, quick 4)")
    ap.add_argument("--no-checks", dest="checks", action="store_false",
                    help="run auto with checks=False (the masking checks are not timed then)")
    ap.add_argument("--json", default=None, help="also write the per-sample numbers to this JSON file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    Auto = auto_class()
    names = list(BUILDERS) if args.task == "all" else [args.task]
    default_n = {"multilabel": 32, "seg3d": 8, "seg2d": 32}
    t_all = time.perf_counter()
    dump: dict[str, Any] = {}
    print(f"# auto benchmark{' (quick)' if args.quick else ''}\n\nmedadv on {platform.machine()} CPU, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread; box [0, 1], L∞.\n")
    for name in names:
        t0 = time.perf_counter()
        b = BUILDERS[name](4 if args.quick else (args.n or default_n[name]), args.quick)
        rows = [bench_eps(b, eps, args, Auto) for eps in b.eps]
        print(report(b, rows, args.quick))
        print(f"_{name}: {time.perf_counter() - t0:.0f} s in all._\n", flush=True)
        dump[name] = {"setup": b.setup, "rows": to_jsonable(rows)}
    log(f"total {time.perf_counter() - t_all:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dump, f, indent=1)


if __name__ == "__main__":
    main()
