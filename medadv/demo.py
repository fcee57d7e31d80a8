"""``medadv demo --unet``: attack a 3-D brain-tissue segmenter trained here on the real MNI152 template.

(``medadv demo`` without ``--unet`` attacks a published, pretrained model instead: :mod:`medadv.demo_deepbet`.)

1. Crops of the MNI152 T1 template (2 mm) with grey/white-matter/other-brain labels: training crops
   from the left hemisphere, test crops from the right one.
2. A small MONAI UNet trained on CPU and cached in the user cache directory. It is trained here
   because no pretrained medical segmentation weights can be had offline.
3. FGSM, PGD, CosPGD and SegPGD at two L∞ budgets; Dice per tissue, clean vs attacked.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from .attacks import FGSM, PGD, Attack, CosPGD, SegPGD
from .data.mni152 import TISSUE_CLASSES, tissue_patches
from .evaluation import evaluate
from .models import cache_dir, fit_supervised, load_checkpoint, save_checkpoint, small_unet
from .results import Results
from .tasks import get_task
from .threats import Linf

__all__ = ["DemoConfig", "build_demo_model", "run_demo", "write_demo_outputs"]

T = TypeVar("T")

CHECKPOINT_VERSION = 1


class DemoConfig:
    """Settings of the demo (defaults run in a few minutes on 2 CPU cores)."""

    def __init__(self, *, patch: int = 32, spacing_mm: int = 2, n_train: int = 64, n_test: int = 8,
                 epochs: int = 25, batch_size: int = 4, lr: float = 5e-3, channels: tuple[int, ...] = (8, 16, 32),
                 budgets: tuple[float, ...] = (4 / 255, 16 / 255), steps: int = 10, seed: int = 0) -> None:
        self.patch, self.spacing_mm, self.n_train, self.n_test = patch, spacing_mm, n_train, n_test
        self.epochs, self.batch_size, self.lr, self.channels = epochs, batch_size, lr, tuple(channels)
        self.budgets, self.steps, self.seed = tuple(budgets), steps, seed

    def model_tag(self) -> str:
        ch = "-".join(map(str, self.channels))
        return (f"mni152_unet_v{CHECKPOINT_VERSION}_p{self.patch}_s{self.spacing_mm}_n{self.n_train}"
                f"_e{self.epochs}_c{ch}_seed{self.seed}.pt")


def _own_rng(fn: Callable[..., T]) -> Callable[..., T]:
    """Run ``fn`` on a private copy of torch's global RNG: the demo seeds it for reproducible weights,
    and medadv never leaves the caller's global RNG state changed."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with torch.random.fork_rng(devices=[]):
            return fn(*args, **kwargs)

    return wrapper


@_own_rng
def build_demo_model(cfg: DemoConfig, *, cache: Path | None = None, retrain: bool = False,
                     progress: bool = True, echo=print) -> torch.nn.Module:
    """The demo UNet: loaded from the cache, or trained on MNI152 crops and cached."""
    torch.manual_seed(cfg.seed)
    model = small_unet(1, len(TISSUE_CLASSES), ndim=3, channels=cfg.channels)
    path = (cache or cache_dir("demo")) / cfg.model_tag()
    if path.is_file() and not retrain:
        load_checkpoint(path, model)
        echo(f"loaded cached model {path}")
        return model.eval()
    echo("training a small MONAI UNet on MNI152 crops (left hemisphere) on the CPU;\n"
         "  it is trained here because no pretrained medical segmentation weights can be had offline.")
    x, y = tissue_patches(cfg.n_train, cfg.patch, cfg.spacing_mm, split="train", seed=cfg.seed)
    t0 = time.perf_counter()
    train_task = get_task("segmentation", num_classes=len(TISSUE_CLASSES))
    history = fit_supervised(model, train_task, x, y, epochs=cfg.epochs,
                             batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed, progress=progress,
                             desc="train UNet")
    save_checkpoint(path, model, final_loss=float(history[-1]))
    echo(f"trained in {time.perf_counter() - t0:.0f} s (final loss {history[-1]:.3f}); cached at {path}")
    return model.eval()


