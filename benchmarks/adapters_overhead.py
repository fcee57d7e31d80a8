"""Adapter overhead: the same L∞ PGD through each toolkit adapter vs. medadv's own loop, one 3-D UNet.

Every run does the same number of forward+backward passes on the same volumes (no random start), so the
ratios to medadv's PGD measure what each bridge (and the toolkit's own loop) adds. Times are medians of
``--repeats`` runs in the same process; compare ratios, not seconds, across machines.

    OMP_NUM_THREADS=1 python benchmarks/adapters_overhead.py --size 24 --steps 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=24)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torchattacks
    from art.attacks.evasion import ProjectedGradientDescentNumpy

    from medadv.adapters import foolbox as mfb
    from medadv.adapters.art import ARTSegmenter
    from medadv.adapters.torchattacks import TorchattacksModel
    from medadv.attacks.pgd import PGD
    from medadv.models import small_unet
    from medadv.tasks import Segmentation
    from medadv.threats import Linf

    torch.manual_seed(0)
    model = small_unet(1, 3, ndim=3, channels=(8, 16, 32)).eval()
    task = Segmentation(3)
    x = torch.rand(args.batch, 1, *([args.size] * 3))
    with torch.no_grad():
        y = model(x).argmax(1)
    eps, alpha, n = 0.03, 0.01, args.steps

    medadv_pgd = PGD(task, Linf(eps, bounds=(0.0, 1.0)), steps=n, step_size=alpha, random_start=False)
    est = ARTSegmenter(model, task, x.shape[1:], clip_values=(0.0, 1.0))
    art_pgd = ProjectedGradientDescentNumpy(est, eps=eps, eps_step=alpha, max_iter=n, num_random_init=0,
                                            verbose=False)
    fmodel = mfb.TaskModel(model, task, bounds=(0, 1))
    fb_pgd = mfb.LinfPGD(steps=n, abs_stepsize=alpha, random_start=False)
    w = TorchattacksModel(model, task, bounds=(0.0, 1.0))
    ta_pgd = torchattacks.PGD(w, eps=eps, alpha=alpha, steps=n, random_start=False)
    xn, yn = x.numpy(), y.numpy()

    runs = {
        "medadv PGD": lambda: medadv_pgd(model, x, y),
        "ART PGD (ARTSegmenter)": lambda: art_pgd.generate(xn, y=yn),
        "Foolbox LinfPGD (TaskModel)": lambda: fb_pgd(fmodel, x, mfb.criterion(task, y), epsilons=eps),
        "torchattacks PGD (TorchattacksModel)": lambda: w.attack(ta_pgd, x, y),
    }
    times = {}
    for name, fn in runs.items():
        fn()  # warm-up
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        times[name] = statistics.median(samples)
    base = times["medadv PGD"]
    print(f"3-D UNet, batch {args.batch} x 1 x {args.size}^3, {n} steps, {torch.get_num_threads()} thread(s)")
    print("| run | median s | ratio to medadv PGD |")
    print("|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {t:.3f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
