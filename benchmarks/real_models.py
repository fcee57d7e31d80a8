"""A published, pretrained model attacked in its real pipeline: deepbet brain extraction on two real T1 heads.

deepbet 1.0.2 (Fisch et al., Computers in Biology and Medicine 179 (2024) 108845; its own TorchScript weights, read
offline from the installed wheel by :mod:`medadv.models.zoo`) with its preprocessing inside the model, so every ε is
in the scanner's grey levels (both heads are uint8: data box (0, 255)). The normalisation window (and, two-stage, the
box) is frozen to the clean image's (``model.fit(x)``) before the attacks.

Subjects: Colin27 (Debian ``mricron-data``: ``ch2.nii.gz`` with skull, reference brain ``ch2bet``; 1 mm) and the ITK
KmeansTest head (Debian ``insighttoolkit5-examples``: ``KmeansTest_T1UCharRaw``, reference ``KmeansTest_T1RawSkullStrip``;
2×3×2 mm). A subject whose package is missing is skipped with the ``apt-get`` line.

Rows, per subject, model and ε ∈ {1, 2, 4, 8} grey levels (untargeted, against the reference mask, L∞ ball in the
data box): FGSM, PGD, CosPGD, SegPGD, APGD (CE), the ``volume`` PGD (grow the brain, TIV), ``auto``
(``version="custom"``: APGD-CE, APGD-SegPGD, APGD-volume-grow; the worst case by its metric) and the random-sign
noise control of the same L∞ size; VAFA once per subject (not an Lp attack: its budget is the quantisation table's
``q_max`` in grey levels, ``renormalize="none"``). Columns: Dice of the attacked mask to the clean mask and to the
reference, brain volume (TIV) change in ml and %, the measured L∞ (grey levels) and wall time of the attack.
Models: the bbox stage alone at ``--size``³ (every row), and the two-stage pipeline (bbox 128³ → fine 256³, its
forward+backward is ≈ 4 s on 2 cores) on Colin27 with ``--full-steps`` iterations at ε ∈ ``--full-eps``. One certify
row: randomized smoothing (:class:`medadv.certify.RandomizedSmoothing`, per voxel, SegCertify with Holm, τ = 0.75) of
the bbox stage on Colin27.

Run: ``OMP_NUM_THREADS=2 python benchmarks/real_models.py [--smoke] [--output real_models.md]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medadv.attacks import APGD, PGD, Attack, AutoEvaluation
from medadv.attacks.vafa import VAFA
from medadv.demo_deepbet import BOUNDS, RandomSign, table_rows
from medadv.evaluation import evaluate
from medadv.models.zoo import load_model
from medadv.tasks import Segmentation
from medadv.threats import Box, Linf


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def subjects(smoke: bool) -> list[Any]:
    """The heads on this machine (Colin27, ITK KmeansTest); a missing one is logged with its apt-get line."""
    from medadv.data import heads

    out = []
    for load in (heads.colin27, heads.itk_head):
        try:
            out.append(load())
        except FileNotFoundError as e:
            log(f"skipped: {e}")
    return out[:1] if smoke else out


def attacks_at(task: Segmentation, eps: float, steps: int, voxel_ml: float, families: tuple[str, ...]) -> dict[str, Attack]:
    """The benchmark's ε-ball attacks at ``eps`` grey levels, named ``family@eps``."""
    from medadv.attacks import FGSM, CosPGD, SegPGD

    t = Linf(float(eps), bounds=BOUNDS)
    it: dict[str, Any] = {"steps": steps, "seed": 0}
    make = {
        "fgsm": lambda: FGSM(task, t),
        "pgd": lambda: PGD(task, t, **it),
        "cospgd": lambda: CosPGD(task, t, **it),
        "segpgd": lambda: SegPGD(task, t, **it),
        "apgd": lambda: APGD(task, t, **it),
        "volume": lambda: PGD(task, t, loss="volume", volume_goal="grow", voxel_volume_ml=voxel_ml, **it),
        "auto": lambda: AutoEvaluation(task, t, version="custom", steps=steps,
                                       attacks=["apgd-ce", "apgd-segpgd", "apgd-volume-grow"]),
        "noise": lambda: RandomSign(task, t, seed=0),
    }
    return {f"{f}@{eps:g}": make[f]() for f in families}


def run_rows(model: nn.Module, task: Segmentation, head: Any, attacks: dict[str, Attack], budget_label: str | None = None
             ) -> list[dict[str, Any]]:
    """Each attack in its own ``evaluate`` call (so each has its own wall time); one table row each."""
    x, y = head.batch(), head.mask[None].long()
    rows = []
    for name, atk in attacks.items():
        t0 = time.perf_counter()
        res = evaluate(model, task, (x, y), {name: atk}, spacing=head.spacing, seed=0)
        sec = time.perf_counter() - t0
        clean, row = table_rows(res)
        summ = res.summary()[0]
        row.update(seconds=sec, linf=float(summ["linf"]), clean_dice_ref=clean["dice_ref"], clean_tiv=clean["tiv_ml"],
                   budget=budget_label or f"{row['eps']:g}")
        rows.append(row)
        log(f"  {name:<12} Dice→clean {row['dice_clean']:.4f}  Dice→ref {row['dice_ref']:.4f}  "
            f"ΔTIV {row['tiv_change_ml']:+.1f} ml ({row['tiv_change_pct']:+.2f} %)  {sec:.1f} s")
    return rows


