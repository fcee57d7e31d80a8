"""GPU-first evaluation benchmark (issue 18, item 6): the engine, evaluate(), the CLI and whole volumes, one run.

Every row is measured in the same run on the chosen device (``--device cuda`` when available, else ``cpu``) and
compares medadv with a reference doing the same work (the raw forward+backward-to-input loop, or the bare
attacks), as the median of the per-round ratios of interleaved repeats (methods in a rotating order):

1. PGD-10 loop (``attack.perturb``: the engine alone) vs the raw 10-step loop (forward, loss,
   ``torch.autograd.grad`` to the input, sign step, ε-ball clamp, box clamp), 3-D MONAI UNet;
2. host synchronisations per step of PGD, APGD, CosPGD, SegPGD, VAFA, DAG and PGD with ``active_set=True``
   (CUDA: ``torch.cuda.set_sync_debug_mode("warn")`` around a 10-step and a 20-step ``attack()``; per step =
   the difference / 10);
3. ``medadv.evaluate()`` vs the same attack called on the same batches directly (3-D UNet, PGD-10);
4. ``evaluate(hd95=True)`` vs the bare attacks, same setting;
5. ``attack()`` (the full public call) vs the raw loop, DenseNet-121 multi-label (CheXNet architecture);
6. APGD-10 vs PGD-10 on the 3-D UNet (loops, ``attack()``; bf16 ``amp=True`` loops on CUDA);
7. ``amp=True`` PGD-10 loop vs a raw bf16-autocast loop (DenseNet-121, 3-D UNet; CUDA only);
8. PGD-10 on the whole 1 mm MNI152 brain (182 x 218 x 182) through ``medadv.models.SlidingWindow`` (96^3
   windows): time, peak memory, volumes/s for 4 volumes (CUDA; on CPU only with ``--all``);
9. ``evaluate()`` with FGSM on near-free models (one ``Conv3d``, ``Segmentation(3)``; a tiny 14-output conv net,
   ``MultiLabel()``) vs the bare attacks: what the pipeline itself costs;
10. volumes/s of ``medadv evaluate CONFIG`` (in process, ``medadv.cli.main``) on real NIfTI volumes written as
    ``examples/prepare.py`` writes them, PGD-10 at the example config's first budget, and the share of the time
    spent inside the attacks.

Sizes: the GPU sizes of the issue (``--size full``, default on CUDA) or a CPU preset that runs in a few minutes
on 2 cores (``--size small``, default on CPU); ``--smoke`` runs tiny sizes once (for the test that keeps this
script alive). Times are this process's CPU time on the CPU (``--clock cpu``, one thread unless ``--threads``),
wall time with ``torch.cuda.synchronize()`` on CUDA.

Usage::

    python benchmarks/gpu.py --device cuda --output benchmarks/gpu.md
    python benchmarks/gpu.py --device cpu --output benchmarks/gpu.md          # the small preset
    python benchmarks/gpu.py --smoke --device cpu --output /tmp/gpu.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib.util
import io
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from medadv import APGD, DAG, FGSM, PGD, VAFA, Box, CosPGD, Linf, MultiLabel, Segmentation, SegPGD, evaluate
from medadv.models.nets import chexnet, small_unet

ROOT = Path(__file__).resolve().parents[1]
EPS, ALPHA, STEPS = 8 / 255, 2 / 255, 10
NA_CUDA = "n/a (CUDA only)"


# --- sizes ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    name: str
    unet_channels: tuple[int, ...]
    unet_x: tuple[int, ...]          # row 1, 6, 7: batch shape
    eval_x: tuple[int, ...]          # rows 3, 4: one batch's shape (4 batches)
    dense_x: tuple[int, ...]         # rows 5, 7: DenseNet-121 batch
    sync_x: tuple[int, ...]          # row 2
    free_seg_x: tuple[int, ...]      # row 9
    free_ml_x: tuple[int, ...]
    brain_mm: int                    # row 8: template spacing (1: the 1 mm brain)
    brain_roi: int
    brain_channels: tuple[int, ...]
    cli_volumes: int                 # row 10
    cli_size: int
    repeats: int
    batches: int = 4


FULL = Sizes("full (GPU sizes)", (16, 32, 64, 128, 256), (2, 1, 128, 128, 128), (4, 1, 96, 96, 96), (32, 3, 224, 224),
             (2, 1, 64, 64, 64), (2, 1, 48, 48, 48), (2, 1, 224, 224), 1, 96, (16, 32, 64, 128, 256), 32, 48, 10)
SMALL = Sizes("small (CPU preset)", (8, 16), (2, 1, 32, 32, 32), (2, 1, 32, 32, 32), (4, 3, 64, 64),
              (2, 1, 32, 32, 32), (2, 1, 48, 48, 48), (2, 1, 224, 224), 1, 96, (8, 16), 8, 48, 7)
SMOKE = Sizes("smoke (tiny, 1 repeat)", (4, 8), (1, 1, 16, 16, 16), (1, 1, 16, 16, 16), (1, 3, 32, 32),
              (1, 1, 16, 16, 16), (1, 1, 16, 16, 16), (1, 1, 32, 32), 4, 24, (4, 8), 2, 24, 1, batches=2)


# --- timing ---------------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self, device: torch.device, kind: str) -> None:
        self.cuda = device.type == "cuda"
        self.kind = kind
        self.now = time.process_time if kind == "cpu" else time.perf_counter

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def interleave(self, methods: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
        """Warm every method up once, then ``repeats`` rounds, each running every method once, in a rotating order."""
        for f in methods.values():
            f()
        self.sync()
        names = list(methods)
        times: dict[str, list[float]] = {k: [] for k in names}
        for r in range(repeats):
            for k in names[r % len(names):] + names[: r % len(names)]:
                gc.collect()
                self.sync()
                t0 = self.now()
                methods[k]()
                self.sync()
                times[k].append(self.now() - t0)
        return times


def paired(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def med(times: dict[str, list[float]], k: str) -> float:
    return statistics.median(times[k])


def fmt_s(t: float) -> str:
    return f"{t:.3f} s" if t < 10 else f"{t:.1f} s"


# --- rows -------------------------------------------------------------------------------------------------------------
@dataclass
class Row:
    num: int
    what: str
    setting: str
    medadv: str
    reference: str
    ratio: float | str | None
    goal: str
    met: str

    def cells(self) -> list[str]:
        r = self.ratio if isinstance(self.ratio, str) else ("" if self.ratio is None else f"{self.ratio:.3f}×")
        return [str(self.num), self.what, self.setting, self.medadv, self.reference, r, self.goal, self.met]


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, num, what, setting, medadv, reference, ratio, goal, limit=None):
        if isinstance(ratio, float) and limit is not None:
            met = "yes" if ratio <= limit else "no"
        else:
            met = "n/a" if isinstance(ratio, str) or ratio is None else ""
        self.rows.append(Row(num, what, setting, medadv, reference, ratio, goal, met))

    def na(self, num, what, why, goal):
        self.rows.append(Row(num, what, "", why, "", "n/a", goal, "n/a"))


def freeze(model: nn.Module, device: torch.device) -> nn.Module:
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def seg_ce(logits, y):  # per-sample mean voxel CE, summed: the same steps as medadv's Segmentation loss
    return F.cross_entropy(logits, y, reduction="none").reshape(logits.shape[0], -1).mean(1).sum()


def bce(logits, y):
    return F.binary_cross_entropy_with_logits(logits, y, reduction="none").mean(1).sum()


def raw_pgd(model, x, loss_fn, y, amp=False):
    x_adv = x.clone()
    for _ in range(STEPS):
        x_adv.requires_grad_(True)
        if amp:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x_adv).float()
        else:
            logits = model(x_adv)
        (g,) = torch.autograd.grad(loss_fn(logits, y), x_adv)
        x_adv = torch.min(torch.max(x_adv.detach() + ALPHA * g.sign(), x - EPS), x + EPS).clamp(0.0, 1.0)
    return x_adv


def pgd(task, **kw):
    return PGD(task, Linf(EPS, bounds=(0.0, 1.0)), steps=kw.pop("steps", STEPS), step_size=ALPHA,
               random_start=False, **kw)


def loop(atk, model, x, y):
    """The engine alone, as pgd_speed.py runs it: clean logits and targets computed once, outside the timing."""
    with torch.no_grad():
        logits = model(x)
    y_t = atk.task.to_target(y, logits)
    return lambda: atk.perturb(model, x, y_t, logits)


class Bench:
    def __init__(self, device: torch.device, sizes: Sizes, clock: Clock, repeats: int, run_all: bool) -> None:
        self.dev, self.s, self.clock, self.repeats, self.all = device, sizes, clock, repeats, run_all
        self.cuda = device.type == "cuda"
        self.report = Report()
        self._unet: nn.Module | None = None

    def unet(self) -> nn.Module:
        if self._unet is None:
            torch.manual_seed(0)
            self._unet = freeze(small_unet(1, 3, ndim=3, channels=self.s.unet_channels), self.dev)
        return self._unet

    def seg_batch(self, shape, k=3, seed=0):
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(shape, generator=g)
        y = torch.randint(0, k, (shape[0], *shape[2:]), generator=g)
        return x.to(self.dev), y.to(self.dev)

    def unet_label(self) -> str:
        return f"3-D UNet ch {self.s.unet_channels}"

    # 1 and 6 ------------------------------------------------------------------------------------------------------
    def row1_and_6(self) -> None:
        net, task = self.unet(), Segmentation(3)
        x, y = self.seg_batch(self.s.unet_x)
        p, a = pgd(task), APGD(task, Linf(EPS, bounds=(0.0, 1.0)), steps=STEPS, random_start=False)
        methods = {"raw": lambda: raw_pgd(net, x, seg_ce, y), "pgd loop": loop(p, net, x, y),
                   "apgd loop": loop(a, net, x, y), "pgd attack()": lambda: p(net, x, y),
                   "apgd attack()": lambda: a(net, x, y)}
        if self.cuda:
            pa = pgd(task, amp=True)
            aa = APGD(task, Linf(EPS, bounds=(0.0, 1.0)), steps=STEPS, random_start=False, amp=True)
            methods |= {"pgd amp loop": loop(pa, net, x, y), "apgd amp loop": loop(aa, net, x, y),
                        "raw bf16": lambda: raw_pgd(net, x, seg_ce, y, amp=True)}
        diff = float((methods["pgd loop"]().x_adv - methods["raw"]()).abs().max())
        t = self.clock.interleave(methods, self.repeats)
        shape = "×".join(map(str, self.s.unet_x))
        setting = f"{self.unet_label()}, {shape}, Segmentation(3)"
        self.report.add(1, "PGD-10 loop (`perturb`) vs raw fwd+bwd loop", f"{setting}; max |Δx_adv| {diff:.1e}",
                        fmt_s(med(t, "pgd loop")), fmt_s(med(t, "raw")), paired(t, "pgd loop", "raw"), "≤ 1.03×", 1.03)
        self.report.add(6, "APGD-10 vs PGD-10, loops (`perturb`)", setting, fmt_s(med(t, "apgd loop")),
                        fmt_s(med(t, "pgd loop")), paired(t, "apgd loop", "pgd loop"), "≤ 1.05×", 1.05)
        self.report.add(6, "APGD-10 vs PGD-10, `attack()`", setting, fmt_s(med(t, "apgd attack()")),
                        fmt_s(med(t, "pgd attack()")), paired(t, "apgd attack()", "pgd attack()"), "≤ 1.05×", 1.05)
        if self.cuda:
            self.report.add(6, "APGD-10 vs PGD-10, loops, bf16 `amp=True`", setting, fmt_s(med(t, "apgd amp loop")),
                            fmt_s(med(t, "pgd amp loop")), paired(t, "apgd amp loop", "pgd amp loop"), "≤ 1.05×", 1.05)
            self.report.add(7, "`amp=True` PGD-10 loop vs raw bf16-autocast loop", setting,
                            fmt_s(med(t, "pgd amp loop")), fmt_s(med(t, "raw bf16")),
                            paired(t, "pgd amp loop", "raw bf16"), "≤ 1.03× (none set; row 1's)", 1.03)
            self.report.notes.append(f"row 7, 3-D UNet: bf16 raw loop {fmt_s(med(t, 'raw bf16'))} vs fp32 raw loop "
                                     f"{fmt_s(med(t, 'raw'))} ({paired(t, 'raw bf16', 'raw'):.2f}× fp32).")
        else:
            self.report.na(6, "APGD-10 vs PGD-10, loops, bf16 `amp=True`", NA_CUDA, "≤ 1.05×")

    # 2 ------------------------------------------------------------------------------------------------------------
    def row2(self) -> None:
        what = "host syncs per step (10- vs 20-step `attack()`)"
        if not self.cuda:
            self.report.na(2, what, NA_CUDA, "0")
            return
        net, task = self.unet(), Segmentation(3)
        x, y = self.seg_batch(self.s.sync_x)
        ball = Linf(EPS, bounds=(0.0, 1.0))
        y_dag = (y + 1) % 3
        makers: dict[str, Callable[[int], Callable[[], object]]] = {
            "PGD": lambda n: lambda: PGD(task, ball, steps=n)(net, x, y),
            "APGD": lambda n: lambda: APGD(task, ball, steps=n)(net, x, y),
            "CosPGD": lambda n: lambda: CosPGD(task, ball, steps=n)(net, x, y),
            "SegPGD": lambda n: lambda: SegPGD(task, ball, steps=n)(net, x, y),
            "VAFA": lambda n: lambda: VAFA(task, Box(0.0, 1.0), steps=n, block=16)(net, x, y),
            "DAG": lambda n: lambda: DAG(task, ball, steps=n, stop_fraction=0.0)(net, x, y_dag),
            "PGD active_set": lambda n: lambda: PGD(task, ball, steps=n, active_set=True)(net, x, y),
            "PGD active_set, check_every=10": lambda n: lambda: PGD(task, ball, steps=n, active_set=True,
                                                                    check_every=10)(net, x, y),
        }
        cells, worst = [], 0.0
        for name, make in makers.items():
            counts = []
            for n in (10, 20):
                f = make(n)
                f()  # warm-up (lazy initialisation syncs once)
                torch.cuda.synchronize()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        f()
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                counts.append(sum("synchroniz" in str(w.message) for w in caught))
            per = (counts[1] - counts[0]) / 10
            if not name.startswith("PGD active_set"):
                worst = max(worst, per)
            cells.append(f"{name} {per:g} ({counts[0]}/{counts[1]})")
        shape = "×".join(map(str, self.s.sync_x))
        self.report.rows.append(Row(2, what, f"{self.unet_label()}, {shape}; per step (syncs in 10 / 20 steps)",
                                    "; ".join(cells), "0", "", "0 (active set: 1 per compaction)",
                                    "yes" if worst == 0 else "no"))

    # 3, 4 ---------------------------------------------------------------------------------------------------------
    def brain_batches(self, shape) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Crops of the MNI152 template and its 4 tissue labels (real anatomy: realistic label surfaces for
        HD95), ``shape[0]`` crops per batch, each batch from other positions."""
        from medadv.data.mni152 import load_tissue_map

        t1, lab = load_tissue_map(self.s.brain_mm)  # 1 mm; the 4 mm template in --smoke
        size = shape[2:]
        xs, ys = [], []
        for i in range(self.s.batches * shape[0]):
            lo = [min(d - s, max(0, (d - s) // 2 + (s // 3) * ((i + k) % 3 - 1)))
                  for k, (d, s) in enumerate(zip(t1.shape, size, strict=True))]
            sl = tuple(slice(a, a + s) for a, s in zip(lo, size, strict=True))
            xs.append(t1[sl])
            ys.append(lab[sl])
        n = shape[0]
        return [(torch.stack(xs[b * n:(b + 1) * n])[:, None].contiguous().to(self.dev),
                 torch.stack(ys[b * n:(b + 1) * n]).contiguous().to(self.dev)) for b in range(self.s.batches)]

    def row3_and_4(self) -> None:
        torch.manual_seed(0)
        net, task = freeze(small_unet(1, 4, ndim=3, channels=self.s.unet_channels), self.dev), Segmentation(4)
        batches = self.brain_batches(self.s.eval_x)
        atk = PGD(task, Linf(EPS, bounds=(0.0, 1.0)), steps=STEPS, seed=0)

        def bare():
            return [atk(net, x, y) for x, y in batches]

        methods = {"bare": bare, "evaluate": lambda: evaluate(net, task, batches, atk),
                   "evaluate hd95": lambda: evaluate(net, task, batches, atk, hd95=True)}
        t = self.clock.interleave(methods, self.repeats)
        shape = "×".join(map(str, self.s.eval_x))
        setting = (f"3-D UNet ch {self.s.unet_channels}, 4 classes, {self.s.batches} batches of {shape} "
                   f"({self.s.brain_mm} mm MNI152 crops, tissue labels), PGD-10 (random start)")
        self.report.add(3, "`evaluate()` vs the bare attacks", setting, fmt_s(med(t, "evaluate")),
                        fmt_s(med(t, "bare")), paired(t, "evaluate", "bare"), "≤ 1.10×", 1.10)
        self.report.add(4, "`evaluate(hd95=True)` vs the bare attacks", setting, fmt_s(med(t, "evaluate hd95")),
                        fmt_s(med(t, "bare")), paired(t, "evaluate hd95", "bare"), "≤ 1.5×", 1.5)

    # 5, 7 ---------------------------------------------------------------------------------------------------------
    def row5_and_7(self) -> None:
        torch.manual_seed(0)
        net = freeze(chexnet(14, 3), self.dev)
        task = MultiLabel()
        g = torch.Generator().manual_seed(0)
        x = torch.rand(self.s.dense_x, generator=g).to(self.dev)
        y = (torch.rand(self.s.dense_x[0], 14, generator=g) < 0.3).float().to(self.dev)
        p = pgd(task)
        methods = {"raw": lambda: raw_pgd(net, x, bce, y), "attack()": lambda: p(net, x, y)}
        if self.cuda:
            pa = pgd(task, amp=True)
            methods |= {"amp loop": loop(pa, net, x, y), "raw bf16": lambda: raw_pgd(net, x, bce, y, amp=True)}
        diff = float((methods["attack()"]().x_adv - methods["raw"]()).abs().max())
        t = self.clock.interleave(methods, self.repeats)
        shape = "×".join(map(str, self.s.dense_x))
        setting = f"DenseNet-121 (CheXNet arch., random weights), {shape}, MultiLabel() 14 labels"
        self.report.add(5, "`attack()` (full public call) vs raw 10-step loop",
                        f"{setting}; max |Δx_adv| {diff:.1e}", fmt_s(med(t, "attack()")), fmt_s(med(t, "raw")),
                        paired(t, "attack()", "raw"), "≤ 1.10×", 1.10)
        if self.cuda:
            self.report.add(7, "`amp=True` PGD-10 loop vs raw bf16-autocast loop", setting, fmt_s(med(t, "amp loop")),
                            fmt_s(med(t, "raw bf16")), paired(t, "amp loop", "raw bf16"), "≤ 1.03× (none set; row 1's)", 1.03)
            self.report.notes.append(f"row 7, DenseNet-121: bf16 raw loop {fmt_s(med(t, 'raw bf16'))} vs fp32 raw "
                                     f"loop {fmt_s(med(t, 'raw'))} ({paired(t, 'raw bf16', 'raw'):.2f}× fp32).")
        else:
            self.report.na(7, "`amp=True` PGD-10 loop vs raw bf16-autocast loop (DenseNet-121, 3-D UNet)", NA_CUDA,
                           "≤ 1.03× (none set; row 1's)")

    # 8 ------------------------------------------------------------------------------------------------------------
    def row8(self) -> None:
        what = "PGD-10, whole MNI152 brain through `SlidingWindow`"
        if not self.cuda and not self.all:
            self.report.na(8, what, "n/a (CUDA only; minutes on a CPU: run with `--all`)", "—")
            return
        from medadv.data.mni152 import load_tissue_map
        from medadv.models import SlidingWindow

        t1, lab = load_tissue_map(self.s.brain_mm)
        if self.s.brain_mm == 1:  # the FSL 1 mm grid, as benchmarks/sliding_window.py cuts it
            t1, lab = t1[8:190, 8:226, 0:182], lab[8:190, 8:226, 0:182]
        x, y = t1[None, None].contiguous().to(self.dev), lab[None].contiguous().to(self.dev)
        torch.manual_seed(0)
        net = freeze(small_unet(1, 4, ndim=3, channels=self.s.brain_channels), self.dev)
        sw = SlidingWindow(net, self.s.brain_roi, overlap=0.25, mode="gaussian", sw_batch_size=4 if self.cuda else 1,
                           checkpoint=True)
        task = Segmentation(4)
        atk = PGD(task, Linf(4 / 255, bounds=(0.0, 1.0)), steps=STEPS, seed=0)
        PGD(task, Linf(4 / 255, bounds=(0.0, 1.0)), steps=1, seed=0)(sw, x, y)  # warm-up
        clock = Clock(self.dev, "wall")
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        clock.sync()
        t0 = time.perf_counter()
        atk(sw, x, y)
        clock.sync()
        one = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated() if self.cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30
        shape = "×".join(map(str, x.shape[2:]))
        if self.cuda:  # 4 volumes in one batch (sliding_window_inference runs every volume's windows)
            x4 = torch.cat([x, x.flip(2), x.flip(3), x.flip(4)])
            y4 = torch.cat([y, y.flip(1), y.flip(2), y.flip(3)])
            clock.sync()
            t0 = time.perf_counter()
            atk(sw, x4, y4)
            clock.sync()
            four = time.perf_counter() - t0
            vps = f"{4 / four:.3f} volumes/s (4 volumes in one batch: {fmt_s(four)}); peak {peak:.2f} GiB " \
                  f"(max_memory_allocated, 1 volume)"
        else:
            vps = f"{1 / one:.4f} volumes/s (one at a time); peak RSS {peak:.2f} GiB (process)"
        setting = (f"{shape} at {self.s.brain_mm} mm, UNet ch {self.s.brain_channels}, {self.s.brain_roi}³ windows, "
                   f"overlap 0.25, gaussian, checkpoint=True, wall clock")
        self.report.rows.append(Row(8, what, setting, f"{fmt_s(one)} per volume; {vps}", "", "", "—", "n/a"))

    # 9 ------------------------------------------------------------------------------------------------------------
    def row9(self) -> None:
        torch.manual_seed(0)
        conv = freeze(nn.Conv3d(1, 3, 3, padding=1), self.dev)
        tiny = freeze(nn.Sequential(nn.Conv2d(1, 4, 3, stride=4, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                    nn.Flatten(), nn.Linear(4, 14)), self.dev)
        seg_b = [self.seg_batch(self.s.free_seg_x, seed=i) for i in range(self.s.batches)]
        g = torch.Generator().manual_seed(0)
        ml_b = [(torch.rand(self.s.free_ml_x, generator=g).to(self.dev),
                 (torch.rand(self.s.free_ml_x[0], 14, generator=g) < 0.3).float().to(self.dev))
                for _ in range(self.s.batches)]
        for label, net, task, batches in (("Conv3d(1, 3, 3), Segmentation(3)", conv, Segmentation(3), seg_b),
                                          ("tiny conv net, 14 outputs, MultiLabel()", tiny, MultiLabel(), ml_b)):
            atk = FGSM(task, Linf(EPS, bounds=(0.0, 1.0)))

            def bare(atk=atk, net=net, batches=batches):
                return [atk(net, x, y) for x, y in batches]

            t = self.clock.interleave({"bare": bare, "evaluate": lambda atk=atk, net=net, task=task, batches=batches:
                                       evaluate(net, task, batches, atk)}, self.repeats)
            shape = "×".join(map(str, batches[0][0].shape))
            self.report.add(9, "`evaluate()` vs bare attacks, FGSM, near-free model",
                            f"{label}, {self.s.batches} batches of {shape}", fmt_s(med(t, "evaluate")),
                            fmt_s(med(t, "bare")), paired(t, "evaluate", "bare"), "≤ 1.2×", 1.2)

    # 10 -----------------------------------------------------------------------------------------------------------
    def row10(self) -> None:
        import yaml

        import medadv.attacks.base as base
        import medadv.evaluation as ev
        from medadv.cli import main
        from medadv.models import save_checkpoint

        spec = importlib.util.spec_from_file_location("medadv_examples_prepare", ROOT / "examples" / "prepare.py")
        assert spec is not None and spec.loader is not None
        prep = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(prep)
        n = self.s.cli_volumes
        with tempfile.TemporaryDirectory(prefix="medadv_gpu_bench_") as tmp:
            folder = Path(tmp)
            prep.write_seg3d(folder / "data" / "seg3d", n=n, size=self.s.cli_size)
            torch.manual_seed(0)  # random weights: the cost does not depend on them
            save_checkpoint(folder / "data" / "unet3d.pt", small_unet(1, 4, ndim=3, channels=prep.UNET_CHANNELS))
            cfg = yaml.safe_load((ROOT / "examples" / "seg3d_nifti.yaml").read_text())
            budget = cfg["budgets"][0]
            cfg.update(budgets=[budget], attacks=[{"name": "pgd", "steps": STEPS}], output="results")
            path = folder / "seg3d_nifti.yaml"
            path.write_text(yaml.safe_dump(cfg))

            spent = {"attack": 0.0, "evaluate": 0.0, "attack_cpu": 0.0, "evaluate_cpu": 0.0, "calls": 0}
            call, evaluate_fn = base.Attack.__call__, ev.evaluate

            def timed_call(self_, *a, **k):
                self.clock.sync()
                t0, c0 = time.perf_counter(), time.process_time()
                try:
                    return call(self_, *a, **k)
                finally:
                    self.clock.sync()
                    spent["attack"] += time.perf_counter() - t0
                    spent["attack_cpu"] += time.process_time() - c0
                    spent["calls"] += 1

            def timed_evaluate(*a, **k):
                t0, c0 = time.perf_counter(), time.process_time()
                try:
                    return evaluate_fn(*a, **k)
                finally:
                    spent["evaluate"] += time.perf_counter() - t0
                    spent["evaluate_cpu"] += time.process_time() - c0

            base.Attack.__call__ = timed_call  # type: ignore[method-assign]
            ev.evaluate = timed_evaluate
            out = io.StringIO()
            try:
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0, p0 = time.perf_counter(), time.process_time()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    rc = main(["evaluate", str(path), "--no-progress", "--overwrite"])
                wall, own_cpu = time.perf_counter() - t0, time.process_time() - p0
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            finally:
                base.Attack.__call__ = call  # type: ignore[method-assign]
                ev.evaluate = evaluate_fn
            if rc != 0:
                raise RuntimeError(f"medadv evaluate failed ({rc}):\n{out.getvalue()[-2000:]}")
        cpu = sum(getattr(b, f) - getattr(a, f) for a, b in ((r0, r1), (c0, c1)) for f in ("ru_utime", "ru_stime"))
        setting = (f"`medadv evaluate` on the seg3d_nifti example config: {n} NIfTI volumes "
                   f"{self.s.cli_size}³ (MNI152 crops), UNet ch {prep.UNET_CHANNELS} (random weights), "
                   f"PGD-10 at {budget}, batch {cfg['batch_size']}, hd95 {cfg['hd95']}, report and "
                   f"{cfg.get('cases', 2)} worst cases; wall clock")
        share = (f"inside the attacks: {spent['attack'] / wall:.0%} of the wall time, {spent['attack_cpu'] / own_cpu:.0%} "
                 f"of this process's CPU time ({spent['calls']} attack calls, incl. the report's worst-case redraws); "
                 f"inside evaluate(): {spent['evaluate'] / wall:.0%} wall, {spent['evaluate_cpu'] / own_cpu:.0%} CPU")
        self.report.rows.append(Row(10, "CLI throughput", setting,
                                    f"{n / wall:.3f} volumes/s ({fmt_s(wall)} wall, {fmt_s(cpu)} CPU)", share,
                                    "", "—", "n/a"))


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def render(rep: Report, dev: torch.device, args: argparse.Namespace, sizes: Sizes, total: float, cpu_total: float,
           cmd: str) -> str:
    lines = ["# GPU-first evaluation benchmark (issue 18, item 6)", ""]
    if dev.type != "cuda":
        why = "no GPU was available" if not torch.cuda.is_available() else "run with `--device cpu`"
        lines += [f"**GPU figures unmeasured in this run: {why}; CPU figures below.** On a GPU run",
                  "`python benchmarks/gpu.py --device cuda --output benchmarks/gpu.md` (the issue's sizes, wall "
                  "clock); rows 2, 7 and 8 are measured on CUDA only.", ""]
    threads = torch.get_num_threads()
    lines += [
        f"- device: **{device_name(dev)}** ({dev.type}{f', {threads} thread(s)' if dev.type == 'cpu' else ''})",
        f"- torch {torch.__version__}, Python {platform.python_version()}, "
        f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- command: `{cmd}`",
        f"- sizes: {sizes.name}; clock: {args.clock}"
        f"{' (this process CPU time)' if args.clock == 'cpu' else ' (wall' + (', torch.cuda.synchronize)' if dev.type == 'cuda' else ')')}"
        f"; {args.repeats} interleaved repeats after one warm-up; ratio = median over the rounds of "
        "(medadv time / reference time in the same round); ε = 8/255, α = 2/255, 10 steps, no random start "
        "unless said",
        f"- total time of the run: {total:.0f} s wall, {cpu_total:.0f} s CPU (this process)",
        "",
        "| # | measurement | setting | medadv | reference | ratio | goal | met? |",
        "|---|---|---|---|---|---:|---|---|",
    ]
    for r in sorted(rep.rows, key=lambda r: r.num):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |")
    if rep.notes:
        lines += ["", *(f"- {n}" for n in rep.notes)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", choices=["full", "small"], help="full: the GPU sizes (default on CUDA); small: the CPU "
                    "preset (default on CPU)")
    ap.add_argument("--small", dest="size", action="store_const", const="small", help="same as --size small")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (< 60 s on a CPU)")
    ap.add_argument("--all", action="store_true", help="also row 8 (the whole 1 mm brain) on a CPU: minutes")
    ap.add_argument("--repeats", type=int, help="interleaved repeats (default: 10 full, 7 small, 1 smoke)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    ap.add_argument("--clock", choices=["cpu", "wall"], help="cpu: process CPU time (default on CPU); wall: elapsed "
                    "(always on CUDA)")
    ap.add_argument("--rows", help="comma-separated row numbers to run (default all; the others are left out)")
    ap.add_argument("--output", help="write the Markdown table here (it is printed either way)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available")
    dev = torch.device(args.device)
    sizes = SMOKE if args.smoke else {"full": FULL, "small": SMALL}[args.size or ("full" if dev.type == "cuda" else "small")]
    args.repeats = args.repeats or sizes.repeats
    if dev.type == "cuda":
        args.clock = "wall"
    args.clock = args.clock or "cpu"
    if dev.type == "cpu":
        torch.set_num_threads(args.threads)
    rows = {int(r) for r in args.rows.split(",")} if args.rows else set(range(1, 11))
    bench = Bench(dev, sizes, Clock(dev, args.clock), args.repeats, args.all)
    steps = [((1, 6), bench.row1_and_6), ((2,), bench.row2), ((3, 4), bench.row3_and_4), ((5, 7), bench.row5_and_7),
             ((8,), bench.row8), ((9,), bench.row9), ((10,), bench.row10)]
    t0, c0 = time.perf_counter(), time.process_time()
    for nums, fn in steps:
        if rows & set(nums):
            t = time.perf_counter()
            fn()
            print(f"rows {nums}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    total, cpu_total = time.perf_counter() - t0, time.process_time() - c0
    cmd = "python " + " ".join(shlex.quote(a) for a in ([Path(sys.argv[0]).as_posix()] + (argv or sys.argv[1:])))
    text = render(bench.report, dev, args, sizes, total, cpu_total, cmd)
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
