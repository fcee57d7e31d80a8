"""``medadv demo``: a published, pretrained brain-extraction network attacked in its real pipeline.

The model is **deepbet** 1.0.2 (Fisch et al., "deepbet: Fast brain extraction of T1-weighted MRI using
Convolutional Neural Networks", Computers in Biology and Medicine 179 (2024) 108845; PyPI, MIT): its own
TorchScript weights, with its preprocessing (resampling, 0.5/99.5 % quantile window, z-score) inside the model
(:mod:`medadv.models.deepbet`), so ε is in the scanner's grey levels. The subject is the real Colin27 T1 head with
skull (Debian ``mricron-data``, :func:`medadv.data.heads.colin27`), the reference brain mask its ``ch2bet``.

On a CPU the demo attacks deepbet's first (bbox) stage at ``size``³ (96³: about a minute on 2 cores); ``full=True``
(``medadv demo --full``, the default on a GPU) attacks the whole two-stage pipeline (bbox 128³ → box crop → fine
256³). The normalisation window (and, two-stage, the box) is frozen to the clean image's
(:meth:`~medadv.models.deepbet.DeepbetBBox.fit`): the attacker moves voxels inside a pipeline whose preprocessing
was fixed before the attack.

Attacks (untargeted, against the reference mask, at ε ∈ {1, 2, 4, 8} grey levels of the uint8 data, data bounds
(0, 255)): FGSM, PGD, CosPGD, SegPGD, the ``volume`` loss PGD that grows the brain (TIV, deepbet's clinical
output), and a random-sign noise control of the same L∞ size (every voxel ± ε). The table: Dice of the attacked
mask to the clean mask and to the reference, and the change of the brain volume (TIV, ml and %).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from .attacks import FGSM, PGD, Attack, CosPGD, SegPGD
from .attacks.noise import Noise
from .results import Results
from .runtime import make_generator
from .tasks import Task, get_task
from .threats import Linf

__all__ = ["DeepbetDemoConfig", "RandomSign", "demo_attacks", "load_subject", "run_deepbet_demo",
           "write_deepbet_outputs", "format_deepbet_table", "BOUNDS", "MRICRON_HINT"]

T = TypeVar("T")

#: Colin27's grey levels are uint8: the data box of every attack, grey levels
BOUNDS = (0.0, 255.0)
#: what the demo needs that pip does not install (Debian package with Colin27)
MRICRON_HINT = "apt-get install mricron-data"
CLASS_NAMES = ("background", "brain")


class DeepbetDemoConfig:
    """Settings of the deepbet demo.

    Args:
        size: the bbox stage's grid, voxels per side (a multiple of 32: the nets' skip connections need it;
            deepbet's own is 128). Ignored with ``full``.
        full: attack the two-stage pipeline (bbox 128³, fine 256³) instead of the bbox stage alone; ``None``: on a
            GPU only.
        budgets: L∞ radii in grey levels (Colin27 is uint8, 0..254).
        steps: iterations of the iterative attacks.
        seed: seed of the attacks' random starts and of the noise control.
        device: ``"cpu"``, ``"cuda"`` or ``None`` (CUDA when available).
    """

    def __init__(self, *, size: int = 96, full: bool | None = None, budgets: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0),
                 steps: int = 10, seed: int = 0, device: str | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or size % 32:
            raise ValueError(f"`size` must be a positive multiple of 32 (voxels per side of deepbet's bbox grid), "
                             f"got {size!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"`steps` must be a positive int (attack iterations), got {steps!r}")
        budgets = tuple(budgets)
        if not budgets or any(isinstance(b, bool) or not isinstance(b, int | float) or not 0 < b <= 255
                              for b in budgets):
            raise ValueError(f"`budgets` must be grey levels in (0, 255], got {budgets!r}")
        if device not in (None, "cpu", "cuda"):
            raise ValueError(f"`device` must be 'cpu', 'cuda' or None (CUDA when available), got {device!r}")
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.size, self.budgets, self.steps, self.seed = size, budgets, steps, seed
        self.full = self.device == "cuda" if full is None else bool(full)

    def model_name(self) -> str:
        """What the table's title names."""
        return "deepbet (two stages: bbox 128³ → fine 256³)" if self.full else f"deepbet bbox stage at {self.size}³"


class RandomSign(Noise):
    """The noise control of the demo: every element moved by ±ε (a fair coin per element), the L∞ ball's corners.

    Random noise of the same L∞ size as the attacks (a non-adversarial control: an attack that hurts much more than
    this is exploiting the model, not merely perturbing it); ``x + ε·s`` with ``s ∈ {−1, +1}`` from the attack's
    seeded generator, then clipped to the data box (so a voxel at a bound moves only inward). Constructed as
    :class:`~medadv.attacks.noise.Noise` with an :class:`~medadv.threats.Linf` ball (σ = ε).
    """

    def draw(self, x: Tensor) -> Tensor:
        """``ε·s`` with ``s`` a random sign per element."""
        gen = make_generator(self.seed, x.device)
        s = torch.randint(0, 2, x.shape, generator=gen, device=x.device).to(x.dtype) * 2 - 1
        return s * self.std(x)


