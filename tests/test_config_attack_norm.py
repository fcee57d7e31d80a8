"""An ``attacks`` entry's own ``norm:`` (issue 32, item 4a): Paschali et al.'s uncapped L2 DeepFool beside L∞ FGSM
in one config, the budget-scale rule applied in the entry's own norm, and the attacks that cannot take it."""

from __future__ import annotations

import warnings

import pytest

from medadv.config import build_attacks
from medadv.config_schema import AttackEntry, ConfigError, validate_config
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, Segmentation
from medadv.threats import L2, Linf

BASE = {"model": {"monai": "Classifier", "kwargs": {"in_shape": [1, 16, 16], "classes": 3, "channels": [4],
                                                    "strides": [2]}},
        "task": {"type": "multiclass"}, "data": {"source": "synthetic"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]}, "budgets": ["8/255"]}
DEEPFOOL = {"name": "deepfool", "norm": "l2", "budgets": [100.0], "steps": 5, "candidates": 3}


def test_an_entry_norm_gives_that_entry_an_l2_ball_and_leaves_the_others_linf():
    cfg = validate_config({**BASE, "attacks": ["fgsm", DEEPFOOL]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no large-budget warning: 100 is a legitimate (uncapped) L2 budget
        attacks = build_attacks(cfg, MultiClass())
    assert sorted(attacks) == ["deepfool@100", "fgsm@0.0313725"]
    deepfool, fgsm = attacks["deepfool@100"].threat, attacks["fgsm@0.0313725"].threat
    assert type(deepfool) is L2 and deepfool.eps == 100.0 and deepfool.box.bounds == (0.0, 1.0)
    assert type(fgsm) is Linf and fgsm.eps == pytest.approx(8 / 255)
    # `norm` names the ball: it is not one of DeepFool's own parameters
    assert cfg.attacks[1].params() == {"steps": 5, "candidates": 3}
    assert attacks["deepfool@100"].get_params()["steps"] == 5


def test_the_entry_norm_also_works_the_other_way_round_and_from_a_plain_mapping():
    plan = {"threat": {"norm": "l2", "bounds": [0, 1]}, "budgets": [2.0],
            "attacks": ["pgd", {"name": "fgsm", "norm": "LINF", "budgets": ["4/255"]}]}
    attacks = build_attacks(plan, MultiClass())
    assert type(attacks["pgd@2"].threat) is L2
    assert type(attacks["fgsm@0.0156863"].threat) is Linf


def test_a_large_budget_passes_in_l2_and_is_refused_in_linf():
    assert validate_config({**BASE, "attacks": [DEEPFOOL]}).attacks[0].budgets == [100.0]
    without = {k: v for k, v in DEEPFOOL.items() if k != "norm"}
    with pytest.raises(ConfigError, match=r"^`budgets\[0\]` is 100, more than half the data range \[0, 1\]"):
        validate_config({**BASE, "attacks": [without]})
    # an entry in L∞ on an L2 config runs the config's budgets in L∞: they are checked in L∞ too
    l2 = {**BASE, "threat": {"norm": "l2", "bounds": [0, 1]}, "budgets": [3.0]}
    assert validate_config({**l2, "attacks": ["pgd"]}).budgets == [3.0]
    with pytest.raises(ConfigError, match=r"`budgets\[0\]` is 3, more than half the data range"):
        validate_config({**l2, "attacks": ["pgd", {"name": "fgsm", "norm": "linf"}]})
    with pytest.raises(ConfigError, match=r"`budgets\[0\]` is 3"):
        build_attacks({"threat": {"norm": "l2", "bounds": [0, 1]}, "budgets": [3.0],
                       "attacks": [{"name": "fgsm", "norm": "linf"}]}, MultiClass())
    assert validate_config({**l2, "attacks": [{"name": "fgsm", "norm": "linf"}], "allow_large_budgets": True})


def test_a_bad_norm_gets_did_you_mean():
    with pytest.raises(ConfigError) as e:
        validate_config({**BASE, "attacks": [{"name": "deepfool", "norm": "lnif"}]})
    assert str(e.value) == "`attacks[0].norm` must be one of 'linf', 'l2'; got 'lnif' (str); did you mean 'linf'?"
    with pytest.raises(ConfigError, match=r"`attacks\[0\]\.norm` must be one of 'linf', 'l2'; got 3 \(int\)"):
        validate_config({**BASE, "attacks": [{"name": "deepfool", "norm": 3}]})


def test_an_attack_with_its_own_norm_parameter_gets_it_as_that_parameter():
    """DAG declares ``norm`` (its step normalisation) and runs in L∞ only: the entry's ``norm`` is DAG's."""
    entry = {"name": "dag", "norm": "l2", "steps": 2, "budgets": [0.6]}
    plan = {"threat": {"bounds": [0, 1]}, "attacks": [entry]}
    # the budget is checked in the threat's L∞: the entry's norm is not its ball's
    with pytest.raises(ConfigError, match=r"`budgets\[0\]` is 0.6"):
        build_attacks(plan, Segmentation(num_classes=2))
    attacks = build_attacks({**plan, "attacks": [{**entry, "budgets": [0.1]}]}, Segmentation(num_classes=2))
    (dag,) = attacks.values()
    assert dag.norm == "l2" and type(dag.threat) is Linf
    assert AttackEntry.model_validate(entry).threat_norm(["norm", "steps"]) is None
    assert AttackEntry.model_validate(entry).threat_norm(["steps"]) == "l2"


def test_a_norm_an_attack_cannot_run_in_or_a_box_attack_is_refused():
    seg = Segmentation(num_classes=2)
    with pytest.raises(ConfigError, match=r"entry 'vafa': `norm` sets the norm of an ε-ball, and vafa runs on the "
                                          r"data box"):
        build_attacks({"threat": {"bounds": [0, 1]}, "attacks": [{"name": "vafa", "norm": "l2"}]}, seg)
    with pytest.raises(ConfigError, match=r"entry 'gap': `norm: l2`, and gap runs only in Linf balls"):
        build_attacks({"threat": {"bounds": [0, 1]}, "budgets": ["8/255"],
                       "attacks": [{"name": "gap", "norm": "l2"}]}, MultiClass())
    # an unknown attack is still refused by name when the attacks are built, norm or not
    cfg = validate_config({**BASE, "attacks": [{"name": "deepfoo", "norm": "l2", "budgets": [100.0]}]})
    with pytest.raises(InvalidParameterError, match="did you mean 'deepfool'"):
        build_attacks(cfg, MultiClass())
