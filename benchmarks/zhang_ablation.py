"""Why Zhang et al.'s two saliency effects do (not) reproduce on the recipe's models (issue 32, item 2).

The recipe ``examples/papers/zhang2024.yaml`` trains a small MONAI DenseNet and ResNet on 32² axial patches of
the real MNI152 template (multi-label: background / grey matter / white matter cover >= 30 % of the patch) and
runs Zhang et al.'s prediction attack x^p (Table 1: the AUC collapses, the maps stay) and saliency attack x^s
(Table 2: the map moves onto an upper-right square, the AUC stays). This script measures both effects on the
recipe's own models and test patches, then changes one property at a time (the attack's settings, the surrogate,
the pooling, the training, the input size) with the recipe's setting as the reference row and random ±ε noise of
the same L∞ norm as the control. Results: ``benchmarks/zhang_ablation.md``.

Run (2 CPU cores, about 5-10 min; models are trained once and cached by ``medadv.config.build_model``, the
variants are retrained every run)::

    OMP_NUM_THREADS=2 python benchmarks/zhang_ablation.py [--part prediction|relevance|all] [--n 12]

Writes ``benchmarks/zhang_ablation.json`` and prints the two Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadv.attacks.pgd import PGD
from medadv.attacks.relevance import SaliencyRelevance
from medadv.attacks.resistance import SaliencyResistance
from medadv.attacks.saliency import REFERENCE_PIXELS, square_target
from medadv.config import build_data, build_model, build_task, load_config
from medadv.explain import Explanation, Gradient, get_explanation
from medadv.metrics.classification import roc_auc
from medadv.metrics.saliency import map_ssim, mass_in_region
from medadv.models import fit_supervised
from medadv.tasks import Task
from medadv.threats import Linf

HERE = Path(__file__).parent
RECIPE = HERE.parent / "examples" / "papers" / "zhang2024.yaml"
EPS_P, EPS_S = 0.03, 0.06  # Zhang et al.'s L∞ budgets on [0, 1] images (no mean/std normalisation, spec 002 §6.2)


# --- the recipe's models and data, and their variants ---------------------------------------------------------------
class Recipe:
    """The recipe's task, model sections, training section and test-data section, read from the YAML file."""

    def __init__(self, path: Path = RECIPE) -> None:
        cfg = load_config(path)
        self.task: Task = build_task(cfg["task"])
        self.specs = {"densenet": dict(cfg["model"]), "resnet": dict(cfg["models"]["resnet"])}
        self.train = dict(cfg["model"]["train"])
        self.data = dict(cfg["data"])

    def model(self, arch: str) -> nn.Module:
        """The recipe's trained network exactly as ``medadv evaluate`` builds it (cached weights)."""
        return build_model(self.specs[arch], task=self.task)

    def test_data(self, n: int, size: int = 32, spacing_mm: int = 2) -> tuple[Tensor, Tensor]:
        """The recipe's test patches (the first ``n`` of its seeded crops; its own ``n`` is 12)."""
        kw = {**self.data["kwargs"], "size": size, "spacing_mm": spacing_mm}
        return build_data({**self.data, "n": n, "kwargs": kw})

    def variant(self, arch: str, *, pool: str = "max", size: int = 32, spacing_mm: int = 2,
                trained: bool = True) -> nn.Module:
        """The recipe's network with one property changed, trained exactly as the recipe trains it.

        pool: ``"avg"`` replaces every max pool by an average pool of the same window (same resolution);
        size/spacing_mm: patch side and voxel size of the training (and test) patches, 64 px at 1 mm covers the
        recipe's 32 px at 2 mm field of view with 4× the pixels; trained: ``False`` keeps the random init.
        """
        spec = {k: v for k, v in self.specs[arch].items() if k != "train"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "random weights" warning: this function trains them
            model = build_model(spec)
        if pool == "avg":
            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if isinstance(child, nn.MaxPool2d):
                        setattr(parent, name, nn.AvgPool2d(child.kernel_size, child.stride,  # type: ignore[arg-type]
                                                           child.padding, count_include_pad=False))  # type: ignore[arg-type]
        if trained:
            kw = {**self.train["data"]["kwargs"], "size": size, "spacing_mm": spacing_mm}
            x, y = build_data({**self.train["data"], "kwargs": kw})
            fit_supervised(model, self.task, x, y, epochs=int(self.train["epochs"]), lr=float(self.train["lr"]),
                           batch_size=int(self.train.get("batch_size", 16)), seed=int(self.train.get("seed", 0)))
        return model.eval()


# --- measurements -----------------------------------------------------------------------------------------------------
def _probs(model: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        return model(x).sigmoid()


def macro_auc_of(scores: Tensor, y: Tensor) -> float:
    """Mean of the per-label AUCs that are defined (a label present in all or no test patches is skipped)."""
    return float(roc_auc(scores.double(), y.double()).nanmean())


def noise_like(x: Tensor, eps: float, seed: int = 1) -> Tensor:
    """Random ±ε signs (the L∞ control of the same norm as the attack), clipped to [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    return (x + eps * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1).to(x.dtype)).clamp(0, 1)


def flip_distance(model: nn.Module, x: Tensor) -> Tensor:
    """First-order L∞ distance to each label's decision boundary, |z_c| / ‖∇ₓ z_c‖₁, ``(N, L)``.

    An L∞ step of ε changes z_c by at most ε·‖∇ₓ z_c‖₁ to first order, so a label flips at about this ε. It is
    the quantity that ties the attack budget to the model and the input size: ‖∇ₓ z‖₁ sums over pixels.
    """
    v = x.clone().requires_grad_(True)
    z = model(v)
    out = []
    for c in range(z.shape[1]):
        (g,) = torch.autograd.grad(z[:, c].sum(), v, retain_graph=True)
        out.append(z[:, c].detach().abs() / g.flatten(1).abs().sum(1).clamp_min(1e-12))
    return torch.stack(out, 1)


def flip_pgd(model: nn.Module, x: Tensor, y: Tensor, c: int, eps: float, steps: int = 20) -> Tensor:
    """Per-class flip (Zhang et al.'s x^p protocol without the map term): signed steps on BCE(z_c, 1 − y_c)."""
    delta = torch.zeros_like(x)
    alpha = 2.5 * eps / steps
    for _ in range(steps):
        d = delta.clone().requires_grad_(True)
        z = model((x + d).clamp(0, 1))[:, c]
        loss = F.binary_cross_entropy_with_logits(z, 1 - y[:, c], reduction="sum")
        (g,) = torch.autograd.grad(loss, d)
        delta = (delta - alpha * g.sign()).clamp(-eps, eps)
    return (x + delta).clamp(0, 1)


def per_class(model: nn.Module, x: Tensor, y: Tensor, attack: Callable[[int], Tensor], expl: Explanation
              ) -> dict[str, float]:
    """Attack every class c separately (the class-c AUC uses the images attacked for c, as Zhang et al.'s Table 1):
    macro AUC, fraction of (image, class) predictions flipped, map SSIM of class c (clean vs attacked), L∞."""
    p0 = _probs(model, x)
    scores, flipped, ssim, linf = torch.empty_like(p0), [], [], []
    for c in range(y.shape[1]):
        xa = attack(c)
        pa = _probs(model, xa)
        scores[:, c] = pa[:, c]
        flipped.append(((pa[:, c] > 0.5) != (p0[:, c] > 0.5)).float())
        lab = torch.full((len(x),), c, dtype=torch.long)
        ssim.append(map_ssim(expl(model, x, lab), expl(model, xa, lab)))
        linf.append((xa - x).flatten(1).abs().amax(1))
    return {"auc": macro_auc_of(scores, y), "flipped": float(torch.cat(flipped).mean()),
            "map_ssim": float(torch.cat(ssim).mean()), "linf_255": float(torch.cat(linf).max() * 255)}


def prediction_rows(rec: Recipe, n: int) -> list[dict[str, Any]]:
    """Effect 1 (Table 1): AUC collapse under the prediction attack, and how much the map moves."""
    rows: list[dict[str, Any]] = []
    expl = Gradient()

    def add(model_name: str, model: nn.Module, x: Tensor, y: Tensor, setting: str, fn: Callable[[int], Tensor],
            *, all_labels: bool = False) -> None:
        t0 = time.time()
        r: dict[str, Any]
        if all_labels:  # one attack on every label at once (the recipe's PGD row); maps of the explained class
            xa = fn(-1)
            p0, pa = _probs(model, x), _probs(model, xa)
            lab = p0.argmax(1)
            r = {"auc": macro_auc_of(pa, y), "flipped": float(((pa > 0.5) != (p0 > 0.5)).float().mean()),
                 "map_ssim": float(map_ssim(expl(model, x, lab), expl(model, xa, lab)).mean()),
                 "linf_255": float((xa - x).abs().max() * 255)}
        else:
            r = dict(per_class(model, x, y, fn, expl))
        r.update(model=model_name, setting=setting, auc_clean=macro_auc_of(_probs(model, x), y),
                 eps_flip_median=float(flip_distance(model, x).median()), seconds=round(time.time() - t0, 1))
        rows.append(r)
        print(f"  {model_name:>16} | {setting:<58} | AUC {r['auc_clean']:.3f} -> {r['auc']:.3f} | flipped "
              f"{r['flipped']:.2f} | map SSIM {r['map_ssim']:.2f} | Linf*255 {r['linf_255']:.1f}", flush=True)

    task = rec.task
    threat = Linf(EPS_P, bounds=(0.0, 1.0))

    def block(name: str, model: nn.Module, x: Tensor, y: Tensor, full: bool) -> None:
        add(name, model, x, y, "control: random ±0.03 noise", lambda c: noise_like(x, EPS_P))
        add(name, model, x, y, "recipe: PGD ε 0.03, 20 steps, BCE over all labels",
            lambda c: PGD(task, threat, steps=20)(model, x, y).x_adv, all_labels=True)
        if full:
            add(name, model, x, y, "per-class flip (BCE to 1−y_c), ε 0.03, 20 signed steps",
                lambda c: flip_pgd(model, x, y, c, EPS_P))
        add(name, model, x, y, "x^p paper: Adam lr 2e-4 × 8 steps, ReLU (no surrogate)",
            lambda c: SaliencyResistance(task, threat, expl, label=c)(model, x, y).x_adv)
        if not full:
            return
        add(name, model, x, y, "x^p, lr ε/20 × 20 steps (reaches ε), ReLU",
            lambda c: SaliencyResistance(task, threat, expl, label=c, steps=20, step_size=EPS_P / 20)(
                model, x, y).x_adv)
        add(name, model, x, y, "x^p, lr ε/20 × 20 steps, softplus β 10→100 (map term on)",
            lambda c: SaliencyResistance(task, threat, expl, label=c, steps=20, step_size=EPS_P / 20,
                                         softplus_beta=(10.0, 100.0))(model, x, y).x_adv)
        # Zhang's γ_s = 8e4 is for 512² maps; rescaled by (P/512²)² it is ≈ 1 at 32², so the map term (MSE of
        # sum-1 maps, ~1e-6) weighs nothing against the flip term: give it a weight that makes it count
        add(name, model, x, y, "x^p, as above, map weight γ_s = 1e6 (map term counts)",
            lambda c: SaliencyResistance(task, threat, expl, label=c, steps=20, step_size=EPS_P / 20,
                                         softplus_beta=(10.0, 100.0), prefactors=(1e6, 10.0))(model, x, y).x_adv)

    x, y = rec.test_data(n)
    block("densenet (recipe)", rec.model("densenet"), x, y, full=True)
    block("resnet (recipe)", rec.model("resnet"), x, y, full=True)
    # input size: the same field of view at 4× the pixels (64 px at 1 mm), retrained as the recipe trains
    x64, y64 = rec.test_data(n, size=64, spacing_mm=1)
    block("densenet 64² (1 mm)", rec.variant("densenet", size=64, spacing_mm=1), x64, y64, full=False)
    return rows


def relevance_rows(rec: Recipe, n: int) -> list[dict[str, Any]]:
    """Effect 2 (Table 2): the map pulled onto the target square while the prediction is kept."""
    rows: list[dict[str, Any]] = []
    recipe_kw: dict[str, Any] = {"steps": 200, "prefactors": (1.0, 10.0), "max_prob_change": 0.02}

    def add(model_name: str, model: nn.Module, x: Tensor, y: Tensor, setting: str, *, eps: float = EPS_S,
            expl: Explanation | None = None, **kw: Any) -> None:
        expl = expl or Gradient()
        t0 = time.time()
        p0 = _probs(model, x)
        label = p0.argmax(1)  # a present finding: the most confident label (Zhang et al. attack positives)
        side = x.shape[-1]
        target = square_target((side, side))[None].expand(len(x), -1, -1)

        def scores(v: Tensor) -> tuple[float, float]:
            m = expl(model, v, label)
            return float(map_ssim(m, target).mean()), float(mass_in_region(m, target).mean())

        args = {**recipe_kw, **kw}
        res = SaliencyRelevance(rec.task, Linf(eps, bounds=(0.0, 1.0)), expl, label=label, **args)(model, x)
        pa = _probs(model, res.x_adv)
        s_c, m_c = scores(x)
        s_n, m_n = scores(noise_like(x, eps))
        s_a, m_a = scores(res.x_adv)
        r = {"model": model_name, "setting": setting, "ssim_tgt_clean": s_c, "ssim_tgt_noise": s_n,
             "ssim_tgt_adv": s_a, "mass_clean": m_c, "mass_noise": m_n, "mass_adv": m_a,
             "ssim_org": float(map_ssim(expl(model, x, label), expl(model, res.x_adv, label)).mean()),
             "dp_max": float((pa - p0).abs().max()), "labels_kept": float(((pa > 0.5) == (p0 > 0.5)).all(1).float().mean()),
             "auc_clean": macro_auc_of(p0, y), "auc_adv": macro_auc_of(pa, y),
             "linf_255": float(res.linf.max() * 255), "seconds": round(time.time() - t0, 1)}
        rows.append(r)
        print(f"  {model_name:>16} | {setting:<52} | SSIM_tgt {s_c:.3f}/{s_n:.3f} -> {s_a:.3f} | mass {m_c:.3f}/"
              f"{m_n:.3f} -> {m_a:.3f} | SSIM_org {r['ssim_org']:.2f} | dp {r['dp_max']:.3f} | AUC {r['auc_clean']:.3f}"
              f" -> {r['auc_adv']:.3f} | Linf*255 {r['linf_255']:.1f}", flush=True)

    x, y = rec.test_data(n)
    dn = rec.model("densenet")
    name = "densenet (recipe)"
    add(name, dn, x, y, "recipe as audited: ε .06, 200 Adam steps ε/20, γ=(1,10), |Δp|≤.02")
    add("resnet (recipe)", rec.model("resnet"), x, y, "recipe as audited: ε .06, 200 Adam steps ε/20, γ=(1,10), |Δp|≤.02")
    add(name, dn, x, y, "recipe, Grad-CAM (layer auto: 4×4)", expl=get_explanation({"name": "gradcam", "layer": "auto"}))
    # the attack's settings
    add(name, dn, x, y, "no softplus surrogate (ReLU: 2nd derivative 0)", softplus_beta=None)
    add(name, dn, x, y, "surrogate with hard max pools", smooth_pools=False)
    add(name, dn, x, y, "Zhang's MSE loss and prefactors (1e14·(P/512²)², 1e4)", goal="target_mse",
        prefactors=(1e14 * (x.shape[-1] ** 2 / REFERENCE_PIXELS) ** 2, 1e4))
    add(name, dn, x, y, "Zhang's Adam lr 2e-4 (travels ≤ 0.04)", step_size=2e-4)
    add(name, dn, x, y, "600 steps", steps=600)
    add(name, dn, x, y, "ε 0.3 (5×)", eps=0.3)
    # the prediction constraint
    add(name, dn, x, y, "labels kept only (no |Δp| bound; Zhang: AUC kept)", max_prob_change=None)
    add(name, dn, x, y, "labels kept only, surrogate with hard max pools", max_prob_change=None, smooth_pools=False)
    add("resnet (recipe)", rec.model("resnet"), x, y, "labels kept only", max_prob_change=None)
    add(name, dn, x, y, "no prediction term or check (upper bound at ε)", prefactors=(1.0, 0.0),
        max_prob_change=None, keep_fraction=1e-6)
    add(name, dn, x, y, "no prediction term or check, ε 0.3", eps=0.3, prefactors=(1.0, 0.0),
        max_prob_change=None, keep_fraction=1e-6)
    # the model
    add("densenet avg-pool", rec.variant("densenet", pool="avg"), x, y, "recipe settings (retrained, max→avg pool)")
    add("densenet untrained", rec.variant("densenet", trained=False), x, y, "recipe settings (random init)")
    x64, y64 = rec.test_data(n, size=64, spacing_mm=1)
    dn64 = rec.variant("densenet", size=64, spacing_mm=1)
    add("densenet 64² (1 mm)", dn64, x64, y64, "recipe settings (retrained at 4× pixels)")
    add("densenet 64² (1 mm)", dn64, x64, y64, "labels kept only", max_prob_change=None)
    add("densenet 64² (1 mm)", dn64, x64, y64, "no prediction term or check", prefactors=(1.0, 0.0),
        max_prob_change=None, keep_fraction=1e-6)
    return rows


# --- tables -------------------------------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    """A Markdown table cell: a literal ``|`` (as in ``|Δp|``) would end the cell."""
    return text.replace("|", "\\|")


def table_prediction(rows: list[dict[str, Any]]) -> str:
    """Markdown table of effect 1."""
    out = ["| model | setting | AUC clean → attacked | flipped (image, class) | map SSIM clean vs attacked | "
           "L∞·255 | median first-order flip ε |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {_cell(r['setting'])} | {r['auc_clean']:.3f} → {r['auc']:.3f} | {r['flipped']:.2f} | "
                   f"{r['map_ssim']:.2f} | {r['linf_255']:.1f} | {r['eps_flip_median']:.4f} |")
    return "\n".join(out)


def table_relevance(rows: list[dict[str, Any]]) -> str:
    """Markdown table of effect 2."""
    out = ["| model | setting | SSIM to target: clean / noise → attack | mass in target: clean / noise → attack | "
           "SSIM to original | max \\|Δp\\| | labels kept | AUC clean → attacked | L∞·255 |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {_cell(r['setting'])} | {r['ssim_tgt_clean']:.3f} / {r['ssim_tgt_noise']:.3f} → "
                   f"**{r['ssim_tgt_adv']:.3f}** | {r['mass_clean']:.3f} / {r['mass_noise']:.3f} → **{r['mass_adv']:.3f}** | "
                   f"{r['ssim_org']:.2f} | {r['dp_max']:.3f} | {r['labels_kept']:.2f} | {r['auc_clean']:.3f} → "
                   f"{r['auc_adv']:.3f} | {r['linf_255']:.1f} |")
    return "\n".join(out)


def main() -> None:
    """Command line: run the parts, write the JSON, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("prediction", "relevance", "all"), default="all")
    ap.add_argument("--n", type=int, default=12, help="test patches (the recipe uses 12)")
    ap.add_argument("--out", type=Path, default=HERE / "zhang_ablation.json")
    args = ap.parse_args()
    if args.n < 4:
        raise SystemExit(f"--n must be >= 4 (AUCs need both classes), got {args.n}")
    torch.manual_seed(0)
    rec = Recipe()
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    t0 = time.time()
    if args.part in ("prediction", "all"):
        print("Effect 1: prediction attack x^p")
        results["prediction"] = prediction_rows(rec, args.n)
    if args.part in ("relevance", "all"):
        print("Effect 2: saliency attack x^s (gradient map unless stated)")
        results["relevance"] = relevance_rows(rec, args.n)
    meta = results.get("meta", {})
    meta.update({"n": args.n, "torch": torch.__version__, "threads": torch.get_num_threads(),
                 f"seconds_{args.part}": round(time.time() - t0, 1)})
    results["meta"] = meta
    args.out.write_text(json.dumps(results, indent=1, default=lambda v: None if isinstance(v, float)
                                   and math.isnan(v) else v))
    if "prediction" in results:
        print("\n" + table_prediction(results["prediction"]))
    if "relevance" in results:
        print("\n" + table_relevance(results["relevance"]))


if __name__ == "__main__":
    main()