def _own_rng(fn: Callable[..., T]) -> Callable[..., T]:
    """Run ``fn`` on a private copy of torch's global RNG: medadv never leaves the caller's RNG state changed."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with torch.random.fork_rng(devices=[]):
            return fn(*args, **kwargs)

    return wrapper


def load_subject(directory: str | Path | None = None) -> Any:
    """Colin27 (1 mm, with skull) and its ``ch2bet`` brain: :func:`medadv.data.heads.colin27`.

    Raises ``FileNotFoundError`` in one line naming the ``apt-get`` command when ``mricron-data`` is missing (no
    pip-installable fallback: nilearn's MNI152 templates are skull-stripped or averaged, not one head with skull).
    """
    from .data import heads

    d = Path(directory) if directory is not None else heads.MRICRON_DIR
    if not (d / "ch2.nii.gz").is_file() or not (d / "ch2bet.nii.gz").is_file():
        raise FileNotFoundError(f"the demo's subject Colin27 ({d / 'ch2.nii.gz'}, {d / 'ch2bet.nii.gz'}) is not on "
                                f"this machine: install the Debian package with: {MRICRON_HINT}")
    return heads.colin27(1, d)


def demo_attacks(task: Task, cfg: DeepbetDemoConfig, voxel_ml: float) -> dict[str, Attack]:
    """The demo's attacks by table name (``pgd@4`` ...): FGSM, PGD, CosPGD, SegPGD, the TIV-growing ``volume``
    PGD and the random-sign ``noise`` control, at every budget of ``cfg`` (grey levels, box :data:`BOUNDS`)."""
    attacks: dict[str, Attack] = {}
    for eps in cfg.budgets:
        threat = Linf(float(eps), bounds=BOUNDS)
        it: dict[str, Any] = {"steps": cfg.steps, "seed": cfg.seed}
        attacks[f"fgsm@{eps:g}"] = FGSM(task, threat)
        attacks[f"pgd@{eps:g}"] = PGD(task, threat, **it)
        attacks[f"cospgd@{eps:g}"] = CosPGD(task, threat, **it)
        attacks[f"segpgd@{eps:g}"] = SegPGD(task, threat, **it)
        # grow: the direction in which deepbet already errs on Colin27 (its clean TIV is above ch2bet's), so the
        # attacked Dice to the reference falls with ε as for the other attacks
        attacks[f"volume@{eps:g}"] = PGD(task, threat, loss="volume", volume_goal="grow", voxel_volume_ml=voxel_ml,
                                         **it)
        attacks[f"noise@{eps:g}"] = RandomSign(task, threat, seed=cfg.seed)
    return attacks


def build_model(cfg: DeepbetDemoConfig) -> nn.Module:
    """deepbet from the zoo (its wheel's weights, offline): the bbox stage at ``cfg.size`` or, ``full``, both stages."""
    from .models.zoo import load_model

    model = load_model("deepbet") if cfg.full else load_model("deepbet-bbox", size=cfg.size)
    return model.to(cfg.device).eval()


@_own_rng
def run_deepbet_demo(cfg: DeepbetDemoConfig | None = None, *, subject_dir: str | Path | None = None,
                     progress: bool = True, echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """Attack deepbet on Colin27 and print the table (:func:`format_deepbet_table`); returns the results with the
    model, task, data and attacks (what :func:`write_deepbet_outputs` draws cases from)."""
    cfg = cfg or DeepbetDemoConfig()
    head = load_subject(subject_dir)  # before any model work: a missing package is one line
    model = build_model(cfg)
    x = head.batch().to(cfg.device)
    y = head.mask[None].long().to(cfg.device)
    # the clean window (and box) is frozen: the attacks move voxels inside the preprocessing deepbet fixed from the
    # clean image, and a box that jumps between steps would make the loss discontinuous
    model.fit(x)  # type: ignore[operator]
    task = get_task("segmentation", num_classes=2, outputs="probabilities")
    attacks = demo_attacks(task, cfg, head.voxel_ml)
    echo(f"deepbet (Fisch et al. 2024, pretrained, weights from its wheel) on Colin27 {tuple(head.image.shape)} "
         f"at {head.spacing[0]:g} mm; attacking {cfg.model_name()} on {cfg.device}, {cfg.steps} steps")
    t0 = time.perf_counter()
    from .evaluation import evaluate

    results = evaluate(model, task, (x, y), attacks, spacing=head.spacing, progress=progress, seed=cfg.seed,
                       meta={"demo": "deepbet-colin27", "model": cfg.model_name()})
    seconds = time.perf_counter() - t0
    echo(format_deepbet_table(results))
    echo(f"{len(attacks)} attacks in {seconds:.0f} s")
    return {"results": results, "model": model, "task": task, "x": x, "y": y, "attacks": attacks, "head": head,
            "config": cfg, "seconds": seconds}


def table_rows(results: Results) -> list[dict[str, Any]]:
    """One row per (attack, ε): ``attack``, ``eps`` (grey levels; NaN for an attack without an ε-ball), ``dice_clean`` (attacked mask vs clean mask),
    ``dice_ref`` (attacked mask vs reference), ``tiv_ml`` (attacked brain volume), ``tiv_change_ml``,
    ``tiv_change_pct``; the first row is the clean prediction (``attack`` ``"clean"``)."""
    rows = results.summary()
    if not rows:
        return []
    first = rows[0]
    out: list[dict[str, Any]] = [{"attack": "clean", "eps": 0.0, "dice_clean": 1.0,
                                  "dice_ref": float(first["clean_mean_dice"]),
                                  "tiv_ml": float(first["clean_volume_ml"][1]), "tiv_change_ml": 0.0,
                                  "tiv_change_pct": 0.0}]
    for r in rows:
        out.append({"attack": str(r["attack"]).split("@")[0], "eps": float("nan") if r["budget"] is None else float(r["budget"]),
                    "dice_clean": float(r["dice_to_clean"]), "dice_ref": float(r["adv_mean_dice"]),
                    "tiv_ml": float(r["adv_volume_ml"][1]), "tiv_change_ml": float(r["volume_change_ml"][1]),
                    "tiv_change_pct": float(r["volume_change_pct"][1])})
    return out


def format_deepbet_table(results: Results) -> str:
    """The demo's table: per attack and ε (grey levels), Dice to the clean mask, Dice to the reference (ch2bet) mask,
    the brain volume (TIV, ml) and its change (ml, %)."""
    rows = table_rows(results)
    head = (f"{'attack':<8}{'eps':>5}{'Dice→clean':>12}{'Dice→ref':>10}{'TIV ml':>9}{'ΔTIV ml':>9}{'ΔTIV %':>8}")
    summary = results.summary()
    ref = f" (reference mask: {float(summary[0]['ref_volume_ml'][1]):.1f} ml)" if summary and \
        "ref_volume_ml" in summary[0] else ""
    lines = [f"Dice of the attacked brain mask to the clean mask and to the reference (ch2bet); TIV = brain volume{ref}",
             head, "-" * len(head)]
    for r in rows:
        eps = "-" if r["attack"] == "clean" else f"{r['eps']:g}"
        lines.append(f"{r['attack']:<8}{eps:>5}{r['dice_clean']:>12.4f}{r['dice_ref']:>10.4f}{r['tiv_ml']:>9.1f}"
                     f"{r['tiv_change_ml']:>+9.1f}{r['tiv_change_pct']:>+8.2f}")
    return "\n".join(lines)


def write_deepbet_outputs(out: dict[str, Any], folder: str | Path, *, cases: int = 1) -> list[Path]:
    """``medadv demo --output``: ``results.json``/``.csv``, ``table.md``, ``report.md`` and ``report.html`` of a
    :func:`run_deepbet_demo` result in ``folder``. The HTML report draws three planes (sagittal, coronal, axial) of
    the strongest attack's mask change (attacked again under the same seed: the example the table measured).
    Returns the paths written."""
    from .report import worst_cases, write_html_report, write_report
    from .report.cases import volume_axis_names
    from .safe_io import write_text

    res: Results = out["results"]
    cfg: DeepbetDemoConfig = out["config"]
    title = f"medadv demo: {cfg.model_name()} on Colin27 (ε in grey levels)"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    res.to_json(folder / "results.json")
    res.to_csv(folder / "results.csv")
    table = folder / "table.md"
    write_text(table, f"# {title}\n\n```\n{format_deepbet_table(res)}\n```\n")  # never through a link
    md = write_report(res, folder, title=title)
    axes = volume_axis_names(out["head"].affine) or ("sagittal", "coronal", "axial")
    drawn = worst_cases(out["model"], out["task"], (out["x"], out["y"]), out["attacks"], res, k=cases,
                        strongest_only=True, class_names=CLASS_NAMES, axis_names=axes, seed=cfg.seed,
                        spacing=tuple(out["head"].spacing))  # voxels drawn to scale
    html = write_html_report(res, folder, title=title, class_names=CLASS_NAMES, cases=drawn)
    return [folder / "results.json", folder / "results.csv", table, Path(md), html]
