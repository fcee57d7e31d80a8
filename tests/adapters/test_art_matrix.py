"""The ART support matrix as a test: every evasion attack ART exports, on every task kind, is either ok (ART's own
attack, called as an ART user would, stays in the box and inside ε and lowers the task metric or reaches its
target) or refused with a clear message before the model is called.

The attack classes are discovered from ``art.attacks.evasion`` at test time: an ART update that adds one fails
``test_every_exported_attack_is_classified`` until it is classified in ``adapters/art_support.py``.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import art.attacks.evasion as evasion
import art.defences.trainer as trainers
import art.metrics as metrics
import numpy as np
import pytest
import torch
from art.attacks.attack import EvasionAttack

from medadv.adapters.art import (
    EXCLUDED,
    EXCLUDED_TRAINERS_AND_METRICS,
    SUPPORT,
    TRAINERS_AND_METRICS,
    ARTClassifier,
    ARTSegmenter,
    UnsupportedAttackError,
)
from medadv.adapters.support import TASK_KINDS

warnings.filterwarnings("ignore", module="art")

HU = (-1024.0, 3071.0)  # CT in Hounsfield units (as tests/adapters/conftest.py)


class HUModel(torch.nn.Module):
    """A model trained on [0, 1] inputs, fed CT-like data in HU."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - HU[0]) / (HU[1] - HU[0]))


EXPORTED = sorted(n for n, c in vars(evasion).items() if inspect.isclass(c) and issubclass(c, EvasionAttack))


def test_every_exported_attack_is_classified():
    assert set(EXPORTED) == set(SUPPORT) | set(EXCLUDED), (
        f"unclassified: {sorted(set(EXPORTED) - set(SUPPORT) - set(EXCLUDED))}, "
        f"stale: {sorted(set(SUPPORT) | set(EXCLUDED) - set(EXPORTED))}")
    assert not set(SUPPORT) & set(EXCLUDED)
    for table in (SUPPORT, TRAINERS_AND_METRICS):
        for name, row in table.items():
            assert set(row) == set(TASK_KINDS), name
            for cell in row.values():
                assert cell.status == "ok" or ("use" in cell.reason and len(cell.reason) > 40), name


# --- the four models -----------------------------------------------------------------------------------------
@dataclass
class Case:
    kind: str
    est: Any
    model: torch.nn.Module
    x: np.ndarray
    y: np.ndarray            # labels as an ART user passes them (one-hot, multi-hot, label map)
    metric: Callable[[np.ndarray], float]
    target: np.ndarray | None  # a target for targeted attacks (classifiers)
    target_metric: Callable[[np.ndarray], float] | None
    lo: float
    hi: float

    @property
    def r(self) -> float:
        return self.hi - self.lo


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _logits(model: torch.nn.Module, x: np.ndarray) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(x, dtype=np.float32)))


