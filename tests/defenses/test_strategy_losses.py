"""Each strategy's loss equals a hand-computed value on a tiny batch; train-time attacks run in eval mode."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from medadv.attacks.pgd import PGD
from medadv.defenses import PGDAT, TRADES, MAAdvT, MPAdvT
from medadv.defenses.trainer import draw_seed
from medadv.params import InvalidParameterError
from medadv.runtime import attack_mode
from medadv.tasks import MultiClass, MultiLabel
from medadv.threats import Box, Linf

NAT = [[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]]
ADV = [[1.0, 0.5, -1.0], [0.2, 0.3, 1.0]]
Y = [0, 1]
ML_NAT = [[1.0, -2.0], [0.5, 0.0]]
ML_ADV = [[-0.5, -1.0], [1.5, -0.3]]
ML_Y = [[1.0, 0.0], [0.0, 1.0]]


def softmax(z):
    e = [math.exp(v) for v in z]
    return [v / sum(e) for v in e]


def sigmoid(z):
    return 1 / (1 + math.exp(-z))


def kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


def mart_by_hand(nat, adv, y, beta=6.0, boosted=True):
    adv_terms, rob_terms = [], []
    for zn, za, yi in zip(nat, adv, y, strict=True):
        pn, pa = softmax(zn), softmax(za)
        term = -math.log(pa[yi])
        if boosted:
            term += -math.log(1.0001 - max(p for j, p in enumerate(pa) if j != yi) + 1e-12)
        adv_terms.append(term)
        rob_terms.append(kl(pn, pa) * (1.0000001 - pn[yi]))
    return sum(adv_terms) / len(adv_terms) + beta * sum(rob_terms) / len(rob_terms)


def mart_multilabel_by_hand(nat, adv, y, beta=6.0):
    adv_terms, rob_terms = [], []
    for zn_row, za_row, y_row in zip(nat, adv, y, strict=True):
        for zn, za, yl in zip(zn_row, za_row, y_row, strict=True):
            pn, pa = sigmoid(zn), sigmoid(za)
            pyn, pya = (pn, pa) if yl == 1 else (1 - pn, 1 - pa)
            adv_terms.append(-math.log(pya) - math.log(1.0001 - (1 - pya) + 1e-12))
            rob_terms.append(kl([pn, 1 - pn], [pa, 1 - pa]) * (1.0000001 - pyn))
    return sum(adv_terms) / len(adv_terms) + beta * sum(rob_terms) / len(rob_terms)


def trades_by_hand(nat, adv, y, beta):
    ce = [-math.log(softmax(zn)[yi]) for zn, yi in zip(nat, y, strict=True)]
    kls = [kl(softmax(zn), softmax(za)) for zn, za in zip(nat, adv, strict=True)]
    return sum(ce) / len(ce) + beta * sum(kls) / len(kls)


def trades_multilabel_by_hand(nat, adv, y, beta):
    terms, kls = [], []
    for zn_row, za_row, y_row in zip(nat, adv, y, strict=True):
        for zn, za, yl in zip(zn_row, za_row, y_row, strict=True):
            pn, pa = sigmoid(zn), sigmoid(za)
            terms.append(-math.log(pn if yl == 1 else 1 - pn))
            kls.append(kl([pn, 1 - pn], [pa, 1 - pa]))
    return sum(terms) / len(terms) + beta * sum(kls) / len(kls)


T = torch.tensor
THREAT = Linf(0.1, bounds=(0.0, 1.0))


@pytest.mark.parametrize("boosted", [True, False])
def test_mart_multiclass_matches_hand_computation(boosted):
    got = MAAdvT(THREAT, boosted_ce=boosted).criterion(T(NAT), T(ADV), T(Y), MultiClass())
    assert float(got.detach()) == pytest.approx(mart_by_hand(NAT, ADV, Y, boosted=boosted), rel=1e-5)


def test_mart_multilabel_bernoulli_form_matches_hand_computation():
    got = MAAdvT(THREAT).criterion(T(ML_NAT), T(ML_ADV), T(ML_Y), MultiLabel())
    assert float(got.detach()) == pytest.approx(mart_multilabel_by_hand(ML_NAT, ML_ADV, ML_Y), rel=1e-5)


def test_mart_weight_gradient_can_be_detached():
    nat = T(NAT).requires_grad_(True)
    g_flow = torch.autograd.grad(MAAdvT(THREAT).criterion(nat, T(ADV), T(Y), MultiClass()), nat)[0]
    g_stop = torch.autograd.grad(MAAdvT(THREAT, detach_weight=True).criterion(nat, T(ADV), T(Y), MultiClass()), nat)[0]
    assert not torch.allclose(g_flow, g_stop)


def test_trades_matches_hand_computation():
    got = TRADES(THREAT, beta=6.0).criterion(T(NAT), T(ADV), T(Y), MultiClass())
    assert float(got.detach()) == pytest.approx(trades_by_hand(NAT, ADV, Y, 6.0), rel=1e-5)
    got = TRADES(THREAT, beta=2.0).criterion(T(ML_NAT), T(ML_ADV), T(ML_Y), MultiLabel())
    assert float(got.detach()) == pytest.approx(trades_multilabel_by_hand(ML_NAT, ML_ADV, ML_Y, 2.0), rel=1e-5)


class Recorder(nn.Module):
    """A fixed linear model that records the train/eval mode of every forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 3)
        with torch.no_grad():
            self.lin.weight.copy_(T([[2.0, 0.5], [0.0, 1.5], [-1.0, 0.0]]))
            self.lin.bias.zero_()
        self.modes: list[bool] = []

    def forward(self, x):
        self.modes.append(self.training)
        return self.lin(x)


