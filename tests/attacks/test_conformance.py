"""Conformance: every registered attack, on every task it supports, honours the one attack contract.

Parametrized from ``available_attacks()`` and the classes' metadata by ``conftest.py`` (the factory):
a new attack gets these checks without editing a list. Checked per attack and task:

* bad inputs (NaN ``x``, ``x`` outside the box, a ``y`` of the wrong shape, a model that is not an
  ``nn.Module``) get a clear error before any work (at most the one clean forward that validates ``y``);
* ``x_adv`` lies inside the data box (exactly) and, for ball attacks, inside the ε-ball, for every norm
  the attack declares (and the plain box for "ball_or_box" attacks);
* the model's modes, ``requires_grad`` flags, ``.grad``, weights and BatchNorm statistics, the caller's
  ``x`` and ``y`` and torch's global RNG are left as they were; ``x_adv`` does not alias ``x``;
* the same seed gives the same tensor;

and per attack: ``check_declarations()`` passes, ``get_params()`` round-trips through a YAML config to
the same fingerprint, the fingerprint changes when any declared parameter, the ε or the box changes,
and an unknown keyword is refused with the closest valid name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import yaml
from torch import Tensor, nn

from medadv.attacks.base import AttackResult, attack_class, get_attack
from medadv.params import InvalidParameterError, stable_hash
from medadv.threats import Box, Threat


# --- one attack run per case, shared by the checks that only read it -------------------------------------------
@dataclass
class Run:
    x: Tensor
    y: Tensor
    x_before: Tensor
    y_before: Tensor
    state_before: dict[str, Any]
    state_after: dict[str, Any]
    rng_before: Tensor
    rng_after: Tensor
    grad_mode: tuple[bool, bool]
    seeded: bool
    result: AttackResult | None
    error: BaseException | None

    def get(self) -> AttackResult:
        if self.error is not None:
            raise AssertionError(f"the attack call failed: {type(self.error).__name__}: {self.error}") \
                from self.error
        assert self.result is not None
        return self.result


_RUNS: dict[str, Run] = {}


def _run(case: Any, factory: Any) -> Run:
    threat = case.threat()
    key = f"{case.name}|{case.setting.key}|{threat!r}"  # a norm case with the default threat shares the run
    if key in _RUNS:
        return _RUNS[key]
    attack = case.build(threat=threat)
    model = factory.prepare_model(case.model()).to(factory.device)  # `pytest --device cuda` runs it on the GPU
    x, y = (t.to(factory.device) for t in case.data())
    x_before, y_before = x.clone(), y.clone()
    state_before = factory.model_state(model)
    rng_before = torch.get_rng_state()
    grad_before = torch.is_grad_enabled()
    result, error = None, None
    try:
        result = attack(model, x, y)
    except Exception as e:  # recorded: every check of this case reports it
        error = e
    run = Run(x, y, x_before, y_before, state_before, factory.model_state(model), rng_before,
              torch.get_rng_state(), (grad_before, torch.is_grad_enabled()),
              getattr(attack, "seed", None) is not None, result, error)
    _RUNS[key] = run
    return run


def _box_violation(box: Box, x_adv: Tensor) -> float:
    if box.bounds is None:
        return 0.0
    lo, hi = box.lohi(x_adv)
    return float(torch.maximum(lo - x_adv, x_adv - hi).clamp_min(0).max())


def _check_inside(threat: Threat | Box, x: Tensor, res: AttackResult) -> None:
    box = threat if isinstance(threat, Box) else threat.box
    # exactly inside: a model or a second attack that checks its input must accept x_adv
    assert _box_violation(box, res.x_adv) == 0.0, f"x_adv leaves the box {box!r} by {_box_violation(box, res.x_adv)}"
    box.check_inside(res.x_adv, "x_adv")
    if isinstance(threat, Threat):
        norms = threat.norm(res.x_adv - x)
        tol = threat.eps * 1e-5 + 1e-6
        assert bool((norms <= threat.eps + tol).all()), \
            f"x_adv leaves the {type(threat).__name__} ball of radius {threat.eps}: norms {norms.tolist()}"


# --- per attack and task -----------------------------------------------------------------------------------------
def test_result_has_the_documented_shapes(case, factory):
    run = _run(case, factory)
    res = run.get()
    n = run.x.shape[0]
    assert res.x_adv.shape == run.x.shape and res.x_adv.dtype == run.x.dtype and res.x_adv.device == run.x.device
    assert res.fooled.shape == (n,) and res.fooled.dtype == torch.bool
    assert res.linf.shape == (n,) and res.l2.shape == (n,)
    assert torch.isfinite(res.x_adv).all() and torch.isfinite(res.logits).all()
    assert not res.x_adv.requires_grad
    # the typed details' declared columns are per-sample values (they become result-table columns)
    for i, row in enumerate(res.rows()):
        assert set(row) == set(() if res.details is None else res.details.columns), i


def test_x_adv_inside_box_and_ball(case, factory):
    run = _run(case, factory)
    _check_inside(case.threat(), run.x, run.get())


def test_every_declared_norm_is_respected(norm_case, factory):
    run = _run(norm_case, factory)
    _check_inside(norm_case.threat(), run.x, run.get())


HU_LO, HU_WIDTH = -1024.0, 4095.0  # CT in Hounsfield units: the factory's [0, 1] box mapped onto [-1024, 3071]


def _in_hu(threat: Threat | Box) -> Threat | Box:
    box = threat if isinstance(threat, Box) else threat.box
    assert box.bounds is not None
    lo, hi = box.bounds
    hu = Box(HU_LO + HU_WIDTH * lo, HU_LO + HU_WIDTH * hi)
    return hu if isinstance(threat, Box) else type(threat)(threat.eps * HU_WIDTH, bounds=hu)


def test_every_declared_norm_stays_finite_on_hu_range_data(norm_case, factory):
    """Data in Hounsfield units drive the tiny models' logits into the thousands: the softmax saturates and
    probabilities underflow to exactly 0, where a careless log or normalisation gives NaN (issue 19: APGD's
    JS loss under L2). Every attack, every declared norm: a finite ``x_adv`` inside the box and the ball."""
    threat = _in_hu(norm_case.threat())
    attack = norm_case.build(threat=threat)
    model = factory.prepare_model(norm_case.model()).to(factory.device)
    x, y = norm_case.data()
    x, y = (HU_LO + HU_WIDTH * x).to(factory.device), y.to(factory.device)
    res = attack(model, x, y)
    assert torch.isfinite(res.x_adv).all(), "x_adv holds NaN/Inf on HU-range data"
    _check_inside(threat, x, res)


def _state_problems(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = []
    if after["modes"] != before["modes"]:
        out.append("train/eval flags of the submodules changed")
    if after["requires_grad"] != before["requires_grad"]:
        out.append("requires_grad flags changed")
    if not all(a is None for a in after["grads"]):
        out.append("gradients left on the model's parameters")
    changed = [k for k, v in before["state"].items() if not torch.equal(v, after["state"][k])]
    if changed:
        out.append(f"weights or buffers changed (BatchNorm statistics?): {changed}")
    return out


def test_model_state_is_restored(case, factory):
    run = _run(case, factory)
    run.get()
    assert not _state_problems(run.state_before, run.state_after)
    assert run.grad_mode[0] == run.grad_mode[1], "torch's grad mode changed"


def test_caller_tensors_are_untouched(case, factory):
    run = _run(case, factory)
    res = run.get()
    assert torch.equal(run.x, run.x_before), "x was modified in place"
    assert torch.equal(run.y, run.y_before), "y was modified in place"
    # x_adv and the returned labels are the caller's to modify: they must not share memory with x and y
    assert res.x_adv.untyped_storage().data_ptr() != run.x.untyped_storage().data_ptr(), "x_adv aliases x"
    assert res.y.untyped_storage().data_ptr() != run.y.untyped_storage().data_ptr(), "result.y aliases y"


def test_global_rng_is_untouched(case, factory):
    run = _run(case, factory)
    run.get()
    assert run.seeded, "the factory builds attacks with their default seed, which must not be None"
    assert torch.equal(run.rng_before, run.rng_after), "a seeded attack used or re-seeded torch's global RNG"


def test_same_seed_same_tensor(case, factory):
    first = _run(case, factory).get()
    x, y = case.data()
    again = case.build()(factory.prepare_model(case.model()), x, y)
    assert torch.equal(first.x_adv, again.x_adv), "same seed, same settings, same data: a different x_adv"


BAD = ("nan_x", "x_outside_box", "y_wrong_shape", "model_not_a_module")


@pytest.mark.parametrize("bad", BAD)
def test_bad_input_fails_clearly_before_work(case, bad, factory):
    attack = case.build()
    model = case.model().eval()
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    x, y = case.data()
    allowed = 0  # forwards allowed before the error
    if bad == "nan_x":
        x[0].view(-1)[0] = float("nan")
        err, match = ValueError, r"`x` contains NaN"
    elif bad == "x_outside_box":
        hi = factory.make_box(case.setting).hi
        x = x + 2 * (hi if isinstance(hi, Tensor) else float(hi))
        err, match = ValueError, r"`x` has values .* outside the declared bounds"
    elif bad == "y_wrong_shape":
        y = y[:-1] if y.ndim == 1 or not case.setting.segmenter else y[:, :-1]
        err, match = (ValueError, TypeError), r"`y`"
        allowed = 1  # the clean forward that y is checked against
    else:
        model = lambda t: t  # noqa: E731
        err, match = TypeError, r"`model` must be a torch.nn.Module"
    with pytest.raises(err, match=match):
        attack(model, x, y)
    assert len(calls) <= allowed, f"{len(calls)} forward passes before the error"


# --- per attack --------------------------------------------------------------------------------------------------
def test_declarations_are_complete(attack_name):
    cls = attack_class(attack_name)
    cls.check_declarations()
    assert cls.threat_kind in ("ball", "box", "ball_or_box")
    assert cls.__doc__ and cls.__doc__.strip(), "a public attack needs a docstring"


class _NotYAML(Exception):
    pass


def _to_config(v: Any) -> Any:
    """A value's YAML form: plain values as they are, objects by their ``config()`` form."""
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v
    if isinstance(v, tuple | list):
        return [_to_config(e) for e in v]
    if isinstance(v, Mapping):
        return {str(k): _to_config(e) for k, e in v.items()}
    config = getattr(v, "config", None)
    if callable(config):
        return _to_config(config())
    raise _NotYAML(type(v).__name__)