@pytest.fixture(scope="module")
def cases(trained_multiclass, trained_multilabel, trained_seg2d, trained_seg3d):
    out = {}
    t = trained_multiclass
    x, yi = _np(t.x[:4]), t.y[:4]
    tgt = (yi + 1) % 4
    est = ARTClassifier(t.model, t.task, x.shape[1:], clip_values=(0.0, 1.0))
    out["multiclass"] = Case(
        "multiclass", est, t.model, x, np.eye(4, dtype=np.float32)[_np(yi)],
        lambda xa, sl=slice(None), m=t.model, yi=yi: float((_logits(m, xa).argmax(1) == yi[sl]).float().mean()),
        np.eye(4, dtype=np.float32)[_np(tgt)],
        lambda xa, sl=slice(None), m=t.model, tg=tgt: float((_logits(m, xa).argmax(1) == tg[sl]).float().mean()), 0.0, 1.0)
    t = trained_multilabel
    x, y = _np(t.x[:4]), t.y[:4]
    est = ARTClassifier(t.model, t.task, x.shape[1:], clip_values=(0.0, 1.0))
    target = 1.0 - y
    out["multilabel"] = Case(
        "multilabel", est, t.model, x, _np(y),
        lambda xa, sl=slice(None), t=t, y=y: float(
            t.task.metrics(_logits(t.model, xa), y[sl])["label_accuracy"].mean()),
        _np(target),
        lambda xa, sl=slice(None), t=t, g=target: float(
            t.task.metrics(_logits(t.model, xa), g[sl])["label_accuracy"].mean()),
        0.0, 1.0)
    t = trained_seg2d
    x, y = _np(t.x[:2]), t.y[:2]
    est = ARTSegmenter(t.model, t.task, x.shape[1:], clip_values=(0.0, 1.0))
    out["seg2d"] = Case("seg2d", est, t.model, x, _np(y),
                        lambda xa, sl=slice(None), t=t, y=y: float(t.task.metrics(_logits(t.model, xa), y[sl])["mean_dice"].mean()),
                        None, None, 0.0, 1.0)
    t = trained_seg3d  # CT-like data in Hounsfield units, the model sees HU
    model = HUModel(t.model).eval()
    x, y = _np(t.x[:2] * (HU[1] - HU[0]) + HU[0]), t.y[:2]
    est = ARTSegmenter(model, t.task, x.shape[1:], clip_values=HU)
    out["seg3d"] = Case("seg3d", est, model, x, _np(y),
                        lambda xa, sl=slice(None), t=t, m=model, y=y: float(
                            t.task.metrics(_logits(m, xa), y[sl])["mean_dice"].mean()),
                        None, None, *HU)
    return out


# --- how an ART user calls each attack (tiny budgets; ε relative to the data range r) ---------------------------
def _pgd_kw(r: float) -> dict:
    return dict(eps=0.2 * r, eps_step=0.05 * r, max_iter=5, verbose=False)


