"""The ``defenses`` study (Xu et al. 2021, Table 5): one trained copy of the model per training strategy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv import PGD, Linf
from medadv.config_schema import ConfigError
from medadv.studies import defenses, models, run_study, validate_study
from medadv.studies.defenses import build_strategy, initial_copy, strategy_classes
from medadv.tasks import MultiClass
from medadv.training import fit_supervised

EPS = 0.2


def _separable(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes on 4×4 images: one robust pixel (class shift ±0.3, more than ε) and fifteen weak pixels (shift
    ±0.1, less than ε, but many of them): clean training leans on the weak ones, which PGD at ε = 0.2 flips."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    s = y.float() * 2 - 1
    x = 0.5 + 0.1 * s[:, None] + 0.05 * torch.randn(n, 16, generator=g)
    x[:, 0] = 0.5 + 0.3 * s + 0.05 * torch.randn(n, generator=g)
    return x.clamp(0, 1).reshape(n, 1, 4, 4), y


@pytest.fixture(scope="module")
def problem():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    task = MultiClass()
    x, y = _separable(128, 0)
    fit_supervised(model, task, x[:64], y[:64], epochs=30, lr=0.05, batch_size=16)
    attack = PGD(task, Linf(EPS, bounds=(0.0, 1.0)), steps=5)
    return model, task, x, y, {"pgd": attack}


def test_strategy_names_come_from_the_defenses_package():
    from medadv.defenses import PGDAT, TRADES, VAFT, GaussianAugmentation, MAAdvT, MPAdvT

    known = strategy_classes()
    assert {known[c.name] for c in (PGDAT, MPAdvT, MAAdvT, TRADES, VAFT, GaussianAugmentation)} == \
        {PGDAT, MPAdvT, MAAdvT, TRADES, VAFT, GaussianAugmentation}

    class Noisy(PGDAT):  # a new strategy is a study option as soon as it is defined
        name = "noisy_at_for_test"

    assert strategy_classes()["noisy_at_for_test"] is Noisy


def test_every_strategy_gets_rows_and_pgd_at_beats_none(problem):
    model, task, x, y, attacks = problem
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    r = defenses(model, task, (x, y), attacks, strategies=["none", "pgd_at", "mpadvt", "maadvt"], epochs=5, lr=0.05,
                 batch_size=16)
    assert [row["strategy"] for row in r.rows] == ["none", "pgd_at", "mpadvt", "maadvt"]
    by = {row["strategy"]: row for row in r.rows}
    # the same budget for training and attack: PGD-AT holds up where clean training falls
    assert by["none"]["adv"] < 0.75 and by["pgd_at"]["adv"] > 0.9 and by["pgd_at"]["adv"] > by["none"]["adv"] + 0.2
    assert by["maadvt"]["adv"] > by["none"]["adv"] + 0.2
    assert all(row["clean"] >= 0.95 and row["budget"] == EPS for row in r.rows)
    assert r.meta["n_train"] == 64 and r.meta["n_eval"] == 64 and r.meta["train_eps"] == EPS
    assert len(r.meta["training"]["pgd_at"]["loss"]) == 5
    # the caller's model and random stream are left alone
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
    # seeded: the same call gives the same table
    again = defenses(model, task, (x, y), attacks, strategies=["none", "pgd_at"], epochs=5, lr=0.05, batch_size=16)
    assert again.rows == r.rows[:2]


def test_none_without_epochs_is_the_given_model(problem):
    model, task, x, y, attacks = problem
    r = defenses(model, task, (x, y), attacks, strategies=[{"name": "none", "epochs": 0},
                                                           {"name": "pgd_at", "id": "at_small", "eps": 0.05}],
                 epochs=2, batch_size=16)
    given = models({"m": model}, task, [(x[64:], y[64:])], attacks)  # the evaluation half, unchanged model
    assert r.rows[0]["clean"] == pytest.approx(given.rows[0]["clean"])
    assert r.rows[0]["adv"] == pytest.approx(given.rows[0]["adv"])
    assert r.meta["training"]["none"]["loss"] == [] and "eps=0.05" in r.meta["training"]["at_small"]["repr"]
    # a control: training it cleanly for two epochs does change it
    trained = defenses(model, task, (x, y), attacks, strategies=["none"], epochs=2, lr=0.5, batch_size=16)
    assert trained.meta["training"]["none"]["loss"] and trained.rows[0] != r.rows[0]


def test_train_data_and_reset(problem):
    model, task, x, y, attacks = problem
    r = defenses(model, task, (x[64:], y[64:]), attacks, strategies=["none"], train_data=(x[:64], y[:64]),
                 init="reset", epochs=20, lr=0.1, batch_size=16)
    assert r.meta["n_train"] == 64 and r.meta["init"] == "reset" and r.rows[0]["clean"] > 0.9
    a, b = initial_copy(model, "reset", 3), initial_copy(model, "reset", 3)
    assert torch.equal(a[1].weight, b[1].weight) and not torch.equal(a[1].weight, model[1].weight)

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, x):
            return x.flatten(1)[:, :2] * self.w

    with pytest.raises(ValueError, match="reset_parameters"):
        initial_copy(Scaled(), "reset", 0)
    with pytest.raises(ValueError, match="untrained"):
        defenses(model, task, (x, y), attacks, strategies=["none"], init="reset", epochs=0)


def test_bad_entries_are_refused_with_the_reason(problem):
    model, task, x, y, attacks = problem
    with pytest.raises(ValueError, match="did you mean 'pgd_at'"):
        defenses(model, task, (x, y), attacks, strategies=["pgd_ta"])
    with pytest.raises(ValueError, match="needs `sigma`"):
        defenses(model, task, (x, y), attacks, strategies=["gaussian"])
    with pytest.raises(ValueError, match="unknown parameter `stpes`"):
        defenses(model, task, (x, y), attacks, strategies=[{"name": "pgd_at", "stpes": 3}])
    with pytest.raises(ValueError, match="distinct `id`s"):
        defenses(model, task, (x, y), attacks, strategies=["pgd_at", "pgd_at"])
    with pytest.raises(ValueError, match="train_split"):
        defenses(model, task, (x, y), attacks, train_split=1.5)
    with pytest.raises(ValueError, match="attacks` is empty"):
        defenses(model, task, (x, y), {})
    with pytest.raises(ValueError, match="ε-ball"):
        build_strategy({"name": "maadvt"}, threat=None, box=None)
    with pytest.raises(ConfigError, match=r"studies.defenses.strategies.*did you mean 'mpadvt'"):
        validate_study({"study": "defenses", "strategies": ["mpadvtt"]}, ("studies", "defenses"))
    with pytest.raises(ConfigError, match="not both"):
        validate_study({"study": "defenses", "train_split": 0.5,
                        "train": {"source": "synthetic", "n": 4, "kwargs": {"kind": "multiclass_blobs"}}})


def test_config_entry_with_a_train_source():
    from medadv.data.synthetic import multiclass_blobs
    from medadv.models import small_cnn

    torch.manual_seed(0)
    model = small_cnn(1, 2, width=4)
    task = MultiClass()
    x, y = multiclass_blobs(n=16, num_classes=2, size=8, seed=1)
    spec = {"strategies": ["none", {"name": "gaussian", "sigma": 0.1}], "epochs": 1, "batch_size": 8, "eps": "4/255",
            "train": {"source": "synthetic", "n": 16, "kwargs": {"kind": "multiclass_blobs", "num_classes": 2,
                                                                  "size": 8}}, "title": "Table 5"}
    attacks = {"pgd": PGD(task, Linf(8 / 255, bounds=(0.0, 1.0)), steps=2)}
    r = run_study("defenses", spec, model, task, (x, y), attacks)
    assert [row["strategy"] for row in r.rows] == ["none", "gaussian"] and r.meta["title"] == "Table 5"
    assert r.meta["n_train"] == 16 and r.meta["train_eps"] == pytest.approx(4 / 255)

    from medadv.report.html import _study_section

    sec = _study_section(r, None)
    assert sec.id == "study-defenses" and sec.title.startswith("Table 5")
    assert any(type(b).__name__ == "Image" for b in sec.blocks)