def test_params_round_trip_through_a_yaml_config(attack_name, factory):
    """``get_params()`` -> ``yaml.safe_dump`` -> load -> ``get_attack`` gives the same fingerprint.

    Objects go through their ``config()`` form (explanations). Only values that have no YAML form at
    all, ``nn.Module`` instances (a trained GAP generator) and tensors, are handed over as objects; a
    config names them by path instead (e.g. ``generator: {checkpoint: gap.pt}``).
    """
    case = factory.first_case(attack_name)
    attack = case.build()
    params = attack.get_params()
    assert list(params) == attack.param_names()
    cfg, objects = {}, {}
    for k, v in params.items():
        try:
            cfg[k] = _to_config(v)
        except _NotYAML:
            assert isinstance(v, nn.Module | Tensor), f"`{k}` = {type(v).__name__} has no YAML (config()) form"
            objects[k] = v
    loaded = yaml.safe_load(yaml.safe_dump({"name": attack_name, **cfg}))
    again = get_attack(loaded.pop("name"), case.task, case.threat(), **loaded, **objects)
    assert again.fingerprint() == attack.fingerprint()
    assert again.get_params().keys() == params.keys()


def _try_build(case: Any, **params: Any) -> Any:
    try:
        return case.build(**params)
    except (ValueError, TypeError) as e:  # e.g. a value another parameter rules out
        return e


