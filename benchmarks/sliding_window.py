"""PGD-10 on the whole 1 mm MNI152 template through sliding-window inference: time and peak memory per step.

The volume is the nilearn MNI152 2009a T1 template (1 mm) cut to the FSL MNI152 1 mm grid, 182 x 218 x 182
voxels (world x -90..91, y -126..91, z -72..109 mm), scaled to [0, 1], with its tissue labels
(:func:`medadv.data.mni152.load_tissue_map`). The model is a small MONAI UNet (channels 8, 16; one
stride-2 level; seeded random weights: the cost does not depend on the weights). Every variant computes
the gradient of the mean voxel cross-entropy of the *blended* whole-volume logits w.r.t. the whole volume,
with the same windows (MONAI's positions) and the same Gaussian importance map:

* ``medadv``: PGD-10 (``medadv.PGD``) on ``SlidingWindow(model, roi, checkpoint=True)`` -- MONAI
  ``sliding_window_inference`` with each window's activations recomputed in the backward pass (the
  config's default, ``inference: {checkpoint: true}``);
* ``medadv-nockpt``: the same with ``checkpoint=False`` (autograd keeps every window's activations);
* ``hand``: a hand-written loop (slice, forward, weight, add; divide by the summed weights) under autograd;
* ``hand-2pass``: a hand-written two-pass gradient: blended logits without autograd, their loss gradient,
  then per window a forward with autograd and a backward of that window's share (one window in memory).

Each variant runs in its own process (peak memory = ``ru_maxrss``, and its rise over the process before the
attack). ``python benchmarks/sliding_window.py`` writes ``benchmarks/sliding_window.json``; the numbers are in
``benchmarks/sliding_window.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

VARIANTS = ("medadv", "medadv-nockpt", "hand", "hand-2pass")
FSL_BOX = (slice(8, 190), slice(8, 226), slice(0, 182))  # the FSL 1 mm grid inside nilearn's 197x233x189


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _load() -> float:
    import os

    return os.getloadavg()[0]  # other processes on the machine stretch the wall time, not the CPU time


def volume() -> tuple[torch.Tensor, torch.Tensor]:
    from medadv.data.mni152 import load_tissue_map

    t1, lab = load_tissue_map(1)
    return t1[FSL_BOX][None, None].contiguous(), lab[FSL_BOX][None].contiguous()


def model() -> torch.nn.Module:
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    net = UNet(spatial_dims=3, in_channels=1, out_channels=4, channels=(8, 16), strides=(2,), num_res_units=0)
    return net.eval().requires_grad_(False)


def window_starts(size: int, roi: int, overlap: float) -> list[int]:
    """MONAI's window positions along one axis (``dense_patch_slices`` with its scan interval)."""
    if roi >= size:
        return [0]
    interval = max(int(roi * (1 - overlap)), 1)
    starts = {min(i * interval, size - roi) for i in range(math.ceil(size / interval))}
    return sorted(starts)


def hand_windows(shape: tuple[int, ...], roi: int, overlap: float) -> list[tuple[slice, ...]]:
    grids = [window_starts(s, roi, overlap) for s in shape]
    return [(slice(a, a + roi), slice(b, b + roi), slice(c, c + roi))
            for a in grids[0] for b in grids[1] for c in grids[2]]


def importance(roi: int) -> torch.Tensor:
    from monai.data.utils import compute_importance_map

    return compute_importance_map((roi,) * 3, mode="gaussian", sigma_scale=0.125, device="cpu")


def hand_forward(net: torch.nn.Module, x: torch.Tensor, windows, w: torch.Tensor) -> torch.Tensor:
    """Blended logits of every window, as autograd sees ordinary slicing and adding."""
    out = x.new_zeros((x.shape[0], 4, *x.shape[2:]))
    norm = x.new_zeros((1, 1, *x.shape[2:]))
    for sl in windows:
        idx = (slice(None), slice(None), *sl)
        out[idx] = out[idx] + net(x[idx]) * w
        norm[idx] += w
    return out / norm


def hand_grad(net, x, y, windows, w, two_pass: bool) -> torch.Tensor:
    from torch.nn.functional import cross_entropy

    if not two_pass:
        xv = x.detach().requires_grad_(True)
        loss = cross_entropy(hand_forward(net, xv, windows, w), y)
        return torch.autograd.grad(loss, xv)[0]
    with torch.no_grad():  # pass 1: blended logits and the summed weights, no autograd
        out = x.new_zeros((x.shape[0], 4, *x.shape[2:]))
        norm = x.new_zeros((1, 1, *x.shape[2:]))
        for sl in windows:
            idx = (slice(None), slice(None), *sl)
            out[idx] += net(x[idx]) * w
            norm[idx] += w
    logits = (out / norm).requires_grad_(True)
    g = torch.autograd.grad(cross_entropy(logits, y), logits)[0]
    gx = torch.zeros_like(x)
    for sl in windows:  # pass 2: each window's share of d loss / d logits, back through that window only
        idx = (slice(None), slice(None), *sl)
        xw = x[idx].detach().requires_grad_(True)
        (net(xw) * (w * g[idx] / norm[idx])).sum().backward()
        gx[idx] += xw.grad
    return gx


