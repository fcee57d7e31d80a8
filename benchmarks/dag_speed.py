"""DAG per-iteration cost vs the forward+backward floor (and adv_lib's DAG) on a small 2-D UNet.

Every method runs the same number of iterations T on the same model and batch: the step is tiny, so no
sample reaches its target and nothing stops early (the script checks every sample ran T iterations).
Methods run interleaved in a rotating order, ``--repeats`` times; we report the median time per
iteration and the median of the per-repeat ratio to the floor run in the same round.

- **floor**: per iteration one forward, a cross-entropy loss to the target map, ``torch.autograd.grad``
  to the input (parameters frozen), an L∞-normalised step and the [0, 1] clamp: the least any DAG
  iteration can cost.
- **medadv DAG loop**: the engine alone (``attack.perturb``), i.e. the iterations plus the per-call
  setup and the typed details (one extra forward and SSIM), amortised over T.
- **medadv DAG attack()**: the public call (input validation and the final forward for the result).
- **adv_lib DAG**: ``adv_lib.attacks.segmentation.dag`` (Rony et al.'s adversarial-library, BSD-3),
  loaded from a local copy of the repository (``--adv-lib PATH``, the folder holding ``adv_lib/``); its
  plotting dependency (visdom) is stubbed out. Skipped when no path is given.

``--profile`` prints the top operators of one medadv run (torch.profiler, CPU self time).

Times are the process's CPU time by default: with one thread it measures the work itself and is
barely disturbed by other jobs on a shared machine. Usage::

    OMP_NUM_THREADS=1 python benchmarks/dag_speed.py --repeats 7 [--adv-lib /path/to/adversarial-library]
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from medadv.attacks.dag import DAG, dag_target_a
from medadv.models.nets import small_unet
from medadv.tasks import Segmentation
from medadv.threats import Box

GAMMA = 1e-6  # small enough that no voxel reaches its target: every method runs all T iterations


def load_adv_lib_dag(root: str) -> Callable:
    """``adv_lib``'s ``dag`` function from a source checkout, without importing the whole package."""
    base = Path(root) / "adv_lib"
    pkg = types.ModuleType("adv_lib")
    pkg.__path__ = [str(base)]  # type: ignore[attr-defined]
    utils = types.ModuleType("adv_lib.utils")
    utils.__path__ = [str(base / "utils")]  # type: ignore[attr-defined]
    visdom = types.ModuleType("adv_lib.utils.visdom_logger")
    visdom.VisdomLogger = object  # type: ignore[attr-defined]
    sys.modules.update({"adv_lib": pkg, "adv_lib.utils": utils, "adv_lib.utils.visdom_logger": visdom})
    for name, path in (("adv_lib.utils.losses", base / "utils" / "losses.py"),
                       ("adv_lib_dense_adversary", base / "attacks" / "segmentation" / "dense_adversary.py")):
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["adv_lib_dense_adversary"].dag


def floor(model: nn.Module, x: torch.Tensor, target: torch.Tensor, steps: int) -> torch.Tensor:
    x_adv = x.clone()
    for _ in range(steps):
        x_adv.requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(model(x_adv), target), x_adv)
        n = g.flatten(1).abs().amax(dim=1).clamp_min(1e-12).reshape(-1, 1, 1, 1)
        x_adv = (x_adv.detach() - GAMMA * g / n).clamp(0.0, 1.0)
    return x_adv


def timed(fn: Callable[[], object], clock: str) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.process_time() if clock == "cpu" else time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.process_time() if clock == "cpu" else time.perf_counter()) - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--adv-lib", default=None)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = small_unet(1, args.classes, ndim=2, channels=(8, 16, 32)).to(dev).eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    task = Segmentation(args.classes)
    x = torch.rand(args.batch, 1, args.size, args.size, device=dev)
    with torch.no_grad():
        pred = model(x).argmax(1)
    # type A (everything to background), target region = every voxel not predicted background
    y_adv, _ = dag_target_a(pred)
    mask = torch.ones_like(pred, dtype=torch.bool)
    attack = DAG(task, Box(0.0, 1.0), steps=args.steps, step_size=GAMMA, stop_fraction=0.0, check_every=10)
    T = args.steps

    res = attack(model, x, y_adv, target_mask=mask)
    assert res.details is not None and bool((res.details.iterations == T).all()), res.details.iterations

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            attack.perturb(model, x, y_adv, None, target_mask=mask)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            floor(model, x, y_adv, T)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))

    methods: dict[str, Callable[[], object]] = {
        "floor (fwd+bwd, step, clamp)": lambda: floor(model, x, y_adv, T),
        "medadv DAG loop (perturb)": lambda: attack.perturb(model, x, y_adv, None, target_mask=mask),
        "medadv DAG attack()": lambda: attack(model, x, y_adv, target_mask=mask),
    }
    if args.adv_lib:
        adv_dag = load_adv_lib_dag(args.adv_lib)
        methods["adv_lib DAG"] = lambda: adv_dag(model, x, y_adv, masks=mask, targeted=True, max_iter=T, γ=GAMMA)

    names = list(methods)
    times: dict[str, list[float]] = {k: [] for k in names}
    ratios: dict[str, list[float]] = {k: [] for k in names}
    for fn in methods.values():  # warm-up
        fn()
    for r in range(args.repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {k: timed(methods[k], args.clock) for k in order}
        for k in names:
            times[k].append(got[k] / T)
            ratios[k].append(got[k] / got[names[0]])
    clock = "CUDA wall time" if dev.type == "cuda" else f"process {args.clock} time"
    print(f"device: {dev} ({platform.processor() or platform.machine()}), torch {torch.__version__}, threads "
          f"{args.threads}, {clock}; MONAI UNet (8, 16, 32) 2-D, {args.batch}×1×{args.size}×{args.size}, "
          f"{args.classes} classes, T = {T} iterations, {args.repeats} interleaved repeats\n")
    print("| method | median ms/iteration | min ms/iteration | × floor, paired median |")
    print("|---|---:|---:|---:|")
    for k in names:
        print(f"| {k} | {1e3 * statistics.median(times[k]):.2f} | {1e3 * min(times[k]):.2f} | "
              f"{statistics.median(ratios[k]):.3f} |")


if __name__ == "__main__":
    main()
