"""Transfer table and models table against a hand computation on two toy models.

Data: constant 2×2 images of value c = (0.6, 0.9, 0.2, 0.45), labels (0, 0, 1, 0). A predicts class 0 iff
Σ pixels > 2; B iff the top-left pixel > 0.5. Both are right on samples 1-3 (clean accuracy 0.75).
FGSM (ε = 0.25) on A moves every pixel by ∓0.25: c → (0.35, 0.65, 0.45, 0.2), so A and B are right on samples
2 and 3 only (0.5). FGSM on B moves only the top-left pixel (B's gradient is zero elsewhere): A stays right on
samples 1-3 (Σ = 2.15, 3.35, 1.05) → 0.75, B is right on 2 and 3 → 0.5.
"""

from __future__ import annotations

import pytest

from medadv import FGSM, Linf, MultiClass
from medadv.studies import models, transfer


def test_transfer_table_equals_the_hand_computation(toy_pair):
    x, y, a, b = toy_pair
    task = MultiClass()
    r = transfer({"A": a, "B": b}, {"A": a, "B": b}, task, (x, y), {"fgsm": FGSM(task, Linf(0.25, bounds=(0, 1)))})
    table = {(row["surrogate"], row["target"]): row for row in r.rows}
    expected_adv = {("A", "A"): 0.5, ("A", "B"): 0.5, ("B", "A"): 0.75, ("B", "B"): 0.5}
    for cell, adv in expected_adv.items():
        row = table[cell]
        assert row["clean"] == pytest.approx(0.75) and row["adv"] == pytest.approx(adv), cell
        # untargeted fooling: the prediction is not the label (every wrong sample here was attacked)
        assert row["fooling_rate"] == pytest.approx(1 - adv), cell
        assert row["white_box"] == (cell[0] == cell[1]) and row["budget"] == 0.25
    assert r.meta["metric"] == "accuracy"
    # Paschali's summary over the black-box cells: A gets only B's examples (0.75), B only A's (0.5)
    summary = {s["target"]: s for s in r.meta["summary"]}
    assert summary["A"]["avg"] == pytest.approx(0.75) and summary["A"]["drop_points"] == pytest.approx(0.0)
    assert summary["B"]["avg"] == pytest.approx(0.5) and summary["B"]["drop_points"] == pytest.approx(25.0)


def test_transfer_targeted_fooling_counts_reaching_the_target(toy_pair):
    x, y, a, b = toy_pair
    task = MultiClass()
    atk = FGSM(task, Linf(0.25, bounds=(0, 1)), targeted=True)
    r = transfer({"A": a, "B": b}, {"A": a, "B": b}, task, (x, y), [atk], target_fn=lambda x, y, logits: 1 - y)
    # targets (1, 1, 0, 1); with two classes the targeted step is the untargeted one. On A's examples both
    # models predict (1, 0, 1, 1): targets reached on samples 1 and 4. On B's, A predicts (0, 0, 1, 1) and
    # reaches only sample 4, B predicts (1, 0, 1, 1): samples 1 and 4.
    got = {(row["surrogate"], row["target"]): row["fooling_rate"] for row in r.rows}
    assert got == pytest.approx({("A", "A"): 0.5, ("A", "B"): 0.5, ("B", "A"): 0.25, ("B", "B"): 0.5})
    with pytest.raises(ValueError, match="target_fn"):
        transfer({"A": a}, {"B": b}, task, (x, y), [atk])


def test_models_table_equals_the_hand_computation(toy_pair):
    x, y, a, b = toy_pair
    task = MultiClass()
    r = models({"A": a, "B": b}, task, (x, y), {"fgsm": FGSM(task, Linf(0.25, bounds=(0, 1)))})
    assert [row["model"] for row in r.rows] == ["A", "B"]
    assert [(row["clean"], row["adv"], row["drop_points"]) for row in r.rows] == [(0.75, 0.5, 25.0)] * 2
    assert r.meta["ranking"]["clean"] == ["A", "B"]


def test_transfer_on_trained_models(trained_multiclass):
    import copy

    import torch

    t = trained_multiclass
    other = copy.deepcopy(t.model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.0 + 0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    atk = FGSM(t.task, Linf(0.1, bounds=(0, 1)))
    r = transfer({"m": t.model}, {"m": t.model, "other": other}, t.task, (t.x, t.y), {"fgsm": atk})
    white = next(row for row in r.rows if row["target"] == "m")
    # the white-box cell is the attack's own result on its model
    res = atk(t.model, t.x, t.y)
    assert white["adv"] == pytest.approx(float((res.logits.argmax(1) == t.y).float().mean()))
    assert white["fooling_rate"] == pytest.approx(res.fooling_rate)
    assert all(row["adv"] <= row["clean"] for row in r.rows)