#: attack -> (constructor kwargs(case), ε bound or None, how success is judged: "metric" | "target")
CTOR: dict[str, Callable[[Case], dict]] = {
    "FastGradientMethod": lambda c: dict(eps=0.2 * c.r),
    "ProjectedGradientDescent": lambda c: _pgd_kw(c.r),
    "ProjectedGradientDescentNumpy": lambda c: _pgd_kw(c.r),
    "ProjectedGradientDescentPyTorch": lambda c: _pgd_kw(c.r),
    "BasicIterativeMethod": lambda c: _pgd_kw(c.r),
    "MomentumIterativeMethod": lambda c: _pgd_kw(c.r),
    "AutoProjectedGradientDescent": lambda c: dict(_pgd_kw(c.r), max_iter=10, nb_random_init=1),
    "AutoConjugateGradient": lambda c: dict(_pgd_kw(c.r), max_iter=10, nb_random_init=1),
    "RescalingAutoConjugateGradient": lambda c: dict(_pgd_kw(c.r), max_iter=10, nb_random_init=1),
    "AutoAttack": lambda c: dict(eps=0.2 * c.r, eps_step=0.05 * c.r),
    "ShadowAttack": lambda c: dict(nb_steps=30, batch_size=8, learning_rate=0.5, verbose=False),
    "Wasserstein": lambda c: dict(max_iter=5, eps_iter=2, conjugate_sinkhorn_max_iter=20,
                                  projected_sinkhorn_max_iter=20, verbose=False),
    "VirtualAdversarialMethod": lambda c: dict(max_iter=2, eps=0.2, verbose=False),
    "DeepFool": lambda c: dict(max_iter=10, verbose=False),
    "NewtonFool": lambda c: dict(max_iter=5, eta=0.5, verbose=False),
    "CarliniL0Method": lambda c: dict(max_iter=10, binary_search_steps=1, learning_rate=0.1, initial_const=5.0,
                                      verbose=False),
    "CarliniL2Method": lambda c: dict(max_iter=10, binary_search_steps=1, learning_rate=0.1, initial_const=5.0,
                                      verbose=False),
    "CarliniLInfMethod": lambda c: dict(max_iter=3, learning_rate=0.1, initial_const=1.0, verbose=False),
    "ElasticNet": lambda c: dict(max_iter=10, binary_search_steps=1, learning_rate=0.1, initial_const=5.0,
                                 verbose=False),
    "SaliencyMapMethod": lambda c: dict(theta=1.0, gamma=0.3, verbose=False),
    "SquareAttack": lambda c: dict(eps=0.2 * c.r, max_iter=10, verbose=False, **(
        {} if c.kind == "multiclass" else dict(adv_criterion=c.est.adversarial_criterion, loss=c.est.margin_loss))),
    "BoundaryAttack": lambda c: dict(targeted=False, max_iter=10, num_trial=5, sample_size=5, init_size=20,
                                     verbose=False),
    "HopSkipJump": lambda c: dict(max_iter=2, max_eval=50, init_eval=10, init_size=20, verbose=False),
    "GeoDA": lambda c: dict(max_iter=400, sub_dim=4, verbose=False),
    "SignOPTAttack": lambda c: dict(targeted=False, max_iter=2, query_limit=100, num_trial=2, k=2),
    "SimBA": lambda c: dict(max_iter=50, attack="px", epsilon=0.2, verbose=False),
    "ZooAttack": lambda c: dict(max_iter=10, nb_parallel=64, use_resize=False, use_importance=False,
                                learning_rate=0.1, initial_const=1.0, verbose=False),
    "PixelAttack": lambda c: dict(th=10, max_iter=2),
    "ThresholdAttack": lambda c: dict(th=10, max_iter=2),
    "UniversalPerturbation": lambda c: dict(max_iter=2, eps=0.3 * c.r, attacker="fgsm", verbose=False),
    "TargetedUniversalPerturbation": lambda c: dict(max_iter=2, eps=0.3 * c.r),
    "SpatialTransformation": lambda c: dict(max_translation=20.0, num_translations=2, max_rotation=20.0,
                                            num_rotations=2, verbose=False),
    "AdversarialPatch": lambda c: dict(max_iter=30, patch_shape=c.x.shape[1:], learning_rate=2.0, scale_min=0.4,
                                       scale_max=0.6, rotation_max=0.0, verbose=False),
    "AdversarialPatchPyTorch": lambda c: dict(max_iter=30, patch_shape=c.x.shape[1:], learning_rate=2.0,
                                              scale_min=0.4, scale_max=0.6, rotation_max=0.0, verbose=False),
    "AdversarialPatchNumpy": lambda c: dict(max_iter=5, verbose=False),
    "FeatureAdversariesPyTorch": lambda c: dict(delta=0.2 * c.r, layer=-1, max_iter=10, step_size=0.05 * c.r,
                                                verbose=False),
    "FeatureAdversariesNumpy": lambda c: dict(delta=0.2 * c.r, layer=-1),
    "CompositeAdversarialAttackPyTorch": lambda c: dict(max_iter=2, max_inner_iter=2, verbose=False),
    "LaserAttack": lambda c: dict(iterations=2, laser_generator=None),
    "GRAPHITEBlackbox": lambda c: dict(noise_size=c.x.shape[-2:], net_size=c.x.shape[-2:], num_xforms_mask=2,
                                       num_xforms_boost=2, num_boost_queries=20),
    "GRAPHITEWhiteboxPyTorch": lambda c: dict(net_size=c.x.shape[-2:], num_xforms=2, steps=2, first_steps=2),
}
#: attacks bounded by ε (L∞ unless noted), as ``ctor kwarg name``
EPS_BOUNDED = {"FastGradientMethod": "eps", "ProjectedGradientDescent": "eps", "ProjectedGradientDescentNumpy": "eps",
               "ProjectedGradientDescentPyTorch": "eps", "BasicIterativeMethod": "eps",
               "MomentumIterativeMethod": "eps", "AutoProjectedGradientDescent": "eps",
               "AutoConjugateGradient": "eps", "RescalingAutoConjugateGradient": "eps", "SquareAttack": "eps",
               "FeatureAdversariesPyTorch": "delta"}
