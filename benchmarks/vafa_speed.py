"""VAFA per-step cost vs the model's forward+backward alone.

One VAFA step = soft quantisation of the block DCT coefficients, block IDCT + merge, per-slice
renormalisation, model forward, loss, optional block SSIM, backward to the q tables, signed update and
projection onto [q_min, q_max]. It is timed through the attack's own engine hooks (``objective``, the
step rule, ``project``), i.e. exactly the body of the engine loop. The reference is one forward +
backward to the input of the same model on the same volume with the same loss — the floor for any
gradient attack. ``attack() / T`` is the whole public call (setup, T steps, the final forward for the
result) divided by its T steps. All variants are interleaved in every repeat so machine load affects
them alike; we report medians, the median of the per-repeat ratios to the floor and the ratio of the
minimum times (the least disturbed runs on a shared machine).

Usage: ``python benchmarks/vafa_speed.py [--repeats 5] [--model paper|small|conv1x1] [--size 96] [--threads 1]``.
``--model conv1x1`` (a 1×1 convolution instead of a network) measures VAFA's own work per step in
absolute terms: the time a VAFA step adds to any model's forward+backward.
On CPU the timer is process CPU time (see :func:`timed`); on CUDA it is synchronised wall time.
Writes a Markdown table to stdout (copied into ``benchmarks/vafa.md``).

``python benchmarks/vafa_speed.py --dice-effect`` instead measures what MONAI's ``squared_pred`` in the
DiceCE loss (the papers' setting) changes in VAFA's effect: the 3-D UNet of the test suite (the
``trained_seg3d`` fixture, trained the same way) attacked with ``squared_pred=True`` and ``False``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch

from medadv.attacks.engine import StepContext
from medadv.attacks.vafa import VAFA
from medadv.tasks import Segmentation
from medadv.threats import Box


def build_model(kind: str, classes: int) -> torch.nn.Module:
    from monai.networks.nets import UNet

    if kind == "conv1x1":  # next to no model: isolates VAFA's own work (its overhead in absolute terms)
        return torch.nn.Conv3d(1, classes, 1)
    if kind == "paper":  # Malik et al.'s 3-D UNet (spec 003 §5)
        return UNet(spatial_dims=3, in_channels=1, out_channels=classes, channels=(16, 32, 64, 128, 256),
                    strides=(2, 2, 2, 2), num_res_units=2)
    return UNet(spatial_dims=3, in_channels=1, out_channels=classes, channels=(8, 16, 32), strides=(2, 2),
                num_res_units=1)


def model_step(model, task, x, y) -> None:
    xr = x.clone().requires_grad_(True)
    loss = task.loss(model(xr), y)
    torch.autograd.grad(loss.sum(), xr)


def engine_step(attack: VAFA, model, x, y) -> Callable[[], torch.Tensor]:
    """One step of the engine loop for ``attack``: objective, gradient to q, step rule, projection."""
    ctx = StepContext(step=0, steps=attack.steps, restart=0, index=torch.arange(x.shape[0], device=x.device),
                      x=x, y=y, clean_logits=None, state={}, shared={})
    attack.setup(model, ctx)
    q0 = attack.init_variable(ctx, None)
    rule = attack.step_rule()
    state = rule.init(q0, ctx)

    def step() -> torch.Tensor:
        ctx.shared["losses"].clear()
        q = q0.detach().requires_grad_(True)
        obj, _ = attack.objective(model, q, ctx)
        (g,) = torch.autograd.grad(obj.sum(), q)
        return attack.project(rule.step(q.detach(), g, obj, ctx, state), ctx)

    return step


def timed(fn) -> float:
    """Wall time on CUDA; on CPU the process CPU time, which a machine shared with other jobs does
    not inflate the way it inflates wall time (run with one thread so the two agree when idle)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def dice_effect() -> None:
    """Mean Dice (clean and under VAFA) with the DiceCE attack loss with and without ``squared_pred``."""
    from medadv.data.synthetic import segmentation_blobs
    from medadv.models import fit_supervised, small_unet

    torch.manual_seed(0)  # as tests/conftest.py trains `trained_seg3d`
    model = small_unet(1, 3, ndim=3, channels=(8, 16))
    x, y = segmentation_blobs(n=36, seed=0, num_classes=3, size=16, ndim=3)
    eval_task = Segmentation(3)
    fit_supervised(model, eval_task, x[:32], y[:32], epochs=40, lr=2e-2, batch_size=8)
    model.eval()
    x, y = x[32:], y[32:]
    with torch.no_grad():
        clean = eval_task.mean_dice(model(x).argmax(1), y)
    print(f"trained 3-D UNet (conftest trained_seg3d), 4 held-out 16³ volumes, clean mean Dice "
          f"(foreground) {float(clean.mean()):.4f}\n")
    print("| VAFA setting | squared_pred | mean Dice under attack | Dice drop | final loss |")
    print("|---|---|---|---|---|")
    for kw in ({"block": 8, "steps": 20}, {"block": 8, "steps": 20, "q_max": 30}, {"block": 16, "steps": 20}):
        for sq in (False, True):
            task = Segmentation(3, loss="dicece", include_background=True, squared_pred=sq)
            res = VAFA(task, Box(0.0, 1.0), **kw)(model, x, y)
            with torch.no_grad():
                adv = eval_task.mean_dice(model(res.x_adv).argmax(1), y)
            assert res.details is not None
            label = ", ".join(f"{k}={v}" for k, v in kw.items())
            print(f"| {label} | {sq} | {float(adv.mean()):.4f} | {float((clean - adv).mean()):.4f} | "
                  f"{float(res.details.final_loss.mean()):.4f} |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--model", choices=("paper", "small", "conv1x1"), default="paper")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--steps", type=int, default=5, help="steps of the attack() / T row")
    p.add_argument("--squared-pred", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--dice-effect", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.dice_effect:
        dice_effect()
        return
    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    classes = 14
    model = build_model(args.model, classes).to(dev).eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    # the papers' loss: DiceCE with MONAI's squared_pred
    task = Segmentation(classes, loss="dicece", include_background=True, squared_pred=args.squared_pred)
    s = args.size
    x = torch.rand(1, 1, s, s, s, device=dev)
    y = torch.randint(0, classes, (1, s, s, s), device=dev)
    box = Box(0.0, 1.0)
    fns: dict[str, Callable[[], object]] = {"model fwd+bwd": lambda: model_step(model, task, x, y)}
    for b in (32, 8):
        for use_ssim in (False, True):
            atk = VAFA(task, box, block=b, use_ssim=use_ssim)
            fns[f"VAFA {b}³{' + SSIM' if use_ssim else ''}"] = engine_step(atk, model, x, y)
    whole = VAFA(task, box, block=8, use_ssim=True, steps=args.steps)
    whole_name = f"VAFA 8³ + SSIM, attack() / T (T = {args.steps})"
    fns[whole_name] = lambda: whole(model, x, y)
    times: dict[str, list[float]] = {k: [] for k in fns}
    ratios: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(args.repeats):
        got = {k: timed(fn) / (args.steps if k == whole_name else 1) for k, fn in fns.items()}
        for k, v in got.items():
            times[k].append(v)
            ratios[k].append(v / got["model fwd+bwd"])
    clock = "CUDA wall time" if dev.type == "cuda" else "process CPU time"
    print(f"device: {dev} ({platform.processor() or platform.machine()}), torch {torch.__version__}, threads "
          f"{args.threads}, {clock}, model {args.model} UNet, volume {s}³, 14 classes, DiceCE "
          f"(squared_pred={args.squared_pred}), {args.repeats} interleaved repeats\n")
    print("| variant | median s/step | min s/step | × fwd+bwd, paired median | × fwd+bwd, min/min |")
    print("|---|---|---|---|---|")
    base = min(times["model fwd+bwd"])
    for k, v in times.items():
        print(f"| {k} | {statistics.median(v):.4f} | {min(v):.4f} | {statistics.median(ratios[k]):.3f} | "
              f"{min(v) / base:.3f} |")


if __name__ == "__main__":
    main()
