"""Certified (randomized smoothing) vs. empirical (``auto``) robustness on real offline data, CPU.

Three tasks on real anatomy (no download), each with a naturally trained model and one trained with Gaussian
noise at the smoothing's σ (:class:`medadv.defenses.GaussianAugmentation`, Cohen et al. 2019):

* ``multilabel``: ``small_cnn`` on :func:`medadv.data.brain_patches.brain_patches` (Colin27 + AAL macro-regions,
  or the nilearn MNI152 fallback), metric: exact match of every label; certification per label with Bonferroni
  over the labels;
* ``seg2d``: a 2-D MONAI UNet on axial 32×32 slices of the MNI152 tissue crops (left hemisphere train, right test;
  the recipe of ``benchmarks/auto_bench.py``), metric: mean Dice; per-voxel radii with Bonferroni over voxels;
* ``seg3d``: the 3-D MONAI UNet of ``medadv demo`` (:func:`medadv.demo.build_demo_model`), metric: mean Dice; its
  noise-trained counterpart is the same network fine-tuned with Gaussian noise (a few epochs from the natural
  weights, to keep the run short).

For each model: the clean metric of the base model; ``RandomizedSmoothing.certify`` (σ, n0, n, α = 0.001) with
its time and the certified metric at L2 radii (data units, inputs in [0, 1]; abstentions count as errors); the
empirical metric of the *same smoothed model* under attack, with its time: ``auto`` (``version="fast"``, L2 ball of
the same radius, box [0, 1]) on the expectation-over-noise surrogate of Salman et al. (NeurIPS 2019, SmoothAdv),
the adversarial inputs then classified by the smoothed model (:func:`medadv.studies.certify.empirical_smoothed`,
what the ``certify`` study of a config runs). Certified ≤ empirical must hold at every radius (a certificate is a
lower bound on the smoothed model's robust metric); the last column checks it.

Models are cached under medadv's user cache (``$MEDADV_CACHE`` or ``~/.cache/medadv``, sub-folder
``bench_certify``; the natural 3-D UNet in the demo's cache) and loaded with ``weights_only=True``.

Run: ``OMP_NUM_THREADS=2 python benchmarks/certify.py [--smoke] [--output certify_results.md] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from medadv.certify import RandomizedSmoothing, certified_accuracy, certified_dice
from medadv.data.brain_patches import brain_patches
from medadv.data.mni152 import TISSUE_CLASSES, tissue_patches
from medadv.defenses import AdversarialTrainer, GaussianAugmentation
from medadv.models import cache_dir, load_checkpoint, save_checkpoint, small_cnn, small_unet
from medadv.studies.certify import empirical_smoothed
from medadv.tasks import MultiLabel, Segmentation, Task

BOUNDS = (0.0, 1.0)
TOL = 1e-6


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Sizes:
    sigma: float
    radii: tuple[float, ...]
    n0: int
    n: int
    n_test: int
    seg2d_test: int
    seg3d_test: int
    ml_crops: int
    ml_epochs: int
    seg2d_crops: int
    seg2d_epochs: int
    seg3d_finetune: int
    auto_steps: int | None
    draws: int
    queries: int
    smoke: bool = False

    @staticmethod
    def of(smoke: bool) -> Sizes:
        if smoke:
            return Sizes(0.12, (0.025, 0.05, 0.1), 4, 16, 3, 3, 1, 2, 1, 4, 1, 1, 2, 2, 10, smoke=True)
        return Sizes(0.12, (0.025, 0.05, 0.1), 16, 128, 16, 8, 1, 24, 20, 32, 12, 3, 10, 4, 50)


@dataclass
class Bench:
    name: str
    title: str
    task: Task
    models: dict[str, nn.Module]
    x: Tensor
    y: Tensor
    setup: str
    train_s: dict[str, float] = field(default_factory=dict)


def _cached(tag: str, model: nn.Module, train: Callable[[], Any], smoke: bool) -> float:
    """Load ``model`` from the bench cache or train it (returns the training seconds, 0 when loaded)."""
    path = cache_dir("bench_certify_smoke" if smoke else "bench_certify") / f"{tag}.pt"
    if path.is_file():
        load_checkpoint(path, model)
        log(f"  loaded {path}")
        return 0.0
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        train()
    sec = time.perf_counter() - t0
    save_checkpoint(path, model, train_seconds=sec)
    log(f"  trained {tag} in {sec:.0f} s; cached at {path}")
    return sec


def _train(model: nn.Module, task: Task, x: Tensor, y: Tensor, sigma: float | None, epochs: int, lr: float,
           batch_size: int) -> None:
    strategy = GaussianAugmentation(sigma if sigma else 1e-12)  # σ ≈ 0: plain training on the same loop
    AdversarialTrainer(model, task, strategy, epochs=epochs, batch_size=batch_size, lr=lr, seed=0).fit(x, y)


def multilabel_bench(s: Sizes) -> Bench:
    train = brain_patches(split="train", crops_per_slice=s.ml_crops, seed=0)
    test = brain_patches(split="test", crops_per_slice=s.ml_crops, seed=0)
    task = MultiLabel()
    n_labels = len(train.label_names)
    models: dict[str, nn.Module] = {}
    secs: dict[str, float] = {}
    for kind, sigma in (("natural", None), ("noise", s.sigma)):
        torch.manual_seed(0)
        m = small_cnn(1, n_labels, width=16)
        tag = f"ml_cnn16_c{s.ml_crops}_e{s.ml_epochs}_{kind}{sigma or ''}"
        secs[kind] = _cached(tag, m, functools.partial(_train, m, task, train.x, train.y, sigma, s.ml_epochs, 3e-3, 32),
                             s.smoke)
        models[kind] = m.eval()
    with torch.no_grad():
        right = task.robust_metric(models["natural"](test.x), test.y) > 0.5
    clean_all = float(right.float().mean())
    order = torch.randperm(len(test), generator=torch.Generator().manual_seed(0))
    # patches the natural model gets exactly right first (the others are at the floor), others only to fill up
    order = torch.cat([order[right[order]], order[~right[order]]])[: s.n_test]
    setup = (f"`brain_patches` ({train.source}), 32×32 patches at 2 mm, {n_labels} labels, {len(train)} training "
             f"patches; `small_cnn(1, {n_labels}, width=16)`, {s.ml_epochs} epochs (Adam 3e-3, batch 32), natural "
             f"and with Gaussian noise σ = {s.sigma}; natural clean exact match on all {len(test)} test patches "
             f"{clean_all:.3f}; {len(order)} test patches ({int(right[order].sum())} of them exactly right; seeded "
             "random choice, the exactly right ones first)")
    return Bench("multilabel", "Multi-label CNN on brain patches (exact match)", task, models, test.x[order],
                 test.y[order], setup, secs)


def _slices(n_crops: int, split: str, seed: int, per_crop: int) -> tuple[Tensor, Tensor]:
    x3, y3 = tissue_patches(n_crops, 32, 2, split=split, seed=seed)
    idx = torch.linspace(4, 27, per_crop).round().long()
    x = x3[:, :, :, :, idx].permute(0, 4, 1, 2, 3).reshape(-1, 1, 32, 32).contiguous()
    y = y3[:, :, :, idx].permute(0, 3, 1, 2).reshape(-1, 32, 32).contiguous()
    return x, y


def seg2d_bench(s: Sizes) -> Bench:
    x_tr, y_tr = _slices(s.seg2d_crops, "train", 0, 4)
    task = Segmentation(len(TISSUE_CLASSES), include_background=False)
    channels = (16, 32, 64)
    models: dict[str, nn.Module] = {}
    secs: dict[str, float] = {}
    for kind, sigma in (("natural", None), ("noise", s.sigma)):
        torch.manual_seed(0)
        m = small_unet(1, len(TISSUE_CLASSES), ndim=2, channels=channels)
        tag = f"seg2d_unet_n{s.seg2d_crops}_e{s.seg2d_epochs}_{kind}{sigma or ''}"
        secs[kind] = _cached(tag, m, functools.partial(_train, m, task, x_tr, y_tr, sigma, s.seg2d_epochs, 5e-3, 16),
                             s.smoke)
        models[kind] = m.eval()
    x3, y3 = tissue_patches(s.seg2d_test, 32, 2, split="test", seed=1)
    x, y = x3[..., 16].contiguous(), y3[..., 16].contiguous()
    setup = (f"MONAI UNet 2-D (channels {channels}), {s.seg2d_epochs} epochs (Adam 5e-3, batch 16) on {len(x_tr)} "
             f"axial 32×32 slices (2 mm) of {s.seg2d_crops} left-hemisphere MNI152 crops, natural and with noise "
             f"σ = {s.sigma}; {s.seg2d_test} test slices (middle axial slice of right-hemisphere crops); "
             "`Segmentation(4, include_background=False)`")
    return Bench("seg2d", "2-D UNet on MNI152 tissue slices (mean Dice)", task, models, x, y, setup, secs)


def seg3d_bench(s: Sizes) -> Bench:
    from medadv.demo import DemoConfig, build_demo_model

    cfg = DemoConfig(n_train=4, epochs=1) if s.smoke else DemoConfig()
    t0 = time.perf_counter()
    cache = cache_dir("bench_certify_smoke") if s.smoke else None  # the full run shares `medadv demo`'s model
    natural = build_demo_model(cfg, cache=cache, progress=False, echo=log)
    secs = {"natural": time.perf_counter() - t0}
    task = Segmentation(len(TISSUE_CLASSES), include_background=False)
    noise = build_demo_model(cfg, cache=cache, progress=False, echo=lambda *_: None)  # a second copy, fine-tuned
    x_tr, y_tr = tissue_patches(cfg.n_train, cfg.patch, cfg.spacing_mm, split="train", seed=cfg.seed)
    tag = f"seg3d_{cfg.model_tag().removesuffix('.pt')}_noise{s.sigma}_ft{s.seg3d_finetune}"
    secs["noise"] = _cached(tag, noise, lambda: _train(noise, task, x_tr, y_tr, s.sigma, s.seg3d_finetune, 1e-3,
                                                       cfg.batch_size), s.smoke)
    x, y = tissue_patches(s.seg3d_test, cfg.patch, cfg.spacing_mm, split="test", seed=cfg.seed + 1)
    setup = (f"the UNet of `medadv demo` (MONAI UNet, channels {cfg.channels}, {cfg.epochs} epochs on {cfg.n_train} "
             f"left-hemisphere MNI152 crops {cfg.patch}³ at {cfg.spacing_mm} mm); noise model: the same weights "
             f"fine-tuned {s.seg3d_finetune} epochs with Gaussian noise σ = {s.sigma} (Adam 1e-3); {s.seg3d_test} "
             "right-hemisphere test crops; `Segmentation(4, include_background=False)`")
    return Bench("seg3d", "3-D UNet of `medadv demo` on MNI152 tissue (mean Dice)", task,
                 {"natural": natural.eval(), "noise": noise.eval()}, x, y, setup, secs)


BUILDERS = {"multilabel": multilabel_bench, "seg2d": seg2d_bench, "seg3d": seg3d_bench}


def certified_metric(b: Bench, res: Any, radii: tuple[float, ...]) -> Tensor:
    if res.family == "segmentation":
        return certified_dice(res, b.y, list(radii))
    return certified_accuracy(res, b.y, list(radii))  # multi-label: certified exact match


def run_model(b: Bench, kind: str, s: Sizes) -> dict[str, Any]:
    model = b.models[kind]
    with torch.no_grad():
        clean = float(b.task.robust_metric(model(b.x), b.y).float().mean())
    batch = 64 if b.name == "seg3d" else 1024
    rs = RandomizedSmoothing(b.task, s.sigma, n0=s.n0, n=s.n, alpha=0.001, batch_size=batch, seed=0)
    t0 = time.perf_counter()
    res = rs.certify(model, b.x, b.y)
    cert_s = time.perf_counter() - t0
    radii0 = (0.0, *s.radii)
    cert = certified_metric(b, res, radii0)
    # the smoothed model under `auto` (run on the expectation-over-noise surrogate), radius 0 = its clean metric
    t0 = time.perf_counter()
    per, _, masking = empirical_smoothed(rs, model, b.x, b.y, s.radii, attack="auto", bounds=BOUNDS,
                                         steps=s.auto_steps, draws=s.draws, seed=0, options={"queries": s.queries})
    emp_s = time.perf_counter() - t0
    emp = [float(v) for v in per.double().mean(dim=0)]
    certs = [float(v) for v in cert]
    row: dict[str, Any] = {"model": kind, "clean": clean, "cert": certs, "emp": emp, "cert_s": cert_s,
                           "emp_s": emp_s, "abstain": float(res.abstain_fraction.mean()), "masking": masking,
                           "ok": [c <= e + TOL for c, e in zip(certs, emp, strict=True)]}
    log(f"  {b.name}/{kind}: clean {clean:.3f}; certified {[round(v, 3) for v in certs]} in {cert_s:.1f} s; "
        f"smoothed under auto {[round(v, 3) for v in emp]} in {emp_s:.1f} s")
    return row


def report(benches: list[tuple[Bench, list[dict[str, Any]]]], s: Sizes, total_s: float) -> str:
    lines = ["# Certified vs. empirical robustness (randomized smoothing, `medadv.certify`)", "",
             "Generated by `benchmarks/certify.py`" + (" `--smoke` (tiny sizes: numbers meaningless)" if s.smoke
                                                        else "") + f" on {platform.processor() or 'CPU'}, torch "
             f"{torch.__version__}, {torch.get_num_threads()} threads; total {total_s:.0f} s.", "",
             f"Smoothing: σ = {s.sigma} (data units, inputs in [0, 1]), n0 = {s.n0} selection and n = {s.n} "
             "estimation draws, α = 0.001, Bonferroni over labels / voxels, per-element radii. Certified metric at "
             "L2 radius r: abstentions (and elements certified below r) count as errors. Empirical: the smoothed "
             f"model under `auto` (`version=\"fast\"`{'' if s.auto_steps is None else f', {s.auto_steps} steps'}, "
             f"{s.queries} Square queries) in the L2 ball of radius r, box [0, 1], run on the average of the base "
             f"model's probabilities over {s.draws} fixed noise draws (Salman et al. 2019) and scored by the "
             f"smoothed model's majority class of n draws; at r the worst of the clean input and every attack at "
             "radius ≤ r. Each cell: certified / empirical.", ""]
    for b, rows in benches:
        lines += [f"## {b.title}", "", b.setup + ".", ""]
        head = ("| model | train s | clean (base) | smoothed, r = 0 | "
                + " | ".join(f"cert. / emp. at r = {r:g}" for r in s.radii)
                + " | abstain | certify s | attack s | certified ≤ empirical |")
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for row in rows:
            pairs = " | ".join(f"{c:.3f} / {e:.3f}" for c, e in zip(row["cert"][1:], row["emp"][1:], strict=True))
            lines.append(f"| {row['model']} | {b.train_s.get(row['model'], 0.0):.0f} | {row['clean']:.3f} | "
                         f"{row['cert'][0]:.3f} / {row['emp'][0]:.3f} | {pairs} | {row['abstain']:.3f} | "
                         f"{row['cert_s']:.1f} | "
                         f"{row['emp_s']:.1f} | {'yes' if all(row['ok']) else 'NO'} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a test runs this)")
    ap.add_argument("--task", choices=[*BUILDERS, "all"], default="all")
    ap.add_argument("--output", type=Path, default=None, help="write the Markdown table here")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    s = Sizes.of(args.smoke)
    t0 = time.perf_counter()
    done: list[tuple[Bench, list[dict[str, Any]]]] = []
    for name, build in BUILDERS.items():
        if args.task not in ("all", name):
            continue
        log(f"{name}:")
        b = build(s)
        done.append((b, [run_model(b, kind, s) for kind in ("natural", "noise")]))
    text = report(done, s, time.perf_counter() - t0)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps({b.name: rows for b, rows in done}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
