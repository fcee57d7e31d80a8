"""Probability outputs everywhere (issue 29, item 3): every consumer that takes a model, on a softmax-ending 3-D
segmenter and a sigmoid-ending multi-label classifier.

With the task declaring ``outputs="probabilities"`` each consumer works and gives what it gives on the logits the
probabilities come from (the sigmoid model without its sigmoid; for the softmax, its ``log_softmax``: the logits a
softmax keeps, up to a per-voxel shift no loss, arg-max or margin sees), under the same seed. Undeclared, it refuses
in one line naming ``outputs: probabilities`` (the masking checks, which diagnose rather than refuse, flag it).

Consumers: every registered attack (``auto`` included), the masking checks, randomized smoothing (predict and
certify for each family), the ART estimators (``predict``, ``loss_gradient``, an ART attack), Foolbox's
``TaskModel`` (a Foolbox attack), torchattacks' ``TorchattacksModel`` and ``MedadvAttack``, the adversarial trainer
(PGD-AT and Gaussian noise training for smoothing), supervised fitting, the GAP trainer, report cases and every
registered study. Comparisons that train (Adam) or normalise maps run in float64, where ``log(softmax)`` and
``log_softmax`` agree to rounding that no step can amplify past the tolerance.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import medadv  # noqa: F401  (registers every attack and study)
from medadv.attacks import PGD
from medadv.attacks.base import attack_class, available_attacks
from medadv.tasks import Task
from medadv.testing._common import count_forwards
from medadv.testing.attack_checks import AttackCase, Setting, admits, settings
from medadv.threats import Linf

ATTACKS = available_attacks()
#: the two models of the issue: a 3-D segmenter ending in a softmax, a multi-label classifier ending in sigmoids
KINDS = ("softmax-seg3d", "sigmoid-multilabel")


def _setting(kind: str) -> Setting:
    """``softmax-seg3d``, ``sigmoid-multilabel`` (the issue's two models) or ``softmax-multiclass`` (certify)."""
    key = {"softmax-seg3d": "seg3d", "sigmoid-multilabel": "multilabel", "softmax-multiclass": "multiclass"}[kind]
    return next(s for s in settings(["segmentation", "multilabel", "multiclass"]) if s.key == key)


class Ending(nn.Module):
    """``net`` followed by ``final``: a sigmoid, a softmax or log-softmax over the class axis, or nothing."""

    def __init__(self, net: nn.Module, final: str) -> None:
        super().__init__()
        self.net, self.final = net, final

    def forward(self, x: Tensor) -> Tensor:
        z = self.net(x)
        return {"sigmoid": z.sigmoid(), "softmax": z.softmax(dim=1), "log_softmax": z.log_softmax(dim=1),
                "logits": z}[self.final]


def _final(kind: str) -> str:
    return "sigmoid" if kind == "sigmoid-multilabel" else "softmax"


def _reference(kind: str) -> str:
    """What the declared probabilities read as: the logits themselves (sigmoid), or the log-probabilities."""
    return "logits" if kind == "sigmoid-multilabel" else "log_softmax"


class Pair:
    """One kind's example: the undeclared and declared tasks, the probability model and its logit reference (two
    independent copies of one network), and the data."""

    def __init__(self, kind: str, double: bool = False) -> None:
        self.kind = kind
        self.setting = _setting(kind)
        ex = self.setting.example()
        self.ex = ex
        self.task: Task = ex.task
        self.declared: Task = ex.task.with_outputs("probabilities")
        self.net: nn.Module = copy.deepcopy(ex.model).eval()
        self.x, self.y = ex.x, ex.y
        if double:  # float64: log(softmax) and log_softmax then agree to 1e-16, not float32's 1e-7, which training
            # (Adam) and normalised maps would amplify past any fixed tolerance
            self.net, self.x = self.net.double(), self.x.double()

    def probs(self) -> nn.Module:
        return Ending(copy.deepcopy(self.net), _final(self.kind)).eval()

    def ref(self) -> nn.Module:
        return Ending(copy.deepcopy(self.net), _reference(self.kind)).eval()

    def threat(self, eps: float = 0.05) -> Linf:
        return Linf(eps, bounds=self.ex.box)


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def _refuses_probabilities(fn: Callable[[], Any]) -> str:
    with pytest.raises(ValueError, match="outputs: probabilities") as info:
        fn()
    return _one_line(info.value)


def _seeded(fn: Callable[[], Any]) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # consumers drawing from the global RNG draw the same numbers in both runs
        return fn()


def _close(a: Tensor, b: Tensor, atol: float = 1e-4) -> None:
    torch.testing.assert_close(a.detach().float(), b.detach().float(), atol=atol, rtol=1e-4)


# --- every registered attack (auto included) ---------------------------------------------------------------------------
def _attack_case(name: str, kind: str) -> AttackCase:
    s = _setting(kind)
    if not admits(attack_class(name), s):  # e.g. a 2-D-only attack: the 3-D segmenter is refused as logits are
        s = next((o for o in settings([s.kind]) if admits(attack_class(name), o)), s)
    return AttackCase(name, s)


def _refusal(case: AttackCase, task: Task, model: nn.Module, x: Tensor, y: Tensor) -> str | None:
    try:
        case.build(task=task)(model, x, y)
    except (TypeError, ValueError) as e:
        return _one_line(e)
    return None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ATTACKS)
