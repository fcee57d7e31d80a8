"""Zhang et al.'s two saliency effects on the zhang2024 recipe's own DenseNet: what limits them (issue 32, item 2).

The recipe (``examples/papers/zhang2024.yaml``) trains a small MONAI DenseNet on 32² MNI152 patches. The
measurements behind these tests are in ``benchmarks/zhang_ablation.md``; the tests pin what holds on any machine,
as margins over controls and over the paper's setting, never absolute map similarities.

* Prediction attack x^p: Zhang et al.'s setting (Adam lr 2e-4, 8 steps for the gradient map) moves no pixel by
  more than about T·lr = 0.0016, an order of magnitude below the model's distance to its decision boundaries, so
  hardly anything flips. The same attack given steps that can reach ε = 0.03 collapses the AUC.
* Saliency attack x^s: on a ReLU network the map has no input gradient (the attack does not move at all); with
  the softplus surrogate the map moves into the target square, but the probability bound the recipe had
  (|Δp| ≤ 0.02) is what held it back: keeping only the labels (the paper's criterion) moves about three times
  more mass into the square, and dropping the prediction term and check altogether more still.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from medadv.attacks.relevance import SaliencyRelevance
from medadv.attacks.resistance import SaliencyResistance
from medadv.attacks.saliency import square_target
from medadv.config import build_data, build_model, build_task, load_config
from medadv.explain import Gradient
from medadv.metrics.classification import roc_auc
from medadv.metrics.saliency import mass_in_region
from medadv.tasks import Task
from medadv.threats import Linf

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "papers" / "zhang2024.yaml"
LR, T = 2e-4, 8  # Zhang et al.'s x^p for the gradient map (spec 002 §1.3)


@pytest.fixture(scope="module")
def recipe():
    """The recipe's trained DenseNet (trained here, into a private cache) and its 12 test patches.

    Trained with one thread: the weights, and with them every margin below, shift with the thread count (with two
    threads the flip distance measured 0.0075 instead of 0.0149), so the test pins the one-thread model.
    """
    pytest.importorskip("nilearn")  # the MNI152 template ships inside the nilearn wheel
    threads = torch.get_num_threads()
    try:
        with pytest.MonkeyPatch.context() as mp, torch.random.fork_rng():
            mp.setenv("MEDADV_CACHE", tempfile.mkdtemp(prefix="medadv-zhang-"))
            torch.set_num_threads(1)
            cfg = load_config(RECIPE)
            task = build_task(cfg["task"])
            model = build_model(cfg["model"], task=task)
            x, y = build_data(cfg["data"])
    finally:
        torch.set_num_threads(threads)
    return task, model, x, y


def _probs(model: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        return model(x).sigmoid()


def _xp(task: Task, model: nn.Module, x: Tensor, y: Tensor, **kw) -> tuple[float, float, float]:
    """x^p on every class separately (the class-c AUC on the images attacked for c, as Zhang et al.'s Table 1):
    macro AUC, fraction of (image, class) predictions flipped, max L∞."""
    p0 = _probs(model, x)
    scores, flipped, linf = torch.empty_like(p0), [], []
    for c in range(y.shape[1]):
        res = SaliencyResistance(task, Linf(0.03, bounds=(0.0, 1.0)), Gradient(), label=c, **kw)(model, x, y)
        pa = _probs(model, res.x_adv)
        scores[:, c] = pa[:, c]
        flipped.append(((pa[:, c] > 0.5) != (p0[:, c] > 0.5)).float())
        linf.append(res.linf)
    auc = float(roc_auc(scores.double(), y.double()).nanmean())
    return auc, float(torch.cat(flipped).mean()), float(torch.cat(linf).max())


def test_zhang_prediction_attack_steps_do_not_reach_the_models_flip_distance(recipe):
    task, model, x, y = recipe
    auc0 = float(roc_auc(_probs(model, x).double(), y.double()).nanmean())
    # first-order L∞ distance of each label to its boundary: |z_c| / ‖∇ₓ z_c‖₁ (measured median 0.015)
    v = x.clone().requires_grad_(True)
    z = model(v)
    dist = []
    for c in range(z.shape[1]):
        (g,) = torch.autograd.grad(z[:, c].sum(), v, retain_graph=True)
        dist.append(z[:, c].detach().abs() / g.flatten(1).abs().sum(1))
    median = float(torch.stack(dist).median())

    auc_paper, flipped_paper, linf_paper = _xp(task, model, x, y)  # defaults: Zhang's lr 2e-4 × 8 steps
    auc_full, flipped_full, linf_full = _xp(task, model, x, y, steps=20, step_size=0.03 / 20)
    print(f"AUC {auc0:.3f}: paper {auc_paper:.3f} (flipped {flipped_paper:.2f}, Linf {linf_paper:.4f}); "
          f"reaching eps {auc_full:.3f} (flipped {flipped_full:.2f}, Linf {linf_full:.4f}); flip distance {median:.4f}")

    # Adam moves a pixel by about lr per step: the paper's setting travels ~T·lr, far inside ε = 0.03 ...
    assert linf_paper <= 2 * T * LR
    # ... and the model's boundaries are several times further away (measured ×9; ×4.7 for a model trained with
    # two threads)
    assert median > 2 * T * LR
    # so the paper's setting flips little and keeps the AUC (measured 0.991 → 0.972, 3 % flipped) ...
    assert auc_paper > auc0 - 0.1
    # ... while the same attack whose steps can reach ε collapses it (measured 0.521, 19 % flipped)
    assert linf_full > 0.9 * 0.03
    assert auc_full < auc_paper - 0.25
    assert flipped_full > flipped_paper + 0.08


def test_zhang_saliency_attack_is_held_back_by_the_prediction_bound(recipe):
    task, model, x, _ = recipe
    label = _probs(model, x).argmax(1)
    expl = Gradient()
    target = square_target((x.shape[-2], x.shape[-1]))[None].expand(len(x), -1, -1)

    def mass(v: Tensor) -> float:
        return float(mass_in_region(expl(model, v, label), target).mean())

    def attack(**kw) -> Tensor:
        args = {"steps": 200, "prefactors": (1.0, 10.0), "max_prob_change": 0.02, **kw}
        return SaliencyRelevance(task, Linf(0.06, bounds=(0.0, 1.0)), expl, label=label, **args)(model, x).x_adv

    g = torch.Generator().manual_seed(1)
    noise = (x + 0.06 * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1)).clamp(0, 1)
    m_clean, m_noise = mass(x), mass(noise)
    relu = attack(softplus_beta=None)  # the ReLU network's map has no input gradient
    m_recipe = mass(attack())
    kept = attack(max_prob_change=None)  # the recipe now: every label kept, probabilities free
    m_kept = mass(kept)
    free = attack(prefactors=(1.0, 0.0), max_prob_change=None, keep_fraction=1e-6)
    m_free = mass(free)
    print(f"mass in target: clean {m_clean:.4f} noise {m_noise:.4f} |dp|<=0.02 {m_recipe:.4f} labels kept "
          f"{m_kept:.4f} no prediction term {m_free:.4f}")

    # ReLU network, no surrogate: nothing to follow, the attack returns the clean input
    assert torch.equal(relu, x)
    # with the surrogate the recipe's attack does move mass into the square (measured 0.027 vs 0.016 clean/noise)
    assert m_recipe > 1.2 * max(m_clean, m_noise)
    # but the probability bound is what holds it back: keeping only the labels (Zhang et al.'s criterion, the
    # recipe's setting now) moves about three times more (measured 0.092, ×3.4) with every label kept ...
    assert m_kept > 2.0 * m_recipe
    with torch.no_grad():
        assert torch.equal(model(kept) > 0, model(x) > 0)
    # ... and with no prediction term at all the same budget moves more still (measured 0.131, ×4.9)
    assert m_free > 2.5 * m_recipe
    with torch.no_grad():
        dp = float((model(free).sigmoid() - model(x).sigmoid()).abs().max())
    assert dp > 0.1  # ... by changing the prediction, which the paper's "AUC kept" allows (measured 0.55)
