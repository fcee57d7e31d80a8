"""Gradient-masking checks: each flag fires on a purpose-built masked model and none fires on honest ones."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from medadv.masking import (
    CHECKS,
    MaskingFlag,
    check_black_box,
    check_monotone,
    check_probability_outputs,
    check_randomised,
    check_unbounded,
    check_zero_gradients,
    monotone_flags,
    run_checks,
)
from medadv.params import InvalidParameterError
from medadv.results import Results
from medadv.tasks import MultiClass, MultiLabel, Segmentation, Task
from medadv.threats import Box

FIXTURES = ["trained_multiclass", "trained_multilabel", "trained_seg2d", "trained_seg3d"]
STEPS = 10  # the unbounded run: the trained fixtures reach the floor in 10 APGD steps (default 50)


class Noisy(nn.Module):
    """Randomised defence: fresh Gaussian input noise in every forward, eval mode included."""

    def __init__(self, net: nn.Module, scale: float = 0.05) -> None:
        super().__init__()
        self.net, self.scale = net, scale

    def forward(self, x):
        return self.net(x + self.scale * torch.randn_like(x))


class Quantised(nn.Module):
    """Non-differentiable input quantisation to 1/8 steps (``round`` has a zero gradient everywhere)."""

    def forward_input(self, x):
        return torch.round(x * 8) / 8

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(self.forward_input(x))


class Detached(Quantised):
    """Quantisation through integers: the output has no autograd path to the input at all."""

    def forward_input(self, x):
        return (x * 8).round().long().to(x.dtype) / 8


class Probabilities(nn.Module):
    """Returns probabilities: softmax over the class axis, or sigmoids for multi-label."""

    def __init__(self, net: nn.Module, sigmoid: bool) -> None:
        super().__init__()
        self.net, self.sigmoid = net, sigmoid

    def forward(self, x):
        out = self.net(x)
        return out.sigmoid() if self.sigmoid else out.softmax(dim=1)


def snapshot(model: nn.Module):
    return (copy.deepcopy(model.state_dict()), [m.training for m in model.modules()],
            [p.requires_grad for p in model.parameters()],
            [None if p.grad is None else p.grad.clone() for p in model.parameters()])


def assert_untouched(model: nn.Module, before) -> None:
    state, modes, flags, grads = before
    after = model.state_dict()
    assert state.keys() == after.keys()
    assert all(torch.equal(state[k], after[k]) for k in state)
    assert [m.training for m in model.modules()] == modes
    assert [p.requires_grad for p in model.parameters()] == flags
    for g, p in zip(grads, model.parameters(), strict=True):  # the caller's .grad buffers are left as they were
        assert (g is None and p.grad is None) or (g is not None and p.grad is not None and torch.equal(g, p.grad))


def ids(flags: list[MaskingFlag]) -> set[str]:
    return {f.check for f in flags}


# --- honest models: no flag ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", FIXTURES)
def test_no_flag_on_trained_models(fixture, request):
    t = request.getfixturevalue(fixture)
    x, y = t.x.clone(), t.y.clone()
    before = snapshot(t.model)
    t.model.train()  # the checks run in eval mode and restore the caller's mode
    torch.manual_seed(123)
    flags = run_checks(t.model, t.task, t.x, t.y, Box(0, 1), steps=STEPS)
    drawn = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(drawn, torch.rand(3))  # a deterministic model: the checks consumed no global RNG
    assert all(m.training for m in t.model.modules())
    t.model.eval()
    assert flags == [], [str(f) for f in flags]
    assert torch.equal(t.x, x) and torch.equal(t.y, y)
    assert_untouched(t.model, before)


# --- (a) randomised model ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", FIXTURES)
def test_randomised_model_flagged(fixture, request):
    t = request.getfixturevalue(fixture)
    x = t.x.clone()
    model = Noisy(t.model)
    before = snapshot(model)
    flag = check_randomised(model, t.x)
    assert flag is not None and flag.check == "randomised"
    assert flag.value > 0.01  # input noise of 0.05 moves the outputs by ~10-50 %
    assert "EOT" in flag.message or "Expectation over Transformation" in flag.message
    assert check_randomised(t.model, t.x) is None
    # the only flag of the whole battery: noise does not hide the gradient
    assert ids(run_checks(model, t.task, t.x, t.y, Box(0, 1), steps=STEPS)) == {"randomised"}
    assert torch.equal(t.x, x)
    assert_untouched(model, before)


def test_randomised_threshold_and_repeats(trained_multiclass):
    t = trained_multiclass
    tiny = Noisy(t.model, scale=1e-7)
    flag = check_randomised(tiny, t.x, repeats=3, rtol=0.0)
    assert flag is not None and 0 < flag.value < 1e-3
    assert check_randomised(tiny, t.x, repeats=3, rtol=1e-3) is None
    with pytest.raises(InvalidParameterError, match="`repeats` of check_randomised must be an integer >= 2"):
        check_randomised(t.model, t.x, repeats=1)
    with pytest.raises(InvalidParameterError, match="`rtol`"):
        check_randomised(t.model, t.x, rtol=-1.0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        check_randomised(t.model, t.x.numpy())


# --- (b) non-differentiable quantisation -------------------------------------------------------------------------------
@pytest.mark.parametrize("wrapper", [Quantised, Detached])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_quantised_model_flagged(fixture, wrapper, request):
    t = request.getfixturevalue(fixture)
    x, y = t.x.clone(), t.y.clone()
    model = wrapper(t.model)
    before = snapshot(model)
    zero = check_zero_gradients(model, t.task, t.x, t.y)
    assert zero is not None and zero.check == "zero_gradients" and zero.value == 1.0
    assert "BPDA" in zero.message
    flags = {f.check: f for f in run_checks(model, t.task, t.x, t.y, Box(0, 1), steps=STEPS)}
    assert set(flags) == {"zero_gradients", "unbounded_not_floor"}
    # APGD cannot move: the metric stays at the clean one (accuracy ~0.9, exact match 1, Dice ~0.75-0.9)
    with torch.no_grad():
        clean = t.task.robust_metric(model(t.x), t.y).double().mean().item()
    assert flags["unbounded_not_floor"].value == pytest.approx(clean) and clean > 0.5
    assert torch.equal(t.x, x) and torch.equal(t.y, y)
    assert_untouched(model, before)


def test_zero_gradients_of_honest_model_below_threshold(trained_multiclass):
    t = trained_multiclass
    # dead ReLUs over the constant background give the small CNN a few exact zeros, far from half
    assert check_zero_gradients(t.model, t.task, t.x, t.y) is None
    flag = check_zero_gradients(t.model, t.task, t.x, t.y, threshold=1e-6)
    assert flag is not None and 0 < flag.value < 0.5
    assert check_zero_gradients(t.model, t.task, t.x, None) is None  # y=None: the clean prediction
    with pytest.raises(InvalidParameterError, match="`threshold`"):
        check_zero_gradients(t.model, t.task, t.x, t.y, threshold=0.0)
    with pytest.raises(ValueError, match="out of range"):
        check_zero_gradients(t.model, t.task, t.x, t.y + 10)


def test_zero_gradient_of_one_sample_is_flagged(trained_multiclass):
    t = trained_multiclass

    class DeadFirst(nn.Module):  # sample 0 quantised, the others honest
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(torch.cat([torch.round(x[:1] * 8) / 8, x[1:]]))

    flag = check_zero_gradients(DeadFirst(t.model), t.task, t.x, t.y)
    assert flag is not None and flag.value < 0.5  # the mean share is low, but one sample has no gradient
    assert "1 of 32 samples" in flag.message


def test_unbounded_per_channel_box_uses_widest_range(trained_seg2d):
    t = trained_seg2d
    box = Box(torch.zeros(2, 1, 1), torch.tensor([1.0, 2.0]).reshape(2, 1, 1))
    flag = check_unbounded(Quantised(t.model), t.task, t.x, t.y, box, steps=2)
    assert flag is not None and "(ε = 2)" in flag.message
    assert check_unbounded(t.model, t.task, t.x, t.y, box, steps=STEPS) is None
    with pytest.raises(ValueError, match="outside the declared bounds"):
        check_unbounded(t.model, t.task, t.x + 1.5, t.y, Box(0, 1))
    with pytest.raises(InvalidParameterError, match="`steps` of check_unbounded"):
        check_unbounded(t.model, t.task, t.x, t.y, Box(0, 1), steps=0)
    with pytest.raises(TypeError, match="`task` must be a medadv Task"):
        check_unbounded(t.model, "segmentation", t.x, t.y, Box(0, 1))


def test_unbounded_small_eps_does_not_reach_floor(trained_multiclass):
    """The flag measures the attack's reach: a tiny ball cannot fool the honest model, so it fires."""
    t = trained_multiclass
    flag = check_unbounded(t.model, t.task, t.x, t.y, Box(0, 1), steps=STEPS, eps=1e-4)
    assert flag is not None and flag.value > 0.5


