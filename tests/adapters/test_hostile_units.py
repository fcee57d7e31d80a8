"""Budgets in the wrong units, through every toolkit adapter and randomized smoothing (issue 28, item 4).

The cases are generated, not listed: every attack (and ART trainer) a toolkit exports that takes a budget -- read
from the adapter's support table and the toolkit's own constructor signatures, run on every task kind where the
table says ``ok`` -- times the two unit mistakes, plus every randomized-smoothing task family times the ``sigma``
mistakes:

* **too large**: a budget on the 0-255 scale given for data in [0, 1] (``FastGradientMethod(clf, eps=8)``,
  ``epsilons=8``), or torchattacks' ``eps=8`` meant as 8 HU (it is a fraction of the range there), or
  ``sigma=25`` on [0, 1] data: refused before any model call with one line naming the argument and the box
  (``allow_large_budgets=True`` lets it through);
* **too small**: a [0, 1]-scale budget given for CT in HU (``eps=4/255`` moves no voxel by more than 0.016 HU),
  or torchattacks' ``eps=w.unit_eps(4/255)``: a :class:`~medadv.threats.SmallBudgetWarning` naming the argument
  and the box, raised before the attack's work (the tests turn it into an error to stop there).

The rule is medadv's own (:func:`medadv.threats.check_budget_scale`, the one ``Linf`` uses).
"""

from __future__ import annotations

import inspect
import math
import warnings

import foolbox as fb
import numpy as np
import pytest
import torch
import torchattacks
from art.attacks import evasion as art_evasion
from art.defences import trainer as art_trainer
from torch import nn

from medadv.adapters import art_support
from medadv.adapters import foolbox as mfb
from medadv.adapters.art import ARTClassifier, ARTSegmenter
from medadv.adapters.foolbox import TaskModel
from medadv.adapters.foolbox_support import SUPPORT as FOOLBOX_SUPPORT
from medadv.adapters.torchattacks import TorchattacksModel
from medadv.adapters.torchattacks_support import SUPPORT as TA_SUPPORT
from medadv.certify import FAMILIES, RandomizedSmoothing
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import LargeBudgetWarning, SmallBudgetWarning

UNIT, HU = (0.0, 1.0), (-1024.0, 3071.0)
SHAPE = (1, 8, 8)  # one input; L2 half-diagonal of the unit box: 0.5 * sqrt(64) = 4, L1: 32
D = math.prod(SHAPE)
#: a plausible [0, 1]-scale budget per norm: ×255 it is the "0-255 scale" mistake, given for HU data the
#: "[0, 1]-scale budget on CT" mistake
PLAUSIBLE = {math.inf: 8 / 255, 2.0: 0.5, 1.0: 1.0}
TASKS = {"multiclass": MultiClass(), "multilabel": MultiLabel(), "seg2d": Segmentation(3)}