def test_fingerprint_differs_when_a_parameter_differs(attack_param, factory):
    name, p = attack_param
    case = factory.first_case(name)
    base = case.build()
    declared = base.declared_params()
    assert p in declared, f"`{p}` is not declared"
    current = base.get_params()[p]
    values = factory.candidates(declared[p], current)
    if not values:
        return  # the declaration admits this one value only: there is no other setting to tell apart
    refused = []
    # a value may apply to some tasks only (auto's progressive_radius is refused for multi-class): every setting
    for setting in factory.settings_for(case.cls):
        here = factory.Case(name, setting)
        here_base = here.build()
        for v in values:
            other = _try_build(here, **{p: v})
            if isinstance(other, Exception):
                refused.append(f"{v!r} ({setting.key}): {other}")
                continue
            assert stable_hash(other.get_params()[p]) != stable_hash(current), f"`{p}`={v!r} was not stored"
            assert other.fingerprint() != here_base.fingerprint(), f"`{p}`={v!r} gives the same fingerprint"
            return
    # values that need another parameter changed with them (GAP's universal=True needs input_shape,
    # AutoAttack's version='standard' needs attacks=None): two valid builds that differ in `p` only
    for q, cq in declared.items():
        if q == p or q not in base.param_names():
            continue
        for w in [base.get_params()[q], *factory.candidates(cq, base.get_params()[q], limit=4)]:
            built = []
            for v in [current, *values]:
                other = _try_build(case, **{p: v, q: w})
                if not isinstance(other, Exception):
                    built.append((v, other))
                if len(built) == 2:
                    (v1, a), (v2, b) = built
                    assert a.fingerprint() != b.fingerprint(), \
                        f"`{p}`={v1!r} and {v2!r} (with `{q}`={w!r}) give the same fingerprint"
                    return
    pytest.fail(f"no different valid value of `{p}` ({declared[p]!r}, now {current!r}) could be built: {refused}")


