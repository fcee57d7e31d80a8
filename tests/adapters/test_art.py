"""ART's own, unmodified attacks and trainer through medadv's ART estimators."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from art.attacks.evasion import (
    AutoProjectedGradientDescent,
    BasicIterativeMethod,
    DeepFool,
    FastGradientMethod,
    HopSkipJump,
    ProjectedGradientDescent,
    ProjectedGradientDescentNumpy,
    SaliencyMapMethod,
    SquareAttack,
)
from art.attacks.evasion.projected_gradient_descent.projected_gradient_descent_pytorch import (
    ProjectedGradientDescentPyTorch,
)
from art.defences.trainer import AdversarialTrainer, AdversarialTrainerFBFPyTorch, AdversarialTrainerMadryPGD

from medadv.adapters.art import ARTClassifier, ARTSegmenter, UnsupportedAttackError
from medadv.models import chexnet, small_cnn, small_unet
from medadv.tasks import MultiClass, MultiLabel, Segmentation

EPS = 0.1


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _check_box(x_adv: np.ndarray, x: np.ndarray, eps: float, lo: float, hi: float) -> None:
    assert x_adv.shape == x.shape and x_adv.dtype == np.float32
    assert np.abs(x_adv - x).max() <= eps * (1 + 1e-5)
    assert x_adv.min() >= lo and x_adv.max() <= hi


# --- multi-label -------------------------------------------------------------------------------------------
def test_chexnet_14_labels_all_art_attacks_untargeted_and_targeted():
    torch.manual_seed(0)
    model = chexnet(14, in_channels=1).eval()
    task = MultiLabel()
    est = ARTClassifier(model, task, (1, 32, 32), clip_values=(0.0, 1.0))
    assert est.nb_classes == 14
    x = np.random.default_rng(0).random((2, 1, 32, 32), dtype=np.float32)
    logits = torch.from_numpy(est.predict(x))
    # the labels have the top-scoring finding present; the targets have it absent
    y = _np(torch.nn.functional.one_hot(logits.argmax(1), 14).float())
    target = _np(torch.nn.functional.one_hot((logits.argmax(1) + 1) % 14, 14).float())

    def loss(xa, labels):
        return task.loss(torch.from_numpy(est.predict(xa)), torch.from_numpy(labels))

    assert isinstance(ProjectedGradientDescent(est, eps=EPS)._attack, ProjectedGradientDescentPyTorch)
    kw = dict(eps=EPS, eps_step=0.04, max_iter=2, verbose=False)
    attacks = {
        "fgm": lambda t: FastGradientMethod(est, eps=EPS, targeted=t),
        "pgd_torch": lambda t: ProjectedGradientDescent(est, num_random_init=0, targeted=t, **kw),
        "pgd_numpy": lambda t: ProjectedGradientDescentNumpy(est, num_random_init=0, targeted=t, **kw),
        "bim": lambda t: BasicIterativeMethod(est, targeted=t, **kw),
    }
    base_u, base_t = loss(x, y), loss(x, target)
    for name, make in attacks.items():
        xa = make(False).generate(x, y=y)
        xt = make(True).generate(x, y=target)
        _check_box(xa, x, EPS, 0.0, 1.0)
        _check_box(xt, x, EPS, 0.0, 1.0)
        assert (loss(xa, y) > base_u).all(), name
        assert (loss(xt, target) < base_t).all(), name
    assert all(p.grad is None for p in model.parameters())
    # ART's APGD only attacks samples whose arg-max output equals the arg-max label: refused when constructed
    with pytest.raises(UnsupportedAttackError, match="AutoProjectedGradientDescent.*medadv's 'apgd'"):
        AutoProjectedGradientDescent(est, nb_random_init=1, **kw)


# ART's FGM divides label rows by their sum: an all-negative row becomes NaN, which the estimator reads
# (correctly) as "no finding present"
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
def test_multilabel_trained_metric_drops_labels_stay_multi_hot(trained_multilabel):
    t = trained_multilabel
    est = ARTClassifier(t.model, t.task, t.x.shape[1:], clip_values=(0.0, 1.0))
    x, y = _np(t.x), _np(t.y)
    assert est.predict_labels(x).dtype == np.float32
    clean = t.task.metrics(t.model(t.x), t.y)["label_accuracy"].mean()
    # FGM rescales multi-hot rows by their sum; the estimator still reads every positive label
    for attack in (FastGradientMethod(est, eps=EPS),
                   ProjectedGradientDescent(est, eps=EPS, eps_step=0.03, max_iter=10, verbose=False)):
        xa = attack.generate(x, y=y)
        _check_box(xa, x, EPS, 0.0, 1.0)
        adv = t.task.metrics(t.model(torch.from_numpy(xa)), t.y)["label_accuracy"].mean()
        assert adv < clean - 0.15, type(attack).__name__
    assert t.model.training is False


def test_multilabel_in_hounsfield_units_not_clipped_to_unit_range(trained_multilabel, hu):
    wrap, to_hu, bounds = hu
    t = trained_multilabel
    model = wrap(t.model)
    x = _np(to_hu(t.x))
    est = ARTClassifier(model, t.task, x.shape[1:], clip_values=bounds)
    eps = EPS * (bounds[1] - bounds[0])
    xa = ProjectedGradientDescent(est, eps=eps, eps_step=eps / 3, max_iter=10, verbose=False).generate(x, y=_np(t.y))
    _check_box(xa, x, eps, *bounds)
    assert xa.min() < -500 and xa.max() > 1.5  # data stayed in HU
    clean = t.task.metrics(t.model(t.x), t.y)["label_accuracy"].mean()
    assert t.task.metrics(model(torch.from_numpy(xa)), t.y)["label_accuracy"].mean() < clean - 0.15


def test_multiclass_jsma_and_deepfool(trained_multiclass):
    t = trained_multiclass
    est = ARTClassifier(t.model, MultiClass(), t.x.shape[1:], clip_values=(0.0, 1.0))
    x = _np(t.x)
    clean = (t.model(t.x).argmax(1) == t.y).float().mean()
    assert clean > 0.8
    for attack in (SaliencyMapMethod(est, theta=1.0, gamma=0.2, verbose=False),
                   DeepFool(est, max_iter=20, verbose=False)):
        xa = attack.generate(x)
        assert xa.shape == x.shape and xa.min() >= 0 and xa.max() <= 1
        acc = (t.model(torch.from_numpy(xa)).argmax(1) == t.y).float().mean()
        assert acc < clean - 0.3, type(attack).__name__


# --- segmentation --------------------------------------------------------------------------------------------
def test_segmentation_3d_hu_with_preprocessing_dice_drops(trained_seg3d, hu):
    _, to_hu, bounds = hu
    t = trained_seg3d
    x = _np(to_hu(t.x))
    grads = [p.grad.clone() for p in t.model.parameters()]  # left over from training: must stay untouched
    # ART's preprocessing in HU maps the CT range onto the [0, 1] the UNet was trained on
    est = ARTSegmenter(t.model, t.task, x.shape[1:], clip_values=bounds,
                       preprocessing=(bounds[0], bounds[1] - bounds[0]))
    assert np.allclose(est.predict(x), _np(t.model(t.x)), atol=1e-4)
    eps = 0.15 * (bounds[1] - bounds[0])
    clean = t.task.metrics(t.model(t.x), t.y)["mean_dice"].mean()
    kw = dict(eps=eps, eps_step=eps / 4, max_iter=6, verbose=False)
    for attack, y in ((FastGradientMethod(est, eps=eps), _np(t.y)),
                      (ProjectedGradientDescent(est, num_random_init=0, **kw), _np(t.y)),
                      (BasicIterativeMethod(est, **kw), None)):  # y=None: ART passes the score map
        xa = attack.generate(x, y=y)
        _check_box(xa, x, eps, *bounds)
        logits = torch.from_numpy(est.predict(xa))
        assert logits.shape == (x.shape[0], 3, *x.shape[2:])
        assert t.task.metrics(logits, t.y)["mean_dice"].mean() < clean - 0.1, type(attack).__name__
    assert t.model.training is False
    assert all(torch.equal(p.grad, g) for p, g in zip(t.model.parameters(), grads, strict=True))


def test_segmentation_2d_multichannel_and_dice_loss(trained_seg2d):
    t = trained_seg2d
    task = Segmentation(3, loss="dice")
    est = ARTSegmenter(t.model, task, t.x.shape[1:], clip_values=(0.0, 1.0))
    x = _np(t.x)
    g = est.loss_gradient(x, _np(t.y))
    assert g.shape == x.shape and np.abs(g).sum() > 0
    tg = est.loss_gradient(t.x, t.y)  # torch in, torch out (for torch-native attacks)
    assert isinstance(tg, torch.Tensor) and torch.allclose(tg, torch.from_numpy(g), atol=1e-6)
    xa = ProjectedGradientDescent(est, eps=EPS, eps_step=0.03, max_iter=8, num_random_init=0,
                                  verbose=False).generate(x, y=_np(t.y))
    _check_box(xa, x, EPS, 0.0, 1.0)
    assert (est.compute_loss(xa, _np(t.y)) > est.compute_loss(x, _np(t.y))).all()
    # targeted: ART descends the task loss towards a target label map (here: background everywhere)
    target = np.zeros_like(_np(t.y))
    xt = ProjectedGradientDescent(est, eps=0.3, eps_step=0.05, max_iter=10, num_random_init=0, targeted=True,
                                  verbose=False).generate(x, y=target)
    _check_box(xt, x, 0.3, 0.0, 1.0)
    organ = _np(t.y) > 0
    assert (est.predict(xt).argmax(1) == 0)[organ].mean() > (est.predict(x).argmax(1) == 0)[organ].mean() + 0.1


@pytest.mark.parametrize("net", ["segresnet", "unetr"])
def test_monai_3d_nets_run_art_attacks(net):
    from monai.networks.nets import UNETR, SegResNet

    torch.manual_seed(0)
    if net == "segresnet":
        model = SegResNet(spatial_dims=3, init_filters=4, in_channels=1, out_channels=2, blocks_down=(1, 1, 1),
                          blocks_up=(1, 1), norm=("GROUP", {"num_groups": 2}))
    else:
        model = UNETR(in_channels=1, out_channels=2, img_size=16, feature_size=4, hidden_size=32, mlp_dim=64,
                      num_heads=2)
    model.eval()
    est = ARTSegmenter(model, Segmentation(2), (1, 16, 16, 16), clip_values=(0.0, 1.0))
    x = np.random.default_rng(0).random((1, 1, 16, 16, 16), dtype=np.float32)
    y = est.predict(x).argmax(1)
    for attack in (FastGradientMethod(est, eps=0.05),
                   ProjectedGradientDescent(est, eps=0.05, eps_step=0.02, max_iter=2, num_random_init=0,
                                            verbose=False)):
        xa = attack.generate(x, y=y)
        _check_box(xa, x, 0.05, 0.0, 1.0)
        assert est.compute_loss(xa, y)[0] > est.compute_loss(x, y)[0]
    # the last sub-module of both nets is the output convolution: its activations are the logits
    assert np.allclose(est.get_activations(x, len(est.layer_names) - 1), est.predict(x), atol=1e-5)


# --- adversarial training ----------------------------------------------------------------------------------
def test_art_adversarial_trainer_through_both_estimators(trained_multilabel, trained_seg3d):
    for fixture, make in ((trained_multilabel, lambda: small_cnn(1, 4, width=8)),
                          (trained_seg3d, lambda: small_unet(1, 3, ndim=3, channels=(8, 16)))):
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x, y = _np(fixture.x), _np(fixture.y)
        if isinstance(fixture.task, Segmentation):
            est = ARTSegmenter(model, fixture.task, x.shape[1:], clip_values=(0.0, 1.0), optimizer=opt)
        else:
            est = ARTClassifier(model, fixture.task, x.shape[1:], clip_values=(0.0, 1.0), optimizer=opt)
        pgd = ProjectedGradientDescent(est, eps=0.05, eps_step=0.02, max_iter=2, num_random_init=0, verbose=False)
        before = copy.deepcopy(model.state_dict())
        with torch.no_grad():
            loss0 = float(fixture.task.loss(model.eval()(fixture.x), fixture.task.to_target(fixture.y, fixture.x)).mean())
        AdversarialTrainer(est, pgd, ratio=0.5).fit(x, y, nb_epochs=4, batch_size=16)
        assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
        with torch.no_grad():
            loss1 = float(fixture.task.loss(model.eval()(fixture.x), fixture.task.to_target(fixture.y, fixture.x)).mean())
        assert loss1 < loss0


# --- bad input ---------------------------------------------------------------------------------------------
def test_estimators_reject_bad_arguments(trained_seg3d, trained_multilabel):
    with pytest.raises(TypeError, match="task"):
        ARTClassifier(trained_seg3d.model, trained_seg3d.task, (1, 16, 16, 16), clip_values=(0.0, 1.0))
    with pytest.raises(TypeError, match="task"):
        ARTSegmenter(trained_multilabel.model, MultiLabel(), (1, 16, 16), clip_values=(0.0, 1.0))
    with pytest.raises(ValueError, match="input_shape"):
        ARTSegmenter(trained_seg3d.model, trained_seg3d.task, (16,), clip_values=(0.0, 1.0))
    est = ARTSegmenter(trained_seg3d.model, trained_seg3d.task, (1, 16, 16, 16), clip_values=(0.0, 1.0))
    x = _np(trained_seg3d.x)
    with pytest.raises(ValueError, match="optimizer"):
        est.fit(x, _np(trained_seg3d.y))
    with pytest.raises(ValueError, match="`y`"):
        est.loss_gradient(x, np.zeros((x.shape[0], 8, 8, 8)))
    with pytest.raises(ValueError, match="`x`"):
        est.predict(x[:, :, :8])
    x_copy = x.copy()
    est.loss_gradient(x, _np(trained_seg3d.y))
    assert np.array_equal(x, x_copy)


# --- refusals and safe habits (issue 9) ----------------------------------------------------------------------
class _Count:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(lambda *_: setattr(self, "n", self.n + 1))


def test_multilabel_generate_without_y_is_refused_before_any_model_call(trained_multilabel):
    t = trained_multilabel
    est = ARTClassifier(t.model, t.task, t.x.shape[1:], clip_values=(0.0, 1.0))
    x = _np(t.x[:4])
    count = _Count(t.model)
    for attack in (FastGradientMethod(est, eps=EPS),
                   ProjectedGradientDescent(est, eps=EPS, eps_step=0.03, max_iter=2, verbose=False)):
        with pytest.raises(UnsupportedAttackError, match=r"generate\(x\) without y .*y=clf.predict_labels\(x\)"):
            attack.generate(x)
    assert count.n == 0
    count.handle.remove()
    with pytest.raises(ValueError, match=r"multi-hot of shape \(N, 4\)"):
        FastGradientMethod(est, eps=EPS).generate(x, y=_np(t.y[:4]).argmax(1))
    # the multi-hot prediction is the documented replacement, and it attacks every label
    xa = ProjectedGradientDescent(est, eps=EPS, eps_step=0.03, max_iter=5, verbose=False).generate(
        x, y=est.predict_labels(x))
    assert (est.predict_labels(xa) != est.predict_labels(x)).any()


@pytest.mark.parametrize("which", ["classifier", "segmenter"])
def test_inputs_outside_clip_values_are_refused(which, trained_multilabel, trained_seg2d):
    t = trained_multilabel if which == "classifier" else trained_seg2d
    make = ARTClassifier if which == "classifier" else ARTSegmenter
    est = make(t.model, t.task, t.x.shape[1:], clip_values=(0.0, 1.0))
    x = _np(t.x[:2]) * 255.0  # 8-bit intensities, box in [0, 1]
    count = _Count(t.model)
    with pytest.raises(ValueError, match=r"outside the estimator's clip_values \(0, 1\)"):
        FastGradientMethod(est, eps=EPS).generate(x, y=_np(t.y[:2]))
    assert count.n == 0
    count.handle.remove()


def test_float64_queries_and_nb_classes(trained_multiclass, trained_seg3d):
    t = trained_multiclass
    est = ARTClassifier(t.model, MultiClass(), t.x.shape[1:], clip_values=(0.0, 1.0))
    x64 = _np(t.x[:2]).astype(np.float64)  # what ART's decision-based attacks query with
    assert np.allclose(est.predict(x64), _np(t.model(t.x[:2])), atol=1e-5)
    assert est.loss_gradient(x64, np.eye(4)[_np(t.y[:2])]).dtype == np.float32
    seg = ARTSegmenter(trained_seg3d.model, trained_seg3d.task, (1, 16, 16, 16), clip_values=(0.0, 1.0))
    assert seg.nb_classes == 3


def test_parameter_settings_with_arg_max_logic_are_refused_when_constructed(trained_multilabel, trained_seg2d,
                                                                           trained_multiclass):
    ml = ARTClassifier(trained_multilabel.model, trained_multilabel.task, (1, 16, 16), clip_values=(0.0, 1.0))
    seg = ARTSegmenter(trained_seg2d.model, trained_seg2d.task, (2, 32, 32), clip_values=(0.0, 1.0))
    with pytest.raises(UnsupportedAttackError, match=r"ProjectedGradientDescent\(num_random_init=3\) .*arg-max"):
        ProjectedGradientDescent(ml, eps=EPS, num_random_init=3)
    with pytest.raises(UnsupportedAttackError, match=r"FastGradientMethod\(minimal=True\)"):
        FastGradientMethod(ml, eps=EPS, minimal=True)
    with pytest.raises(UnsupportedAttackError, match=r"SquareAttack\(default adv_criterion/loss\).*margin_loss"):
        SquareAttack(ml, eps=EPS)
    with pytest.raises(UnsupportedAttackError, match=r"ProjectedGradientDescent\(num_random_init=1\).*pass "
                                                     r"num_random_init=0"):
        ProjectedGradientDescent(seg, eps=EPS, num_random_init=1)
    # ART's Madry trainer defaults to a random start: the message says what to pass, at construction
    with pytest.raises(UnsupportedAttackError, match=r"AdversarialTrainerMadryPGD\(num_random_init=1\)"):
        AdversarialTrainerMadryPGD(seg, eps=EPS, eps_step=0.05, max_iter=2)
    AdversarialTrainerMadryPGD(seg, eps=EPS, eps_step=0.05, max_iter=2, num_random_init=0)
    mc = ARTClassifier(trained_multiclass.model, MultiClass(), (1, 16, 16), clip_values=(0.0, 1.0),
                       optimizer=torch.optim.SGD(trained_multiclass.model.parameters(), lr=0.0))
    with pytest.raises(UnsupportedAttackError, match=r"AdversarialTrainerFBFPyTorch\(an nn.Sequential model\)"):
        AdversarialTrainerFBFPyTorch(mc, eps=EPS).fit(_np(trained_multiclass.x[:4]),
                                                      np.eye(4)[_np(trained_multiclass.y[:4])], nb_epochs=1)


def test_label_powerset_view(trained_multilabel):
    t = trained_multilabel
    est = ARTClassifier(t.model, t.task, t.x.shape[1:], clip_values=(0.0, 1.0))
    view = est.label_powerset()
    assert view.nb_classes == 16
    labels = _np(t.y[:8])
    assert np.array_equal(view.decode(view.encode(labels)), labels)
    x = _np(t.x[:4])
    assert np.array_equal(view.decode(view.predict(x)), est.predict_labels(x))
    with pytest.raises(UnsupportedAttackError, match=r"HopSkipJump .* run it on clf.label_powerset\(\)"):
        HopSkipJump(est)
    with pytest.raises(UnsupportedAttackError, match="only serves decision-based attacks"):
        FastGradientMethod(view, eps=EPS).generate(x)
    with pytest.raises(ValueError, match=r"y=view.encode\(labels\)"):
        HopSkipJump(view, verbose=False).generate(x, y=labels[:4])