class Net(nn.Module):
    """A tiny classifier or segmenter (not an ``nn.Sequential``: ART's FBF trainer refuses those)."""

    def __init__(self, seg: bool) -> None:
        super().__init__()
        self.seg = seg
        self.conv = nn.Conv2d(1, 3 if seg else 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.conv(x)
        return z if self.seg else z.mean(dim=(2, 3))


class HUNet(nn.Module):
    """The same network fed CT-like data in HU (the scaling to [0, 1] is part of the model)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - HU[0]) / (HU[1] - HU[0]))


def _model(kind: str, box: tuple[float, float]) -> tuple[nn.Module, list[int]]:
    """A model for ``kind`` in ``box`` units and the list its forward hook appends to (no call = no work)."""
    torch.manual_seed(0)
    net = Net(kind.startswith("seg"))
    model = (net if box == UNIT else HUNet(net)).eval()
    calls: list[int] = []
    net.register_forward_hook(lambda *_: calls.append(1))
    return model, calls


def _data(kind: str, box: tuple[float, float], n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = box[0] + torch.rand((n, *SHAPE), generator=g) * (box[1] - box[0])
    if kind == "multiclass":
        return x, torch.tensor([0, 1] * (n // 2))
    if kind == "multilabel":
        return x, torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]] * (n // 2))
    return x, torch.randint(0, 3, (n, *SHAPE[1:]), generator=g)


def _one_line(err: BaseException) -> str:
    msg = str(err)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


def _check_large(msg: str, toolkit: str, attack: str, arg: str, value: float) -> None:
    assert msg.startswith(f"{toolkit} {attack} {arg}={value:g} is more than half the "), msg
    assert "[0, 1]" in msg and "allow_large_budgets=True" in msg, msg


def _check_small(msg: str, toolkit: str, attack: str, arg: str, box: str) -> None:
    assert msg.startswith(f"{toolkit} {attack} {arg}=") and "is below 0.001 of the data range" in msg, msg
    assert box in msg, msg


# --- ART: every attack and trainer whose constructor takes `eps`, on every kind its cell is ok ------------------
def _art_class(name: str) -> type | None:
    return getattr(art_evasion, name, None) or getattr(art_trainer, name, None)


def _art_p(cls: type) -> float | None:
    """The L_p of the default ``norm`` (None: not an Lp ball, e.g. Wasserstein's, which has no data-unit scale)."""
    norm = inspect.signature(cls.__init__).parameters.get("norm")
    value = math.inf if norm is None else norm.default
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _art_cases() -> list[tuple[str, str]]:
    tables = {**art_support.SUPPORT, **art_support.TRAINERS_AND_METRICS}
    out = []
    for name, row in sorted(tables.items()):
        cls = _art_class(name)
        if not isinstance(cls, type) or "eps" not in inspect.signature(cls.__init__).parameters:
            continue
        if _art_p(cls) is None:
            continue
        out += [(name, kind) for kind in TASKS if row[kind].status == "ok"
                and "label_powerset" not in row[kind].note]
    return out


ART_CASES = _art_cases()


def _art_estimator(kind: str, box: tuple[float, float], **kw):
    model, calls = _model(kind, box)
    kw["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.0)  # ART's trainers want one before anything else
    if kind.startswith("seg"):
        est = ARTSegmenter(model, TASKS[kind], SHAPE, clip_values=box, **kw)
    else:
        est = ARTClassifier(model, TASKS[kind], SHAPE, clip_values=box, nb_classes=4, **kw)
    return est, calls


def _art_build(name: str, kind: str, est, eps: float):
    cls = _art_class(name)
    params = inspect.signature(cls.__init__).parameters
    kw: dict = {"eps": eps}
    if "eps_step" in params:
        kw["eps_step"] = eps / 4  # ART refuses a step larger than the budget
    if "num_random_init" in params and kind != "multiclass":
        kw["num_random_init"] = 0 if kind.startswith("seg") else 1  # the table's notes: seg 0, multi-label <= 1
    if name in art_support.SQUARE_LIKE and kind != "multiclass":
        kw.update(adv_criterion=est.adversarial_criterion, loss=est.margin_loss)  # the table's note
    if name == "AdversarialTrainerFBFPyTorch":
        kw["use_amp"] = False
    return cls(est, **kw)


def _art_use(obj, kind: str) -> None:
    """The first use of an attack or trainer whose constructor does not touch the estimator (ART's FBF trainer):
    the estimator's first call checks it, before any model call."""
    x, y = _data(kind, UNIT)
    if isinstance(obj, art_trainer.Trainer):
        obj.fit(x.numpy(), np.eye(4, dtype=np.float32)[y.numpy()] if kind == "multiclass" else y.numpy(), nb_epochs=1)
    else:
        obj.generate(x.numpy(), y.numpy() if kind != "multiclass" else None)


def test_the_art_cases_cover_the_budgeted_attacks():
    names = {n for n, _ in ART_CASES}
    assert {"FastGradientMethod", "ProjectedGradientDescent", "BasicIterativeMethod", "SquareAttack",
            "AdversarialTrainerMadryPGD"} <= names
    assert "Wasserstein" not in names  # its eps is a Wasserstein radius, not data units
    assert len(ART_CASES) >= 20


@pytest.mark.parametrize("name,kind", ART_CASES)
def test_art_budget_on_the_0_255_scale_is_refused_before_any_work(name, kind):
    est, calls = _art_estimator(kind, UNIT)
    cls = _art_class(name)
    eps = 255 * PLAUSIBLE[_art_p(cls)]
    with pytest.raises(ValueError) as err:
        _art_use(_art_build(name, kind, est, eps), kind)
    msg = _one_line(err.value)
    _check_large(msg, "ART", name, "eps", eps)
    assert "`clip_values`" in msg and not calls
    # a budget in data units builds, and the opt-out lets the large one through
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBudgetWarning)
        _art_build(name, kind, est, PLAUSIBLE[_art_p(cls)])
        _art_build(name, kind, _art_estimator(kind, UNIT, allow_large_budgets=True)[0], eps)


@pytest.mark.parametrize("name,kind", ART_CASES)
def test_art_unit_budget_on_hu_data_warns_before_any_work(name, kind):
    est, calls = _art_estimator(kind, HU)
    eps = PLAUSIBLE[_art_p(_art_class(name))]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBudgetWarning)
        with pytest.raises(SmallBudgetWarning) as err:
            _art_use(_art_build(name, kind, est, eps), kind)
    _check_small(_one_line(err.value), "ART", name, "eps", "[-1024, 3071]")
    assert not calls


def test_art_budget_set_after_construction_is_refused_at_generate():
    est, calls = _art_estimator("multiclass", UNIT)
    atk = art_evasion.FastGradientMethod(est, eps=8 / 255)
    atk.set_params(eps=8.0)
    with pytest.raises(ValueError, match=r"^ART FastGradientMethod eps=8 is more than half the data range \[0, 1\]"):
        atk.generate(_data("multiclass", UNIT)[0].numpy())
    assert not calls


# --- Foolbox: every attack whose distance is an Lp norm (p >= 1), on every kind its cell is ok ------------------
#: constructor arguments without a default
_FB_REQUIRED = {"VirtualAdversarialAttack": {"steps": 1}}


def _fb_attack(name: str):
    return getattr(fb.attacks, name)(**_FB_REQUIRED.get(name, {}))


def _fb_p(name: str) -> float | None:
    try:
        p = float(_fb_attack(name).distance.p)
    except Exception:  # no fixed distance (Spatial, minimisation attacks without one), or numba missing
        return None
    return p if p >= 1 else None  # L0 counts elements: no data-unit scale


FB_CASES = [(name, kind) for name in sorted(FOOLBOX_SUPPORT) if _fb_p(name) is not None
            for kind in ("multiclass", "multilabel") if FOOLBOX_SUPPORT[name][kind].status == "ok"]


def _fb_call(name: str, kind: str, box: tuple[float, float], eps: float, **kw):
    model, calls = _model(kind, box)
    fmodel = TaskModel(model, TASKS[kind], box, **kw)
    x, y = _data(kind, box)
    crit = y if kind == "multiclass" else mfb.criterion(TASKS[kind], y)
    return (lambda: _fb_attack(name)(fmodel, x, crit, epsilons=[eps])), calls


def test_the_foolbox_cases_cover_the_budgeted_attacks():
    names = {n for n, _ in FB_CASES}
    assert {"LinfProjectedGradientDescentAttack", "L2ProjectedGradientDescentAttack", "LinfFastGradientAttack",
            "L2CarliniWagnerAttack", "BoundaryAttack", "L1BasicIterativeAttack"} <= names
    assert len(FB_CASES) >= 40


@pytest.mark.parametrize("name,kind", FB_CASES)
def test_foolbox_epsilons_on_the_0_255_scale_are_refused_before_any_work(name, kind):
    eps = 255 * PLAUSIBLE[_fb_p(name)]
    run, calls = _fb_call(name, kind, UNIT, eps)
    with pytest.raises(ValueError) as err:
        run()
    msg = _one_line(err.value)
    _check_large(msg, "Foolbox", name, "epsilons", eps)
    assert "TaskModel's `bounds`" in msg and not calls


@pytest.mark.parametrize("name,kind", FB_CASES)
def test_foolbox_unit_epsilons_on_hu_data_warn_before_any_work(name, kind):
    run, calls = _fb_call(name, kind, HU, PLAUSIBLE[_fb_p(name)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBudgetWarning)
        with pytest.raises(SmallBudgetWarning) as err:
            run()
    _check_small(_one_line(err.value), "Foolbox", name, "epsilons", "[-1024, 3071]")
    assert not calls


def test_a_refused_call_is_refused_again_when_repeated():
    """The checks remember what passed (one warning per call), never what was refused."""
    run, calls = _fb_call("LinfProjectedGradientDescentAttack", "multiclass", UNIT, 8.0)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^Foolbox LinfProjectedGradientDescentAttack epsilons=8 is more"):
            run()
    est, calls2 = _art_estimator("multiclass", UNIT)
    atk = art_evasion.FastGradientMethod(est, eps=8 / 255)
    atk.set_params(eps=8.0)
    x = _data("multiclass", UNIT)[0].numpy()
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^ART FastGradientMethod eps=8 is more"):
            atk.generate(x)
    assert not calls and not calls2


def test_foolbox_opt_out_and_sane_budgets_run():
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBudgetWarning)
        warnings.simplefilter("error", LargeBudgetWarning)
        run, calls = _fb_call("LinfProjectedGradientDescentAttack", "multiclass", UNIT, 8.0, allow_large_budgets=True)
        run()
        assert calls
        run, calls = _fb_call("LinfProjectedGradientDescentAttack", "multiclass", HU, 8.0)  # 8 HU: a real budget
        run()
        assert calls


# --- torchattacks: every attack whose constructor takes a budget (eps, max_epsilon), both entry points ----------
def _ta_budget_arg(name: str) -> str | None:
    params = inspect.signature(getattr(torchattacks, name).__init__).parameters
    return next((a for a in ("eps", "max_epsilon") if a in params), None)


def _ta_p(atk) -> float:
    norm = str(getattr(atk, "norm", "L2" if "L2" in type(atk).__name__ else "Linf"))
    return 2.0 if norm == "L2" else math.inf


TA_CASES = [(name, kind, entry) for name in sorted(TA_SUPPORT) if _ta_budget_arg(name)
            for kind in ("multiclass", "multilabel") if TA_SUPPORT[name][kind].status == "ok"
            for entry in (("attack", "direct") if kind == "multiclass" else ("attack",))]


def _ta_run(name: str, kind: str, entry: str, value, **kw):
    model, calls = _model(kind, HU)
    w = TorchattacksModel(model, TASKS[kind], bounds=HU, **kw)
    arg = _ta_budget_arg(name)
    atk = getattr(torchattacks, name)(w, **{arg: value(w) if callable(value) else value})
    x, y = _data(kind, HU)
    run = (lambda: w.attack(atk, x, y)) if entry == "attack" else (lambda: atk(w.encode(x), w.labels(y)))
    return run, calls, arg, atk


def test_the_torchattacks_cases_cover_the_budgeted_attacks():
    names = {n for n, _, _ in TA_CASES}
    assert {"PGD", "FGSM", "PGDL2", "Square", "APGD", "AutoAttack", "PIFGSM"} <= names
    assert len(TA_CASES) >= 40


@pytest.mark.parametrize("name,kind,entry", TA_CASES)
def test_torchattacks_eps_in_data_units_is_refused_before_any_work(name, kind, entry):
    """``PGD(w, eps=8)`` meant as 8 HU: torchattacks' eps is a fraction of the range, so 8 is 8 × 4 095 HU."""
    run, calls, arg, atk = _ta_run(name, kind, entry, 8.0)
    with pytest.raises(ValueError) as err:
        run()
    msg = _one_line(err.value)
    _check_large(msg, "torchattacks", name, arg, 8.0)
    assert f"{arg}=w.unit_eps(8) = 0.0019536" in msg and "(-1024, 3071)" in msg and not calls


@pytest.mark.parametrize("name,kind,entry", TA_CASES)
def test_torchattacks_unit_eps_of_a_0_1_budget_warns_before_any_work(name, kind, entry):
    """``eps=w.unit_eps(4/255)`` on CT: a [0, 1]-scale budget converted as if it were HU (4 millionths of the range)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBudgetWarning)
        run, calls, arg, atk = _ta_run(name, kind, entry, lambda w: None)
        setattr(atk, arg, atk.model.unit_eps(PLAUSIBLE[_ta_p(atk)]))
        with pytest.raises(SmallBudgetWarning) as err:
            run()
    msg = _one_line(err.value)
    _check_small(msg, "torchattacks", name, arg, "(-1024, 3071)")
    assert "pass the fraction itself" in msg and not calls


def test_torchattacks_opt_out_and_sane_budgets_run():
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBudgetWarning)
        run, calls, _, _ = _ta_run("PGD", "multiclass", "attack", 8.0, allow_large_budgets=True)
        run()
        assert calls
        run, calls, _, _ = _ta_run("PGD", "multiclass", "attack", lambda w: w.unit_eps(8.0))  # 8 HU
        run()
        assert calls


# --- randomized smoothing: every task family ----------------------------------------------------------------------
_FAMILY_KIND = {"multiclass": "multiclass", "multilabel": "multilabel", "segmentation": "seg2d"}


def test_every_smoothing_family_is_covered():
    assert set(FAMILIES) == set(_FAMILY_KIND)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_smoothing_sigma_on_the_0_255_scale_is_refused_when_built(family):
    task = TASKS[_FAMILY_KIND[family]]
    with pytest.raises(ValueError) as err:
        RandomizedSmoothing(task, sigma=25, bounds=UNIT)
    msg = _one_line(err.value)
    assert msg.startswith("RandomizedSmoothing sigma=25 is more than the data range [0, 1] (`bounds`)"), msg
    assert "allow_large_budgets=True" in msg
    RandomizedSmoothing(task, sigma=25, bounds=UNIT, allow_large_budgets=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RandomizedSmoothing(task, sigma=1.0, bounds=UNIT)  # Cohen et al.'s largest sigma: at the limit, accepted


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_smoothing_sigma_on_the_0_255_scale_warns_without_bounds_before_any_work(family):
    kind = _FAMILY_KIND[family]
    model, calls = _model(kind, UNIT)
    x, _ = _data(kind, UNIT)
    rs = RandomizedSmoothing(TASKS[kind], sigma=25, n0=2, n=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LargeBudgetWarning)
        with pytest.raises(LargeBudgetWarning) as err:
            rs.certify(model, x)
        with pytest.raises(LargeBudgetWarning):
            rs.predict(model, x)
    msg = _one_line(err.value)
    assert msg.startswith("RandomizedSmoothing sigma=25 is more than the data range [") and "range of `x`" in msg
    assert not calls


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_smoothing_unit_sigma_on_hu_data_warns(family):
    kind = _FAMILY_KIND[family]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBudgetWarning)
        with pytest.raises(SmallBudgetWarning) as err:
            RandomizedSmoothing(TASKS[kind], sigma=0.25, bounds=HU)
        model, calls = _model(kind, HU)
        with pytest.raises(SmallBudgetWarning) as err2:
            RandomizedSmoothing(TASKS[kind], sigma=0.25, n0=2, n=4).certify(model, _data(kind, HU)[0])
    for e in (err, err2):
        msg = _one_line(e.value)
        assert msg.startswith("RandomizedSmoothing sigma=0.25 is below 0.001 of the data range"), msg
    assert "[-1024, 3071]" in str(err.value) and not calls


def test_smoothing_refuses_inputs_outside_its_bounds():
    model, calls = _model("multiclass", UNIT)
    rs = RandomizedSmoothing(MultiClass(), sigma=0.25, n0=2, n=4, bounds=UNIT)
    with pytest.raises(ValueError, match=r"^`x` has values in .* outside the declared bounds \(0, 1\)"):
        rs.certify(model, _data("multiclass", HU)[0])
    assert not calls
    assert np.isfinite(rs.certify(model, _data("multiclass", UNIT)[0]).radius.numpy()).all()


# --- the shared rule itself ---------------------------------------------------------------------------------------
def test_the_shared_rule_reads_every_budget_form_and_box():
    from medadv.threats import check_budget_scale

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_budget_scale(8.0, None)  # unbounded: no range to compare with
        check_budget_scale(8.0, (0.0, 255.0))  # 8 on a 0-255 scale: a budget, not a mistake
        check_budget_scale(0.0, HU)  # the clean baseline is not "too small"
        check_budget_scale(3.0, UNIT, p=2.0, size=64)  # an L2 budget within half the box's diagonal (4)
        check_budget_scale(3.0, UNIT, p=2.0)  # no element count: the large side of an L2 budget is not judged
        check_budget_scale(8.0, UNIT, allow_large_budgets=True)
        check_budget_scale(None, UNIT)
        # per-channel box, one channel in [0, 1] and one in HU: large against the widest, small against the narrowest
        lo, hi = torch.tensor([0.0, -1024.0]).view(2, 1, 1), torch.tensor([1.0, 3071.0]).view(2, 1, 1)
        check_budget_scale(8.0, (lo, hi))
        check_budget_scale(0.01, (lo, hi))
    for eps in (8.0, [0.01, 8.0], np.array([0.01, 8.0]), torch.tensor([8.0]), float("inf")):
        with pytest.raises(ValueError, match=r"^eps=(8|inf) is more than half the data range \[0, 1\]: budgets"):
            check_budget_scale(eps, UNIT)
    with pytest.raises(ValueError, match=r"^eps=5 is more than half the L2 diagonal of the data box \[0, 1\] over 64 "
                                         r"elements \(4\)"):
        check_budget_scale(5.0, UNIT, p=2.0, size=64)
    with pytest.warns(LargeBudgetWarning, match=r"^Linf eps=8 is more than half"):
        check_budget_scale(8.0, UNIT, owner="Linf ", large="warn")
    with pytest.warns(SmallBudgetWarning, match=r"^eps=0.0156863 is below 0.001 of the data range \[-1024, 3071\]: "
                                                r".* is eps × \(hi − lo\) here \(0.0156863 → 64.2353\)"):
        check_budget_scale(4 / 255, HU)
    with pytest.raises(ValueError, match=r"`large` must be 'raise' or 'warn'"):
        check_budget_scale(1.0, UNIT, large="refuse")
