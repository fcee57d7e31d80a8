"""The papers' headline studies, one call each, on real offline data (CPU).

* Medi et al. (class-wise robustness): ``classwise`` on a multi-label CNN (brain patches, 8 AAL macro-regions)
  under PGD, and on the 3-D UNet of ``medadv demo`` (MNI152 tissue, voxel-level CFPS with and without background).
* Paschali et al. (generalizability vs robustness): ``models`` (three CNN widths, white-box), ``transfer``
  (3 × 3 black-box table, FGSM and PGD) and ``noise_baseline`` (Gaussian noise at the SSIM of each example).
* Xu et al.: ``corruptions`` (MONAI suite, severities 1..5, flip probability) and ``correlation`` (label
  co-occurrence clean vs PGD, feature shift at a hidden layer).
* Malik et al.: ``frequency`` on the 3-D UNet (the PGD perturbation restricted to low / high DCT bands).
* Zhang et al. (saliency): not a study of :mod:`medadv.studies`; see ``benchmarks/saliency.md``.

Models are trained once and cached (``$MEDADV_CACHE`` or ``~/.cache/medadv``, sub-folder ``bench_papers``; the
3-D UNet is the demo's). Run ``OMP_NUM_THREADS=2 python benchmarks/papers.py [--quick] [--json PATH]``; it
prints the Markdown of ``benchmarks/papers.md``'s tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch
from torch import nn

from medadv import FGSM, PGD, Linf, MultiLabel, Segmentation
from medadv.data.brain_patches import brain_patches
from medadv.data.mni152 import TISSUE_CLASSES, tissue_patches
from medadv.models import cache_dir, fit_supervised, load_checkpoint, save_checkpoint, small_cnn
from medadv.studies import (
    StudyResult,
    classwise,
    correlation,
    corruptions,
    frequency,
    models,
    noise_baseline,
    transfer,
)

BOUNDS = (0.0, 1.0)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cnn(width: int, seed: int, train: Any, epochs: int) -> nn.Module:
    torch.manual_seed(seed)
    model = small_cnn(1, len(train.label_names), width=width)
    path = cache_dir("bench_papers") / f"multilabel_cnn{width}_n{len(train)}_e{epochs}_seed{seed}.pt"
    if path.is_file():
        load_checkpoint(path, model)
    else:
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            losses = fit_supervised(model, MultiLabel(), train.x, train.y, epochs=epochs, batch_size=32, lr=3e-3,
                                    seed=seed)
        save_checkpoint(path, model, final_loss=float(losses[-1]))
        log(f"  trained cnn{width} in {time.perf_counter() - t0:.0f} s")
    return model.eval()


def table(r: StudyResult, cols: list[str], digits: int = 3) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in cols) + " |" for row in r.rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer patches, epochs and severities (a smoke run)")
    ap.add_argument("--json", help="also write every StudyResult to this JSON file")
    args = ap.parse_args()
    crops, epochs, n_test = (4, 4, 48) if args.quick else (24, 20, 192)
    t_start = time.perf_counter()
    out: dict[str, StudyResult] = {}
    md: list[str] = []

    # --- data and models --------------------------------------------------------------------------------------
    train = brain_patches(split="train", crops_per_slice=crops, seed=0)
    test = brain_patches(split="test", crops_per_slice=crops, seed=0)
    order = torch.randperm(len(test), generator=torch.Generator().manual_seed(0))[:n_test]
    x, y = test.x[order], test.y[order]
    names = list(train.label_names)
    task = MultiLabel()
    nets = {f"cnn{w}": cnn(w, seed, train, epochs) for w, seed in ((8, 0), (16, 1), (32, 2))}
    main_net = nets["cnn16"]
    # Paschali's comparisons use exact match: on the test patches every model gets exactly right (the others
    # are at the metric's floor already); the label-level studies use every test patch
    with torch.no_grad():
        right = torch.stack([task.robust_metric(m(x), y) > 0.5 for m in nets.values()]).all(0)
    xr, yr = x[right], y[right]
    eps = 4 / 255
    pgd = PGD(task, Linf(eps, bounds=BOUNDS), steps=10)
    fgsm = FGSM(task, Linf(eps, bounds=BOUNDS))
    md.append(f"Data: `brain_patches` ({train.source}), {len(train)} training and {len(y)} test patches "
              f"(32×32, 2 mm), {len(names)} labels; `small_cnn` widths 8/16/32 trained naturally ({epochs} epochs, "
              f"Adam 3e-3). Exact-match studies (models, transfer, noise) use the {int(right.sum())} test patches all "
              "three models get exactly right. Attacks: L∞ ε = 4/255 on [0, 1]; PGD 10 steps; FGSM.")

    def run(name: str, fn: Any, *a: Any, **kw: Any) -> StudyResult:
        t0 = time.perf_counter()
        r = fn(*a, **kw)
        log(f"{name}: {time.perf_counter() - t0:.1f} s")
        out[name] = r
        return r

    # --- Medi et al. --------------------------------------------------------------------------------------------
    r = run("classwise_multilabel", classwise, main_net, task, (x, y), {"pgd": pgd}, class_names=names)
    md += ["", "## Medi et al.: class-wise robustness (cnn16, PGD, all test patches)", "", table(r, ["class", "support", "clean", "adv",
                                                                              "cfps_clean", "cfps_adv", "cfns_clean",
                                                                              "cfns_adv"])]
    md.append("\nAttractors (labels by CFPS, most spurious findings first): "
              + "; ".join(f"{k}: {' > '.join(v)}" for k, v in r.meta["attractors"].items()))

    from medadv.demo import DemoConfig, build_demo_model

    cfg = DemoConfig()
    unet = build_demo_model(cfg, progress=False, echo=log)
    seg = Segmentation(len(TISSUE_CLASSES), include_background=False)
    xs, ys = tissue_patches(4 if args.quick else 8, cfg.patch, cfg.spacing_mm, split="test", seed=cfg.seed + 1)
    seg_pgd = PGD(seg, Linf(4 / 255, bounds=BOUNDS), steps=10)
    r = run("classwise_seg3d", classwise, unet, seg, (xs, ys), {"pgd": seg_pgd}, class_names=list(TISSUE_CLASSES))
    md += ["", "### 3-D UNet (MNI152 tissue), PGD ε = 4/255: voxel CFPS with and without background", "",
           table(r, ["background", "class", "support", "clean", "adv", "cfps_clean", "cfps_adv"])]

    # --- Paschali et al. ----------------------------------------------------------------------------------------
    r = run("models", models, nets, task, (xr, yr), {"fgsm": fgsm, "pgd": pgd})
    md += ["", "## Paschali et al.: generalizability vs robustness", "", "White-box, exact match:", "",
           table(r, ["model", "clean", "attack", "adv", "drop_points"])]
    r = run("transfer", transfer, nets, nets, task, (xr, yr), {"fgsm": fgsm, "pgd": pgd})
    md += ["", "Transfer (exact match of the target on the surrogate's examples):", "",
           table(r, ["attack", "surrogate", "target", "clean", "adv", "fooling_rate", "white_box"])]
    md += ["", "Black-box summary per target (Avg over the 4 cells from other models, drop in points):", "",
           "| target | clean | avg | drop |", "|---|---|---|---|"]
    md += [f"| {s['target']} | {s['clean']:.3f} | {s['avg']:.3f} | {s['drop_points']:.1f} |" for s in r.meta["summary"]]
    r = run("noise_baseline", noise_baseline, main_net, task, (xr, yr), {"fgsm": fgsm, "pgd": pgd})
    md += ["", "Noise at the SSIM of each adversarial example (cnn16):", "",
           table(r, ["attack", "clean_metric", "adv_metric", "noise_metric", "ssim_adv", "ssim_noise", "sigma"], 4)]

    # --- Xu et al. ----------------------------------------------------------------------------------------------
    r = run("corruptions", corruptions, main_net, task, (x, y), bounds=BOUNDS,
            severities=(1, 3, 5) if args.quick else (1, 2, 3, 4, 5), frames=3)
    md += ["", "## Xu et al.: corruptions and flip probability (cnn16, 3 frames per sequence)", "",
           table(r, ["corruption", "severity", "param", "kind", "metric_clean", "metric", "flip_probability"])]
    r = run("correlation", correlation, main_net, task, (x, y), {"pgd": pgd}, layer="4", label_names=names)
    co = r.meta["cooccurrence"]
    clean_links = sum(v for i, row in enumerate(co["clean"]) for j, v in enumerate(row) if i != j)
    adv_links = sum(v for i, row in enumerate(co["adv"]) for j, v in enumerate(row) if i != j)
    md += ["", "Label co-occurrence under PGD (cnn16):", "",
           table(r, ["label", "clean_count", "adv_count", "clean_rowsum", "adv_rowsum"]),
           f"\nOff-diagonal co-occurrence total: clean {clean_links}, PGD {adv_links}; feature shift at layer 4 "
           f"(mean clean→adv distance / mean clean spread): {r.rows[0]['feature_shift']:.3f}."]

    # --- Malik et al. -------------------------------------------------------------------------------------------
    r = run("frequency", frequency, unet, seg, (xs, ys), {"pgd": seg_pgd}, cutoff=0.25)
    md += ["", "## Malik et al.: frequency bands of the PGD perturbation (3-D UNet, mean Dice)", "",
           table(r, ["attack", "band", "value", "retained"])]

    md.append(f"\nTotal time: {time.perf_counter() - t_start:.0f} s on {torch.get_num_threads()} threads.")
    print("\n".join(md))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({k: v.to_dict() for k, v in out.items()}, fh, indent=1)


if __name__ == "__main__":
    main()