@_own_rng
def run_demo(cfg: DemoConfig | None = None, *, cache: Path | None = None, retrain: bool = False,
             progress: bool = True, echo=print) -> dict[str, Any]:
    """Train (or load) the demo model, attack it, print Dice per tissue; returns the results."""
    cfg = cfg or DemoConfig()
    torch.manual_seed(cfg.seed)
    model = build_demo_model(cfg, cache=cache, retrain=retrain, progress=progress, echo=echo)
    task = get_task("segmentation", num_classes=len(TISSUE_CLASSES), include_background=False)
    x, y = tissue_patches(cfg.n_test, cfg.patch, cfg.spacing_mm, split="test", seed=cfg.seed + 1)
    attacks: dict[str, Attack] = {}
    for name, cls in (("fgsm", FGSM), ("pgd", PGD), ("cospgd", CosPGD), ("segpgd", SegPGD)):
        for eps in cfg.budgets:
            threat = Linf(eps, bounds=(0.0, 1.0))  # the template is scaled to [0, 1]
            kw = {} if cls is FGSM else {"steps": cfg.steps, "seed": cfg.seed}
            attacks[f"{name}@{eps * 255:g}/255"] = cls(task, threat, **kw)  # type: ignore[arg-type]
    echo(f"attacking {cfg.n_test} held-out crops (right hemisphere, {cfg.patch}^3 voxels at {cfg.spacing_mm} mm)")
    results = evaluate(model, task, (x, y), attacks, progress=progress, meta={"demo": "mni152-tissue"})
    echo(format_dice_table(results))
    # the data, task and attacks come back too, so `medadv demo --output` can draw cases in report.html
    return {"results": results, "model": model, "task": task, "x": x, "y": y, "attacks": attacks}


def write_demo_outputs(out: dict[str, Any], folder: str | Path, *, cases: int = 2) -> list[Path]:
    """``medadv demo --output``: ``results.json``/``.csv``, ``report.md`` and ``report.html`` of a
    :func:`run_demo` result in ``folder``; the HTML report draws the ``cases`` crops the strongest attack
    damaged most (attacked again: the demo's attacks are seeded, so they are the crops the table measured).
    Returns the paths written."""
    from .report import worst_cases, write_html_report, write_report

    res: Results = out["results"]
    title = "medadv demo: MNI152 tissue segmentation"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    res.to_json(folder / "results.json")
    res.to_csv(folder / "results.csv")
    md = write_report(res, folder, title=title)
    drawn = worst_cases(out["model"], out["task"], (out["x"], out["y"]), out["attacks"], res, k=cases,
                        strongest_only=True, class_names=TISSUE_CLASSES, axis_names=("sagittal", "coronal", "axial"))
    html = write_html_report(res, folder, title=title, class_names=TISSUE_CLASSES, cases=drawn)
    return [folder / "results.json", folder / "results.csv", Path(md), html]


def format_dice_table(results: Results) -> str:
    """Dice per tissue, clean and attacked, one line per attack."""
    rows = results.summary()
    names = TISSUE_CLASSES[1:]
    head = f"{'attack':<16}" + "".join(f"{n:>14}" for n in names) + f"{'mean':>10}"
    lines = ["Dice per tissue (test crops, right hemisphere)", head, "-" * len(head)]
    clean = rows[0]["clean_dice"][1:]
    lines.append(f"{'clean':<16}" + "".join(f"{v:>14.3f}" for v in clean) + f"{rows[0]['clean_mean_dice']:>10.3f}")
    for r in rows:
        lines.append(f"{r['attack']:<16}" + "".join(f"{v:>14.3f}" for v in r["adv_dice"][1:])
                     + f"{r['adv_mean_dice']:>10.3f}")
    return "\n".join(lines)
