"""``auto``: the worst case over its members per sample, only non-floor samples attacked, exactness of skipping,
SEA's progressive radius inside the ball, the member list per task and version, and clear refusals."""

from __future__ import annotations

import pytest
import torch

from medadv.attacks.auto import COMPONENTS, AutoEvaluation, auto_components
from medadv.attacks.base import get_attack
from medadv.attacks.pgd import PGD
from medadv.evaluation import evaluate
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, MultiLabel, Segmentation, registered_task_classes
from medadv.threats import L2, Box, Linf

ML_MEMBERS = ["apgd-ce", "apgd-margin", "apgd-flip", "square"]
SEG_MEMBERS = ["apgd-ce", "apgd-balanced-ce", "apgd-js", "apgd-cospgd", "apgd-segpgd", "square"]


def _metric(t, x_adv):
    with torch.no_grad():
        return t.task.robust_metric(t.model(x_adv), t.y)


def _alone(t, threat, members, **kw):
    """Each member run alone on every sample: per-sample robust metric, (members, N)."""
    out = []
    for j, name in enumerate(members):
        # member j of the ensemble uses seed + j: give the single run the same seed
        atk = AutoEvaluation(t.task, threat, version="custom", attacks=[name], checks=False, seed=j, **kw)
        out.append(_metric(t, atk(t.model, t.x, t.y).x_adv))
    return torch.stack(out)


@pytest.mark.parametrize("eps", [0.03, 0.05])
def test_multilabel_worst_case_of_members_and_no_weaker_than_pgd(trained_multilabel, eps):
    t = trained_multilabel
    threat = Linf(eps, bounds=(0.0, 1.0))
    atk = AutoEvaluation(t.task, threat, version="custom", attacks=ML_MEMBERS, steps=15, queries=50, checks=False)
    res = atk(t.model, t.x, t.y)
    final = _metric(t, res.x_adv)
    d = res.details
    assert torch.equal(final, d.metric_after[:, -1].to(final))
    # the metric after each member never rises, and only samples above the floor are attacked
    assert bool((d.metric_after[:, 1:] <= d.metric_after[:, :-1]).all())
    assert bool((d.attacked[:, 1:] <= (d.metric_after[:, :-1] > 0)).all())
    alone = _alone(t, threat, ML_MEMBERS, steps=15, queries=50)
    # identical per sample to the worst case over the members run alone on every sample
    assert torch.equal(final, alone.min(dim=0).values)
    pgd = PGD(t.task, threat, steps=15)(t.model, t.x, t.y)
    assert bool((final <= _metric(t, pgd.x_adv)).all())
    assert float(final.mean()) < float(t.task.robust_metric(t.model(t.x), t.y).mean())
    assert float((res.x_adv - t.x).abs().max()) <= eps + 1e-6


def test_seg3d_worst_case_of_members_and_no_weaker_than_pgd(trained_seg3d):
    t = trained_seg3d
    threat = Linf(0.08, bounds=(0.0, 1.0))
    # selection by Dice (the robust metric _metric reads); worst-of is tested in test_auto_selection.py
    atk = AutoEvaluation(t.task, threat, version="custom", attacks=SEG_MEMBERS, steps=10, queries=30, checks=False,
                         metric="dice")
    res = atk(t.model, t.x, t.y)
    final = _metric(t, res.x_adv)
    alone = _alone(t, threat, SEG_MEMBERS, steps=10, queries=30, metric="dice")
    # the same per-sample numbers as running every member alone (up to float reduction order across batches)
    assert torch.allclose(final, alone.min(dim=0).values, atol=1e-6)
    assert bool((final <= alone.min(dim=0).values + 1e-6).all())
    pgd = PGD(t.task, threat, steps=10)(t.model, t.x, t.y)
    assert float(final.mean()) <= float(_metric(t, pgd.x_adv).mean())
    assert float(final.mean()) < float(_metric(t, t.x).mean())


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_progressive_radius_stays_in_the_ball(trained_seg2d, norm):
    t = trained_seg2d
    box = Box(torch.zeros(2, 1, 1), torch.tensor([1.0, 2.0]).reshape(2, 1, 1))
    x = t.x * torch.tensor([1.0, 2.0]).reshape(1, 2, 1, 1)  # data inside the per-channel box
    threat = Linf(0.05, bounds=box) if norm == "Linf" else L2(1.0, bounds=box)
    atk = AutoEvaluation(t.task, threat, version="custom", attacks=["apgd-ce", "apgd-js"], steps=10, checks=False,
                         progressive_radius=True)
    res = atk(t.model, x, t.y)
    assert bool((res.linf <= threat.eps + 1e-6).all()) if norm == "Linf" else bool((res.l2 <= threat.eps + 1e-5).all())
    lo, hi = box.lohi(x)
    assert bool(((res.x_adv >= lo) & (res.x_adv <= hi)).all())
    with torch.no_grad():
        assert float(t.task.robust_metric(t.model(res.x_adv), t.y).mean()) < \
            float(t.task.robust_metric(t.model(x), t.y).mean())