def test_fingerprint_differs_with_the_budget_and_the_box(attack_name, factory):
    case = factory.first_case(attack_name)
    threat = case.threat()
    base = case.build().fingerprint()
    box = threat if isinstance(threat, Box) else threat.box
    lo, hi = box.bounds
    wider = Box(lo, hi * 2)
    if isinstance(threat, Threat):
        assert case.build(threat=threat.with_eps(threat.eps * 2)).fingerprint() != base
        assert case.build(threat=type(threat)(threat.eps, bounds=wider)).fingerprint() != base
    else:
        assert case.build(threat=wider).fingerprint() != base


def test_unknown_parameter_names_the_closest(attack_param, factory):
    name, p = attack_param
    case = factory.first_case(name)
    typo = p + p[-1]
    with pytest.raises(InvalidParameterError, match=rf"unknown parameter `{typo}`.*did you mean '{p}'"):
        get_attack(name, case.task, case.threat(), **{typo: 1})


def test_deprecated_alias_warns_and_maps_to_the_new_name(attack_alias, factory):
    name, old, new = attack_alias
    case = factory.first_case(name)
    declared = case.cls.declared_params()
    assert new in case.cls.param_names() and new in declared, f"alias `{old}` points to `{new}`, not a parameter"
    assert old not in case.cls.param_names()
    base = case.build()
    for v in factory.candidates(declared[new], base.get_params()[new]):
        ref = _try_build(case, **{new: v})
        if isinstance(ref, Exception):
            continue
        with pytest.warns(FutureWarning, match=rf"`{old}` .*deprecated.*`{new}`"):
            via_alias = get_attack(name, case.task, case.threat(),
                                   **{k: w for k, w in case.small().items() if k != new}, **{old: v})
        assert via_alias.fingerprint() == ref.fingerprint() != base.fingerprint()
        return
    pytest.fail(f"no value of `{new}` to try the alias `{old}` with")


