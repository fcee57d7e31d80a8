"""Foolbox's attacks through medadv's criteria, task-aware model and loss hook."""

from __future__ import annotations

import foolbox as fb
import pytest
import torch

from medadv.adapters import foolbox as mfb
from medadv.tasks import MultiClass

EPS = 0.1


def _grads(model):
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _same_grads(model, before) -> bool:
    return all((g is None and p.grad is None) or (g is not None and torch.equal(p.grad, g))
               for p, g in zip(model.parameters(), before, strict=True))


def test_multilabel_pgd_l2pgd_fgsm_fool_trained_model(trained_multilabel):
    t = trained_multilabel
    fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
    crit = mfb.criterion(t.task, t.y)
    assert isinstance(crit, fb.criteria.Misclassification)
    clean_fooled = t.task.fooled(t.model(t.x), t.y)
    before = _grads(t.model)
    for attack, eps, p in ((mfb.LinfPGD(steps=10), EPS, float("inf")), (mfb.L2PGD(steps=10), 1.5, 2.0),
                           (mfb.FGSM(), EPS, float("inf"))):
        raw, clipped, is_adv = attack(fmodel, t.x, crit, epsilons=eps)
        assert clipped.shape == t.x.shape and clipped.dtype == t.x.dtype and clipped.device == t.x.device
        assert (clipped - t.x).flatten(1).norm(p=p, dim=1).max() <= eps * (1 + 1e-4)
        assert clipped.min() >= 0 and clipped.max() <= 1
        with torch.no_grad():
            logits = t.model(clipped)
        assert torch.equal(is_adv, t.task.fooled(logits, t.y))  # criterion == the task's fooled test
        assert is_adv.float().mean() > clean_fooled.float().mean() + 0.3, type(attack).__name__
    assert _same_grads(t.model, before) and not t.model.training


def test_multilabel_targeted_reaches_target_vector(trained_multilabel):
    t = trained_multilabel
    fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
    target = t.y.clone()
    target[:, 0] = 1 - target[:, 0]  # flip one finding
    crit = mfb.criterion(t.task, target, targeted=True)
    assert hasattr(crit, "target_classes")
    _, clipped, is_adv = mfb.LinfPGD(steps=20)(fmodel, t.x, crit, epsilons=0.2)
    assert (clipped - t.x).abs().max() <= 0.2 + 1e-6
    assert is_adv.float().mean() > 0.5
    with pytest.raises(ValueError, match="unsupported criterion"):  # Foolbox's FGSM is untargeted only
        mfb.FGSM()(fmodel, t.x, crit, epsilons=0.1)


def test_segmentation_3d_hu_dice_and_pixel_accuracy_criteria(trained_seg3d, hu):
    wrap, to_hu, bounds = hu
    t = trained_seg3d
    model = wrap(t.model)
    x = to_hu(t.x)
    fmodel = mfb.TaskModel(model, t.task, bounds=bounds)
    eps = 0.15 * (bounds[1] - bounds[0])
    clean = t.task.metrics(t.model(t.x), t.y)["mean_dice"]
    for attack, e in ((mfb.LinfPGD(steps=6, abs_stepsize=eps / 4), eps), (mfb.FGSM(), eps),
                      (mfb.L2PGD(steps=6, abs_stepsize=eps * 16 / 4), eps * 16)):
        _, clipped, is_adv = attack(fmodel, x, mfb.criterion(t.task, t.y), epsilons=e)
        assert clipped.shape == x.shape and clipped.min() >= bounds[0] and clipped.max() <= bounds[1]
        assert clipped.min() < -500  # HU range kept, nothing squeezed into [0, 1]
        with torch.no_grad():
            adv = t.task.metrics(model(clipped), t.y)["mean_dice"]
        assert adv.mean() < clean.mean() - 0.1, type(attack).__name__
        assert torch.equal(is_adv, adv < t.task.dice_threshold)
    crit = mfb.SegmentationMisclassification(t.y, t.task, metric="pixel_accuracy", threshold=0.95)
    _, clipped, is_adv = mfb.LinfPGD(steps=6, abs_stepsize=eps / 4)(fmodel, x, crit, epsilons=eps)
    with torch.no_grad():
        acc = t.task.metrics(model(clipped), t.y)["pixel_accuracy"]
        clean_acc = t.task.metrics(model(x), t.y)["pixel_accuracy"]
    assert torch.equal(is_adv, acc < 0.95) and acc.mean() < clean_acc.mean() - 0.02