#: targeted attacks: ``y`` is the target; success = the target reached more often (JSMA), or, for the patches
#: (a universal patch on a 16x16 image, 30 steps), the true class lost
TARGETED = {"SaliencyMapMethod", "AdversarialPatch", "AdversarialPatchPyTorch"}
REACHES_TARGET = {"SaliencyMapMethod"}
#: ``y`` is something other than labels
GUIDES = {"FeatureAdversariesPyTorch", "FeatureAdversariesNumpy"}
#: attacks run on fewer samples (ART's Shadow takes one image per call; query-hungry decision attacks two)
FEW_SAMPLES = {"ShadowAttack": 1, "SignOPTAttack": 2, "BoundaryAttack": 2, "HopSkipJump": 2, "ZooAttack": 2,
               "CarliniL0Method": 2, "CarliniL2Method": 2, "CarliniLInfMethod": 2, "ElasticNet": 2, "NewtonFool": 2,
               "PixelAttack": 2, "Wasserstein": 2}
#: Shadow drives a multi-class image to one class (2 for this model): use an image of another class
SAMPLE_FROM = {"ShadowAttack": 1}


class _Forwards:
    """Counts forward passes of the model (hook added after setup)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.n = 0
        self.handle = model.register_forward_hook(self)

    def __call__(self, *_: Any) -> None:
        self.n += 1


def _generate(name: str, c: Case, est: Any) -> np.ndarray:
    attack = getattr(evasion, name)(est, **CTOR[name](c))
    x, y = c.x, c.y
    if name in GUIDES:
        y = np.roll(c.x, 1, axis=0)  # guide: another sample's features
    elif name in TARGETED:
        y = c.target
    sl = slice(SAMPLE_FROM.get(name, 0), SAMPLE_FROM.get(name, 0) + FEW_SAMPLES.get(name, len(x)))
    x, y = x[sl], y[sl]
    if c.kind == "multilabel" and hasattr(est, "encode"):
        y = est.encode(y)  # label-set classes
    out = attack.generate(x, y=y)
    if name.startswith("AdversarialPatch"):
        patch, _ = out
        out = attack.apply_patch(x, scale=0.5)
    return out


CELLS = [(a, k) for a in sorted(SUPPORT) for k in TASK_KINDS]


@pytest.mark.parametrize(("attack", "kind"), CELLS, ids=[f"{a}-{k}" for a, k in CELLS])
def test_cell(attack, kind, cases):
    c = cases[kind]
    cell = SUPPORT[attack][kind]
    np.random.seed(0)
    torch.manual_seed(0)
    if cell.status == "refused":
        forwards = _Forwards(c.model)
        try:
            with pytest.raises(UnsupportedAttackError) as err:
                _generate(attack, c, c.est)
        finally:
            forwards.handle.remove()
        message = str(err.value)
        assert f"ART {attack}" in message and "use" in message.split(":", 1)[1], message
        assert forwards.n == 0, f"the model ran {forwards.n} times before the refusal"
        return
    est = c.est.label_powerset() if "label_powerset" in cell.note else c.est
    first = SAMPLE_FROM.get(attack, 0)
    sl = slice(first, first + FEW_SAMPLES.get(attack, len(c.x)))
    x = c.x[sl]
    x_adv = np.asarray(_generate(attack, c, est))
    assert x_adv.shape == x.shape and np.isfinite(x_adv).all()
    assert x_adv.min() >= c.lo and x_adv.max() <= c.hi, (x_adv.min(), x_adv.max())
    if attack in EPS_BOUNDED:
        eps = CTOR[attack](c)[EPS_BOUNDED[attack]]
        assert np.abs(x_adv - x).max() <= eps * (1 + 1e-5) + 1e-6
    if attack in REACHES_TARGET:
        assert c.target_metric(x_adv, sl) > c.target_metric(x, sl) + 0.2
    else:
        drop = 0.1 if c.kind != "multilabel" else 0.05
        assert c.metric(x_adv, sl) < c.metric(x, sl) - drop, (c.metric(x_adv, sl), c.metric(x, sl))


# --- trainers and metrics ---------------------------------------------------------------------------------------
def _fresh(c: Case) -> tuple[torch.nn.Module, Any]:
    """A trainable copy of the case's model behind a new estimator (with an optimiser)."""
    model = copy.deepcopy(c.model).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    if isinstance(c.est, ARTSegmenter):
        return model, ARTSegmenter(model, c.est.task, c.x.shape[1:], clip_values=(c.lo, c.hi), optimizer=opt)
    return model, ARTClassifier(model, c.est.task, c.x.shape[1:], clip_values=(c.lo, c.hi), optimizer=opt)