def test_multiclass_runs_pyautoattack_members_in_turn(trained_multiclass):
    t = trained_multiclass
    threat = Linf(0.1, bounds=(0.0, 1.0))
    atk = AutoEvaluation(t.task, threat, version="custom", attacks=["apgd-ce", "apgd-t"], steps=10, targets=2,
                         checks=False)
    res = atk(t.model, t.x, t.y)
    d = res.details
    clean = t.task.robust_metric(t.model(t.x), t.y)
    assert bool((d.attacked[:, 0] == (clean > 0)).all())
    assert bool((d.attacked[:, 1] == (d.metric_after[:, 0] > 0)).all())  # APGD-T only on still-robust samples
    alone = _metric(t, AutoEvaluation(t.task, threat, version="custom", attacks=["apgd-ce"], steps=10,
                                      checks=False)(t.model, t.x, t.y).x_adv)
    assert float(_metric(t, res.x_adv).mean()) <= float(alone.mean())
    assert float(res.linf.max()) <= 0.1 + 1e-6


def test_versions_and_members_per_task():
    assert auto_components(MultiClass()) == ("apgd-ce", "apgd-t", "fab-t", "square")
    assert auto_components(MultiLabel(), "fast") == ("apgd-ce", "apgd-margin", "apgd-flip", "square")
    seg = auto_components(Segmentation(3))
    assert {"apgd-balanced-ce", "apgd-js", "apgd-cospgd", "apgd-segpgd"} <= set(seg)
    atk = get_attack("auto", Segmentation(3), Linf(0.1, bounds=(0, 1)), version="fast")
    assert atk.components == auto_components(Segmentation(3), "fast") and atk._steps == 20
    # declared parameters: the fingerprint sees the version and the iteration counts
    a = AutoEvaluation(MultiLabel(), Linf(0.1, bounds=(0, 1)), version="fast")
    assert a.fingerprint() != a.set_params(steps=50).fingerprint()
    assert a.fingerprint() != a.set_params(version="standard").fingerprint()
    # every registered kind that declares members (the built-in ones and any added kind, e.g. regression)
    assert set(COMPONENTS) == {c.name for c in registered_task_classes() if c.auto_members}
    assert {"multiclass", "multilabel", "segmentation"} <= set(COMPONENTS)


def test_refusals():
    threat = Linf(0.1, bounds=(0, 1))
    with pytest.raises(InvalidParameterError, match="did you mean 'apgd-flip'"):
        AutoEvaluation(MultiLabel(), threat, version="custom", attacks=["apgd-flp"])
    with pytest.raises(InvalidParameterError, match="unknown member 'apgd-balanced-ce' for MultiLabel"):
        AutoEvaluation(MultiLabel(), threat, version="custom", attacks=["apgd-balanced-ce"])
    with pytest.raises(InvalidParameterError, match="required with version='custom'"):
        AutoEvaluation(MultiLabel(), threat, version="custom")
    with pytest.raises(InvalidParameterError, match="not allowed with version='fast'"):
        AutoEvaluation(MultiLabel(), threat, version="fast", attacks=["apgd-ce"])
    with pytest.raises(InvalidParameterError, match="progressive_radius"):
        AutoEvaluation(MultiClass(), threat, progressive_radius=True)
    with pytest.raises(InvalidParameterError, match="targeted"):
        AutoEvaluation(MultiLabel(), threat, targeted=True)
    with pytest.raises(InvalidParameterError, match="`steps` of AutoEvaluation must be"):
        AutoEvaluation(MultiLabel(), threat, steps=0)
    per_channel = Linf(0.1, bounds=Box(torch.zeros(2, 1, 1), torch.ones(2, 1, 1)))
    with pytest.raises(InvalidParameterError, match="scalar"):
        AutoEvaluation(MultiClass(), per_channel)