def test_every_attack_declared_equals_logits_undeclared_refused(name: str, kind: str) -> None:
    case = _attack_case(name, kind)
    net = case.model()
    x, y = case.data()
    final, reference = _final(kind), _reference(kind)
    declared = case.task.with_outputs("probabilities")
    if _refusal(case, case.task, Ending(copy.deepcopy(net), reference), x, y) is not None:
        # the attack does not take this setting at all: it refuses the probabilities too, in one line
        assert _refusal(case, declared, Ending(copy.deepcopy(net), final), x, y) is not None
        return
    got, want = (_seeded(lambda t=t, f=f: case.build(task=t)(Ending(copy.deepcopy(net), f), x, y))
                 for t, f in ((declared, final), (case.task, reference)))
    assert torch.equal(got.fooled, want.fooled)
    _close(got.x_adv, want.x_adv)
    _close(got.logits, want.logits)
    model = Ending(copy.deepcopy(net), final)
    with count_forwards(model) as calls:
        _refuses_probabilities(lambda: case.build()(model, x, y))
    assert len(calls) == 1  # told on the first output: no step


# --- masking checks -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_masking_checks_read_declared_probabilities_as_logits(kind: str) -> None:
    from medadv.masking import check_unbounded, check_zero_gradients, run_checks

    p = Pair(kind)
    got = run_checks(p.probs(), p.declared, p.x, p.y, p.ex.box, steps=5)
    want = run_checks(p.ref(), p.task, p.x, p.y, p.ex.box, steps=5)
    assert [f.check for f in got] == [f.check for f in want]
    assert all(abs(a.value - b.value) < 1e-4 for a, b in zip(got, want, strict=True))
    assert "probability_outputs" not in [f.check for f in got]
    g = check_zero_gradients(p.probs(), p.declared, p.x, p.y, threshold=1e-9)
    w = check_zero_gradients(p.ref(), p.task, p.x, p.y, threshold=1e-9)
    assert (g is None) == (w is None) and (g is None or abs(g.value - w.value) < 1e-6)
    # undeclared: the checks diagnose (a flag); the unbounded attack refuses the outputs in one line
    flags = run_checks(p.probs(), p.task, p.x, p.y, p.ex.box, unbounded=False)
    assert "probability_outputs" in [f.check for f in flags]
    _refuses_probabilities(lambda: check_unbounded(p.probs(), p.task, p.x, p.y, p.ex.box, steps=2))


# --- randomized smoothing ---------------------------------------------------------------------------------------------
def _family_pair(family: str) -> Pair:
    return Pair({"multiclass": "softmax-multiclass", "multilabel": "sigmoid-multilabel",
                 "segmentation": "softmax-seg3d"}[family])


