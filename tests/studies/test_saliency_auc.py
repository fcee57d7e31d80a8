"""The saliency study's AUC columns and its surrogate mode (Zhang et al. 2024: Tables 1–2 AUC, Fig. 3 proxy model)."""

from __future__ import annotations

import pytest
import torch

import medadv.studies._common as common
from medadv import FGSM, Linf
from medadv.metrics.classification import macro_auc, multiclass_auc
from medadv.models import small_cnn
from medadv.studies import run_study, saliency
from medadv.studies.registry import study_drawer


def _other_model() -> torch.nn.Module:
    torch.manual_seed(3)  # an untrained second architecture: its AUC differs from the trained model's
    return small_cnn(1, 4, width=4).eval()


def test_every_row_has_the_dataset_auc_of_its_model_clean_and_attacked(trained_multilabel):
    t = trained_multilabel
    x, y = t.x[:16], t.y[:16]
    nets = {"a": t.model, "b": _other_model()}
    atk = FGSM(t.task, Linf(0.15, bounds=(0.0, 1.0)))
    r = saliency(nets, t.task, (x, y), {"fgsm": atk}, explanations=["gradient", "gradient_x_input"])
    assert len(r.rows) == 4
    for name, net in nets.items():
        with torch.no_grad():
            clean = float(macro_auc(net(x).sigmoid().double(), y.double()))
        adv = float(macro_auc(atk(net, x, y).logits.sigmoid().double(), y.double()))
        rows = [row for row in r.rows if row["model"] == name]
        assert len(rows) == 2
        for row in rows:
            assert row["auc_clean"] == pytest.approx(clean, abs=1e-9)
            assert row["auc_adv"] == pytest.approx(adv, abs=1e-9)
        assert r.meta["auc"][name]["fgsm"] == {"clean": rows[0]["auc_clean"], "adv": rows[0]["auc_adv"]}
    a = next(row for row in r.rows if row["model"] == "a")
    assert a["auc_clean"] > 0.9 and a["auc_adv"] < a["auc_clean"] - 0.2  # the prediction attack lowers the AUC
    assert r.rows[0]["auc_clean"] != pytest.approx(r.rows[-1]["auc_clean"])  # per model, not one number


def test_multiclass_auc_per_budget_and_max_samples(trained_multiclass):
    t = trained_multiclass
    x, y = t.x[:20], t.y[:20]
    small, large = FGSM(t.task, Linf(0.02, bounds=(0.0, 1.0))), FGSM(t.task, Linf(0.3, bounds=(0.0, 1.0)))
    # two budgets of one attack (the same name): each row has its own budget's AUC
    r = saliency({"m": t.model}, t.task, (t.x, t.y), [small, large], explanations=["gradient"], max_samples=20)
    with torch.no_grad():
        expected = float(multiclass_auc(t.model(x).softmax(1).double(), y))
    by_budget = {row["budget"]: row for row in r.rows}
    assert set(by_budget) == {0.02, 0.3}
    for budget, atk in ((0.02, small), (0.3, large)):
        row = by_budget[budget]
        assert row["auc_clean"] == pytest.approx(expected, abs=1e-9)
        adv = float(multiclass_auc(atk(t.model, x, y).logits.softmax(1).double(), y))
        assert row["auc_adv"] == pytest.approx(adv, abs=1e-9)
    assert by_budget[0.3]["auc_adv"] < by_budget[0.02]["auc_adv"]


