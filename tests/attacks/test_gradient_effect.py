"""On small trained models each gradient attack lowers the metric it targets; targeted attacks move the
prediction toward the target; CosPGD and SegPGD weight the task's loss per element as their papers say."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from medadv.attacks.base import attack_class, available_attacks
from medadv.attacks.bim import BIM
from medadv.attacks.cospgd import CosPGD
from medadv.attacks.fgsm import FGSM
from medadv.attacks.gradient import GradientAttack
from medadv.attacks.pgd import PGD
from medadv.attacks.segpgd import SegPGD
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import L2, Linf

# every registered attack of the gradient family (a new one is covered without editing this file)
GRADIENT_FAMILY = [attack_class(n) for n in available_attacks() if issubclass(attack_class(n), GradientAttack)]


def _ctx(y, step):
    """The per-sample context the engine hands to ``element_weights`` at ``step``."""
    from medadv.attacks.engine import StepContext

    return StepContext(step=step, steps=0, restart=0, index=torch.arange(y.shape[0]), x=y, y=y, clean_logits=None)


def _attack(cls, task, eps, norm=Linf, steps=10, **kw):
    if cls is not FGSM:
        kw["steps"] = steps
    return cls(task, norm(eps, bounds=(0, 1)), **kw)


def _mean_metric(task, logits, y, key):
    return float(task.metrics(logits, y)[key].float().mean())


# --- untargeted: the metric the attack targets goes down --------------------------------------------------------
# (fixture, metric, eps, required drop). Drops are about half of what the attacks achieve on these models.
CASES = [
    ("trained_multiclass", "correct", 0.1, 0.2),
    ("trained_multilabel", "label_accuracy", 0.1, 0.2),
    ("trained_seg2d", "mean_dice", 0.1, 0.12),
    ("trained_seg3d", "mean_dice", 0.1, 0.15),
]


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
@pytest.mark.parametrize("fixture,metric,eps,drop", CASES, ids=[c[0] for c in CASES])
def test_attack_lowers_metric(cls, fixture, metric, eps, drop, request):
    t = request.getfixturevalue(fixture)
    with torch.no_grad():
        clean = _mean_metric(t.task, t.model(t.x), t.y, metric)
    res = _attack(cls, t.task, eps)(t.model, t.x, t.y)
    adv = _mean_metric(t.task, res.logits, t.y, metric)
    assert adv <= clean - drop, f"{cls.__name__}: {metric} {clean:.3f} -> {adv:.3f}"
    assert res.linf.max() <= eps + 1e-6


@pytest.mark.parametrize("fixture", ["trained_multiclass", "trained_seg2d"])
def test_l2_pgd_lowers_metric(fixture, request):
    t = request.getfixturevalue(fixture)
    metric = "correct" if fixture == "trained_multiclass" else "mean_dice"
    with torch.no_grad():
        clean = _mean_metric(t.task, t.model(t.x), t.y, metric)
    eps = 0.1 * t.x[0].numel() ** 0.5 / 2  # an L2 ball about as large as L∞ 0.05 over the whole image
    res = _attack(PGD, t.task, eps, norm=L2)(t.model, t.x, t.y)
    assert _mean_metric(t.task, res.logits, t.y, metric) <= clean - 0.1
    assert res.l2.max() <= eps * (1 + 1e-5)


def test_iterative_attacks_raise_the_loss_more_than_one_step(trained_seg2d):
    t = trained_seg2d
    one = _attack(FGSM, t.task, 0.05)(t.model, t.x, t.y)
    many = _attack(PGD, t.task, 0.05, random_start=False)(t.model, t.x, t.y)
    assert t.task.loss(many.logits, t.y).mean() > t.task.loss(one.logits, t.y).mean()


def test_attacking_the_clean_prediction_when_no_labels(trained_multilabel):
    t = trained_multilabel
    res = _attack(PGD, t.task, 0.1)(t.model, t.x)
    with torch.no_grad():
        pred = t.task.predict(t.model(t.x))
    assert torch.equal(res.y, pred)
    assert res.fooling_rate > 0.5


# --- targeted ---------------------------------------------------------------------------------------------------
def _agreement(task, logits, target):
    return float(task.element_correct(logits, target).float().mean())


def _targeted_eps(cls) -> float:
    return 0.08 if cls is FGSM else 0.15  # one full-size step overshoots the target at larger budgets


def _mixed_labels(t, logits):
    """Labels with both correctly and wrongly predicted elements (the multi-label model is perfect)."""
    y = t.task.to_target(t.y, logits)
    if isinstance(t.task, MultiLabel):
        y = y.clone()
        y[:, 0] = 1 - y[:, 0]
    return y


@pytest.mark.parametrize("cls", [BIM, PGD, CosPGD, SegPGD])
def test_targeted_multiclass_reaches_target_class(cls, trained_multiclass):
    t = trained_multiclass
    target = (t.y + 1) % 4
    res = _attack(cls, t.task, 0.15, targeted=True)(t.model, t.x, target)
    with torch.no_grad():
        before = float((t.model(t.x).argmax(1) == target).float().mean())
    after = float((res.logits.argmax(1) == target).float().mean())
    assert after >= before + 0.3
    assert torch.equal(res.fooled, res.logits.argmax(1) == target)


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
def test_targeted_multilabel_makes_chosen_labels_present(cls, trained_multilabel):
    """"Make labels 0 and 2 present (say Hernia and Mass), keep the other labels as predicted"."""
    t = trained_multilabel
    names = ["Hernia", "Effusion", "Mass", "Nodule"]
    with torch.no_grad():
        pred = t.task.predict(t.model(t.x))
    target = t.task.make_target(pred, present=["Hernia", "Mass"], label_names=names)
    assert torch.equal(target[:, [1, 3]], pred[:, [1, 3]]) and bool((target[:, [0, 2]] == 1).all())
    changed = (target != pred).any(dim=1)
    assert changed.sum() >= 8, "the fixture should have samples where the target differs from the prediction"

    res = _attack(cls, t.task, _targeted_eps(cls), targeted=True)(t.model, t.x, target)
    adv_pred = t.task.predict(res.logits)
    forced_before = float(pred[changed][:, [0, 2]].mean())
    forced_after = float(adv_pred[changed][:, [0, 2]].mean())
    assert forced_after >= forced_before + 0.3, f"{cls.__name__}: {forced_before:.2f} -> {forced_after:.2f}"
    with torch.no_grad():
        before = _agreement(t.task, t.model(t.x), target)
    assert _agreement(t.task, res.logits, target) > before
    assert res.fooling_rate > 0.0  # some samples match the whole target vector


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
@pytest.mark.parametrize("fixture,replace", [("trained_seg2d", {1: 2}), ("trained_seg3d", {2: 0})])
def test_targeted_segmentation_moves_toward_target_map(cls, fixture, replace, request):
    t = request.getfixturevalue(fixture)
    with torch.no_grad():
        clean_logits = t.model(t.x)
    pred = clean_logits.argmax(1)
    target = t.task.make_target(pred, replace=replace)
    (src, dst), = replace.items()
    region = pred == src
    assert region.sum() > 50
    res = _attack(cls, t.task, _targeted_eps(cls), targeted=True)(t.model, t.x, target)
    adv = res.logits.argmax(1)
    moved = float((adv[region] == dst).float().mean())
    need = 0.15 if cls is FGSM else 0.3
    assert moved >= need, f"{cls.__name__}: only {moved:.2f} of the region relabelled"
    agree = _agreement(t.task, res.logits, target)
    if cls is FGSM:
        # one sign step of size ε moves the region (above) but may flip as many voxels elsewhere (3-D: agreement
        # 0.95959 vs 0.95971 clean); the iterative attacks must raise the agreement with the whole target map
        assert agree > _agreement(t.task, clean_logits, target) - 1e-3
    else:
        assert agree > _agreement(t.task, clean_logits, target)


# --- CosPGD: per-element, detached cosine weights ---------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["trained_multiclass", "trained_multilabel", "trained_seg3d", "trained_seg2d"])
def test_cospgd_weights_are_per_element_cosines(fixture, request):
    t = request.getfixturevalue(fixture)
    atk = CosPGD(t.task, Linf(0.05, bounds=(0, 1)), steps=3)
    logits = t.model(t.x).detach().requires_grad_(True)
    y = _mixed_labels(t, logits)
    w = atk.element_weights(logits, _ctx(y, 0))
    grid = t.task.element_loss(logits, y).shape
    assert w.shape == grid, "one weight per element of the task's grid (sample, label or voxel)"
    assert not w.requires_grad, "weights must be detached"
    if isinstance(t.task, MultiLabel):  # Bernoulli pair [σ, 1 - σ] against [y, 1 - y]
        p = logits.sigmoid()
        ref = F.cosine_similarity(torch.stack((p, 1 - p), 1), torch.stack((y, 1 - y), 1), dim=1)
    else:
        p = logits.softmax(1)
        onehot = F.one_hot(y.long(), p.shape[1]).movedim(-1, 1).float()
        ref = F.cosine_similarity(p, onehot, dim=1)
    torch.testing.assert_close(w, ref.detach(), atol=1e-5, rtol=1e-5)
    assert float(w.std()) > 1e-3, "weights should vary over elements (not the scalar mean variant)"
    wt = CosPGD(t.task, Linf(0.05, bounds=(0, 1)), steps=3, targeted=True).element_weights(logits, _ctx(y, 0))
    torch.testing.assert_close(wt, 1 - w)


def test_cospgd_gradient_treats_weights_as_constants(trained_seg2d):
    t = trained_seg2d
    atk = CosPGD(t.task, Linf(0.05, bounds=(0, 1)), steps=3)
    logits = t.model(t.x[:2]).detach().requires_grad_(True)
    y = t.y[:2]
    (g,) = torch.autograd.grad(atk.logits_objective(logits, _ctx(y, 0)).sum(), logits)
    w = atk.element_weights(logits, _ctx(y, 0))
    (ref,) = torch.autograd.grad(t.task.loss(logits, y, w).sum(), logits)
    torch.testing.assert_close(g, ref)
    # differentiating through the cosine too would give a different gradient
    p = logits.softmax(1)
    cos = F.cosine_similarity(p, F.one_hot(y, 3).movedim(-1, 1).float(), dim=1)
    (through,) = torch.autograd.grad(t.task.loss(logits, y, cos).sum(), logits)
    assert not torch.allclose(g, through)


# --- SegPGD: λ_t = (t - 1) / (2T) shifts the weight from correct to wrong elements ------------------------------
@pytest.mark.parametrize("fixture", ["trained_seg2d", "trained_multilabel"])
@pytest.mark.parametrize("steps", [1, 4, 10])
def test_segpgd_lambda_schedule(fixture, steps, request):
    t = request.getfixturevalue(fixture)
    atk = SegPGD(t.task, Linf(0.05, bounds=(0, 1)), steps=steps)
    tgt = SegPGD(t.task, Linf(0.05, bounds=(0, 1)), steps=steps, targeted=True)
    with torch.no_grad():
        logits = t.model(t.x)
    y = _mixed_labels(t, logits)
    correct = t.task.element_correct(logits, y)
    assert correct.any() and (~correct).any()
    for step in range(steps):  # 0-based step = t - 1
        lam = step / (2 * steps)
        w = atk.element_weights(logits, _ctx(y, step))
        assert w.shape == correct.shape
        torch.testing.assert_close(w[correct], torch.full_like(w[correct], 1 - lam))
        torch.testing.assert_close(w[~correct], torch.full_like(w[~correct], lam))
        wt = tgt.element_weights(logits, _ctx(y, step))  # targeted: elements already at the target come second
        torch.testing.assert_close(wt[correct], torch.full_like(wt[correct], lam))
        torch.testing.assert_close(wt[~correct], torch.full_like(wt[~correct], 1 - lam))
    # first step ignores wrong elements entirely; the last one is just under 1/2
    assert float(atk.element_weights(logits, _ctx(y, 0))[~correct].abs().max()) == 0.0
    assert (steps - 1) / (2 * steps) < 0.5


def test_segpgd_objective_is_the_weighted_sum_over_all_elements(trained_seg3d):
    """Both sums are divided by the number of elements |Ω| (not by the size of each set)."""
    t = trained_seg3d
    atk = SegPGD(t.task, Linf(0.05, bounds=(0, 1)), steps=4)
    with torch.no_grad():
        logits = t.model(t.x)
        obj = atk.logits_objective(logits, _ctx(t.y, 2))
    lam = 2 / 8
    ce = F.cross_entropy(logits, t.y, reduction="none").flatten(1)
    corr = (logits.argmax(1) == t.y).flatten(1).float()
    ref = ((1 - lam) * (ce * corr).sum(1) + lam * (ce * (1 - corr)).sum(1)) / ce.shape[1]
    torch.testing.assert_close(obj, ref)


def test_weighting_also_applies_to_dice_losses(trained_seg2d):
    """CosPGD/SegPGD weights enter MONAI-style soft Dice too (loss="dicece"), and still lower the Dice."""
    t = trained_seg2d
    task = Segmentation(3, loss="dicece")
    with torch.no_grad():
        clean = _mean_metric(task, t.model(t.x), t.y, "mean_dice")
    for cls in (CosPGD, SegPGD):
        res = _attack(cls, task, 0.1)(t.model, t.x, t.y)
        assert _mean_metric(task, res.logits, t.y, "mean_dice") <= clean - 0.1


def test_multiclass_task_is_what_the_fixture_uses(trained_multiclass):
    assert isinstance(trained_multiclass.task, MultiClass)  # guards the CASES table above
