"""Conformance: every registered attack, on every task setting it supports, honours the one attack contract.

The checks are the public :func:`medadv.testing.check_attack` (:mod:`medadv.testing.attack_checks`); the tests
below run them per attack × setting × property, so a failure names all three, and ``test_check_attack`` runs the
whole contract per attack × registered task kind (refusals included). One attack run per case is shared by every
check through ``RUNS``. Parametrized from ``available_attacks()``, ``available_tasks()`` and the classes'
metadata by ``conftest.py``: a new attack or task kind gets these checks without editing a list. Checked per
attack and setting:

* bad inputs (NaN ``x``, ``x`` outside the box, a ``y`` of the wrong shape, a model that is not an
  ``nn.Module``) get a clear error before any work (at most the one clean forward that validates ``y``);
* ``x_adv`` lies inside the data box (exactly) and, for ball attacks, inside the ε-ball, for every norm
  the attack declares (and the plain box for "ball_or_box" attacks), also on data in Hounsfield units;
* the model's modes, ``requires_grad`` flags, ``.grad``, weights and BatchNorm statistics, the caller's
  ``x`` and ``y`` and torch's global RNG are left as they were; ``x_adv`` does not alias ``x``;
* the same seed gives the same tensor;
* the result splits per sample, so a run's attack cache (:mod:`medadv.attack_cache`) serves it back, equal, instead
  of crafting it again;

and per attack: ``check_declarations()`` passes, ``get_params()`` round-trips through a YAML config to
the same fingerprint, the fingerprint changes when any declared parameter, the ε or the box changes,
and an unknown keyword is refused with the closest valid name.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from medadv.attacks.base import attack_class
from medadv.params import stable_hash
from medadv.testing import check_attack
from medadv.testing.attack_checks import (
    BAD_INPUTS,
    check_alias,
    check_attack_property,
    check_bad_input,
    check_budget_fingerprint,
    check_case,
    check_norm,
    check_parameter_fingerprint,
    check_unknown_parameter,
)

#: attack runs and outcomes shared by every check of this module (one run per attack × setting × threat)
RUNS: dict[str, Any] = {}


# --- per attack and setting --------------------------------------------------------------------------------------
def test_result_has_the_documented_shapes(case, factory):
    check_case(case, "result shapes", factory.device, RUNS)


def test_x_adv_inside_box_and_ball(case, factory):
    check_case(case, "box and ball", factory.device, RUNS)


def test_every_declared_norm_is_respected(norm_case, factory):
    check_norm(norm_case, factory.device, RUNS)


def test_every_declared_norm_stays_finite_on_hu_range_data(norm_case, factory):
    """Data in Hounsfield units drive the tiny models' logits into the thousands: the softmax saturates and
    probabilities underflow to exactly 0, where a careless log or normalisation gives NaN (issue 19: APGD's
    JS loss under L2). Every attack, every declared norm: a finite ``x_adv`` inside the box and the ball."""
    check_norm(norm_case, factory.device, RUNS, hu=True)


def test_model_state_is_restored(case, factory):
    check_case(case, "model state", factory.device, RUNS)


def test_caller_tensors_are_untouched(case, factory):
    check_case(case, "caller tensors", factory.device, RUNS)


def test_global_rng_is_untouched(case, factory):
    check_case(case, "global RNG", factory.device, RUNS)


def test_same_seed_same_tensor(case, factory):
    check_case(case, "determinism", factory.device, RUNS)


def test_each_sample_is_crafted_once_per_run(case, factory):
    check_case(case, "attack once", factory.device, RUNS)


@pytest.mark.parametrize("bad", BAD_INPUTS)
def test_bad_input_fails_clearly_before_work(case, bad):
    check_bad_input(case, bad, RUNS)


# --- per attack --------------------------------------------------------------------------------------------------
def test_declarations_are_complete(attack_name, factory):
    check_attack_property(factory.first_case(attack_name), "declarations", factory.SETTINGS, RUNS)


def test_params_round_trip_through_a_yaml_config(attack_name, factory):
    """``get_params()`` -> ``yaml.safe_dump`` -> load -> ``get_attack`` gives the same fingerprint.

    Objects go through their ``config()`` form (explanations). Only values that have no YAML form at
    all, ``nn.Module`` instances (a trained GAP generator) and tensors, are handed over as objects; a
    config names them by path instead (e.g. ``generator: {checkpoint: gap.pt}``).
    """
    check_attack_property(factory.first_case(attack_name), "config round trip", factory.SETTINGS, RUNS)


def test_fingerprint_differs_when_a_parameter_differs(attack_param, factory):
    name, p = attack_param
    check_parameter_fingerprint(factory.first_case(name), p, factory.SETTINGS, RUNS)


def test_fingerprint_differs_with_the_budget_and_the_box(attack_name, factory):
    check_budget_fingerprint(factory.first_case(attack_name), RUNS)


def test_unknown_parameter_names_the_closest(attack_param, factory):
    name, p = attack_param
    check_unknown_parameter(factory.first_case(name), p, RUNS)


def test_deprecated_alias_warns_and_maps_to_the_new_name(attack_alias, factory):
    name, old, new = attack_alias
    check_alias(factory.first_case(name), old, new, RUNS)


def test_small_factory_only_shrinks_declared_knobs(attack_name, factory):
    # the factory's own honesty: what it changes is declared (or the generator a GAP-style attack needs)
    for setting in factory.settings_for(attack_class(attack_name)):
        case = factory.Case(attack_name, setting)
        small = case.small()
        assert set(small) <= set(attack_class(attack_name).param_names())
        # (and step_size, in data units, for per-channel boxes of different widths: no default relative to one range)
        assert all(k in factory.SMALL or k == "generator" or (k == "step_size" and setting.channels > 1)
                   for k in small)
        assert not any(isinstance(v, float) and math.isnan(v) for v in small.values())


# --- the public check, per attack × registered task kind ---------------------------------------------------------
def test_check_attack(attack_name, task_kind, factory):
    """``check_attack`` over every registered attack × every registered task kind: the whole contract on the kind's
    examples the attack admits, and a clear refusal before any work on the others (shares ``RUNS`` with the finer
    tests above, so it costs little more than the runs they make)."""
    report = check_attack(attack_name, [task_kind], device=factory.device, cache=RUNS)
    assert report.passed or report.refused or report.skipped, str(report)


# --- the checks themselves catch what they claim to -----------------------------------------------------------
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
    assert torch.is_tensor(factory.candidates(Instance(torch.Tensor), torch.zeros(2))[0])
