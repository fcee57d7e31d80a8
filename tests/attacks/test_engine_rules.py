"""Engine rules of the gradient family: determinism, untouched model and caller state, no host sync in the
step loop, the active set, restarts that keep the worst case, the registry and the result record."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv.attacks.base import Attack, attack_class, available_attacks, get_attack, make_generator, register
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
ITERATIVE = [BIM, PGD, CosPGD, SegPGD]
FIXTURES = ["trained_multiclass", "trained_multilabel", "trained_seg3d", "trained_seg2d"]


def _make(cls, task, threat, **kw):
    if cls is FGSM:  # one step from the clean input: no iteration options
        for k in ("steps", "restarts", "random_start", "active_set", "check_every", "record_trace"):
            kw.pop(k, None)
    elif cls is BIM:
        kw.pop("random_start", None)
    return cls(task, threat, **kw)


# --- determinism ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize("cls", [PGD, CosPGD, SegPGD])
def test_same_seed_same_adversarial_tensor(cls, fixture, request):
    t = request.getfixturevalue(fixture)
    x, y = t.x[:4], t.y[:4]
    atk = cls(t.task, Linf(0.1, bounds=(0, 1)), steps=3, restarts=2, seed=7)
    a, b = atk(t.model, x, y).x_adv, atk(t.model, x, y).x_adv
    assert torch.equal(a, b)
    c = cls(t.task, Linf(0.1, bounds=(0, 1)), steps=3, restarts=2, seed=8)(t.model, x, y).x_adv
    assert not torch.equal(a, c)  # the seed is actually used


def test_seed_none_uses_global_rng(trained_multiclass):
    t = trained_multiclass
    atk = PGD(t.task, L2(1.0, bounds=(0, 1)), steps=2, seed=None)
    torch.manual_seed(3)
    a = atk(t.model, t.x, t.y).x_adv
    torch.manual_seed(3)
    b = atk(t.model, t.x, t.y).x_adv
    assert torch.equal(a, b)


# --- model and caller state -------------------------------------------------------------------------------------
class _BNNet(nn.Module):
    """A net whose state an attack could easily disturb: batch norm statistics, dropout, mixed flags."""

    def __init__(self, out: int = 3, dense: bool = False):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5))
        if dense:
            self.head = nn.Sequential(nn.Identity(), nn.Identity(), nn.Conv2d(4, out, 1))
        else:
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, out))

    def forward(self, x):
        return self.head(self.features(x))


def _snapshot(model: nn.Module):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [(name, m.training) for name, m in model.named_modules()],
        [(name, p.requires_grad, None if p.grad is None else p.grad.clone()) for name, p in model.named_parameters()],
    )


def _assert_same_snapshot(a, b):
    sa, ma, pa = a
    sb, mb, pb = b
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"model state {k} changed"
    assert ma == mb, "training flags changed"
    for (n1, rg1, g1), (n2, rg2, g2) in zip(pa, pb, strict=True):
        assert n1 == n2 and rg1 == rg2, f"requires_grad of {n1} changed"
        assert (g1 is None) == (g2 is None) and (g1 is None or torch.equal(g1, g2)), f".grad of {n1} changed"


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
@pytest.mark.parametrize("task", [MultiClass(), MultiLabel(), Segmentation(3)], ids=["multiclass", "multilabel", "seg"])
@pytest.mark.parametrize("active_set", [False, True])
def test_model_and_caller_state_untouched(cls, task, active_set):
    torch.manual_seed(0)
    model = _BNNet(3, dense=isinstance(task, Segmentation))
    model.train()
    model.head.eval()  # mixed modes must come back exactly as they were
    model.features[0].bias.requires_grad_(False)  # mixed flags too
    model.head[2].weight.grad = torch.ones_like(model.head[2].weight)  # an existing .grad stays as it is
    model(torch.rand(8, 2, 6, 6))  # non-trivial BN running statistics
    before = _snapshot(model)

    x = torch.rand(4, 2, 6, 6, requires_grad=True)
    y = {
        MultiClass: lambda: torch.tensor([0, 1, 2, 0]),
        MultiLabel: lambda: (torch.rand(4, 3) > 0.5).float(),
        Segmentation: lambda: torch.randint(0, 3, (4, 6, 6)),
    }[type(task)]()
    x_copy, y_copy, xv, yv = x.detach().clone(), y.clone(), x._version, y._version
    kw = {"steps": 3, "restarts": 2, "active_set": active_set}
    res = _make(cls, task, Linf(0.2, bounds=(0, 1)), **kw)(model, x, y)

    _assert_same_snapshot(before, _snapshot(model))
    assert torch.equal(x.detach(), x_copy) and torch.equal(y, y_copy)
    assert x._version == xv and y._version == yv, "caller tensors were written in place"
    assert x.requires_grad and x.grad is None
    assert not res.x_adv.requires_grad and res.x_adv.grad_fn is None
    assert res.x_adv.data_ptr() != x.data_ptr()
    # the eval-mode forward was used: dropout off, so the reported logits are reproducible
    with torch.no_grad():
        model.eval()
        ref = model(res.x_adv)
    torch.testing.assert_close(res.logits, ref)


@pytest.mark.parametrize("fixture", ["trained_seg3d", "trained_multilabel"])
def test_works_under_no_grad_and_inference_of_labels(fixture, request):
    t = request.getfixturevalue(fixture)
    atk = CosPGD(t.task, Linf(0.05, bounds=(0, 1)), steps=2)
    ref = atk(t.model, t.x[:2], t.y[:2])
    with torch.no_grad():
        res = atk(t.model, t.x[:2], t.y[:2])
    assert torch.equal(ref.x_adv, res.x_adv)
    # y=None: attack the clean prediction
    res = atk(t.model, t.x[:2])
    with torch.no_grad():
        pred = t.task.predict(t.model(t.x[:2]))
    assert torch.equal(res.y, t.task.to_target(pred, res.logits))


# --- no host synchronisation inside the step loop ---------------------------------------------------------------
@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
def test_no_host_sync_in_step_loop(cls, fixture, request, forbid_host_sync):
    t = request.getfixturevalue(fixture)
    atk = _make(cls, t.task, Linf(0.05, bounds=(0, 1)), steps=3, restarts=2, record_trace=True)
    x, y = t.x[:2], t.y[:2]
    with torch.no_grad():
        logits = t.model(x)

    monkeypatch = forbid_host_sync()
    x_adv, _, trace = atk.perturb(t.model, x, y, logits)
    monkeypatch.undo()
    assert x_adv.shape == x.shape
    if cls is not FGSM:
        assert trace["loss"].shape == (3 * 2, 2)  # steps x restarts rows


# --- active set -------------------------------------------------------------------------------------------------
class _Counting(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.samples = 0

    def forward(self, x):
        self.samples += x.shape[0]
        return self.inner(x)


@pytest.mark.parametrize("fixture", ["trained_multiclass", "trained_multilabel", "trained_seg2d"])
@pytest.mark.parametrize("check_every", [1, 3])
def test_active_set_same_or_more_fooled_less_work(fixture, check_every, request):
    t = request.getfixturevalue(fixture)
    eps = 0.1
    plain_m, active_m = _Counting(t.model), _Counting(t.model)
    kw = {"steps": 8, "seed": 1}
    plain = PGD(t.task, Linf(eps, bounds=(0, 1)), **kw)(plain_m, t.x, t.y)
    active = PGD(t.task, Linf(eps, bounds=(0, 1)), active_set=True, check_every=check_every, **kw)(active_m, t.x, t.y)
    assert plain.fooled.any(), "test needs some fooled samples"
    # every sample fooled by the full run is fooled with the active set too (fooled samples are frozen)
    assert bool((active.fooled | ~plain.fooled).all())
    # samples that were never dropped followed the same trajectory (a smaller batch may round differently,
    # which can flip the sign of a near-zero gradient entry: allow a few elements to differ)
    never = ~active.fooled
    if never.any():
        differs = (active.x_adv[never] - plain.x_adv[never]).abs() > 1e-5
        assert float(differs.float().mean()) < 0.01
    assert active.linf.max() <= eps + 1e-6
    assert active_m.samples < plain_m.samples, "the active set did not save any work"


def test_active_set_trace_marks_dropped_samples(trained_multilabel):
    t = trained_multilabel
    res = PGD(t.task, Linf(0.15, bounds=(0, 1)), steps=6, active_set=True, record_trace=True)(t.model, t.x, t.y)
    loss = res.trace["loss"]
    assert loss.shape == (6, t.x.shape[0])
    assert torch.isfinite(loss[0]).all()
    assert torch.isnan(loss[-1]).any(), "fooled samples should be recorded as NaN once dropped"
    # once dropped, a sample stays dropped
    dropped = torch.isnan(loss)
    assert bool((dropped[1:] | ~dropped[:-1]).all())


def test_active_set_all_fooled_returns_early():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.copy_(torch.tensor([0.0, 0.0, 5.0]))  # always predicts class 2
    counting = _Counting(model)
    x, y = torch.rand(3, 1, 2, 2), torch.zeros(3, dtype=torch.long)  # already fooled at the start
    res = PGD(MultiClass(), Linf(0.1, bounds=(0, 1)), steps=5, active_set=True)(counting, x, y)
    assert res.fooled.all()
    # y given: no clean forward for gradient attacks; one step forward, final forward, no further steps
    assert counting.samples == 3 * 2


# --- restarts ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["trained_multiclass", "trained_multilabel", "trained_seg2d"])
def test_restarts_keep_worst_case_per_sample(fixture, request):
    t = request.getfixturevalue(fixture)
    threat = Linf(0.05, bounds=(0, 1))
    atk = PGD(t.task, threat, steps=3, restarts=3, seed=5)
    res = atk(t.model, t.x, t.y)

    # replay the three restarts one by one: the engine draws each start from the seeded generator in turn
    gen = make_generator(5, t.x.device)
    alpha = 2.5 * threat.eps / 3
    cands = []
    with torch.no_grad():
        for _ in range(3):
            x_adv = threat.clip(t.x + threat.random_delta(t.x, gen))
            for _ in range(3):  # a hand-written PGD run from that start
                with torch.enable_grad():
                    xr = x_adv.clone().requires_grad_(True)
                    (g,) = torch.autograd.grad(t.task.loss(t.model(xr), t.y).sum(), xr)
                x_adv = threat.finalize(t.x, x_adv + alpha * g.sign())
            logits = t.model(x_adv)
            cands.append((x_adv, t.task.fooled(logits, t.y), t.task.loss(logits, t.y)))
    fooled = torch.stack([c[1] for c in cands])
    loss = torch.stack([c[2] for c in cands])
    # the kept candidate per sample: fooled first, then highest loss (ties: the earliest)
    key = fooled.double() * 1e6 + loss.double()  # float64: float32 would round the loss away at 1e6
    best = key.argmax(dim=0)
    expected = torch.stack([c[0] for c in cands])[best, torch.arange(t.x.shape[0])]
    torch.testing.assert_close(res.x_adv, expected, atol=1e-6, rtol=0)
    assert torch.equal(res.fooled, fooled.any(dim=0))
    assert len(set(best.tolist())) > 1 or fooled.all(), "degenerate test: one restart won everywhere"


def test_restarts_never_worse_than_one_run(trained_seg2d):
    t = trained_seg2d
    one = PGD(t.task, Linf(0.05, bounds=(0, 1)), steps=3, seed=2)(t.model, t.x, t.y)
    many = PGD(t.task, Linf(0.05, bounds=(0, 1)), steps=3, restarts=3, seed=2)(t.model, t.x, t.y)
    l1, lm = t.task.loss(one.logits, t.y), t.task.loss(many.logits, t.y)
    assert bool((many.fooled | ~one.fooled).all())
    same = many.fooled == one.fooled
    assert bool((lm[same] >= l1[same] - 1e-5).all())


def test_targeted_restarts_keep_lowest_loss(trained_multiclass):
    t = trained_multiclass
    target = (t.y + 1) % 4
    one = PGD(t.task, Linf(0.05, bounds=(0, 1)), steps=3, targeted=True, seed=2)(t.model, t.x, target)
    many = PGD(t.task, Linf(0.05, bounds=(0, 1)), steps=3, targeted=True, restarts=3, seed=2)(t.model, t.x, target)
    l1, lm = t.task.loss(one.logits, target), t.task.loss(many.logits, target)
    assert bool((many.fooled | ~one.fooled).all())
    same = many.fooled == one.fooled
    assert bool((lm[same] <= l1[same] + 1e-5).all())


# --- result record, eps = 0, trace ------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
def test_result_record(cls, trained_seg3d):
    t = trained_seg3d
    res = _make(cls, t.task, L2(0.5, bounds=(0, 1)), steps=2)(t.model, t.x, t.y)
    assert res.x_adv.shape == t.x.shape and res.x_adv.dtype == t.x.dtype and res.x_adv.device == t.x.device
    d = (res.x_adv - t.x).flatten(1)
    torch.testing.assert_close(res.linf, d.abs().amax(1))
    torch.testing.assert_close(res.l2, d.norm(dim=1))
    assert torch.equal(res.fooled, t.task.fooled(res.logits, t.y))
    assert res.fooled.dtype == torch.bool and res.fooled.shape == (t.x.shape[0],)
    assert res.fooling_rate == pytest.approx(float(res.fooled.float().mean()))


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
def test_zero_budget_returns_the_input(cls, trained_multiclass):
    t = trained_multiclass
    res = _make(cls, t.task, Linf(0.0, bounds=(0, 1)), steps=2)(t.model, t.x, t.y)
    assert torch.equal(res.x_adv, t.x)


def test_trace_records_rising_loss(trained_multiclass):
    t = trained_multiclass
    res = PGD(t.task, Linf(0.1, bounds=(0, 1)), steps=6, random_start=False, record_trace=True)(t.model, t.x, t.y)
    loss = res.trace["loss"]
    assert loss.shape == (6, t.x.shape[0])
    assert loss[-1].mean() > loss[0].mean()
    # step 0 of BIM-style PGD is evaluated at the clean input
    torch.testing.assert_close(loss[0], t.task.loss(t.model(t.x), t.y).detach(), atol=1e-5, rtol=1e-5)
    assert PGD(t.task, Linf(0.1, bounds=(0, 1)), steps=2)(t.model, t.x, t.y).trace is None


# --- registry ---------------------------------------------------------------------------------------------------
def test_registry_names_and_construction():
    names = available_attacks()
    for n, cls in [("fgsm", FGSM), ("bim", BIM), ("pgd", PGD), ("cospgd", CosPGD), ("segpgd", SegPGD)]:
        assert n in names
        assert cls.name == n
        atk = get_attack(n.upper(), task=Segmentation(3), threat=Linf(0.1, bounds=(0, 1)))
        assert type(atk) is cls
    atk = get_attack("pgd", MultiClass(), Linf(0.1, bounds=(0, 1)), steps=7, restarts=2, targeted=True)
    assert (atk.steps, atk.restarts, atk.targeted, atk.budget) == (7, 2, True, 0.1)
    assert atk.step_size is None and atk.alpha == pytest.approx(2.5 * 0.1 / 7)
    assert isinstance(atk, GradientAttack) and isinstance(atk, Attack)


def test_registry_rejects_name_clash():
    with pytest.raises(ValueError, match=r"attack name 'PGD' is already registered to PGD"):

        @register("PGD")
        class Other(GradientAttack):
            pass

    register("pgd")(PGD)  # re-registering the same class is harmless
    assert get_attack("pgd", MultiClass(), Linf(0.1, bounds=(0, 1))).__class__ is PGD