# --- (c) probabilities instead of logits ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", FIXTURES)
def test_probability_outputs_flagged(fixture, request):
    t = request.getfixturevalue(fixture)
    sigmoid = isinstance(t.task, MultiLabel)
    model = Probabilities(t.model, sigmoid)
    with torch.no_grad():
        probs, logits = model(t.x), t.model(t.x)
    flag = check_probability_outputs(t.task, probs)
    assert flag is not None and flag.check == "probability_outputs"
    assert "logits, not probabilities" in flag.message
    assert flag.value == (1.0 if sigmoid else pytest.approx(0.0, abs=1e-5))
    assert check_probability_outputs(t.task, logits) is None
    # through run_checks with precomputed logits; saturated, not zero, gradients (the unbounded run is left
    # out: on probabilities its backward crawls through denormal floats on CPU)
    flags = run_checks(model, t.task, t.x, t.y, Box(0, 1), logits=probs, unbounded=False)
    assert ids(flags) == {"probability_outputs"}


def test_probability_outputs_edge_cases():
    mc = MultiClass()
    # log-probabilities are valid logits (softmax of log-softmax is the softmax): not flagged
    logits = torch.randn(6, 4)
    assert check_probability_outputs(mc, logits.log_softmax(1)) is None
    # per-class sigmoids do not sum to 1 but are bounded: flagged with enough values
    flag = check_probability_outputs(mc, logits.sigmoid())
    assert flag is not None and flag.value == 1.0
    # a lone sample with a few small logits is no evidence (min_values)
    ml = MultiLabel()
    assert check_probability_outputs(ml, torch.tensor([[0.2, 0.7, 0.9]])) is None
    assert check_probability_outputs(ml, torch.tensor([[0.2, 0.7, 0.9]]), min_values=3) is not None
    assert check_probability_outputs(ml, torch.tensor([[0.2, -0.7, 0.9] * 4])) is None
    # segmentation softmax maps, one row per voxel
    seg = Segmentation(3)
    assert check_probability_outputs(seg, torch.randn(2, 3, 4, 4, 4).softmax(1)) is not None
    # half-precision softmax still sums to 1 within atol
    half = torch.randn(8, 5).softmax(1).half().float()
    assert check_probability_outputs(mc, half) is not None
    with pytest.raises(ValueError, match=r"\(N, K\) logits"):
        check_probability_outputs(mc, torch.rand(4))
    with pytest.raises(TypeError, match="`task` must be a medadv Task"):
        check_probability_outputs(None, logits)