def certify_row(model: nn.Module, task: Segmentation, head: Any, sigma: float, n0: int, n: int) -> dict[str, Any]:
    """Per-voxel randomized smoothing of ``model`` on ``head``: certified Dice to the reference at SegCertify's radius."""
    from medadv.certify import RandomizedSmoothing, certified_dice

    x, y = head.batch(), head.mask[None].long()
    # one noisy copy per forward: the fitted model takes inputs of the clean batch's shape (its frozen window)
    rs = RandomizedSmoothing(task, sigma, n0=n0, n=n, alpha=0.001, batch_size=1, correction="holm", tau=0.75,
                             seed=0, bounds=BOUNDS)
    t0 = time.perf_counter()
    res = rs.certify(model, x, y)
    sec = time.perf_counter() - t0
    radius = float(sigma * torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(0.75)))
    dice = float(certified_dice(res, y, [0.0, radius])[1])
    abstain = float(res.abstain.float().mean())
    return {"sigma": sigma, "n0": n0, "n": n, "radius": radius, "dice": dice, "abstain": abstain, "seconds": sec}


def fmt_rows(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| subject | model | attack | ε (grey levels) | Dice→clean | Dice→ref | ΔTIV ml | ΔTIV % | L∞ | time s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['subject']} | {r['model']} | {r['attack']} | {r['budget']} | {r['dice_clean']:.4f} | "
                   f"{r['dice_ref']:.4f} | {r['tiv_change_ml']:+.1f} | {r['tiv_change_pct']:+.2f} | {r['linf']:.3g} | "
                   f"{r['seconds']:.1f} |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes: the test's run (bbox 32³, 1 step, ε 4, one subject)")
    p.add_argument("--size", type=int, default=96, help="the bbox stage's grid (multiple of 32; default 96)")
    p.add_argument("--steps", type=int, default=10, help="iterations of the iterative attacks (default 10)")
    p.add_argument("--full-steps", type=int, default=5, help="iterations on the two-stage pipeline (default 5)")
    p.add_argument("--full-eps", default="4,8", help="ε of the two-stage rows, grey levels (default 4,8; '' skips)")
    p.add_argument("--output", default=str(Path(__file__).with_name("real_models.md")))
    a = p.parse_args(argv)
    size, steps, budgets = a.size, a.steps, (1.0, 2.0, 4.0, 8.0)
    full_eps = [float(e) for e in a.full_eps.split(",") if e.strip()]
    families = ("fgsm", "pgd", "cospgd", "segpgd", "apgd", "volume", "auto", "noise")
    cert = (4.0, 16, 100)  # σ grey levels, n0, n
    if a.smoke:
        size, steps, budgets, full_eps, families, cert = 32, 1, (4.0,), [], ("pgd", "volume", "noise"), \
            (4.0, 2, 4)
    torch.manual_seed(0)
    task = Segmentation(2, outputs="probabilities")
    rows: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    heads = subjects(a.smoke)
    if not heads:
        log("no subject on this machine: apt-get install mricron-data insighttoolkit5-examples")
        return 2
    clean: dict[tuple[str, str], tuple[float, float]] = {}
    cert_result = None
    for head in heads:
        model = load_model("deepbet-bbox", size=size).fit(head.batch())
        label = f"bbox {size}³"
        log(f"{head.name}: {label}")
        for eps in budgets:
            for r in run_rows(model, task, head, attacks_at(task, eps, steps, head.voxel_ml, families)):
                rows.append({**r, "subject": head.name, "model": label})
        vafa = VAFA(task, Box(*BOUNDS), steps=steps, q_max=20.0, renormalize="none")
        for r in run_rows(model, task, head, {"vafa": vafa}, budget_label="q_max 20"):
            rows.append({**r, "subject": head.name, "model": label})
        clean[(head.name, label)] = (rows[-1]["clean_dice_ref"], rows[-1]["clean_tiv"])
        if cert_result is None:
            log(f"{head.name}: certify {label}")
            cert_result = {**certify_row(model, task, head, *cert), "subject": head.name, "model": label}
    if full_eps:
        head = heads[0]
        model = load_model("deepbet").fit(head.batch())
        label = "two-stage 128³→256³"
        log(f"{head.name}: {label}")
        for eps in full_eps:
            for r in run_rows(model, task, head, attacks_at(task, eps, a.full_steps, head.voxel_ml,
                                                            ("fgsm", "pgd", "segpgd", "volume", "noise"))):
                rows.append({**r, "subject": head.name, "model": label})
        clean[(head.name, label)] = (rows[-1]["clean_dice_ref"], rows[-1]["clean_tiv"])
    total = time.perf_counter() - t_all
    write(Path(a.output), rows, clean, cert_result, total, size, steps, a.full_steps, full_eps, a.smoke, heads)
    log(f"wrote {a.output} ({total:.0f} s)")
    return 0


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """Computed from the rows: PGD vs the noise control (Dice→clean drop) and the volume attack vs PGD (|ΔTIV|) at
    the largest ε each (subject, model) has, so the summary never disagrees with the table."""
    out = ["Findings (computed from the table below):", ""]
    groups: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["subject"], r["model"]), {})[f"{r['attack']}@{r['budget']}"] = r
    for (subject, model), g in groups.items():
        for eps in ("8", "4", "2", "1"):
            pgd, noise, vol = g.get(f"pgd@{eps}"), g.get(f"noise@{eps}"), g.get(f"volume@{eps}")
            if pgd is None or noise is None:
                continue
            d_pgd, d_noise = 1 - pgd["dice_clean"], 1 - noise["dice_clean"]
            ratio = f"{d_pgd / d_noise:.0f}×" if d_noise > 0 else "∞×"
            text = (f"- {subject}, {model}, ε = {eps}: PGD lowers Dice→clean by {d_pgd:.4f}, random-sign noise by "
                    f"{d_noise:.4f} ({ratio})")
            if vol is not None:
                text += (f"; the volume attack moves TIV by {vol['tiv_change_ml']:+.0f} ml, PGD by "
                         f"{pgd['tiv_change_ml']:+.0f} ml")
            out.append(text + ".")
            break
    return out


