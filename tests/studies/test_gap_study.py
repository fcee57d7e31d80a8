"""The ``gap`` study: a GAP generator fitted on a training split, rows on it and on held-out data (Xu et al.)."""

from __future__ import annotations

import pytest
import torch

from medadv import PGD, GAPTrainer, Linf
from medadv.attacks.gap import GAP
from medadv.data.synthetic import multiclass_blobs
from medadv.studies import gap, run_study

GEN = {"name": "unet", "ngf": 8}
KW = dict(generator=GEN, epochs=10, batch_size=16, lr=1e-2, loss="neg_true_logprob")


@pytest.fixture(scope="module")
def study_data():
    return multiclass_blobs(n=96, seed=0)  # the blobs of the session's trained_multiclass model


def test_train_and_validation_rows(trained_multiclass, study_data):
    t = trained_multiclass
    x, y = study_data
    r = gap(t.model, t.task, (x, y), budgets=[0.005, 0.1], bounds=(0.0, 1.0), **KW)
    assert [(row["budget"], row["split"], row["n"]) for row in r.rows] == \
        [(0.005, "train", 48), (0.005, "val", 48), (0.1, "train", 48), (0.1, "val", 48)]
    by = {(row["budget"], row["split"]): row for row in r.rows}
    # the epoch kept is the best on the training split: its fooling rate is that row's (computed by the trainer)
    for eps in (0.005, 0.1):
        best = max(h["fooling_rate"] for h in r.meta["history"][f"{eps:.6g}"])
        assert by[(eps, "train")]["fooling_rate"] == pytest.approx(best)
    # a budget far too small fools nothing; a real one does, on the training and on the held-out split
    assert by[(0.005, "train")]["fooling_rate"] == 0.0
    assert by[(0.1, "train")]["fooling_rate"] >= 0.3 and by[(0.1, "val")]["fooling_rate"] >= 0.3
    assert by[(0.1, "val")]["adv"] < by[(0.1, "val")]["clean"]
    row = by[(0.1, "val")]
    assert row["drop_points"] == pytest.approx(100 * (row["clean"] - row["adv"]))

    # the validation row, recomputed: the same generator fitted by hand on the first half, scored on the second
    atk = GAP(t.task, Linf(0.1, bounds=(0.0, 1.0)), {**GEN, "in_channels": 1, "ndim": 2, "seed": 0},
              loss="neg_true_logprob")
    GAPTrainer(atk, t.model, epochs=10, batch_size=16, lr=1e-2, seed=0).fit(x[:48], y[:48])
    with torch.no_grad():
        clean = t.task.predict(t.model(x[48:]))
        adv = t.model(atk(t.model, x[48:], y[48:]).x_adv)
    assert row["fooling_rate"] == pytest.approx(float((t.task.predict(adv) != clean).float().mean()))
    assert row["adv"] == pytest.approx(float((t.task.predict(adv) == y[48:]).float().mean()))


def test_config_entry_budgets_bounds_and_errors(trained_multiclass, study_data):
    t = trained_multiclass
    x, y = study_data
    attacks = {"pgd": PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=2)}
    spec = {"budgets": ["8/255"], "generator": {"name": "unet", "ngf": 4, "depth": 2}, "epochs": 1,
            "train_split": 0.25, "title": "Table 1 (GAP columns)"}
    r = run_study("gap", spec, t.model, t.task, (x, y), attacks)  # the box is the attacks'
    assert [row["split"] for row in r.rows] == ["train", "val"] and r.rows[0]["budget"] == pytest.approx(8 / 255)
    assert r.meta["n_train"] == 24 and r.meta["n_val"] == 72
    r2 = run_study("gap", {"epochs": 1, "generator": {"name": "unet", "ngf": 4, "depth": 2}}, t.model, t.task,
                   (x[:8], y[:8]), attacks)
    assert r2.rows[0]["budget"] == pytest.approx(0.1)  # default: the attacks' budgets

    from medadv.report.html import _study_section

    sec = _study_section(r, None)
    assert sec.id == "study-gap" and sec.title.startswith("Table 1")

    with pytest.raises(ValueError, match="needs L∞ budgets"):
        run_study("gap", {"bounds": [0.0, 1.0]}, t.model, t.task, (x, y), {})
    with pytest.raises(ValueError, match="data box"):
        gap(t.model, t.task, (x, y), budgets=[0.1], bounds=None)
    with pytest.raises(ValueError, match="must be > 0"):
        gap(t.model, t.task, (x, y), budgets=[0.0], bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="train_split"):
        gap(t.model, t.task, (x[:1], y[:1]), budgets=[0.1], bounds=(0.0, 1.0))