# --- black box vs white box -------------------------------------------------------------------------------------------------
def test_black_box_flag():
    white = torch.tensor([1.0, 1.0, 0.0, 0.6, 0.8])
    assert check_black_box(white, white.clone()) is None
    assert check_black_box(white, white + 0.1) is None  # black-box worse: fine
    assert check_black_box(white, white - 0.005) is None  # within the per-sample tolerance
    black = white.clone()
    black[0] = 0.0
    black[3] = 0.4
    flag = check_black_box(white, black)
    assert flag is not None and flag.check == "black_box_wins"
    assert flag.value == pytest.approx(2 / 5)
    assert "2 of 5" in flag.message and "0.6" in flag.message  # mean gain (1 + 0.2) / 2
    # several white-box components: the per-sample best one counts
    stack = torch.stack([white, torch.tensor([0.0, 1.0, 0.0, 0.4, 0.8])])
    flag2 = check_black_box(stack, black)
    assert flag2 is None
    # NaN where the black box did not run: ignored
    partial = torch.tensor([math.nan, 1.0, 0.0, 0.4, math.nan])
    flag3 = check_black_box(white, partial)
    assert flag3 is not None and flag3.value == pytest.approx(1 / 3)
    # a tolerated share (AutoAttack's 0.2 % by default)
    assert check_black_box(white, black, min_share=0.5) is None
    assert check_black_box([1.0, 1.0], [1.0, 0.0]) is not None  # plain sequences
    with pytest.raises(ValueError, match="`white` must be"):
        check_black_box(white[:3], black)
    with pytest.raises(ValueError, match="non-empty"):
        check_black_box([], [])
    with pytest.raises(InvalidParameterError, match="`tolerance`"):
        check_black_box(white, black, tolerance=-0.1)