def write(path: Path, rows: list[dict[str, Any]], clean: dict[tuple[str, str], tuple[float, float]],
          cert: dict[str, Any] | None, total: float, size: int, steps: int, full_steps: int, full_eps: list[float],
          smoke: bool, heads: list[Any]) -> None:
    threads = torch.get_num_threads()
    lines = [
        "# deepbet (a published, pretrained model) attacked on real T1 heads",
        "",
        "Generated by `OMP_NUM_THREADS=2 python benchmarks/real_models.py " + " ".join(sys.argv[1:]) + "`"
        + (" (--smoke: tiny sizes; not the reported run)" if smoke else "") + ".",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores shared with other jobs, "
        f"torch {torch.__version__} with {threads} threads; **no GPU was lent to this run** (CPU only). "
        f"Whole run: {total:.0f} s. Times are wall clock on that shared machine (a row can be several × slower when "
        "other jobs ran at the same moment).",
        "",
        f"Model: deepbet 1.0.2 (Fisch et al. 2024), its own TorchScript weights, preprocessing inside the model; "
        f"normalisation window (and box) frozen to the clean image. Bbox stage at {size}³ with {steps}-step attacks; "
        + (f"two-stage pipeline (bbox 128³ → fine 256³) on {heads[0].name} with {full_steps}-step attacks at "
           f"ε ∈ {{{', '.join(f'{e:g}' for e in full_eps)}}}." if full_eps else "two-stage pipeline not run.")
        + " Attacks are untargeted against the reference brain mask; ε is L∞ in grey levels (uint8 data, box 0..255).",
        "Dice→clean: the attacked mask vs the clean prediction; Dice→ref: vs the reference brain mask; TIV: the brain "
        "volume of the attacked mask minus the clean one. `volume`: PGD on the soft brain volume (grow); `auto`: "
        "custom (APGD-CE, APGD-SegPGD, APGD-volume-grow), worst case by its metric; `noise`: random ±ε per voxel; "
        "VAFA is not an L∞ attack (its L∞ column is what it did).",
        "",
        "Clean predictions:",
        "",
        "| subject | model | Dice→ref | TIV ml |",
        "|---|---|---|---|",
    ]
    lines += [f"| {s} | {m} | {d:.4f} | {v:.1f} |" for (s, m), (d, v) in clean.items()]
    lines += [""] + findings(rows) + [""] + fmt_rows(rows) + [""]
    if cert is not None:
        lines += ["Certify (randomized smoothing per voxel, SegCertify with Holm's correction, τ = 0.75, α = 0.001): "
                  f"{cert['subject']}, {cert['model']}, σ = {cert['sigma']:g} grey levels, n0 = {cert['n0']}, "
                  f"n = {cert['n']}: certified Dice→ref **{cert['dice']:.4f}** at L2 radius {cert['radius']:.2f} grey "
                  f"levels (the whole volume's L2, so far smaller than an L∞ ε of 1 per voxel), "
                  f"{100 * cert['abstain']:.2f} % of voxels abstained, {cert['seconds']:.0f} s.", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
