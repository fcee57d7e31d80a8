"""Speed of 10-step L∞ PGD (and APGD): medadv vs torchattacks, ART, Foolbox and a raw forward+backward loop.

Every method attacks the same model and batch with the same ε, step and number of steps, without random
start (so all do identical work). Methods run interleaved, in a rotating order, ``--repeats`` times; we
report the median and minimum time, the median of the per-repeat ratio to the raw loop run in the
same round, and the ratio of minimum times (the least disturbed runs on a shared machine).

The raw loop is the floor any PGD can reach: per step one forward, the loss, ``torch.autograd.grad`` to
the input (parameters frozen), a sign step, the ε-ball clamp and the [0, 1] clamp. ``medadv attack()`` is
the full public call, which in addition validates the input (finite, inside the bounds), runs the model
once on the clean batch (to validate the output against the task and to label the batch when ``y`` is
None) and once on the result (for ``AttackResult.logits`` and ``fooled``). ``medadv loop`` is the engine
alone (``attack.perturb``), the same work as the raw loop. ``raw + 2 fwd`` is the raw loop plus the same
two extra forwards, i.e. the same outputs as ``attack()``.

``medadv APGD loop`` is APGD (Croce & Hein 2020) on the same engine, 10 steps, no random start: the same 10
forward+backward passes plus one forward to score the last iterate, the per-sample schedule (best point, momentum,
checkpoints) and the per-step best-iterate bookkeeping. Its cost is reported per step against ``medadv loop``
(PGD-10), paired within each round.

Then (``--robust``, on by default) the robust metric of PGD and APGD at the same ε and number of steps on two
small trained models (the test fixtures' recipes): a multi-label CNN (mean label accuracy) and a 3-D UNet
(mean foreground Dice), over four seeds of the random start.

Times are this process's CPU time by default (``--clock cpu``): with one thread it measures the work
itself and is barely disturbed by other jobs on a shared machine, where wall time swings by ±15 %.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/pgd_speed.py --repeats 7 --threads 1 [--clock wall] [--no-robust]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from medadv.attacks.apgd import APGD
from medadv.attacks.cospgd import CosPGD
from medadv.attacks.pgd import PGD
from medadv.attacks.segpgd import SegPGD
from medadv.models.nets import chexnet, small_cnn, small_unet
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import Linf

EPS, ALPHA, STEPS = 8 / 255, 2 / 255, 10


def _freeze(model: nn.Module) -> nn.Module:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def raw_pgd(model: nn.Module, x: torch.Tensor, loss_fn: Callable, y: torch.Tensor) -> torch.Tensor:
    x_adv = x.clone()
    for _ in range(STEPS):
        x_adv.requires_grad_(True)
        (g,) = torch.autograd.grad(loss_fn(model(x_adv), y), x_adv)
        x_adv = torch.min(torch.max(x_adv.detach() + ALPHA * g.sign(), x - EPS), x + EPS).clamp(0.0, 1.0)
    return x_adv


def raw_pgd_with_outputs(model, x, loss_fn, y):
    with torch.no_grad():
        model(x)
    x_adv = raw_pgd(model, x, loss_fn, y)
    with torch.no_grad():
        model(x_adv)
    return x_adv


class _CosPGDClosedForm(CosPGD):
    """CosPGD with its weight from ``Task.target_cosine`` (same values, closed form; CosPGD now uses it)."""

    def element_weights(self, logits, ctx):
        cos = self.task.target_cosine(logits.detach(), ctx.y)
        return 1.0 - cos if self.targeted else cos


def _generic_cosine(task, logits, y):
    """The CosPGD weight from its definition: cosine of the predicted and target distributions."""
    return F.cosine_similarity(*task.distributions(logits, y), dim=1, eps=1e-12)


def _medadv(task, model, x, y, weighted):
    threat = Linf(EPS, bounds=(0.0, 1.0))
    atk = PGD(task, threat, steps=STEPS, step_size=ALPHA, random_start=False)
    with torch.no_grad():
        logits = model(x)
    y_t = task.to_target(y, logits)
    apgd = APGD(task, threat, steps=STEPS, random_start=False)
    out = {
        "medadv attack()": lambda: atk(model, x, y).x_adv,
        "medadv loop": lambda: atk.perturb(model, x, y_t, logits)[0],
        "medadv APGD loop": lambda: apgd.perturb(model, x, y_t, logits)[0],
    }
    if weighted:  # the per-element weightings cost a few element-wise ops per step on top of PGD
        for label, cls in (("CosPGD", CosPGD), ("CosPGD, target_cosine", _CosPGDClosedForm), ("SegPGD", SegPGD)):
            w = cls(task, threat, steps=STEPS, step_size=ALPHA, random_start=False)
            out[f"medadv {label} loop"] = lambda w=w: w.perturb(model, x, y_t, logits)[0]
    return out


def _peers(model, x, y, num_classes):
    out = {}
    import torchattacks

    ta = torchattacks.PGD(model, eps=EPS, alpha=ALPHA, steps=STEPS, random_start=False)
    out["torchattacks PGD"] = lambda: ta(x, y)

    from art.attacks.evasion import ProjectedGradientDescentPyTorch
    from art.estimators.classification import PyTorchClassifier

    clf = PyTorchClassifier(model, loss=nn.CrossEntropyLoss(), input_shape=tuple(x.shape[1:]),
                            nb_classes=num_classes, clip_values=(0.0, 1.0), device_type="cpu")
    art = ProjectedGradientDescentPyTorch(clf, norm=np.inf, eps=EPS, eps_step=ALPHA, max_iter=STEPS,
                                          num_random_init=0, batch_size=x.shape[0], verbose=False)
    xn, yn = x.numpy(), y.numpy()
    out["ART PGD (PyTorch)"] = lambda: art.generate(xn, yn)

    import foolbox as fb

    fmodel = fb.PyTorchModel(model, bounds=(0.0, 1.0), device="cpu")
    fba = fb.attacks.LinfPGD(abs_stepsize=ALPHA, steps=STEPS, random_start=False)
    out["Foolbox LinfPGD"] = lambda: fba(fmodel, x, y, epsilons=EPS)[1]
    return out


# The raw loop sums per-sample mean losses, as medadv does, so both take bitwise the same steps (a batch
# mean instead only rescales the gradient, but near-zero entries can then round to the other sign).
def _ce(logits, y):
    return F.cross_entropy(logits, y, reduction="none").reshape(logits.shape[0], -1).mean(1).sum()


def _bce(logits, y):
    return F.binary_cross_entropy_with_logits(logits, y, reduction="none").mean(1).sum()


def cases():
    torch.manual_seed(0)
    from torchvision.models import resnet18

    net = _freeze(resnet18(num_classes=10))
    x, y = torch.rand(8, 3, 64, 64), torch.randint(0, 10, (8,))
    yield "ResNet-18, multi-class (8×3×64×64, 10 classes)", MultiClass(), net, x, y, _ce, 10

    net = _freeze(chexnet(num_labels=14, in_channels=1))
    x, y = torch.rand(4, 1, 64, 64), (torch.rand(4, 14) < 0.3).float()
    yield "DenseNet-121 (CheXNet), multi-label (4×1×64×64, 14 labels)", MultiLabel(), net, x, y, _bce, None

    net = _freeze(small_unet(1, 3, ndim=3, channels=(8, 16, 32)))
    x, y = torch.rand(2, 1, 32, 32, 32), torch.randint(0, 3, (2, 32, 32, 32))
    yield "MONAI 3-D UNet, segmentation (2×1×32³, 3 classes)", Segmentation(3), net, x, y, _ce, None


def run_case(name, task, model, x, y, loss_fn, num_classes, repeats, clock=time.process_time):
    def one_forward():
        with torch.no_grad():
            return model(x)

    methods = {
        "raw fwd+bwd loop": lambda: raw_pgd(model, x, loss_fn, y),
        "raw + 2 fwd": lambda: raw_pgd_with_outputs(model, x, loss_fn, y),
        "one no-grad forward": one_forward,
        **_medadv(task, model, x, y, weighted=num_classes is None),
    }
    if num_classes is not None:
        methods.update(_peers(model, x, y, num_classes))

    # same adversarial batch as the raw loop: the comparison is of equal work
    ref = raw_pgd(model, x, loss_fn, y)
    for key in ("medadv attack()", "medadv loop"):
        diff = float((torch.as_tensor(methods[key]()) - ref).abs().max())
        assert diff < 1e-5, f"{key} differs from the raw loop by {diff}"
    if "medadv CosPGD loop" in methods:  # same weights up to rounding (the sign step can amplify rounding)
        with torch.no_grad():
            logits, y_t = model(x), task.to_target(y, model(x))
        w_ref = _generic_cosine(task, logits, y_t)
        w_new = task.target_cosine(logits, y_t)
        torch.testing.assert_close(w_new, w_ref, atol=1e-6, rtol=1e-5)

    for f in methods.values():  # warm-up
        f()
    times = {k: [] for k in methods}
    names = list(methods)
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for k in order:
            t0 = clock()
            methods[k]()
            times[k].append(clock() - t0)
    raw = times["raw fwd+bwd loop"]
    rows = []
    for k in names:
        paired = statistics.median(t / b for t, b in zip(times[k], raw, strict=True))
        # on a shared machine the fastest run is the least disturbed one: report both estimates
        rows.append((k, statistics.median(times[k]), min(times[k]), paired, min(times[k]) / min(raw)))
    # APGD against PGD, both on the engine, same steps: the total, and per step once APGD's one fixed
    # no-grad forward (scoring the last iterate) is taken out
    a, p, f = times["medadv APGD loop"], times["medadv loop"], times["one no-grad forward"]
    apgd = (statistics.median(t / b for t, b in zip(a, p, strict=True)), min(a) / min(p),
            statistics.median((t - c) / b for t, b, c in zip(a, p, f, strict=True)), (min(a) - min(f)) / min(p))
    return name, rows, apgd


# --- robust metric: APGD vs PGD at the same budget on small trained models --------------------------------------------
def _trained(make_model, task, data_fn, n_train, n_test, epochs, lr, batch_size=16, **kw):
    """The recipe of the test fixtures (tests/conftest.py): seeded model, synthetic data, held-out split."""
    from medadv.models import fit_supervised

    torch.manual_seed(0)
    model = make_model()
    x, y = data_fn(n=n_train + n_test, seed=0, **kw)
    fit_supervised(model, task, x[:n_train], y[:n_train], epochs=epochs, lr=lr, batch_size=batch_size)
    return _freeze(model), x[n_train:], y[n_train:]


def robust_rows(steps=STEPS, seeds=(0, 1, 2, 3)):
    from medadv.data.synthetic import multilabel_blobs, segmentation_blobs

    ml = _trained(lambda: small_cnn(1, 4, width=8), MultiLabel(), multilabel_blobs, 256, 32, 15, 1e-2, num_labels=4)
    seg = _trained(lambda: small_unet(1, 3, ndim=3, channels=(8, 16)), Segmentation(3), segmentation_blobs,
                   32, 4, 40, 2e-2, batch_size=8, num_classes=3, size=16, ndim=3)
    setups = [  # (model label, metric, trained, attack task, attacks)
        ("multi-label CNN, 32×1×16²", "label_accuracy", ml, MultiLabel(),
         [("PGD", PGD, {}), ("APGD-CE", APGD, {}), ("APGD-margin", APGD, {"loss": "margin"})]),
        ("3-D UNet, 4×1×16³, per-voxel CE", "mean_dice", seg, Segmentation(3),
         [("PGD", PGD, {}), ("APGD-CE", APGD, {}), ("APGD-margin", APGD, {"loss": "margin"})]),
        ("3-D UNet, 4×1×16³, soft-Dice loss", "mean_dice", seg, Segmentation(3, loss="dice"),
         [("PGD", PGD, {}), ("APGD", APGD, {})]),
    ]
    out = []
    for label, metric, (model, x, y), task, attacks in setups:
        with torch.no_grad():
            clean = float(task.metrics(model(x), y)[metric].mean())
        for eps in (0.02, 0.05, 0.1):
            cells = []
            for name, cls, kw in attacks:
                vals = [float(task.metrics(cls(task, Linf(eps, bounds=(0.0, 1.0)), steps=steps, seed=s, **kw)(
                    model, x, y).logits, y)[metric].mean()) for s in seeds]
                cells.append((name, statistics.mean(vals), min(vals), max(vals)))
            out.append((label, metric, clean, eps, cells))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="cpu: this process's CPU time (robust on a shared machine; use with --threads 1); "
                         "wall: elapsed time")
    ap.add_argument("--no-robust", dest="robust", action="store_false",
                    help="skip the APGD vs PGD robust-metric table (trains two small models, about 30 s)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.threads} thread(s), {args.clock} clock, {args.repeats} interleaved repeats, "
          f"ε=8/255, α=2/255, {STEPS} steps\n")
    t0 = time.perf_counter()
    apgd_ratios = []
    for case in cases():
        name, rows, apgd = run_case(*case, repeats=args.repeats, clock=clock)
        apgd_ratios.append((name, *apgd))
        print(f"### {name}\n")
        print("| method | median (s) | min (s) | × raw, paired median | × raw, min/min |")
        print("|---|---:|---:|---:|---:|")
        for k, med, fast, paired, ratio in rows:
            print(f"| {k} | {med:.3f} | {fast:.3f} | {paired:.3f} | {ratio:.3f} |")
        print()
    print("### APGD-10 against PGD-10 (both `perturb` on the engine, same run)\n")
    print("| model | total × PGD, paired median | total × PGD, min/min "
          "| per step (less the one scoring forward) × PGD, paired median | same, min/min |")
    print("|---|---:|---:|---:|---:|")
    for name, paired, ratio, step_paired, step_ratio in apgd_ratios:
        print(f"| {name} | {paired:.3f} | {ratio:.3f} | {step_paired:.3f} | {step_ratio:.3f} |")
    print()
    if args.robust:
        print(f"### Robust metric at the same budget: PGD-{STEPS} vs APGD-{STEPS}, L∞, mean (min–max) over 4 seeds\n")
        print("| model | metric | clean | ε | attack: robust metric |")
        print("|---|---|---:|---:|---|")
        for label, metric, clean, eps, cells in robust_rows():
            txt = "; ".join(f"{n} {m:.3f} ({lo:.3f}–{hi:.3f})" for n, m, lo, hi in cells)
            print(f"| {label} | {metric} | {clean:.3f} | {eps:g} | {txt} |")
        print()
    print(f"total wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