def run_variant(name: str, steps: int, roi: int, overlap: float, eps: float) -> dict:
    torch.set_num_threads(2)
    x, y = volume()
    net = model()
    base = _rss_mb()
    times: list[float] = []
    if name.startswith("medadv"):
        from medadv import PGD, Linf, Segmentation
        from medadv.models.sliding import SlidingWindow

        sw = SlidingWindow(net, roi, overlap=overlap, mode="gaussian", sw_batch_size=1,
                           checkpoint=name == "medadv")
        stamps: list[tuple[float, float]] = []
        sw.register_forward_pre_hook(lambda m, a: stamps.append((time.perf_counter(), time.process_time())))
        attack = PGD(Segmentation(4), Linf(eps, bounds=(0.0, 1.0)), steps=steps, random_start=True, seed=0)
        t0 = time.perf_counter()
        res = attack(sw, x, y)
        total = time.perf_counter() - t0
        # forwards: the clean one, one per step (its backward runs before the next), the final one
        times = [b[0] - a[0] for a, b in zip(stamps[1:-1], stamps[2:], strict=False)][:steps]
        cpu = [b[1] - a[1] for a, b in zip(stamps[1:-1], stamps[2:], strict=False)][:steps]
        extra = {"total_s": total, "forwards": len(stamps), "linf": float(res.linf.max()),
                 "changed_fraction": float((res.logits.argmax(1) != sw(x).argmax(1)).float().mean())}
    else:
        w = importance(roi)
        windows = hand_windows(tuple(x.shape[2:]), roi, overlap)
        delta = torch.zeros_like(x)
        cpu = []
        t0 = time.perf_counter()
        for _ in range(steps):
            t, c = time.perf_counter(), time.process_time()
            g = hand_grad(net, (x + delta).clamp(0, 1), y, windows, w, two_pass=name == "hand-2pass")
            delta = (delta + eps / 4 * g.sign()).clamp(-eps, eps)
            delta = (x + delta).clamp(0, 1) - x
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        extra = {"total_s": time.perf_counter() - t0, "windows": len(windows)}
    peak = _rss_mb()
    return {"variant": name, "steps": steps, "roi": roi, "overlap": overlap, "shape": list(x.shape[2:]),
            "step_s": times, "mean_step_s": sum(times) / max(len(times), 1), "step_cpu_s": cpu,
            "mean_step_cpu_s": sum(cpu) / max(len(cpu), 1), "load_avg_1min": _load(), "peak_rss_mb": peak,
            "baseline_rss_mb": base, "attack_rss_mb": peak - base, **extra}


def check_gradients(roi: int, overlap: float) -> dict:
    """The hand-written gradients equal autograd through MONAI's sliding window (on a 2 mm volume)."""
    from torch.nn.functional import cross_entropy

    from medadv.models.sliding import SlidingWindow

    x, y = volume()
    x, y = x[..., ::2, ::2, ::2].contiguous(), y[..., ::2, ::2, ::2].contiguous()
    net, r = model(), roi // 2
    xv = x.clone().requires_grad_(True)
    ref = torch.autograd.grad(cross_entropy(SlidingWindow(net, r, overlap=overlap, sw_batch_size=1)(xv), y), xv)[0]
    out = {"shape": list(x.shape[2:]), "roi": r}
    for two in (False, True):
        g = hand_grad(net, x, y, hand_windows(tuple(x.shape[2:]), r, overlap), importance(r), two)
        out["hand-2pass" if two else "hand"] = float((g - ref).abs().max() / ref.abs().max())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=VARIANTS, help="run one variant here (internal)")
    p.add_argument("--steps", type=int, default=10, help="PGD steps of the medadv variant (default 10)")
    p.add_argument("--compare-steps", type=int, default=1, help="steps of the other variants (default 1)")
    p.add_argument("--no-check", action="store_true", help="skip the gradient check")
    p.add_argument("--roi", type=int, default=96)
    p.add_argument("--overlap", type=float, default=0.25)
    p.add_argument("--eps", type=float, default=4 / 255)
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    p.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    a = p.parse_args()
    if a.variant:
        print(json.dumps(run_variant(a.variant, a.steps, a.roi, a.overlap, a.eps)))
        return
    results: dict = {"torch_threads": 2, "gradient_check": None if a.no_check else check_gradients(a.roi, a.overlap),
               "runs": []}
    print("gradient check (max |hand - MONAI| / max |MONAI|):", results["gradient_check"], flush=True)
    for v in a.variants:
        steps = a.steps if v == "medadv" else a.compare_steps
        cmd = [sys.executable, __file__, "--variant", v, "--steps", str(steps), "--roi", str(a.roi),
               "--overlap", str(a.overlap), "--eps", str(a.eps)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{v}: failed\n{done.stderr[-2000:]}", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        results["runs"].append(r)
        print(f"{v:>14}: {r['steps']} steps, {r['mean_step_s']:.1f} s/step wall, {r['mean_step_cpu_s']:.1f} CPU-s/step "
              f"(total {r['total_s']:.0f} s, load {r['load_avg_1min']:.1f}), peak RSS {r['peak_rss_mb']:.0f} MB "
              f"(+{r['attack_rss_mb']:.0f} MB for the attack)", flush=True)
        Path(a.out).write_text(json.dumps(results, indent=1))
    Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