def test_segmentation_targeted_map(trained_seg3d):
    t = trained_seg3d
    fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
    target = torch.zeros_like(t.y)  # erase every organ
    crit = mfb.TargetedSegmentation(target, t.task, fraction=0.95)
    organ = t.y > 0
    before = (t.model(t.x).argmax(1) == target)[organ].float().mean()
    _, clipped, is_adv = mfb.LinfPGD(steps=20, abs_stepsize=0.05)(fmodel, t.x, crit, epsilons=0.3)
    after = (t.model(clipped).argmax(1) == target)[organ].float().mean()
    assert after > before + 0.3  # organ voxels now predicted as background
    hit = (t.model(clipped).argmax(1) == target).float().flatten(1).mean(1)
    assert torch.equal(is_adv, hit >= 0.95)


def test_multiclass_deepfool_unmodified_through_task_model(trained_multiclass):
    t = trained_multiclass
    fmodel = mfb.TaskModel(t.model, MultiClass(), bounds=(0, 1))
    clean = (t.model(t.x).argmax(1) == t.y).float().mean()
    _, clipped, is_adv = fb.attacks.LinfDeepFoolAttack(steps=50)(fmodel, t.x, t.y, epsilons=None)
    assert clipped.min() >= 0 and clipped.max() <= 1
    acc = (t.model(clipped).argmax(1) == t.y).float().mean()
    assert acc < clean - 0.3 and is_adv.float().mean() > 0.5
    # multi-class also works with medadv's loss hook (cross-entropy from the task)
    attack = mfb.LinfPGD(steps=10, abs_stepsize=EPS / 4)
    _, clipped, is_adv = attack(fmodel, t.x, mfb.criterion(fmodel.task, t.y), epsilons=EPS)
    assert (t.model(clipped).argmax(1) == t.y).float().mean() < clean - 0.2


def test_bad_input_is_rejected_clearly(trained_multilabel, trained_seg3d):
    t = trained_multilabel
    plain = fb.PyTorchModel(t.model, bounds=(0, 1))
    with pytest.raises(TypeError, match="TaskModel"):
        mfb.LinfPGD(steps=1)(plain, t.x, mfb.criterion(t.task, t.y), epsilons=EPS)
    fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
    with pytest.raises(ValueError, match="outside the model bounds"):
        mfb.LinfPGD(steps=1)(fmodel, t.x + 2, mfb.criterion(t.task, t.y), epsilons=EPS)
    with pytest.raises(ValueError, match="multi-hot"):
        mfb.MultiLabelMisclassification(t.y[:, 0])
    with pytest.raises(ValueError, match="label map"):
        mfb.SegmentationMisclassification(trained_seg3d.y.float(), trained_seg3d.task)
    with pytest.raises(ValueError, match="bounds"):
        mfb.TaskModel(t.model, t.task, bounds=(1, 0))
    with pytest.raises(TypeError, match="task"):
        mfb.TaskModel(t.model, "multilabel", bounds=(0, 1))


# --- Foolbox's own attack classes on a TaskModel -------------------------------------------------------------
def _forwards(model):
    calls = []
    return calls, model.register_forward_hook(lambda *a: calls.append(1))