def _pgd(c: Case, est: Any) -> Any:
    return evasion.ProjectedGradientDescent(est, eps=0.1 * c.r, eps_step=0.05 * c.r, max_iter=2, verbose=False)


TRAIN: dict[str, Callable[[Case, Any], Any]] = {
    "AdversarialTrainer": lambda c, est: trainers.AdversarialTrainer(est, _pgd(c, est), ratio=1.0).fit(
        c.x, c.y, nb_epochs=4, batch_size=4),
    "AdversarialTrainerMadryPGD": lambda c, est: trainers.AdversarialTrainerMadryPGD(
        est, nb_epochs=4, batch_size=4, eps=0.1 * c.r, eps_step=0.05 * c.r, max_iter=2,
        num_random_init=0 if c.kind.startswith("seg") else 1).fit(c.x, c.y),
    "AdversarialTrainerFBFPyTorch": lambda c, est: trainers.AdversarialTrainerFBFPyTorch(est, eps=0.1 * c.r).fit(
        c.x, c.y, nb_epochs=4, batch_size=4),
    "AdversarialTrainerTRADESPyTorch": lambda c, est: trainers.AdversarialTrainerTRADESPyTorch(
        est, _pgd(c, est), beta=1.0).fit(c.x, c.y, nb_epochs=4, batch_size=4),
    "AdversarialTrainerAWPPyTorch": lambda c, est: trainers.AdversarialTrainerAWPPyTorch(
        est, _fresh(c)[1], _pgd(c, est), mode="PGD", gamma=0.01, beta=1.0, warmup=0).fit(
        c.x, c.y, nb_epochs=4, batch_size=4),
    "AdversarialTrainerOAATPyTorch": lambda c, est: trainers.AdversarialTrainerOAATPyTorch(
        est, _fresh(c)[1], _fresh(c)[1], [], _pgd(c, est),
        {"list_swa_epoch": [], "list_swa_tau": [], "beta": 1.0}).fit(c.x, c.y, nb_epochs=1, batch_size=4),
}
METRIC: dict[str, Callable[[Case, Any], Any]] = {
    "empirical_robustness": lambda c, est: metrics.empirical_robustness(est, c.x, "fgsm", {"eps": 0.2 * c.r}),
    "adversarial_accuracy": lambda c, est: metrics.adversarial_accuracy(
        est, c.x, c.y, attack_name="fgsm", attack_params={"eps": 0.2 * c.r}),
    "clever": lambda c, est: metrics.clever(est, c.x[0], nb_batches=2, batch_size=5, radius=0.3 * c.r, norm=2,
                                            verbose=False),
    "clever_u": lambda c, est: metrics.clever_u(est, c.x[0], nb_batches=2, batch_size=5, radius=0.3 * c.r, norm=2,
                                                verbose=False),
    "clever_t": lambda c, est: metrics.clever_t(est, c.x[0], 1, nb_batches=2, batch_size=5, radius=0.3 * c.r,
                                                norm=2),
    "loss_sensitivity": lambda c, est: metrics.loss_sensitivity(est, c.x, c.y),
    "loss_gradient_check": lambda c, est: metrics.loss_gradient_check(est, c.x, c.y, verbose=False),
}


