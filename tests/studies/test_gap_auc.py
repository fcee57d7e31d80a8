"""The ``gap`` study's AUC and label-accuracy columns and its Table 1 / 2 layout (Xu et al. 2021, issue 32 item 3a)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv import GAPTrainer, Linf
from medadv.attacks.gap import GAP
from medadv.data.synthetic import multiclass_blobs, multilabel_blobs
from medadv.metrics.classification import macro_auc, multiclass_auc
from medadv.models import fit_supervised
from medadv.report.blocks import Table, fmt
from medadv.studies import gap
from medadv.studies.gap_rows import _dataset_auc, _draw_gap
from medadv.tasks import MultiClass, MultiLabel, Segmentation

GEN = {"name": "resnet", "ngf": 4}
KW = dict(generator=GEN, epochs=1, max_batches=1, batch_size=16, lr=1e-2, loss="neg_true_logprob")
EPS = 51 / 255  # 0.2: large enough that the attacked scores rank the samples differently


def _linear(task, x, y, outputs: int) -> nn.Module:
    """A linear classifier on the flattened pixels, trained a little (its AUC far from chance, yet not perfect)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), outputs))
    fit_supervised(model, task, x, y, epochs=1, lr=3e-3, batch_size=16)
    return model.eval()


@pytest.fixture(scope="module")
def multiclass():
    x, y = multiclass_blobs(n=64, num_classes=3, seed=1)
    task = MultiClass()
    return task, _linear(task, x, y, 3), x, y


@pytest.fixture(scope="module")
def multilabel():
    x, y = multilabel_blobs(n=64, num_labels=3, seed=1)
    task = MultiLabel()
    return task, _linear(task, x, y, 3), x, y


def _gap_by_hand(task, model, x_tr, y_tr):
    """The study's generator, fitted the same way by hand (same spec, seeds and trainer settings)."""
    atk = GAP(task, Linf(EPS, bounds=(0.0, 1.0)), {**GEN, "in_channels": 1, "ndim": 2, "seed": 0},
              loss="neg_true_logprob")
    GAPTrainer(atk, model, epochs=1, batch_size=16, lr=1e-2, max_batches=1, seed=0).fit(x_tr, y_tr)
    return atk


def test_multiclass_rows_have_the_dataset_auc_of_the_softmax_scores(multiclass):
    task, model, x, y = multiclass
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = gap(model, task, (x, y), budgets=[EPS], bounds=(0.0, 1.0), **KW)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the model is not trained
    by = {row["split"]: row for row in r.rows}
    with torch.no_grad():
        clean_val = model(x[32:])
    assert by["val"]["auc_clean"] == pytest.approx(float(multiclass_auc(clean_val.softmax(1), y[32:])), abs=1e-9)
    with torch.no_grad():
        clean_tr = model(x[:32])
    assert by["train"]["auc_clean"] == pytest.approx(float(multiclass_auc(clean_tr.softmax(1), y[:32])), abs=1e-9)
    assert by["val"]["auc_clean"] > 0.7  # a trained model: far from chance, so a mix-up of columns shows

    # the attacked AUC is the AUC of the attacked logits: recomputed with the same generator fitted by hand
    atk = _gap_by_hand(task, model, x[:32], y[:32])
    with torch.no_grad():
        adv_val = model(atk(model, x[32:], y[32:]).x_adv)
    assert by["val"]["auc_adv"] == pytest.approx(float(multiclass_auc(adv_val.softmax(1), y[32:])), abs=1e-6)
    assert by["val"]["auc_adv"] < by["val"]["auc_clean"] - 0.01  # the two columns are not the same number
    assert "label_accuracy_clean" not in by["val"]  # single-label: ACC is the accuracy of the robust metric