def test_foolbox_own_gradient_attacks_take_the_task_loss(trained_multilabel, trained_seg3d):
    """One mechanism for every BaseGradientDescent attack: Foolbox's class on a TaskModel gives exactly what the
    task-loss subclass gives (same steps, same loss), on multi-label BCE and on segmentation CE or Dice."""
    from medadv.tasks import Segmentation

    t = trained_multilabel
    fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
    crit = mfb.criterion(t.task, t.y)
    for ours, theirs, eps in ((mfb.LinfPGD, fb.attacks.LinfPGD, EPS), (mfb.L2PGD, fb.attacks.L2PGD, 1.0),
                              (mfb.LinfBasicIterativeAttack, fb.attacks.LinfBasicIterativeAttack, EPS)):
        a = ours(steps=4, random_start=False)(fmodel, t.x, crit, epsilons=eps)[1]
        b = theirs(steps=4, random_start=False)(fmodel, t.x, crit, epsilons=eps)[1]
        assert torch.equal(a, b), theirs.__name__
    s = trained_seg3d
    advs = {}
    for loss in ("ce", "dice"):
        fseg = mfb.TaskModel(s.model, Segmentation(3, loss=loss), bounds=(0, 1))
        c = mfb.criterion(fseg.task, s.y)
        a = mfb.L2PGD(steps=3, random_start=False)(fseg, s.x, c, epsilons=2.0)[1]
        advs[loss] = fb.attacks.L2PGD(steps=3, random_start=False)(fseg, s.x, c, epsilons=2.0)[1]
        assert torch.equal(a, advs[loss]), loss
    assert not torch.equal(advs["ce"], advs["dice"])  # the task's loss, not a fixed one


def test_foolbox_own_attacks_leave_grads_and_training_flag(trained_multilabel):
    t = trained_multilabel
    t.model.train()
    try:
        fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
        before = _grads(t.model)
        for attack, eps in ((fb.attacks.L1AdamPGD(steps=3), 8.0), (fb.attacks.SparseL1DescentAttack(steps=3), 8.0),
                            (fb.attacks.MIFGSM(steps=3), EPS)):
            _, clipped, _ = attack(fmodel, t.x, mfb.criterion(t.task, t.y), epsilons=eps)
            assert clipped.min() >= 0 and clipped.max() <= 1
        assert _same_grads(t.model, before) and t.model.training
        assert all(p.requires_grad for p in t.model.parameters())
    finally:
        t.model.eval()


def test_plain_labels_tensor_is_a_clear_error(trained_multilabel, trained_seg2d):
    """Foolbox would wrap a labels tensor in Misclassification and fail with a bare AssertionError."""
    for t, what in ((trained_multilabel, "MultiLabelMisclassification"),
                    (trained_seg2d, "SegmentationMisclassification")):
        fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
        calls, handle = _forwards(t.model)
        for crit in (t.y, fb.criteria.Misclassification(t.y)):
            with pytest.raises(TypeError, match=rf"mfb\.criterion\(fmodel\.task, y\).*{what}"):
                fb.attacks.L2PGD(steps=1)(fmodel, t.x, crit, epsilons=1.0)
            with pytest.raises(TypeError, match="mfb.criterion"):
                fb.attacks.BoundaryAttack(steps=1)(fmodel, t.x, crit, epsilons=None)
        handle.remove()
        assert not calls
    t = trained_multilabel
    fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
    seg_crit = mfb.SegmentationMisclassification(trained_seg2d.y, trained_seg2d.task)
    with pytest.raises(TypeError, match="criterion for Segmentation models"):
        fb.attacks.LinfPGD(steps=1)(fmodel, t.x, seg_crit, epsilons=EPS)