# --- monotone in ε ---------------------------------------------------------------------------------------------------------------
def test_check_monotone():
    assert check_monotone([1, 2, 4], [0.8, 0.5, 0.1]) is None
    assert check_monotone([4, 1, 2], [0.1, 0.8, 0.5]) is None  # any order
    assert check_monotone([1, 2], [0.5, 0.505]) is None  # within tolerance
    flag = check_monotone([1, 2, 4, 8], [0.8, 0.3, 0.5, 0.1], name="accuracy")
    assert flag is not None and flag.check == "non_monotone"
    assert flag.value == pytest.approx(0.2)
    assert "accuracy rises from 0.3 at ε = 2 to 0.5 at ε = 4" in flag.message
    # compared with the lowest value at any smaller budget, not only the previous one
    flag = check_monotone([1, 2, 4], [0.2, 0.4, 0.35])
    assert flag is not None and flag.value == pytest.approx(0.2)
    assert check_monotone([1, 2, 4], [0.8, math.nan, 0.9]) is not None  # NaN skipped, 0.8 -> 0.9 remains
    assert check_monotone([1], [0.5]) is None
    with pytest.raises(ValueError, match="same length"):
        check_monotone([1, 2], [0.5])
    with pytest.raises(ValueError, match="duplicates"):
        check_monotone([1, 1], [0.5, 0.4])


def test_monotone_flags_from_results():
    def rows(attack, budget, values, col="adv_correct"):
        return [{"sample": i, "attack": attack, "budget": budget, col: v} for i, v in enumerate(values)]

    res = Results(rows("auto", 0.01, [True, True, False, True]) + rows("auto", 0.02, [True, False, False, False])
                  + rows("pgd", 0.01, [True, False, False, False]) + rows("pgd", 0.02, [True, True, False, True])
                  + rows("fgsm", None, [True, True, True, True]))
    flags = monotone_flags(res)
    assert [f.check for f in flags] == ["non_monotone"]
    assert "adv_correct of pgd" in flags[0].message and flags[0].value == pytest.approx(0.5)
    assert flags[0].attack == "pgd" and flags[0].as_dict()["attack"] == "pgd"
    assert monotone_flags(res, "auto") == []
    assert len(monotone_flags(res, "pgd")) == 1
    with pytest.raises(ValueError, match="no rows"):
        monotone_flags(res, "apgd")
    # segmentation rows (mean Dice); a sample missing at one budget is left out of both means
    seg = Results(rows("auto", 1.0, [0.9, 0.5, 0.1], "adv_mean_dice") + rows("auto", 2.0, [0.4, 0.45], "adv_mean_dice"))
    assert monotone_flags(seg) == []
    seg.extend([{"sample": 2, "attack": "auto", "budget": 2.0, "adv_mean_dice": 0.8}])
    flags = monotone_flags(seg)
    assert len(flags) == 1 and flags[0].value == pytest.approx((0.4 + 0.45 + 0.8 - 1.5) / 3)
    # multi-label rows
    ml = Results(rows("auto", 1.0, [False, False], "adv_exact_match") + rows("auto", 2.0, [True, False], "adv_exact_match"))
    assert len(monotone_flags(ml)) == 1


# --- the flag object -----------------------------------------------------------------------------------------------------------
def test_flag_object_and_descriptions():
    flag = MaskingFlag("zero_gradients", "msg", 0.75)
    assert flag.as_dict() == {"check": "zero_gradients", "message": "msg", "value": 0.75, "attack": None}
    with pytest.raises(AttributeError):
        flag.value = 0.1  # type: ignore[misc]
    assert set(CHECKS) == {"randomised", "probability_outputs", "zero_gradients", "black_box_wins",
                           "non_monotone", "unbounded_not_floor"}
    assert all(isinstance(v, str) and v for v in CHECKS.values())
    assert str(flag) == "[zero_gradients] msg"