@pytest.mark.parametrize("family", ["multiclass", "multilabel", "segmentation"])
def test_certify_and_predict_declared_equal_logits_undeclared_refused(family: str) -> None:
    from medadv.certify import RandomizedSmoothing

    p = _family_pair(family)
    final, reference = _final(p.kind), _reference(p.kind)
    kw = dict(n0=8, n=24, batch_size=16, seed=3)
    rs_d, rs_u = RandomizedSmoothing(p.declared, 0.1, **kw), RandomizedSmoothing(p.task, 0.1, **kw)
    probs, ref = Ending(copy.deepcopy(p.net), final), Ending(copy.deepcopy(p.net), reference)
    got, want = rs_d.certify(probs, p.x, p.y), rs_u.certify(ref, p.x, p.y)
    assert torch.equal(got.top, want.top) and torch.equal(got.count, want.count)
    assert torch.equal(got.prediction, want.prediction)
    gp, wp = rs_d.predict(probs, p.x), rs_u.predict(ref, p.x)
    assert torch.equal(gp.prediction, wp.prediction) and torch.equal(gp.top, wp.top)
    if family == "multilabel":  # the votes are the task's threshold on logits, not on probabilities read as logits
        assert not bool((got.top == 1).all())
    model = Ending(copy.deepcopy(p.net), final)
    for call in (lambda: rs_u.certify(model, p.x), lambda: rs_u.predict(model, p.x)):
        with count_forwards(model) as calls:
            _refuses_probabilities(call)
        assert len(calls) == 1


# --- adapters -----------------------------------------------------------------------------------------------------------
def _np(t: Tensor) -> Any:
    return t.detach().cpu().numpy()


@pytest.mark.parametrize("kind", KINDS)
def test_art_estimator_predict_loss_gradient_and_attack(kind: str) -> None:
    from art.attacks.evasion import ProjectedGradientDescentNumpy

    from medadv.adapters.art import ARTClassifier, ARTSegmenter

    p = Pair(kind)
    shape = tuple(p.x.shape[1:])

    def est(model: nn.Module, task: Task) -> Any:
        if kind == "sigmoid-multilabel":
            return ARTClassifier(model, task, shape, clip_values=(0.0, 1.0), nb_classes=int(p.y.shape[1]))
        return ARTSegmenter(model, task, shape, clip_values=(0.0, 1.0))

    got, want = est(p.probs(), p.declared), est(p.ref(), p.task)
    x, y = _np(p.x), _np(p.y)
    _close(torch.as_tensor(got.predict(x)), torch.as_tensor(want.predict(x)))  # ART gets logits
    _close(torch.as_tensor(got.loss_gradient(x, y)), torch.as_tensor(want.loss_gradient(x, y)), atol=1e-5)
    attacks = [ProjectedGradientDescentNumpy(e, eps=0.05, eps_step=0.02, max_iter=3, num_random_init=0, verbose=False)
               for e in (got, want)]
    _close(torch.as_tensor(attacks[0].generate(x, y=y)), torch.as_tensor(attacks[1].generate(x, y=y)))
    _refuses_probabilities(lambda: est(p.probs(), p.task).predict(x))
    _refuses_probabilities(lambda: est(p.probs(), p.task).loss_gradient(x, y))


@pytest.mark.parametrize("kind", KINDS)
def test_foolbox_task_model_and_attack(kind: str) -> None:
    import foolbox as fb

    from medadv.adapters import foolbox as mfb

    p = Pair(kind)
    bounds = (0.0, 1.0)
    got_m, want_m = mfb.TaskModel(p.probs(), p.declared, bounds), mfb.TaskModel(p.ref(), p.task, bounds)
    _close(mfb._raw(got_m(p.x)), mfb._raw(want_m(p.x)))
    runs = []
    for fmodel, task in ((got_m, p.declared), (want_m, p.task)):
        attack = fb.attacks.LinfPGD(steps=3, abs_stepsize=0.02, random_start=False)
        _, clipped, success = attack(fmodel, p.x, mfb.criterion(task, p.y), epsilons=0.05)
        runs.append((clipped, success))
    _close(runs[0][0], runs[1][0])
    assert torch.equal(runs[0][1], runs[1][1])
    undeclared = mfb.TaskModel(p.probs(), p.task, bounds)
    _refuses_probabilities(lambda: fb.attacks.LinfPGD(steps=2, random_start=False)(
        undeclared, p.x, mfb.criterion(p.task, p.y), epsilons=0.05))