def test_small_factory_only_shrinks_declared_knobs(attack_name, factory):
    # the factory's own honesty: what it changes is declared (or the generator a GAP-style attack needs)
    case = factory.first_case(attack_name)
    small = case.small()
    assert set(small) <= set(attack_class(attack_name).param_names())
    # (and step_size, in data units, for per-channel boxes of different widths: no default relative to one range)
    assert all(k in factory.SMALL or k == "generator" or (k == "step_size" and case.setting.channels > 1)
               for k in small)
    assert not any(isinstance(v, float) and math.isnan(v) for v in small.values())


# --- the checks themselves catch what they claim to -----------------------------------------------------------
def test_the_checks_catch_a_sloppy_attack(factory):
    """An attack that leaves the ball and the box, runs the model in train mode and draws from the global
    RNG is caught by the helpers the checks above use."""
    from medadv.attacks.base import Attack
    from medadv.threats import Linf

    class Sloppy(Attack):
        """Breaks every rule."""

        def perturb(self, model, x, y, logits):
            model.train()
            model(x)  # BatchNorm statistics move
            return x + 3 * self.threat.eps + torch.rand(()) * 0  # out of the ball, the box; global RNG

    case = factory.Case("pgd", factory.first_case("pgd").setting)
    model = factory.prepare_model(case.model())
    x, y = case.data()
    threat = Linf(0.1, bounds=(0.0, 1.0))
    before, rng = factory.model_state(model), torch.get_rng_state()
    res = Sloppy(case.task, threat)(model, x, y)
    with pytest.raises(AssertionError, match="leaves the box"):
        _check_inside(threat, x, res)
    with pytest.raises(AssertionError, match="leaves the Linf ball"):
        _check_inside(Linf(0.1, bounds=None), x, res)
    assert any("BatchNorm" in p for p in _state_problems(before, factory.model_state(model)))
    assert not torch.equal(rng, torch.get_rng_state())


def test_candidates_give_a_different_valid_value_for_every_constraint_type(factory):
    from medadv.explain import Explanation, SmoothGrad, get_explanation
    from medadv.params import AnyOf, Bool, Component, Instance, Int, Optional, Options, Pair, Real

    def differs(c, current):
        vals = factory.candidates(c, current)
        assert vals, f"no candidate for {c!r}"
        for v in vals:
            assert stable_hash(c.convert(v)) != stable_hash(current), (c, v)
        return vals

    assert all(isinstance(v, int) and v >= 1 for v in differs(Int(low=1), 2))
    assert all(0 < v < 1 for v in differs(Real(low=0, high=1, low_open=True, high_open=True), 0.5))
    assert differs(Bool(), True) == [False]
    assert differs(Options("a", "b", "c"), "a") == ["b", "c"]
    assert differs(Optional(Int(low=0)), None)[0] is not None
    assert None in differs(Optional(Int(low=0)), 3)
    for a, b in differs(Pair(Real(low=0), ordered=True), (0.1, 0.2)):
        assert a <= b
    assert differs(AnyOf(Int(low=1), Options("auto")), "auto")
    comp = Component(Explanation, get_explanation, "an explanation")
    variants = differs(comp, SmoothGrad())
    # a SmoothGrad with one parameter changed, and the other explanations by name
    assert any(isinstance(v, SmoothGrad) for v in variants) and "gradient" in variants
    gen = nn.Conv2d(1, 1, 1)
    assert all(isinstance(m, nn.Module) for m in differs(Instance(nn.Module), gen))
