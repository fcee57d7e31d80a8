"""Speed of 10-step L∞ PGD: medadv vs torchattacks, ART, Foolbox and a raw forward+backward loop.

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

Times are this process's CPU time by default (``--clock cpu``): with one thread it measures the work
itself and is barely disturbed by other jobs on a shared machine, where wall time swings by ±15 %.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/pgd_speed.py --repeats 9 --threads 1 [--clock wall]
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

from medadv.attacks.cospgd import CosPGD
from medadv.attacks.pgd import PGD
from medadv.attacks.segpgd import SegPGD
from medadv.models.nets import chexnet, small_unet
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
    """CosPGD with its weight from ``Task.target_cosine`` (same values, closed form): the proposed change."""

    def element_weights(self, logits, y, step):
        cos = self.task.target_cosine(logits.detach(), y)
        return 1.0 - cos if self.targeted else cos


def _medadv(task, model, x, y, weighted):
    threat = Linf(EPS, bounds=(0.0, 1.0))
    atk = PGD(task, threat, steps=STEPS, step_size=ALPHA, random_start=False)
    with torch.no_grad():
        logits = model(x)
    y_t = task.to_target(y, logits)
    out = {
        "medadv attack()": lambda: atk(model, x, y).x_adv,
        "medadv loop": lambda: atk.perturb(model, x, y_t, logits)[0],
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
    methods = {
        "raw fwd+bwd loop": lambda: raw_pgd(model, x, loss_fn, y),
        "raw + 2 fwd": lambda: raw_pgd_with_outputs(model, x, loss_fn, y),
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
        threat = Linf(EPS, bounds=(0.0, 1.0))
        w_ref = CosPGD(task, threat).element_weights(logits, y_t, 0)
        w_new = _CosPGDClosedForm(task, threat).element_weights(logits, y_t, 0)
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
    return name, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="cpu: this process's CPU time (robust on a shared machine; use with --threads 1); "
                         "wall: elapsed time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.threads} thread(s), {args.clock} clock, {args.repeats} interleaved repeats, "
          f"ε=8/255, α=2/255, {STEPS} steps\n")
    for case in cases():
        name, rows = run_case(*case, repeats=args.repeats, clock=clock)
        print(f"### {name}\n")
        print("| method | median (s) | min (s) | × raw, paired median | × raw, min/min |")
        print("|---|---:|---:|---:|---:|")
        for k, med, fast, paired, ratio in rows:
            print(f"| {k} | {med:.3f} | {fast:.3f} | {paired:.3f} | {ratio:.3f} |")
        print()


if __name__ == "__main__":
    main()