def test_refusal_comes_before_any_work_on_every_entry(trained_seg3d):
    t = trained_seg3d
    fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
    crit = mfb.criterion(t.task, t.y)

    class Sneaky(fb.attacks.L2DeepFoolAttack):  # a user subclass that calls the model without verify_input_bounds
        def run(self, model, inputs, criterion, **kwargs):
            return model(inputs)

    calls, handle = _forwards(t.model)
    entries = [lambda: fb.attacks.L2DeepFoolAttack()(fmodel, t.x, crit, epsilons=None),
               lambda: fb.attacks.L2DeepFoolAttack().run(fmodel, t.x, crit),
               lambda: fb.attacks.L2FMNAttack().repeat(2)(fmodel, t.x, crit, epsilons=None),
               lambda: Sneaky().run(fmodel, t.x, crit)]
    for entry, name in zip(entries, ("L2DeepFoolAttack", "L2DeepFoolAttack", "L2FMNAttack", "L2DeepFoolAttack"),
                           strict=True):
        with pytest.raises(mfb.UnsupportedAttackError, match=rf"Foolbox {name} does not apply to a 3-D seg model.* use "):
            entry()
    handle.remove()
    assert not calls
    assert mfb.attack_name(Sneaky) == "L2DeepFoolAttack" and mfb.attack_name(fb.attacks.PGD()) == (
        "LinfProjectedGradientDescentAttack") and mfb.attack_name(mfb.FGSM) == "LinfFastGradientAttack"


def test_unknown_foolbox_attack_is_refused(trained_multilabel, monkeypatch):
    """An attack a newer Foolbox adds is refused until it is classified in SUPPORT."""
    t = trained_multilabel
    fmodel = mfb.TaskModel(t.model, t.task, bounds=(0, 1))
    NewAttack = type("NewAttack", (fb.attacks.LinfPGD,), {"__module__": "foolbox.attacks.new_attack"})
    monkeypatch.setattr(fb.attacks, "NewAttack", NewAttack, raising=False)
    with pytest.raises(mfb.UnsupportedAttackError, match="NewAttack has not been checked on multi-label"):
        NewAttack(steps=1)(fmodel, t.x, mfb.criterion(t.task, t.y), epsilons=EPS)


def test_unit_box_attacks_need_unit_bounds(trained_seg3d, hu):
    """HopSkipJump clips to [0, 1] whatever the bounds: on HU data it would squeeze the volume; refused with
    the [0, 1] route, which then works (Foolbox's transform_bounds keeps the task)."""
    wrap, to_hu, bounds = hu
    t = trained_seg3d
    model = wrap(t.model)
    fmodel = mfb.TaskModel(model, t.task, bounds=bounds)
    x = to_hu(t.x[:1])
    crit = mfb.criterion(t.task, t.y[:1])
    calls, handle = _forwards(t.model)
    with pytest.raises(ValueError, match=r"clips its iterates to \[0, 1\].*transform_bounds\(\(0, 1\)\)"):
        fb.attacks.HopSkipJumpAttack(steps=1)(fmodel, x, crit, epsilons=None)
    handle.remove()
    assert not calls
    unit = fmodel.transform_bounds((0, 1))
    assert isinstance(unit, mfb.TaskModel) and unit.task is t.task
    torch.manual_seed(0)
    x01 = (x - bounds[0]) / (bounds[1] - bounds[0])
    with torch.no_grad():
        assert torch.allclose(unit(x01), model(x), atol=1e-4)


def test_foolbox_hook_points():
    """What TaskModel relies on in Foolbox 3 / eagerpy: an update that moves one fails here, by name."""
    import inspect

    import eagerpy as ep
    from foolbox.attacks.base import verify_input_bounds

    # every attack starts with verify_input_bounds(x, model), which reads model.bounds: the adapter's entry
    assert list(inspect.signature(verify_input_bounds).parameters) == ["input", "model"]
    assert "bounds" in inspect.getsource(verify_input_bounds)
    # the gradient attacks' loss is ep.crossentropy(logits, labels), dispatched to the logits tensor
    assert "logits.crossentropy(labels)" in inspect.getsource(ep.crossentropy)
    assert "ep.crossentropy(logits, labels)" in inspect.getsource(
        fb.attacks.gradient_descent_base.BaseGradientDescent.get_loss_fn)
