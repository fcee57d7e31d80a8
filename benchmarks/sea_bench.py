"""``auto`` against SEA (Croce, Singh & Hein, ECCV 2024) on segmentation, per sample, on Dice, pixel accuracy, mIoU.

SEA runs from its own repository (nmndeep/Robust-Segmentation, no licence: nothing of it is copied here): point
``MEDADV_SEA_ROOT`` at a local checkout (the folder holding ``semseg/attacker.py``). The script imports that one
file (its ``apgd_largereps``, as the reference's ``tools/infer.py`` calls it: APGD with the progressive radius
2ε → 1.5ε → ε, random start, ``early_stop=True``) and runs the three standard SEA losses (class-balanced masked
cross-entropy with data-set class weights, masked cross-entropy, Jensen–Shannon), keeping per image the result
with the lowest pixel accuracy, as SEA does. Without ``MEDADV_SEA_ROOT`` it says so and runs ``auto`` alone.

Models (trained here on the offline MNI152 template, cached like ``auto_bench.py``'s):

* ``seg2d``: the 2-D MONAI UNet of ``benchmarks/auto_bench.py`` (natural training), its 32 test slices;
* ``seg2d-at``: the same UNet fine-tuned with PGD adversarial training (L∞ 8/255, 5 steps of 2/255);
* ``seg3d``: the 3-D UNet of ``medadv demo`` on its held-out crops.

For each model and ε ∈ {1, 2, 4, 8}/255 (L∞, box [0, 1]): the clean metrics, SEA (worst of its three runs),
``auto`` (``version="standard"``, selection by each of ``dice``, ``accuracy``, ``miou`` and ``worst-of``), and per
sample how often each one is lower (a stronger attack), on mean Dice, pixel accuracy and mIoU. ``--ablation``
runs ``auto``'s ingredients one at a time on ``seg2d`` (members, progressive radius, iterations, selection).

Run: ``MEDADV_SEA_ROOT=/path/to/Robust-Segmentation OMP_NUM_THREADS=1 python benchmarks/sea_bench.py
[--quick] [--models seg2d,seg2d-at,seg3d] [--ablation]``; it prints Markdown (copied into ``benchmarks/auto.md``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import auto_bench  # noqa: E402  (the models and data of the auto benchmark)

from medadv.attacks.auto import AutoEvaluation  # noqa: E402
from medadv.attacks.pgd import PGD  # noqa: E402
from medadv.data.mni152 import TISSUE_CLASSES  # noqa: E402
from medadv.defenses import PGDAT, AdversarialTrainer  # noqa: E402
from medadv.tasks import Segmentation  # noqa: E402
from medadv.threats import Linf  # noqa: E402

BOUNDS = (0.0, 1.0)
EPS = (1 / 255, 2 / 255, 4 / 255, 8 / 255)
METRICS = ("mean_dice", "pixel_accuracy", "miou")
SEA_LOSSES = ("mask-ce-bal", "mask-ce-avg", "js-avg")
SEA_ENV = "MEDADV_SEA_ROOT"
log = auto_bench.log


# ------------------------------------------------------------------------------------------------ the reference
def load_sea() -> Any | None:
    """SEA's ``semseg/attacker.py`` from ``$MEDADV_SEA_ROOT``, or None (and a plain message) when absent."""
    root = os.environ.get(SEA_ENV)
    if not root:
        log(f"{SEA_ENV} is not set: SEA is not run (set it to a checkout of github.com/nmndeep/Robust-Segmentation)")
        return None
    path = Path(root) / "semseg" / "attacker.py"
    if not path.is_file():
        log(f"{SEA_ENV}={root} has no semseg/attacker.py: SEA is not run")
        return None
    import pyautoattack
    import pyautoattack.other_utils

    # the reference imports AutoAttack under its GitHub name; pyautoattack is the same package on PyPI
    sys.modules.setdefault("autoattack", pyautoattack)
    sys.modules.setdefault("autoattack.other_utils", pyautoattack.other_utils)
    spec = importlib.util.spec_from_file_location("sea_attacker", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def class_weights(y: Tensor, num_classes: int) -> Tensor:
    """Data-set class weights of SEA's balanced loss: inverse class frequency over the training labels, mean 1."""
    freq = torch.bincount(y.reshape(-1), minlength=num_classes).double()
    w = 1.0 / freq.clamp_min(1.0)
    return (w / w.mean()).float()


def run_sea(sea: Any, model: nn.Module, x: Tensor, y: Tensor, eps: float, steps: int, weights: Tensor,
            num_classes: int, seed: int = 0) -> tuple[dict[str, Tensor], float]:
    """SEA's three runs; per image the result with the lowest pixel accuracy. Returns the per-sample metrics of
    the kept example (through medadv's task, so both sides are measured by the same code) and the seconds."""
    task = Segmentation(num_classes, include_background=False)
    best_x, best_acc = x.clone(), torch.full((x.shape[0],), float("inf"))
    t0 = time.perf_counter()
    for loss in SEA_LOSSES:
        torch.manual_seed(seed)  # its random start draws from the global generator
        x_adv, _, _ = sea.apgd_largereps(model, x.clone(), y.clone(), weights, norm="Linf", eps=eps, n_iter=steps,
                                         loss=loss, use_rs=True, track_loss="ce-avg", num_classes=num_classes,
                                         early_stop=True)
        with torch.no_grad():
            acc = task.outcome(model(x_adv), y).columns["pixel_accuracy"]
        better = acc < best_acc
        best_x[better], best_acc[better] = x_adv[better], acc[better]
    seconds = time.perf_counter() - t0
    assert float((best_x - x).abs().max()) <= eps + 1e-6, "SEA left the ε-ball"
    return metrics(task, model, best_x, y), seconds


# ---------------------------------------------------------------------------------------------------- measuring
def metrics(task: Segmentation, model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    with torch.no_grad():
        cols = task.outcome(model(x), y).columns
    return {m: cols[m].float() for m in METRICS}


def run_auto(b: Any, eps: float, **kw: Any) -> tuple[dict[str, Tensor], float, Any]:
    atk = AutoEvaluation(b.task, Linf(eps, bounds=BOUNDS), checks=False, seed=0, **kw)
    t0 = time.perf_counter()
    res = atk(b.model, b.x, b.y)
    seconds = time.perf_counter() - t0
    assert float((res.x_adv - b.x).abs().max()) <= eps + 1e-6, "auto left the ε-ball"
    if kw.get("metric") == "worst-of":  # each metric's own worst case over the members
        det = res.details
        return {c: det.worst_of[:, i].float() for i, c in enumerate(det.worst_of_columns)}, seconds, res
    return metrics(b.task, b.model, res.x_adv, b.y), seconds, res


def wins(a: Tensor, ref: Tensor, tol: float = 1e-6) -> tuple[int, int]:
    """(samples where ``a`` is lower — the stronger attack —, samples where ``ref`` is lower)."""
    return int((a < ref - tol).sum()), int((ref < a - tol).sum())


def fmt_eps(eps: float) -> str:
    return f"{eps * 255:g}/255"


# ---------------------------------------------------------------------------------------------------- the models
def at_bench(n: int, quick: bool) -> Any:
    """The 2-D UNet fine-tuned with PGD-AT (L∞ 8/255, 5 steps of 2/255) from the natural one."""
    b = auto_bench.seg2d_bench(n, quick)
    epochs = 2 if quick else 20
    n_crops = 16 if quick else 96
    x_tr, y_tr = auto_bench._slices(n_crops, "train", 0, 4)
    model = b.model
    strategy = PGDAT(Linf(8 / 255, bounds=BOUNDS), steps=5, step_size=2 / 255)
    tag = f"seg2d_unet_pgdat8_n{n_crops}_e{epochs}_seed0"
    auto_bench._cached(tag, model, lambda: AdversarialTrainer(model, b.task, strategy, epochs=epochs, batch_size=16,
                                                              lr=2e-3, seed=0).fit(x_tr, y_tr)[-1])
    model.eval()
    b.name, b.title = "seg2d-at", "2-D UNet, PGD-AT 8/255 (fine-tuned from the natural one)"
    b.setup += f"; then PGD-AT (L∞ 8/255, 5 steps of 2/255) for {epochs} epochs (Adam 2e-3)"
    return b


BUILDERS = {"seg2d": auto_bench.seg2d_bench, "seg2d-at": at_bench, "seg3d": auto_bench.seg3d_bench}


def train_weights(quick: bool) -> Tensor:
    _, y_tr = auto_bench._slices(16 if quick else 96, "train", 0, 4)
    return class_weights(y_tr, len(TISSUE_CLASSES))


# ---------------------------------------------------------------------------------------------------- the tables
def compare(b: Any, sea: Any, weights: Tensor, eps_list: tuple[float, ...], steps: int, quick: bool,
            selections: tuple[str, ...]) -> str:
    lines = [f"### {b.title}\n", f"Setup: {b.setup}. Samples: {b.x.shape[0]}.\n",
             "| ε | metric | clean | SEA (worst of 3) | " + " | ".join(f"auto `{s}`" for s in selections)
             + " | PGD-100 | auto < SEA / SEA < auto (samples) |", "|---" * (6 + len(selections)) + "|"]
    times: list[str] = []
    for eps in eps_list:
        clean = metrics(b.task, b.model, b.x, b.y)
        sea_m, sea_s = run_sea(sea, b.model, b.x, b.y, eps, steps, weights, b.task.num_classes) if sea else ({}, 0.0)
        autos = {}
        for sel in selections:
            kw: dict[str, Any] = {"version": "standard", "metric": sel}
            if quick:
                kw.update(steps=5, queries=20)
            m, s, _ = run_auto(b, eps, **kw)
            autos[sel] = (m, s)
        pgd = PGD(b.task, Linf(eps, bounds=BOUNDS), steps=10 if quick else 100, seed=0)
        pgd_m = metrics(b.task, b.model, pgd(b.model, b.x, b.y).x_adv, b.y)
        for metric in METRICS:
            sel = selections[0]  # the per-sample counts are of the first selection (the standard's)
            cells = [fmt_eps(eps), metric, f"{float(clean[metric].mean()):.4f}",
                     f"{float(sea_m[metric].mean()):.4f}" if sea_m else "—"]
            cells += [f"{float(autos[s][0][metric].mean()):.4f}" for s in selections]
            cells.append(f"{float(pgd_m[metric].mean()):.4f}")
            if sea_m:
                w = wins(autos[sel][0][metric], sea_m[metric])
                cells.append(f"{w[0]} / {w[1]} (`{sel}`)")
            else:
                cells.append("—")
            lines.append("| " + " | ".join(cells) + " |")
        times.append(f"ε {fmt_eps(eps)}: SEA {sea_s:.0f} s, " + ", ".join(f"auto `{s}` {autos[s][1]:.0f} s"
                                                                         for s in selections))
        log(f"  {b.name} ε={fmt_eps(eps)} done: " + times[-1])
    lines += ["", "Times (2 CPU cores): " + "; ".join(times) + ".", ""]
    return "\n".join(lines)


ABLATION: dict[str, dict[str, Any]] = {
    "standard before (100 steps, no radius, Dice)": {"version": "custom",
                                                   "attacks": ["apgd-ce", "apgd-balanced-ce", "apgd-js", "apgd-cospgd",
                                                               "apgd-segpgd", "square"], "steps": 100},
    "+ progressive radius": {"version": "custom", "attacks": ["apgd-ce", "apgd-balanced-ce", "apgd-js", "apgd-cospgd",
                                                             "apgd-segpgd", "square"], "steps": 100,
                             "progressive_radius": True},
    "masked CE ×2 + JS, radius, 100 steps": {"version": "custom",
                                            "attacks": ["apgd-masked-balanced-ce", "apgd-masked-ce", "apgd-js"],
                                            "steps": 100, "progressive_radius": True},
    "masked CE ×2 + JS, radius, 300 steps": {"version": "custom",
                                            "attacks": ["apgd-masked-balanced-ce", "apgd-masked-ce", "apgd-js"],
                                            "steps": 300, "progressive_radius": True},
    "standard now": {"version": "standard"},
}


def ablation(b: Any, sea: Any, weights: Tensor, eps_list: tuple[float, ...], steps: int, quick: bool) -> str:
    lines = [f"### Ablation on {b.title}\n", "| ε | variant | mean Dice | pixel acc. | mIoU | seconds | "
             "lower than SEA on Dice / acc. (samples) |", "|---|---|---|---|---|---|---|"]
    for eps in eps_list:
        sea_m, sea_s = run_sea(sea, b.model, b.x, b.y, eps, steps, weights, b.task.num_classes) if sea else ({}, 0.0)
        if sea_m:
            lines.append(f"| {fmt_eps(eps)} | SEA (3 × {steps}) | {float(sea_m['mean_dice'].mean()):.3f} | "
                         f"{float(sea_m['pixel_accuracy'].mean()):.3f} | {float(sea_m['miou'].mean()):.3f} | "
                         f"{sea_s:.0f} | |")
        for name, kw in ABLATION.items():
            kw = dict(kw)
            for sel in ("dice", "accuracy"):
                if quick:
                    kw.update(steps=5, queries=20)
                m, s, _ = run_auto(b, eps, metric=sel, **kw)
                vs = (f"{wins(m['mean_dice'], sea_m['mean_dice'])[0]}–{wins(m['mean_dice'], sea_m['mean_dice'])[1]} / "
                      f"{wins(m['pixel_accuracy'], sea_m['pixel_accuracy'])[0]}–"
                      f"{wins(m['pixel_accuracy'], sea_m['pixel_accuracy'])[1]}") if sea_m else "—"
                lines.append(f"| {fmt_eps(eps)} | {name}, select `{sel}` | {float(m['mean_dice'].mean()):.3f} | "
                             f"{float(m['pixel_accuracy'].mean()):.3f} | {float(m['miou'].mean()):.3f} | {s:.0f} | "
                             f"{vs} |")
                log(lines[-1])
    return "\n".join(lines + [""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: few samples, few steps")
    ap.add_argument("--models", default="seg2d,seg2d-at,seg3d")
    ap.add_argument("--eps", default=None, help="comma-separated budgets in 1/255 (default 1,2,4,8)")
    ap.add_argument("--steps", type=int, default=300, help="SEA's iterations per loss (the paper's 300)")
    ap.add_argument("--ablation", action="store_true", help="the ablation of auto's ingredients (seg2d)")
    ap.add_argument("--selections", default="worst-of,dice,accuracy",
                    help="auto's selection metrics to run; the first one's per-sample counts against SEA are shown")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sea = load_sea()
    eps_list = tuple(float(e) / 255 for e in args.eps.split(",")) if args.eps else EPS
    steps = 5 if args.quick else args.steps
    weights = train_weights(args.quick)
    print(f"# auto vs SEA\n\nmedadv on {platform.machine()} CPU, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread; box [0, 1], L∞; SEA from `${SEA_ENV}` "
          f"({'found' if sea else 'absent: not run'}), {steps} iterations per loss.\n")
    n_default = {"seg2d": 32, "seg2d-at": 32, "seg3d": 8}
    for name in args.models.split(","):
        b = BUILDERS[name](4 if args.quick else n_default[name], args.quick)
        if args.ablation:
            print(ablation(b, sea, weights, eps_list, steps, args.quick))
        else:
            print(compare(b, sea, weights, eps_list, steps, args.quick, tuple(args.selections.split(","))))


if __name__ == "__main__":
    main()