X = T([[1.0, 0.0], [0.0, 1.0]])  # model(X) == NAT


def _clone(g: torch.Generator) -> torch.Generator:
    h = torch.Generator()
    h.set_state(g.get_state())
    return h


def test_pgd_at_loss_is_ce_on_pgd_examples():
    model, task = Recorder().train(), MultiClass()
    g = torch.Generator().manual_seed(0)
    zero = PGDAT(Linf(0.0, bounds=(0.0, 1.0)), steps=2).loss(model, X, T(Y), task, g)
    assert float(zero.detach()) == pytest.approx(trades_by_hand(NAT, NAT, Y, 0.0), rel=1e-5)  # ε = 0: clean CE by hand

    strategy = PGDAT(Linf(0.3, bounds=(0.0, 1.0)), steps=3, step_size=0.1)
    ref = _clone(g)
    x_adv = PGD(task, strategy.threat, steps=3, step_size=0.1, seed=draw_seed(ref))(model, X, T(Y)).x_adv
    model.modes.clear()
    got = strategy.loss(model, X, T(Y), task, g)
    assert float((x_adv - X).abs().max()) <= 0.3 + 1e-6 and not torch.equal(x_adv, X)
    expected = nn.functional.cross_entropy(model.lin(x_adv), T(Y))
    assert float(got.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    # the attack ran in eval mode (3 steps, final pass), the training forward in train mode
    assert model.modes == [False] * 4 + [True]
    assert model.training and all(p.requires_grad for p in model.parameters())


def test_maadvt_and_trades_loss_use_their_inner_maximisation():
    task = MultiClass()
    for strategy in (MAAdvT(THREAT, steps=3), TRADES(THREAT, steps=3)):
        model = Recorder().train()
        g = torch.Generator().manual_seed(1)
        ref = _clone(g)
        if isinstance(strategy, TRADES):
            x_adv = strategy.adversarial(model, X, T(Y), task, ref)
        else:
            x_adv = PGD(task, THREAT, steps=3, seed=draw_seed(ref))(model, X, T(Y)).x_adv
        with torch.no_grad():
            expected = strategy.criterion(model.lin(X), model.lin(x_adv), T(Y), task)
        got = strategy.loss(model, X, T(Y), task, g)
        assert float(got.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
        assert model.training and model.modes[-2:] == [True, True]


def test_trades_inner_attack_increases_kl_within_budget():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y, task = torch.rand(6, 4), torch.randint(0, 3, (6,)), MultiClass()
    strategy = TRADES(Linf(0.05, bounds=(0.0, 1.0)), steps=5)
    x_adv = strategy.adversarial(model, x, y, task, torch.Generator().manual_seed(0))
    start = Linf(0.05, bounds=(0.0, 1.0))
    x_rand = start.clip(x + start.random_delta(x, torch.Generator().manual_seed(0)))
    with torch.no_grad():
        def kl_to_clean(xa):
            return strategy.criterion(model(x), model(xa), y, task) - task.loss(model(x), y).mean()
        assert float(kl_to_clean(x_adv)) > 2 * float(kl_to_clean(x_rand))
    assert float((x_adv - x).abs().max()) <= 0.05 + 1e-6


def test_mpadvt_draws_and_loss():
    strategy = MPAdvT((0.0, 1.0))
    g = torch.Generator().manual_seed(0)
    u = torch.rand(3, generator=_clone(g), dtype=torch.float64).tolist()
    adv, eps, steps = strategy.draw(g)
    assert adv == (u[0] >= 0.5)
    assert eps == pytest.approx(0.01 + 0.03 * u[1])
    assert steps == 1 + int(u[2] * 9)
    draws = [strategy.draw(g) for _ in range(2000)]
    assert 0.45 < sum(d[0] for d in draws) / len(draws) < 0.55
    assert all(0.01 <= d[1] <= 0.04 for d in draws)
    assert {d[2] for d in draws} == set(range(1, 10))

    task = MultiClass()
    clean_only = MPAdvT((0.0, 1.0), p_adv=0.0)
    got = clean_only.loss(Recorder().train(), X, T(Y), task, torch.Generator().manual_seed(0))
    assert float(got.detach()) == pytest.approx(trades_by_hand(NAT, NAT, Y, 0.0), rel=1e-5)  # clean CE by hand

    always = MPAdvT((0.0, 1.0), p_adv=1.0, eps_range=(0.2, 0.3), steps_range=(2, 4), step_size=0.05)
    model, g = Recorder().train(), torch.Generator().manual_seed(3)
    ref = _clone(g)
    _, eps, steps = always.draw(ref)
    x_adv = PGD(task, Linf(eps, bounds=(0.0, 1.0)), steps=steps, step_size=0.05, seed=draw_seed(ref))(model, X, T(Y)).x_adv
    got = always.loss(model, X, T(Y), task, g)
    assert float(got.detach()) == pytest.approx(float(nn.functional.cross_entropy(model.lin(x_adv), T(Y)).detach()), rel=1e-6)
    assert always.adversarial_batches == 1


@pytest.mark.parametrize("make, match", [
    (lambda: PGDAT("eps"), "threat"), (lambda: PGDAT(THREAT, steps=0), "steps"),
    (lambda: PGDAT(Box(0.0, 1.0)), "threat"), (lambda: TRADES(THREAT, step_size=-0.1), "step_size"),
    (lambda: MPAdvT((0.0, 1.0), eps_range=(0.05, 0.01)), "eps_range"),
    (lambda: MPAdvT((0.0, 1.0), steps_range=(0, 3)), "steps_range"),
    (lambda: MPAdvT((0.0, 1.0), p_adv=2.0), "p_adv"), (lambda: MPAdvT((1.0, 0.0)), "bounds"),
    (lambda: MAAdvT(THREAT, beta=-1.0), "beta"), (lambda: TRADES(THREAT, beta=-1.0), "beta"),
])
def test_bad_arguments(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_trades_kl_attack_with_active_set_matches_full_batch_on_samples_never_stopped():
    # regression: the KL reference was one full-batch tensor, so compacting the active set crashed with a
    # shape mismatch; it is now per-sample engine state that follows the active set
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3)).eval()
    x, task = torch.rand(32, 4), MultiClass()
    with torch.no_grad():
        y = model(x).argmax(1)
    strategy = TRADES(Linf(0.3, bounds=(0.0, 1.0)), steps=6)
    full = strategy.inner_attack(task, seed=3)(model, x, y)
    active = strategy.inner_attack(task, seed=3, active_set=True)
    res = active(model, x, y)
    with attack_mode(model):
        out = active.run(model, x, y, model(x))
    assert torch.equal(out.x_adv, res.x_adv)
    never = out.iterations == 6  # samples the active set never stopped
    assert 0 < int(never.sum()) < x.shape[0]  # the batch really was compacted
    assert torch.equal(res.x_adv[never], full.x_adv[never])
    assert not torch.equal(res.x_adv[~never], full.x_adv[~never])  # stopped samples stayed where they were fooled


def test_strategies_declare_their_parameters():
    for s in (PGDAT(THREAT, steps=3), TRADES(THREAT, beta=2.0), MAAdvT(THREAT, boosted_ce=False),
              MPAdvT((0.0, 1.0), p_adv=0.25)):
        type(s).check_declarations()
        again = type(s)(getattr(s, type(s).positional[0]), **s.get_params())
        assert again.fingerprint() == s.fingerprint()
        assert s.set_params(**{k: v for k, v in s.get_params().items()}).fingerprint() == s.fingerprint()
    assert TRADES(THREAT).fingerprint() != TRADES(THREAT, beta=2.0).fingerprint()
    assert TRADES(THREAT).fingerprint() != TRADES(Linf(0.2, bounds=(0.0, 1.0))).fingerprint()
    assert MAAdvT(THREAT, steps=3).get_params() == {"steps": 3, "step_size": None, "beta": 6.0, "boosted_ce": True,
                                                   "detach_weight": False}
    assert repr(TRADES(THREAT, beta=2.0)) == "TRADES(threat=Linf(eps=0.1, bounds=(0, 1)), beta=2.0)"
    assert TRADES(THREAT, steps=5.0).steps == 5  # converted, not truncated
    with pytest.raises(InvalidParameterError, match="`steps` of TRADES must be an integer >= 1; got 2.5"):
        TRADES(THREAT, steps=2.5)


def test_mpadvt_eps_and_step_are_fractions_of_the_data_range():
    g = torch.Generator().manual_seed(0)
    unit, wide = MPAdvT((0.0, 1.0)), MPAdvT(Box(-1000.0, 1000.0))  # CT in HU: range 2000
    for _ in range(20):
        a, b = unit.draw(_clone(g)), wide.draw(g)
        assert a[0] == b[0] and a[2] == b[2] and b[1] == pytest.approx(2000 * a[1])
    # the PGD it runs uses ε and α in data units: identical steps on rescaled data and model
    model, task = Recorder().train(), MultiClass()
    always = dict(p_adv=1.0, eps_range=(0.2, 0.3), steps_range=(2, 2), step_size=0.05)
    lin = model.lin
    scaled = nn.Sequential(nn.Linear(2, 3))
    with torch.no_grad():
        scaled[0].weight.copy_(lin.weight / 10.0)
        scaled[0].bias.copy_(lin.bias)
    got_unit = MPAdvT((0.0, 1.0), **always).loss(model, X, T(Y), task, torch.Generator().manual_seed(4))
    got_wide = MPAdvT((0.0, 10.0), **always).loss(scaled.train(), 10 * X, T(Y), task, torch.Generator().manual_seed(4))
    assert float(got_wide.detach()) == pytest.approx(float(got_unit.detach()), rel=1e-5)
    with pytest.raises(InvalidParameterError, match="bounded"):
        MPAdvT(Box.unbounded())
    with pytest.raises(InvalidParameterError, match="box"):
        MPAdvT(THREAT)
    with pytest.warns(FutureWarning, match="bounds"):
        assert MPAdvT(bounds=(0.0, 1.0)).box == Box(0.0, 1.0)