def test_multilabel_rows_have_label_accuracy_and_macro_auc(multilabel):
    task, model, x, y = multilabel
    r = gap(model, task, (x, y), budgets=[EPS], bounds=(0.0, 1.0), **KW)
    row = next(row for row in r.rows if row["split"] == "val")
    with torch.no_grad():
        clean = model(x[32:])
    assert row["auc_clean"] == pytest.approx(float(macro_auc(clean.sigmoid(), y[32:])), abs=1e-6)
    hand = float(((clean > 0).float() == y[32:]).float().mean())
    assert row["label_accuracy_clean"] == pytest.approx(hand)
    # the label accuracy is not the exact match the robust metric reports (Xu et al.'s multi-label ACC)
    exact = float(((clean > 0).float() == y[32:]).all(1).float().mean())
    assert row["clean"] == pytest.approx(exact)
    atk = _gap_by_hand(task, model, x[:32], y[:32])
    with torch.no_grad():
        adv = model(atk(model, x[32:], y[32:]).x_adv)
    assert row["label_accuracy_adv"] == pytest.approx(float(((adv > 0).float() == y[32:]).float().mean()))
    assert row["auc_adv"] == pytest.approx(float(macro_auc(adv.sigmoid(), y[32:])), abs=1e-6)


def _paper_table(section) -> Table:
    tables = [b for b in section.blocks if isinstance(b, Table) and b.headers and b.headers[0].text == "metric"]
    assert len(tables) == 1, "the section has one Table 1 / 2 layout table"
    return tables[0]


def test_the_section_shows_the_papers_acc_auc_and_fr_rows(multiclass, multilabel):
    task, model, x, y = multiclass
    r = gap(model, task, (x, y), budgets=[EPS], bounds=(0.0, 1.0), **KW)
    table = _paper_table(_draw_gap(r, None))
    heads = [h.text for h in table.headers]
    assert heads == ["metric", "clean · X", "clean · val.", "GAP L∞ 51/255 · X", "GAP L∞ 51/255 · val."]
    assert [row[0].text for row in table.rows] == ["ACC (accuracy)", "AUC", "FR"]
    by = {row["split"]: row for row in r.rows}
    cells = {row[0].text: [c.text for c in row[1:]] for row in table.rows}
    assert cells["AUC"] == [fmt(by["train"]["auc_clean"]), fmt(by["val"]["auc_clean"]),
                            fmt(by["train"]["auc_adv"]), fmt(by["val"]["auc_adv"])]
    assert cells["ACC (accuracy)"] == [fmt(by["train"]["clean"]), fmt(by["val"]["clean"]),
                                       fmt(by["train"]["adv"]), fmt(by["val"]["adv"])]
    assert cells["FR"] == ["–", "–", fmt(by["train"]["fooling_rate"]), fmt(by["val"]["fooling_rate"])]

    task, model, x, y = multilabel
    r = gap(model, task, (x, y), budgets=[EPS], bounds=(0.0, 1.0), **KW)
    table = _paper_table(_draw_gap(r, None))
    row = next(row for row in r.rows if row["split"] == "val")
    acc = next(t for t in table.rows if t[0].text.startswith("ACC"))
    assert acc[0].text == "ACC (label accuracy)" and acc[-1].text == fmt(row["label_accuracy_adv"])


def test_dataset_auc_by_hand_and_where_it_is_undefined():
    # multi-class, one-vs-rest by hand: class 0's positive outranks both negatives (AUC 1); the positives of
    # classes 1 and 2 each outrank one of their two negatives (AUC 0.5); the macro mean is 2/3
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 2.0], [0.0, 2.0, 1.0]])
    y = torch.tensor([0, 1, 2])
    assert _dataset_auc(MultiClass(), logits, y) == pytest.approx(2 / 3)
    # multi-label: the second label is never present (undefined), so the macro AUC is the first label's alone
    ml = torch.tensor([[2.0, 0.0], [-1.0, 1.0], [1.0, -2.0]])
    assert _dataset_auc(MultiLabel(), ml, torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])) == pytest.approx(1.0)
    assert _dataset_auc(MultiLabel(), ml, torch.zeros(3, 2)) is None  # no label defined: None, never NaN
    # segmentation has no per-sample class scores: no AUC column
    assert _dataset_auc(Segmentation(3), torch.randn(2, 3, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long)) is None