@pytest.mark.parametrize("kind", KINDS)
def test_torchattacks_wrapper_and_medadv_attack(kind: str) -> None:
    import torchattacks

    from medadv.adapters.torchattacks import MedadvAttack, TorchattacksModel

    p = Pair(kind)
    y = p.y
    outs = []
    for model, task in ((p.probs(), p.declared), (p.ref(), p.task)):
        w = TorchattacksModel(model, task, (0.0, 1.0))
        atk = torchattacks.PGD(w, eps=0.05, alpha=0.02, steps=3, random_start=False)
        outs.append(w.attack_result(atk, p.x, y))
    _close(outs[0].x_adv, outs[1].x_adv)
    assert torch.equal(outs[0].fooled, outs[1].fooled)
    _close(outs[0].logits, outs[1].logits)
    got = MedadvAttack(PGD(p.declared, p.threat(), steps=3, random_start=False), p.probs())(p.x, y)
    want = MedadvAttack(PGD(p.task, p.threat(), steps=3, random_start=False), p.ref())(p.x, y)
    _close(got, want)
    w = TorchattacksModel(p.probs(), p.task, (0.0, 1.0))
    _refuses_probabilities(lambda: w.attack(torchattacks.PGD(w, eps=0.05, alpha=0.02, steps=2), p.x, y))
    _refuses_probabilities(lambda: MedadvAttack(PGD(p.task, p.threat(), steps=2), p.probs())(p.x, y))


# --- the adversarial trainer ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_adversarial_trainer_trains_on_the_logits(kind: str) -> None:
    from medadv.defenses import PGDAT, AdversarialTrainer, GaussianAugmentation

    p = Pair(kind)
    for make in (lambda: PGDAT(p.threat(), steps=2), lambda: GaussianAugmentation(0.1)):
        models = []
        for model, task in ((p.probs(), p.declared), (p.ref(), p.task)):
            # SGD, not Adam: Adam would blow the rounding noise of a zero gradient (a conv bias before BatchNorm)
            # up to a full step
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            trainer = AdversarialTrainer(model, task, make(), epochs=1, batch_size=2, optimizer=opt, seed=0)
            _seeded(lambda t=trainer: t.fit(p.x, p.y))  # dropout draws from the global RNG
            models.append(model)
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            _close(a, b, atol=1e-5)
        assert any(not torch.equal(a, b) for a, b in zip(models[0].parameters(), p.net.parameters(), strict=True))
    model = p.probs()
    before = [t.clone() for t in model.parameters()]
    _refuses_probabilities(lambda: AdversarialTrainer(model, p.task, PGDAT(p.threat(), steps=1), epochs=1,
                                                      batch_size=2).fit(p.x, p.y))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # no step taken


@pytest.mark.parametrize("kind", KINDS)
def test_supervised_fit_trains_on_the_logits(kind: str) -> None:
    from medadv.training import fit_supervised

    # float64: Adam turns float32 rounding of a near-zero gradient into a full step of up to lr (measured 1.8e-3
    # on one weight with two threads), so in float32 the comparison depends on the machine
    p = Pair(kind, double=True)
    got, want = p.probs(), p.ref()
    hist = [_seeded(lambda m=m, t=t: fit_supervised(m, t, p.x, p.y, epochs=1, batch_size=2, lr=1e-3))
            for m, t in ((got, p.declared), (want, p.task))]
    assert hist[0] == pytest.approx(hist[1], abs=1e-5)  # the loss of the logits, not of the probabilities
    for a, b in zip(got.parameters(), want.parameters(), strict=True):
        _close(a, b, atol=1e-6)


def test_gap_trainer_fits_the_generator_on_the_logits() -> None:
    from medadv.attacks import GAP
    from medadv.models import UnetGenerator
    from medadv.training import GAPTrainer

    p = Pair("sigmoid-multilabel", double=True)  # float64: Adam would blow float32 rounding up to a step
    gens = []
    for model, task in ((p.probs(), p.declared), (p.ref(), p.task)):
        torch.manual_seed(0)
        atk = GAP(task, p.threat(0.1), UnetGenerator(1, ngf=4).double())
        _seeded(lambda a=atk, m=model: GAPTrainer(a, m, epochs=2, batch_size=3, lr=1e-3).fit(p.x, p.y))
        gens.append(atk.generator)
    for a, b in zip(gens[0].parameters(), gens[1].parameters(), strict=True):
        _close(a, b, atol=1e-6)


