"""The saliency study: model × explanation method under attack (Zhang et al. Tables 1–2)."""

from __future__ import annotations

import pytest
import torch

from medadv import FGSM, PGD, Linf
from medadv.attacks import SaliencyRelevance
from medadv.explain import Gradient
from medadv.studies import run_study, saliency


def _noise_attack_result_ssim(model, x, label, method, eps):
    from medadv.explain import get_explanation
    from medadv.metrics.saliency import map_ssim

    g = torch.Generator().manual_seed(0)
    xn = (x + eps * torch.sign(torch.randn(x.shape, generator=g))).clamp(0, 1)
    e = get_explanation(method)
    return float(map_ssim(e(model, x, label), e(model, xn, label)).mean())


def test_maps_move_more_under_an_attack_than_under_noise_and_rows_cover_every_pair(trained_multiclass):
    t = trained_multiclass
    task = t.task
    attacks = {"pgd": PGD(task, Linf(0.15, bounds=(0, 1)), steps=10, seed=0),
               "fgsm": FGSM(task, Linf(0.15, bounds=(0, 1)))}
    r = saliency({"a": t.model}, task, (t.x, t.y), attacks, explanations=["gradient", "integrated_gradients"])
    assert {(row["model"], row["explanation"], row["attack"]) for row in r.rows} == \
        {("a", e, a) for e in ("gradient", "integrated_gradients") for a in ("pgd", "fgsm")}
    for row in r.rows:
        assert 0.0 <= row["changed"] <= 1.0 and -1.0 <= row["ssim"] <= 1.0 and row["ssim_target"] is None
        assert r.meta["ssim"]["a"][row["attack"]][row["explanation"]] == row["ssim"]
    pgd = next(row for row in r.rows if row["attack"] == "pgd" and row["explanation"] == "gradient")
    assert pgd["changed"] > 0.3
    # control: random ±ε noise of the same L∞ norm moves the map less than the attack
    label = t.model(t.x).argmax(1)
    assert pgd["ssim"] < _noise_attack_result_ssim(t.model, t.x, label, "gradient", 0.15)


def test_a_targeted_explanation_attack_reports_ssim_to_its_target_and_the_config_entry(trained_multiclass):
    t = trained_multiclass
    model, x, y, task = t.model, t.x[:4], t.y[:4], t.task
    atk = SaliencyRelevance(task, Linf(0.1, bounds=(0.0, 1.0)), Gradient(), steps=3, goal="target")
    r = run_study("saliency", {"explanations": ["gradient"], "max_samples": 2, "title": "Table 2"},
                  {"net": model}, task, (x, y), {"relevance": atk})
    (row,) = r.rows
    assert row["ssim_target"] is not None and r.meta["title"] == "Table 2"
    with pytest.raises(Exception, match="did you mean 'gradient'"):
        run_study("saliency", {"explanations": ["gradiant"]}, {"net": model}, task, (x, y), {"relevance": atk})


def test_matched_compares_an_explanation_attack_on_its_own_method_and_attacks_selects(trained_multiclass):
    t = trained_multiclass
    model, x, y, task = t.model, t.x[:4], t.y[:4], t.task
    attacks = {"prediction": FGSM(task, Linf(0.1, bounds=(0.0, 1.0))),
               "relevance": SaliencyRelevance(task, Linf(0.1, bounds=(0.0, 1.0)), Gradient(), steps=2)}
    r = run_study("saliency", {"explanations": ["gradient", "gradient_x_input"], "matched": True}, {"net": model},
                  task, (x, y), attacks)
    assert sorted((row["attack"], row["explanation"]) for row in r.rows) == [
        ("prediction", "gradient"), ("prediction", "gradient_x_input"), ("relevance", "gradient")]
    # a study's `attacks:` runs only the attacks it names (an entry's name covers all its budgets)
    r = run_study("saliency", {"explanations": ["gradient"], "attacks": ["relevance"]}, {"net": model}, task, (x, y),
                  attacks)
    assert {row["attack"] for row in r.rows} == {"relevance"}
    with pytest.raises(ValueError, match="did you mean 'relevance'"):
        run_study("saliency", {"attacks": ["relevanse"]}, {"net": model}, task, (x, y), attacks)
