"""VAFA per-step cost on a 96³ volume vs the model's forward+backward alone.

One VAFA step = soft quantisation of the block DCT coefficients, block IDCT + merge, per-slice
renormalisation, model forward, loss, optional block SSIM, backward to the q tables, signed update.
The reference is one forward + backward to the input of the same model on the same volume — the
floor for any gradient attack. The three variants (model alone, VAFA 32³, VAFA 8³) are interleaved in
every repeat so machine load affects them alike; we report medians and ratios of medians.

Usage: ``python benchmarks/vafa_speed.py [--repeats 5] [--model paper|small] [--threads 1]``.
On CPU the timer is process CPU time (see :func:`timed`); on CUDA it is synchronised wall time.
Writes a Markdown table to stdout (copied into ``benchmarks/vafa.md``).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from medadv.attacks.vafa import VAFA
from medadv.tasks import Segmentation


def build_model(kind: str, classes: int) -> torch.nn.Module:
    from monai.networks.nets import UNet

    if kind == "paper":  # Malik et al.'s 3-D UNet (spec 003 §5)
        return UNet(spatial_dims=3, in_channels=1, out_channels=classes, channels=(16, 32, 64, 128, 256),
                    strides=(2, 2, 2, 2), num_res_units=2)
    return UNet(spatial_dims=3, in_channels=1, out_channels=classes, channels=(8, 16, 32), strides=(2, 2),
                num_res_units=1)


def model_step(model, task, x, y) -> None:
    xr = x.clone().requires_grad_(True)
    loss = task.loss(model(xr), y)
    torch.autograd.grad(loss.sum(), xr)


def vafa_step(attack: VAFA, model, ctx, q, y) -> torch.Tensor:
    q = q.detach().requires_grad_(True)
    obj, _, _ = attack._objective(model, q, ctx, y, 0.05)
    (g,) = torch.autograd.grad(obj.sum(), q)
    return attack._step(q.detach(), g)


def loop_vafa_step(attack: VAFA, model, ctx, q, y) -> torch.Tensor:
    """The same step with blocks merged by a Python loop of slice assignments (one per block), the way
    the reference implementation does it, for comparison with our reshape/permute merge."""
    from medadv.attacks.vafa import soft_quantize
    from medadv.dct import idct_blocks

    q = q.detach().requires_grad_(True)
    rec = idct_blocks(soft_quantize(q, ctx["coeffs"], 0.05), 3)
    b = attack.block
    grey = rec.new_zeros((rec.shape[0], 1, *ctx["padded"]))
    grid = [p // k for p, k in zip(ctx["padded"], b, strict=True)]
    i = 0
    for a in range(grid[0]):
        for c in range(grid[1]):
            for d in range(grid[2]):
                grey[:, :, a * b[0]:(a + 1) * b[0], c * b[1]:(c + 1) * b[1], d * b[2]:(d + 1) * b[2]] = rec[:, :, i]
                i += 1
    u_adv = attack._renorm(grey + 128.0)
    obj = -task_loss(attack, model, u_adv, y)
    (g,) = torch.autograd.grad(obj.sum(), q)
    return attack._step(q.detach(), g)


def task_loss(attack: VAFA, model, u_adv, y):
    return attack.task.loss(model(u_adv), y)


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--model", choices=("paper", "small"), default="paper")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--size", type=int, default=96)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    classes = 14
    model = build_model(args.model, classes).to(dev).eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    task = Segmentation(classes, loss="dicece", include_background=True)
    s = args.size
    x = torch.rand(1, 1, s, s, s, device=dev)
    y = torch.randint(0, classes, (1, s, s, s), device=dev)
    variants = {}
    for b in (32, 8):
        for use_ssim in (False, True):
            atk = VAFA(task, bounds=(0.0, 1.0), block=b, use_ssim=use_ssim)
            ctx = atk._setup(x)
            variants[f"VAFA {b}³{' + SSIM' if use_ssim else ''}"] = (atk, ctx, torch.full_like(ctx["coeffs"], 20.0))
    loop_atk = VAFA(task, bounds=(0.0, 1.0), block=8, use_ssim=False)
    loop_ctx = loop_atk._setup(x)
    loop_q = torch.full_like(loop_ctx["coeffs"], 20.0)
    loop_name = "VAFA 8³, per-block loop merge (reference style)"
    times: dict[str, list[float]] = {"model fwd+bwd": [], **{k: [] for k in variants}, loop_name: []}
    # warm-up once each, then interleaved repeats
    model_step(model, task, x, y)
    for atk, ctx, q in variants.values():
        vafa_step(atk, model, ctx, q, y)
    loop_vafa_step(loop_atk, model, loop_ctx, loop_q, y)
    for _ in range(args.repeats):
        times["model fwd+bwd"].append(timed(lambda: model_step(model, task, x, y)))
        for k, (atk, ctx, q) in variants.items():
            times[k].append(timed(lambda a=atk, c=ctx, qq=q: vafa_step(a, model, c, qq, y)))
        times[loop_name].append(timed(lambda: loop_vafa_step(loop_atk, model, loop_ctx, loop_q, y)))
    base = statistics.median(times["model fwd+bwd"])
    clock = "CUDA wall time" if dev.type == "cuda" else "process CPU time"
    print(f"device: {dev} ({platform.processor() or platform.machine()}), threads {args.threads}, {clock}, "
          f"model {args.model} UNet, volume {s}³, 14 classes, DiceCE, {args.repeats} interleaved repeats\n")
    print("| variant | median s/step | min s/step | ratio to model fwd+bwd |")
    print("|---|---|---|---|")
    for k, v in times.items():
        print(f"| {k} | {statistics.median(v):.3f} | {min(v):.3f} | {statistics.median(v) / base:.3f} |")


if __name__ == "__main__":
    main()
