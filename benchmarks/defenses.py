"""Adversarial training and GAP on real brain-MRI patches (multi-label), CPU, a few minutes.

Data: :func:`medadv.data.brain_patches.brain_patches` — Colin27 T1 patches labelled with the 8 AAL
macro-regions they contain (Debian ``mricron-data``; nilearn MNI152 tissue x hemisphere fallback
otherwise). A small CNN is trained with the same loop, optimiser, seed and epochs under five
strategies after a shared natural pretraining: natural, PGD-AT, MPAdvT, MAAdvT (multi-label Bernoulli MART), TRADES. Each is evaluated
clean and under white-box PGD at ε = 2/255 and 4/255 (per-label accuracy at τ = 0.5 and macro AUC).
GAP generators are trained against the natural model at L∞ = 7, 11, 13 (/255) and their fooling rate
(fraction of patches with at least one label flipped) is reported on the training split ("X") and the
held-out split ("val."), next to random ±ε sign noise of the same L∞ norm, and transferred to the
defended models.

Run: ``OMP_NUM_THREADS=1 python benchmarks/defenses.py`` (``--quick`` for a smoke run). Prints
Markdown tables (copied into ``benchmarks/defenses.md``).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from medadv.attacks.gap import GAP, GAPTrainer
from medadv.attacks.pgd import PGD
from medadv.data.brain_patches import brain_patches
from medadv.defenses import PGDAT, TRADES, AdversarialTrainer, MAAdvT, MPAdvT, TrainingStrategy
from medadv.metrics.classification import macro_auc
from medadv.models import small_cnn
from medadv.models.generators import UnetGenerator
from medadv.tasks import MultiLabel
from medadv.threats import Linf

BOUNDS = (0.0, 1.0)


class Natural(TrainingStrategy):
    """Plain training through the same loop (the baseline)."""

    name = "natural"

    def loss(self, model, x, y, task, generator):
        return task.loss(model(x), y).mean()


def evaluate(model, task, x, y, eps_list, steps):
    """Clean and PGD per-label accuracy and macro AUC."""
    out = {}
    with torch.no_grad():
        logits = model(x)
    out["clean"] = (float(task.element_correct(logits, y).float().mean()), float(macro_auc(logits, y)))
    for eps in eps_list:
        res = PGD(task, Linf(eps, bounds=BOUNDS), steps=steps, step_size=eps / 4, seed=0)(model, x, y)
        out[eps] = (float(task.element_correct(res.logits, y).float().mean()), float(macro_auc(res.logits, y)))
    return out


def noise_fooling(model, task, x, eps, seed=0):
    g = torch.Generator().manual_seed(seed)
    noise = (torch.randint(0, 2, x.shape, generator=g) * 2 - 1).to(x.dtype) * eps
    with torch.no_grad():
        return float(task.fooled(model((x + noise).clamp(*BOUNDS)), task.predict(model(x))).float().mean())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny smoke run")
    ap.add_argument("--pretrain-epochs", type=int, default=15, help="natural epochs every model starts from")
    ap.add_argument("--epochs", type=int, default=10, help="epochs of each strategy after the pretraining")
    ap.add_argument("--gap-epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    pre_epochs, epochs, gap_epochs, crops = (1, 1, 1, 4) if args.quick else (
        args.pretrain_epochs, args.epochs, args.gap_epochs, 24)

    t0 = time.perf_counter()
    train = brain_patches(split="train", crops_per_slice=crops, seed=args.seed)
    test = brain_patches(split="test", crops_per_slice=crops, seed=args.seed)
    task = MultiLabel()
    L = len(train.label_names)
    print(f"data: {train.source}; train {len(train)} / test {len(test)} patches {tuple(train.x.shape[1:])}; "
          f"labels {', '.join(train.label_names)}; train prevalence "
          f"{', '.join(f'{p:.2f}' for p in train.y.mean(0).tolist())} ({time.perf_counter() - t0:.1f} s)")

    eps_train = 4 / 255
    alpha = 1 / 255
    threat = Linf(eps_train, bounds=BOUNDS)
    strategies = {
        "natural": Natural(),
        "PGD-AT (ε 4/255, 4 steps)": PGDAT(threat, steps=4, step_size=alpha),
        "MPAdvT (ε~U(0.01,0.04), T∈{1..9})": MPAdvT(BOUNDS, eps_range=(0.01, 0.04), steps_range=(1, 9), step_size=alpha),
        "MAAdvT (multi-label MART, β 6)": MAAdvT(threat, steps=4, step_size=alpha, beta=6.0),
        "TRADES (β 6)": TRADES(threat, steps=4, step_size=alpha, beta=6.0),
    }
    eval_eps = [2 / 255, 4 / 255]
    models, rows, times = {}, [], {}
    # Every model starts from the same naturally trained weights (Xu et al. start from pretrained
    # backbones; from random init the adversarial strategies collapse towards the label prevalences here).
    torch.manual_seed(args.seed)
    start = small_cnn(1, L, width=16)
    if pre_epochs > 0:
        AdversarialTrainer(start, task, Natural(), epochs=pre_epochs, batch_size=32, lr=3e-3, seed=args.seed).fit(
            train.x, train.y)
    for name, strategy in strategies.items():
        model = small_cnn(1, L, width=16)
        model.load_state_dict(start.state_dict())
        t = time.perf_counter()
        AdversarialTrainer(model, task, strategy, epochs=epochs, batch_size=32, lr=3e-3, seed=args.seed).fit(train.x, train.y)
        times[name] = time.perf_counter() - t
        models[name] = model
        rows.append((name, evaluate(model, task, test.x, test.y, eval_eps, steps=10)))
        print(f"  trained {name} in {times[name]:.1f} s", file=sys.stderr)
    n_params = sum(p.numel() for p in models["natural"].parameters())

    print(f"\n### Clean and PGD-10 robust metrics on the test split (small CNN, {n_params} parameters, "
          f"{pre_epochs} natural epochs then {epochs} epochs of each strategy, Adam 3e-3, batch 32, seed {args.seed})\n")
    print("| training | clean acc | clean AUC | PGD 2/255 acc | PGD 2/255 AUC | PGD 4/255 acc | PGD 4/255 AUC "
          "| train time (× natural) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        cells = [r["clean"], r[eval_eps[0]], r[eval_eps[1]]]
        print(f"| {name} | " + " | ".join(f"{a:.3f} | {u:.3f}" for a, u in cells)
              + f" | {times[name] / times['natural']:.1f} |")

    print("\n### GAP (U-Net generator) against the natural model; fooling rate = any label flipped\n")
    print("| L∞ (/255) | GAP FR on X (train) | GAP FR on val. | noise FR on val. | val. acc under GAP "
          "| transfer FR: " + " | ".join(n.split(" (")[0] for n in list(models)[1:]) + " |")
    print("|---" * (5 + len(models) - 1) + "|")
    natural = models["natural"]
    for mag in (7, 11, 13):
        eps = mag / 255
        atk = GAP(task, Linf(eps, bounds=BOUNDS), UnetGenerator(1, ngf=16, depth=3, seed=args.seed))
        GAPTrainer(atk, natural, epochs=gap_epochs, batch_size=32, lr=1e-3, seed=args.seed).fit(train.x, x_val=None)
        fr_x = atk(natural, train.x).fooling_rate
        res = atk(natural, test.x)
        acc = float(task.element_correct(res.logits, test.y).float().mean())
        transfer = [atk(m, test.x).fooling_rate for m in list(models.values())[1:]]
        print(f"| {mag} | {fr_x:.3f} | {res.fooling_rate:.3f} | {noise_fooling(natural, task, test.x, eps):.3f} "
              f"| {acc:.3f} | " + " | ".join(f"{v:.3f}" for v in transfer) + " |")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s on {torch.get_num_threads()} thread(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