def test_evaluate_tabulates_each_member(trained_multilabel):
    t = trained_multilabel
    attacks = {"auto": AutoEvaluation(t.task, Linf(0.03, bounds=(0, 1)), version="custom", attacks=ML_MEMBERS,
                                      steps=5, queries=20, checks=False)}
    res = evaluate(t.model, t.task, (t.x, t.y), attacks)
    table = res.ensemble_table()
    assert [r["member"] for r in table] == ["(clean)", *ML_MEMBERS]
    table = table[1:]
    clean = sum(r["clean_exact_match"] for r in res.rows) / len(res.rows)
    after = [r["robust_exact_match"] for r in table]
    assert after == sorted(after, reverse=True) and after[-1] <= clean
    assert table[0]["gain"] == pytest.approx(clean - after[0])
    assert table[0]["attacked"] == sum(r["clean_exact_match"] for r in res.rows)
    assert all(r["seconds"] > 0 for r in table if r["attacked"])
    assert abs(after[-1] - sum(r["adv_exact_match"] for r in res.rows) / len(res.rows)) < 1e-9
    text = res.format_summary()
    assert "worst case after each member" in text and "apgd-flip" in text


# --- gradient-masking checks inside auto, and the pytest plugin ------------------------------------------------------
class _Quantised(torch.nn.Module):
    """A masked model: the input is rounded to 1/8 steps before the network (zero input gradients)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(torch.round(x * 8) / 8)


class _Sigmoid(torch.nn.Module):
    """A masked model: probabilities instead of logits (the multi-label head's sigmoid left in)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x).sigmoid()


def test_masking_flags_fire_on_masked_models_and_not_on_the_sound_one(trained_multilabel):
    t = trained_multilabel
    threat = Linf(0.1, bounds=(0.0, 1.0))

    def flags(model):
        atk = AutoEvaluation(t.task, threat, version="custom", attacks=["apgd-ce", "square"], steps=10, queries=100)
        return set(atk(model, t.x, t.y).details.masking)

    assert flags(t.model) == set()
    quantised = flags(_Quantised(t.model))
    # APGD sees no gradient, Square still breaks samples: both the zero-gradient and the black-box flag
    assert {"zero_gradients", "black_box_wins"} <= quantised
    with pytest.raises(ValueError, match="declare `outputs: probabilities`"):  # issue 28: refused, not only flagged
        flags(_Sigmoid(t.model))


def test_pytest_plugin_measures_auto(trained_multilabel, tmp_path):
    from medadv.testing import RobustnessCheck

    t = trained_multilabel
    threat = Linf(0.03, bounds=(0.0, 1.0))
    check = RobustnessCheck(tmp_path / "baselines.json", update=True)
    auto = check.check("cnn-auto", t.model, t.task, (t.x, t.y), AutoEvaluation(t.task, threat, version="fast"))
    pgd = check.measure(t.model, t.task, (t.x, t.y), PGD(t.task, threat, steps=20))
    assert auto <= pgd  # the headline metric (label accuracy) under the ensemble is no higher than under PGD
    assert "cnn-auto" in (tmp_path / "baselines.json").read_text()


def test_segmentation_l2_on_hu_range_data_is_finite():
    """Issue 19: the apgd-js member returned NaN inputs on CT in Hounsfield units under L2 (a saturated softmax),
    and ``auto`` kept them as the worst case (NaN logits score Dice 0)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv3d(1, 4, 3, padding=1), torch.nn.Softplus(),
                                torch.nn.Conv3d(4, 3, 1)).eval()
    lo, hi = -1024.0, 3071.0
    x = lo + torch.rand(2, 1, 8, 8, 8, generator=torch.Generator().manual_seed(1)) * (hi - lo)
    with torch.no_grad():
        y = model(x).argmax(1)
    atk = AutoEvaluation(Segmentation(3), L2(200.0, bounds=(lo, hi)), version="custom", attacks=["apgd-js"],
                         steps=5, checks=False)
    res = atk(model, x, y)
    assert torch.isfinite(res.x_adv).all()
    assert torch.isfinite(res.details.metric_after).all()
    assert bool((res.l2 <= 200.0 * (1 + 1e-5)).all())