#: metrics that build their attack with ART's get_crafter
GET_CRAFTER = {"empirical_robustness", "adversarial_accuracy"}


class _Plain(torch.nn.Module):
    """The model behind a plain module (ART's FBF / TRADES trainers misread nn.Sequential outputs)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def _adv_loss(c: Case, model: torch.nn.Module, x_adv: np.ndarray) -> float:
    logits = _logits(model.eval(), x_adv)
    y = torch.from_numpy(c.y)
    if c.kind == "multiclass":
        y = y.argmax(1)
    elif c.kind.startswith("seg"):
        y = y.long()
    return float(c.est.task.loss(logits, y).mean())


TOOL_CELLS = [(a, k) for a in sorted(TRAINERS_AND_METRICS) for k in TASK_KINDS]


def test_every_exported_trainer_and_metric_is_classified():
    exported = {n for n, c in vars(trainers).items() if inspect.isclass(c) and issubclass(c, trainers.Trainer)
                and c is not trainers.Trainer}
    exported |= {n for n, f in vars(metrics).items() if inspect.isfunction(f)}
    assert exported == set(TRAINERS_AND_METRICS) | set(EXCLUDED_TRAINERS_AND_METRICS)
    assert set(TRAINERS_AND_METRICS) == set(TRAIN) | set(METRIC)


@pytest.mark.parametrize(("name", "kind"), TOOL_CELLS, ids=[f"{a}-{k}" for a, k in TOOL_CELLS])
def test_trainer_or_metric_cell(name, kind, cases):
    c = cases[kind]
    cell = TRAINERS_AND_METRICS[name][kind]
    call = TRAIN.get(name) or METRIC[name]
    np.random.seed(0)
    torch.manual_seed(0)
    model, est = _fresh(c) if name in TRAIN else (c.model, c.est)
    if cell.status == "refused":
        forwards = _Forwards(model)
        try:
            with pytest.raises((UnsupportedAttackError, NotImplementedError)) as err:
                call(c, est)
        finally:
            forwards.handle.remove()
        error = err.value
        if isinstance(error, NotImplementedError):
            # ART's get_crafter re-raises whatever stops the attack it builds as "crafting method not supported";
            # the refusal is the error it was handling (shown first in the traceback)
            assert name in GET_CRAFTER and c.kind.startswith("seg"), error
            error = error.__context__
            assert isinstance(error, UnsupportedAttackError), error
        message = str(error)
        assert f"ART {name}" in message and "use" in message.split(":", 1)[1], message
        assert forwards.n == 0, f"the model ran {forwards.n} times before the refusal"
        return
    if name in METRIC:
        value = np.asarray(call(c, est), dtype=np.float64)
        assert np.isfinite(value).all()
        if name == "loss_sensitivity":  # the mean L2 norm of the task-loss gradient
            grads = c.est.loss_gradient(c.x, c.y).reshape(len(c.x), -1)
            assert value > 0 and np.isclose(value, np.linalg.norm(grads, axis=1).mean(), rtol=1e-4)
        elif name == "loss_gradient_check":  # no zero / NaN / inf gradients
            assert value.shape == (len(c.x), 3) and not value.any()
        elif name == "adversarial_accuracy":
            assert value < 1.0
        else:
            assert (value > 0).all()
        return
    if "nn.Sequential" in cell.note:
        model = _Plain(model)
        est = ARTClassifier(model, c.est.task, c.x.shape[1:], clip_values=(c.lo, c.hi),
                            optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))
    x_adv = evasion.ProjectedGradientDescent(_fresh(c)[1], eps=0.1 * c.r, eps_step=0.05 * c.r, max_iter=2,
                                             verbose=False).generate(c.x, y=c.y)
    before = _adv_loss(c, model, x_adv)
    call(c, est)
    after = _adv_loss(c, model, x_adv)
    assert np.isfinite(after) and after < before, (before, after)