# --- report cases -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_report_cases_declared_equal_logits(kind: str) -> None:
    from medadv.evaluation import evaluate
    from medadv.report.cases import select_cases, worst_cases

    p = Pair(kind)
    attack = {"pgd": PGD(p.declared, p.threat(), steps=3, seed=0)}
    ref_attack = {"pgd": PGD(p.task, p.threat(), steps=3, seed=0)}
    got = select_cases(p.probs(), p.declared, p.x, p.y, attack["pgd"], k=2)
    want = select_cases(p.ref(), p.task, p.x, p.y, ref_attack["pgd"], k=2)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.clean, b.clean) and torch.equal(a.adv, b.adv)
        _close(a.x_adv, b.x_adv)
    # targeted at the clean prediction (a target that reads the clean logits worst_cases hands on): probabilities
    # read as logits would make every label "present" and the target another one
    attack = {"pgd": PGD(p.declared, p.threat(), steps=3, seed=0, targeted=True)}
    ref_attack = {"pgd": PGD(p.task, p.threat(), steps=3, seed=0, targeted=True)}

    def target(x: Tensor, y: Tensor, clean: Tensor) -> Tensor:
        return p.task.predict(clean)

    res = evaluate(p.probs(), p.declared, (p.x, p.y), attack, seed=1, target_fn=target)
    ref = evaluate(p.ref(), p.task, (p.x, p.y), ref_attack, seed=1, target_fn=target)
    got = worst_cases(p.probs(), p.declared, (p.x, p.y), attack, res, k=2, seed=1, target_fn=target)
    want = worst_cases(p.ref(), p.task, (p.x, p.y), ref_attack, ref, k=2, seed=1, target_fn=target)
    assert got and len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.title == b.title and torch.equal(a.adv, b.adv)
        _close(a.x_adv, b.x_adv)
    _refuses_probabilities(lambda: select_cases(p.probs(), p.task, p.x, p.y, ref_attack["pgd"]))


# --- every registered study ---------------------------------------------------------------------------------------------
#: the smallest options of each study that needs or is slow without them
STUDY_OPTIONS: dict[str, dict[str, Any]] = {
    "certify": {"sigma": 0.1, "radii": [0.05], "n0": 8, "n": 24, "batch_size": 16, "empirical": "pgd",
                "empirical_steps": 2, "draws": 2},
    "saliency": {"explanations": ["gradient"]},
    "reader_study": {"pairs": 2},
    "corruptions": {"severities": [1], "suite": ["gaussian_noise", "gibbs"]},
}


def _same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float) and isinstance(b[k], float):
                assert a[k] == pytest.approx(b[k], abs=1e-4, nan_ok=True), k
            else:
                assert a[k] == b[k], k


def _study(name: str, model: nn.Module, task: Task, p: Pair) -> Any:
    from medadv.studies import run_study

    attacks = {"pgd": PGD(task, p.threat(0.01), steps=2, seed=0)}  # a budget that fools some samples, not all
    return _seeded(lambda: run_study(name, STUDY_OPTIONS.get(name, {}), model, task, (p.x, p.y), attacks))


def _studies() -> list[str]:
    from medadv.studies import STUDY_SPECS

    return list(STUDY_SPECS)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", _studies())
def test_every_study_declared_equals_logits_undeclared_refused(name: str, kind: str) -> None:
    p = Pair(kind, double=name != "gap")  # gap's generator is built in float32
    with torch.no_grad():  # labels = the clean prediction: clean metrics of 1, so a misread output shows
        p.y = p.task.predict(p.net(p.x))
    try:
        want = _study(name, p.ref(), p.task, p)
    except (TypeError, ValueError) as e:  # the study does not take this model at all (the reader study: 2-D only)
        _one_line(e)
        with pytest.raises((TypeError, ValueError)):
            _study(name, p.probs(), p.declared, p)
        return
    got = _study(name, p.probs(), p.declared, p)
    _same_rows(got.rows, want.rows)
    _refuses_probabilities(lambda: _study(name, p.probs(), p.task, p))