def test_run_checks_arguments(trained_multiclass):
    t = trained_multiclass
    with pytest.raises(ValueError, match="outside the declared bounds"):
        run_checks(t.model, t.task, t.x * 3, t.y, Box(0, 1))
    with pytest.raises(TypeError, match="`logits` must be a torch.Tensor"):
        run_checks(t.model, t.task, t.x, t.y, Box(0, 1), logits=[1.0])
    with pytest.raises(TypeError, match="nn.Module"):
        run_checks(lambda x: x, t.task, t.x, t.y, Box(0, 1))
    # unbounded=False skips the costly run: the quantised model then only shows its zero gradients
    assert ids(run_checks(Quantised(t.model), t.task, t.x, None, (0, 1), unbounded=False)) == {"zero_gradients"}


def test_batchnorm_model_in_train_mode_untouched():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                        nn.Linear(4 * 8 * 8, 3)).train()
    x, y = torch.rand(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    before = snapshot(net)
    flags = run_checks(net, MultiClass(), x, y, Box(0, 1), steps=3)
    assert "randomised" not in ids(flags)  # eval mode: batch statistics are not used, no flag
    assert net.training and net[1].training
    assert_untouched(net, before)  # running statistics not updated


def test_task_without_robust_metric():
    class Plain(MultiClass):  # a user task that only defines the loss and predictions
        robust_metric = Task.robust_metric

    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    x = torch.rand(4, 1, 4, 4)
    assert run_checks(net, Plain(), x, None, Box(0, 1)) == []  # the unbounded run is skipped
    with pytest.raises(TypeError, match="defines none"):
        check_unbounded(net, Plain(), x, None, Box(0, 1))


def test_monotone_flags_join_the_per_budget_entries_of_a_config():
    """Configs name one entry per budget (``auto@0.0314``): the check still compares across budgets."""
    rows = [{"sample": i, "attack": f"auto@{b}", "budget": b, "adv_correct": v}
            for b, v in ((0.01, 0.2), (0.03, 0.9)) for i in range(4)]
    flags = monotone_flags(Results(rows))
    assert [f.attack for f in flags] == ["auto"] and flags[0].check == "non_monotone"
    assert monotone_flags(Results(rows), "auto") and not monotone_flags(Results(rows[:4]))


def test_monotone_check_leaves_out_attacks_that_do_not_search_the_task_metric():
    # a volume objective or a noise control need not lower Dice as ε grows (the deepbet demo's `volume` attack
    # grows the brain and raises Dice to the reference): flagging them as masked gradients would be wrong
    from medadv.attacks import PGD, Noise
    from medadv.masking import monotone_flags
    from medadv.results import Results
    from medadv.tasks import Segmentation
    from medadv.threats import Linf

    task = Segmentation(2)
    assert PGD(task, Linf(0.1, bounds=(0, 1))).optimises_task_metric
    assert not PGD(task, Linf(0.1, bounds=(0, 1)), loss="volume").optimises_task_metric
    assert not Noise(task, Linf(0.1, bounds=(0, 1))).optimises_task_metric
    rows = [{"sample": s, "attack": f"{a}@{b}", "budget": b, "adv_mean_dice": d}
            for a in ("volume", "pgd") for s in range(2) for b, d in ((1.0, 0.5), (2.0, 0.7))]
    flagged = {f.attack for f in monotone_flags(Results(rows))}
    assert flagged == {"volume", "pgd"}  # the control: without the declaration both rise and both are flagged
    kept = {f.attack for f in monotone_flags(Results(rows, meta={"off_metric": ["volume@1", "volume@2"]}))}
    assert kept == {"pgd"}


def test_the_checks_live_with_the_attacks_and_medadv_masking_reexports_them():
    """``auto`` runs the checks and the unbounded check runs APGD, so they live in ``medadv.attacks.masking`` (no
    attacks <-> masking import cycle, tests/test_layout.py); ``medadv.masking`` offers the very same objects."""
    import ast
    import inspect

    import medadv.attacks.auto
    import medadv.attacks.masking as low
    import medadv.masking as public

    assert public.__all__ == low.__all__
    for name in public.__all__:
        assert getattr(public, name) is getattr(low, name), name
    imported = {(n.level, n.module) for n in ast.walk(ast.parse(inspect.getsource(medadv.attacks.auto)))
                if isinstance(n, ast.ImportFrom)}
    assert (1, "masking") in imported and (2, "masking") not in imported  # .masking, never ..masking
