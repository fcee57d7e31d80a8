"""Multi-class macro one-vs-rest AUC (Xu et al. §5.1): equals scikit-learn's OvR macro AUC on the same numbers,
skips a class absent from the labels, appears in ``Results.summary`` and falls under attack."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

from medadv.attacks import PGD
from medadv.evaluation import evaluate
from medadv.metrics.classification import multiclass_auc
from medadv.threats import Linf


def _scores(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % k
    logits = torch.randn(n, k, generator=g, dtype=torch.float64) + 1.2 * torch.nn.functional.one_hot(y, k)
    return logits.softmax(1), y


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_sklearn_ovr_macro(seed):
    p, y = _scores(40, 4, seed)
    p[:5] = p[5:10]  # tied scores (whole rows: still probabilities)
    ours = float(multiclass_auc(p, y))
    ref = roc_auc_score(y.numpy(), p.numpy(), multi_class="ovr", average="macro")
    assert ours == pytest.approx(ref, abs=1e-12)
    # control: a different score matrix gives a different AUC
    assert float(multiclass_auc(p.flip(0), y)) != pytest.approx(ref, abs=1e-3)


def test_absent_class_is_skipped():
    p, y = _scores(30, 4, 2)
    keep = y != 3  # class 3 has no sample: its OvR AUC is undefined, the mean is over classes 0-2
    p, y = p[keep], y[keep]
    ref = sum(roc_auc_score((y == k).numpy(), p[:, k].numpy()) for k in range(3)) / 3
    assert float(multiclass_auc(p, y)) == pytest.approx(ref, abs=1e-12)
    assert math.isnan(float(multiclass_auc(p[y == 0], y[y == 0])))  # one class only: nothing defined
    with pytest.raises(ValueError, match="out of range"):
        multiclass_auc(p, torch.full_like(y, 4))
    with pytest.raises(ValueError, match="labels"):
        multiclass_auc(p, y[:3])


def test_summary_has_multiclass_auc_and_the_attack_lowers_it(trained_multiclass):
    t = trained_multiclass
    res = evaluate(t.model, t.task, (t.x, t.y), {"pgd": PGD(t.task, Linf(0.15, bounds=(0.0, 1.0)), steps=5)})
    row = res.rows[0]
    assert len(row["clean_scores"]) == 4 and sum(row["clean_scores"]) == pytest.approx(1.0, abs=1e-5)
    s = res.summary()[0]
    with torch.no_grad():
        p = t.model(t.x).softmax(1).double()
    ref = roc_auc_score(t.y.numpy(), p.numpy(), multi_class="ovr", average="macro")
    assert s["clean_macro_auc"] == pytest.approx(ref, abs=1e-5)
    assert s["clean_macro_auc"] > 0.8 and s["adv_macro_auc"] < s["clean_macro_auc"] - 0.1