def test_a_surrogate_crafts_once_and_the_targets_are_evaluated_on_its_examples(trained_multilabel, monkeypatch):
    t = trained_multilabel
    x, y = t.x[:8], t.y[:8]
    target, proxy = t.model, _other_model()
    atk = FGSM(t.task, Linf(0.15, bounds=(0.0, 1.0)))
    crafted_on: list[torch.nn.Module] = []
    real = common.craft

    def spy(attack, model, *args, **kwargs):
        crafted_on.append(model)
        return real(attack, model, *args, **kwargs)

    monkeypatch.setattr(common, "craft", spy)
    r = run_study("saliency", {"surrogate": "proxy", "models": ["target", "proxy"], "explanations": ["gradient"]},
                  {"target": target, "proxy": proxy}, t.task, (x, y), {"fgsm": atk})
    assert crafted_on == [proxy]  # one batch, one attack: crafted once, on the surrogate only
    assert {row["model"] for row in r.rows} == {"target", "proxy"}
    assert all(row["surrogate"] == "proxy" for row in r.rows) and r.meta["surrogate"] == "proxy"
    x_adv = atk(proxy, x, y).x_adv
    with torch.no_grad():
        transferred = float(macro_auc(target(x_adv).sigmoid().double(), y.double()))
    white = float(macro_auc(atk(target, x, y).logits.sigmoid().double(), y.double()))
    row = next(row for row in r.rows if row["model"] == "target")
    assert row["auc_adv"] == pytest.approx(transferred, abs=1e-9)
    assert row["auc_adv"] != pytest.approx(white, abs=1e-3)  # not the target's own (white-box) examples
    # the target's maps: its gradient on the proxy's examples
    from medadv.explain import get_explanation
    from medadv.metrics.saliency import map_ssim

    g = get_explanation("gradient")
    with torch.no_grad():
        label = t.task.explained_class(y, target(x))
    ssim = float(map_ssim(g(target, x, label), g(target, x_adv, label)).double().mean())
    assert row["ssim"] == pytest.approx(ssim, abs=1e-6)
    with pytest.raises(ValueError, match="did you mean 'proxy'"):
        run_study("saliency", {"surrogate": "proxi"}, {"target": target, "proxy": proxy}, t.task, (x, y),
                  {"fgsm": atk})


def test_the_report_has_zhangs_table_per_model_and_method(trained_multilabel):
    t = trained_multilabel
    x, y = t.x[:6], t.y[:6]
    r = saliency({"a": t.model}, t.task, (x, y), {"fgsm": FGSM(t.task, Linf(0.1, bounds=(0.0, 1.0)))},
                 explanations=["gradient", "smoothgrad"])
    section = study_drawer("saliency")(r, None)  # type: ignore[misc]
    table = next(b for b in section.blocks if getattr(b, "caption", "").startswith("Zhang et al.'s Tables 1–2"))
    assert [c.text for c in table.headers] == ["model", "metric", "gradient", "smoothgrad"]
    assert [row[1].text for row in table.rows] == ["AUC (clean)", "AUC on the attacked images",
                                                    "SSIM to the original map", "PSC"]
    grad = next(row for row in r.rows if row["explanation"] == "gradient")
    assert float(table.rows[1][2].text) == pytest.approx(grad["auc_adv"], abs=1e-3)


def test_matched_mapping_compares_an_evaluation_only_method_on_another_methods_attack(trained_multiclass):
    from medadv.attacks import SaliencyRelevance
    from medadv.explain import Gradient, GradientXInput

    t = trained_multiclass
    x, y, task = t.x[:4], t.y[:4], t.task
    box = Linf(0.1, bounds=(0.0, 1.0))
    attacks = {"rel-g": SaliencyRelevance(task, box, Gradient(), steps=2),
               "rel-gxi": SaliencyRelevance(task, box, GradientXInput(), steps=2),
               "fgsm": FGSM(task, box)}
    spec = {"explanations": ["gradient", "gradient_x_input", "integrated_gradients"],
            "matched": {"integrated_gradients": "gradient"}}
    r = run_study("saliency", spec, {"net": t.model}, task, (x, y), attacks)
    assert sorted((row["attack"], row["explanation"]) for row in r.rows) == sorted(
        [("rel-g", "gradient"), ("rel-g", "integrated_gradients"), ("rel-gxi", "gradient_x_input")]
        + [("fgsm", e) for e in spec["explanations"]])
    # the borrowed column is the images of the gradient attack: same AUC on the attacked images
    cell = {(row["attack"], row["explanation"]): row for row in r.rows}
    assert cell[("rel-g", "integrated_gradients")]["auc_adv"] == cell[("rel-g", "gradient")]["auc_adv"]
    with pytest.raises(Exception, match="not one of the `explanations`"):
        run_study("saliency", {"explanations": ["gradient"], "matched": {"xrai": "integrated_gradients"}},
                  {"net": t.model}, task, (x, y), attacks)
    with pytest.raises(Exception, match="did you mean 'gradcam'"):
        run_study("saliency", {"explanations": ["gradient", "xrai"], "matched": {"xrai": "gradcan"}},
                  {"net": t.model}, task, (x, y), attacks)
