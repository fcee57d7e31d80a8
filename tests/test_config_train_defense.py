"""``model.train.defense`` (issue 32, item 7): a network of ``models:`` trained with a training strategy of
:mod:`medadv.defenses` (Medi et al.'s adversarially trained models beside the plain ones), cached apart from the
plainly trained weights."""

from __future__ import annotations

import pytest
import torch

import medadv.defenses.trainer as trainer_module
import medadv.models.fitting as fitting_module
from medadv.config import build_model, study_models, threat_box
from medadv.config_schema import ConfigError, TrainSection, validate_config, validate_section
from medadv.defenses import PGDAT, AdversarialTrainer
from medadv.tasks import MultiClass
from medadv.threats import Box, Linf

NET = {"monai": "Classifier", "kwargs": {"in_shape": [1, 16, 16], "classes": 3, "channels": [4, 8], "strides": [2, 2]},
       "seed": 0}
DATA = {"source": "mni152", "n": 16, "kwargs": {"kind": "classes", "size": 16}}
TRAIN = {"data": DATA, "epochs": 1, "lr": 0.01, "batch_size": 8}
AT = {"name": "pgd_at", "eps": "8/255", "steps": 1}


@pytest.fixture
def spy(monkeypatch):
    """Records every AdversarialTrainer and every plain fit that a build runs."""
    calls: dict[str, list] = {"adversarial": [], "plain": []}

    class Spy(AdversarialTrainer):
        def __init__(self, model, task, strategy, **kw):
            calls["adversarial"].append((strategy, kw))
            super().__init__(model, task, strategy, **kw)

    real_fit = fitting_module.fit_supervised

    def plain(*args, **kw):
        calls["plain"].append(kw)
        return real_fit(*args, **kw)

    monkeypatch.setattr(trainer_module, "AdversarialTrainer", Spy)
    monkeypatch.setattr("medadv.training.supervised.fit_supervised", plain)
    return calls


def _cached(tmp_path):
    return sorted((tmp_path / "cache" / "trained").glob("*.pt"))


def test_a_defense_trains_with_the_adversarial_trainer_and_is_cached_apart(tmp_path, monkeypatch, spy):
    monkeypatch.setenv("MEDADV_CACHE", str(tmp_path / "cache"))
    task, box = MultiClass(), Box(0.0, 1.0)
    plain = build_model({**NET, "train": TRAIN}, task=task, box=box)
    assert len(spy["plain"]) == 1 and spy["adversarial"] == []
    assert len(_cached(tmp_path)) == 1

    state = torch.get_rng_state()
    defended = build_model({**NET, "train": {**TRAIN, "defense": AT}}, task=task, box=box)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random stream is not advanced
    ((strategy, kw),) = spy["adversarial"]
    assert isinstance(strategy, PGDAT) and strategy.steps == 1
    assert type(strategy.threat) is Linf and strategy.threat.eps == pytest.approx(8 / 255)
    assert strategy.threat.box.bounds == (0.0, 1.0)
    assert kw == {"epochs": 1, "batch_size": 8, "lr": 0.01, "seed": 0}
    assert len(spy["plain"]) == 1  # no plain fit for the defended model
    files = _cached(tmp_path)
    assert len(files) == 2  # its own cache file: the defense is part of the key
    assert not all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), defended.state_dict().values(),
                                                     strict=True))

    again = build_model({**NET, "train": {**TRAIN, "defense": AT}}, task=task, box=box)  # from the cache
    assert len(spy["adversarial"]) == 1
    assert all(torch.equal(a, b) for a, b in zip(defended.state_dict().values(), again.state_dict().values(),
                                                 strict=True))
    trades = build_model({**NET, "train": {**TRAIN, "defense": {**AT, "name": "trades"}}}, task=task, box=box)
    assert len(_cached(tmp_path)) == 3 and type(spy["adversarial"][-1][0]).__name__ == "TRADES"
    assert trades.training is False


def test_defense_none_is_plain_training_with_the_plain_cache_file(tmp_path, monkeypatch, spy):
    monkeypatch.setenv("MEDADV_CACHE", str(tmp_path / "cache"))
    build_model({**NET, "train": TRAIN}, task=MultiClass())
    build_model({**NET, "train": {**TRAIN, "defense": "none"}}, task=MultiClass())
    assert len(spy["plain"]) == 1 and spy["adversarial"] == [] and len(_cached(tmp_path)) == 1


def test_study_models_train_a_defended_entry_in_the_configs_data_box(tmp_path, monkeypatch, spy):
    monkeypatch.setenv("MEDADV_CACHE", str(tmp_path / "cache"))
    cfg = {"model": {**NET, "name": "plain"}, "threat": {"norm": "linf", "bounds": [-1.0, 1.0]},
           "models": {"at": {**NET, "train": {**TRAIN, "defense": AT}}}}
    main = torch.nn.Linear(2, 2)
    out = study_models(cfg, main, task=MultiClass())
    assert list(out) == ["plain", "at"] and out["plain"] is main
    ((strategy, _),) = spy["adversarial"]
    assert strategy.threat.box.bounds == (-1.0, 1.0)  # the config's threat.bounds, not a default box
    assert threat_box(cfg["threat"], MultiClass()).bounds == (-1.0, 1.0)


def test_a_misspelt_strategy_gets_did_you_mean_and_a_ball_strategy_needs_eps():
    with pytest.raises(ConfigError) as e:
        build_model({**NET, "train": {**TRAIN, "defense": "pgd_atx"}}, task=MultiClass())
    assert str(e.value).startswith("`model.train.defense`: unknown strategy 'pgd_atx'; did you mean 'pgd_at'?")
    with pytest.raises(ConfigError) as e:
        validate_section(TrainSection, {**TRAIN, "defense": {"name": "pgd_at", "steps": 2}}, ("model", "train"))
    assert str(e.value) == ("`model.train.defense`: strategy 'pgd_at' trains in an L∞ ε-ball: give `eps:` in data "
                            "units, e.g. {name: pgd_at, eps: 8/255}")
    with pytest.raises(ConfigError, match=r"`models\.at\.train\.defense`: unknown parameter `stepz` for strategy "
                                          r"'trades'; did you mean 'steps'"):
        validate_config({"model": NET, "task": {"type": "multiclass"}, "data": DATA, "threat": {"bounds": [0, 1]},
                         "attacks": ["fgsm"], "budgets": [0.01],
                         "models": {"at": {**NET, "train": {**TRAIN, "defense": {**AT, "name": "trades",
                                                                                "stepz": 2}}}}})
    with pytest.raises(ConfigError, match=r"`epochs` of the training belong to `model.train` itself"):
        validate_section(TrainSection, {**TRAIN, "defense": {**AT, "epochs": 3}}, ("model", "train"))


def test_a_box_strategy_without_a_box_is_refused_before_training(tmp_path, monkeypatch, spy):
    monkeypatch.setenv("MEDADV_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"`model.train.defense`: strategy 'mpadvt' needs the data box: pass `box=`"):
        build_model({**NET, "train": {**TRAIN, "defense": "mpadvt"}}, task=MultiClass())
    assert spy["adversarial"] == [] and spy["plain"] == [] and _cached(tmp_path) == []
    with pytest.raises(TypeError, match="`box` must be a medadv.threats.Box"):
        build_model({**NET, "train": {**TRAIN, "defense": "mpadvt"}}, task=MultiClass(), box=(0, 1))
