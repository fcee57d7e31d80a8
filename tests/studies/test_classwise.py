"""Class-wise robustness (Medi et al.): CFPS and friends against the hand computations of the spec's toy
examples, and the study on the trained fixtures checked against an independent count."""

from __future__ import annotations

import math

import pytest
import torch

from medadv import FGSM, PGD, Linf
from medadv.studies import classwise
from medadv.studies.classwise import cfps, class_stats, confusion_matrix, multilabel_stats, pair_matrix

# spec 004 §1.3: rows = truth, columns = prediction
M = torch.tensor([[8, 1, 1], [3, 6, 1], [1, 3, 6]])


def test_cfps_equals_the_hand_computation_and_sums_to_one():
    s = class_stats(M)
    # FP_j = column sum − diagonal = (12−8, 10−6, 8−6) = (4, 4, 2); E = 30 − 20 = 10
    assert s["fp"].tolist() == [4, 4, 2] and s["fn"].tolist() == [2, 4, 4] and float(s["errors"]) == 10
    assert s["cfps"].tolist() == pytest.approx([0.4, 0.4, 0.2])
    assert float(s["cfps"].sum()) == pytest.approx(1.0)
    assert s["recall"].tolist() == pytest.approx([0.8, 0.6, 0.6])
    assert s["ovr_accuracy"].tolist() == pytest.approx([0.8, 22 / 30, 0.8])  # Eq. 2 as printed
    # null CFPS = (E − FN_j) / ((C − 1) E) = (0.4, 0.3, 0.3)
    assert s["attraction"].tolist() == pytest.approx([1.0, 0.4 / 0.3, 0.2 / 0.3])
    assert s["precision"].tolist() == pytest.approx([8 / 12, 0.6, 0.75])


def test_confusion_matrix_counts_pairs_and_cfps_is_undefined_without_errors():
    y = torch.tensor([0] * 10 + [1] * 10 + [2] * 10)
    pred = torch.tensor([0] * 8 + [1, 2] + [0] * 3 + [1] * 6 + [2] + [0] + [1] * 3 + [2] * 6)
    assert confusion_matrix(y, pred, 3).tolist() == M.tolist()
    perfect = cfps(torch.diag(torch.tensor([3, 4, 5])))
    assert all(math.isnan(v) for v in perfect.tolist())


def test_multilabel_cfps_cfns_and_pair_matrix_match_the_spec_example():
    # spec 004 §4.2
    y = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 1, 0]]).float()
    p = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 1], [1, 1, 0]]).float()
    s = multilabel_stats(y, p)
    assert s["fp"].tolist() == [1, 1, 1] and s["fn"].tolist() == [1, 0, 0]
    assert s["cfps"].tolist() == pytest.approx([1 / 3] * 3) and s["cfns"].tolist() == pytest.approx([1, 0, 0])
    assert s["label_accuracy"].tolist() == pytest.approx([0.5, 0.75, 0.75])
    expected = torch.zeros(3, 3, dtype=torch.long)
    expected[0, 2] = 1  # image 2 missed label 0 while predicting label 2
    assert pair_matrix(y, p).tolist() == expected.tolist()


def test_segmentation_cfps_with_and_without_background_match_the_spec_example():
    # spec 004 §4.3: classes {bg, liver, spleen, kidney}
    m = torch.tensor([[9000, 50, 30, 20], [40, 500, 5, 5], [30, 15, 200, 5], [20, 5, 10, 150]])
    assert cfps(m).tolist() == pytest.approx([0.3830, 0.2979, 0.1915, 0.1277], abs=1e-4)
    assert cfps(m[1:, 1:]).tolist() == pytest.approx([0.4444, 0.3333, 0.2222], abs=1e-4)


def _attacks(task):
    return {"pgd": PGD(task, Linf(0.1, bounds=(0.0, 1.0)), steps=3), "fgsm": FGSM(task, Linf(0.1, bounds=(0.0, 1.0)))}


def test_classwise_multiclass_matches_an_independent_count(trained_multiclass):
    t = trained_multiclass
    attacks = _attacks(t.task)
    r = classwise(t.model, t.task, (t.x, t.y), attacks, class_names=["a", "b", "c", "d"])
    assert r.study == "classwise" and r.meta["metric"] == "recall" and r.meta["classes"] == ["a", "b", "c", "d"]
    with torch.no_grad():
        clean = t.model(t.x).argmax(1)
    adv = t.model(attacks["pgd"](t.model, t.x, t.y).x_adv).argmax(1).detach()
    for name, pred in (("clean", clean), ("pgd@0.1", adv)):
        conf = [[0] * 4 for _ in range(4)]
        for yi, pi in zip(t.y.tolist(), pred.tolist(), strict=True):
            conf[yi][pi] += 1
        assert r.meta["confusion"][name] == conf
        errors = sum(conf[i][j] for i in range(4) for j in range(4) if i != j)
        assert r.meta["errors"][name] == errors
    rows = [row for row in r.rows if row["attack"] == "pgd"]
    assert [row["class"] for row in rows] == ["a", "b", "c", "d"]
    conf = r.meta["confusion"]["pgd@0.1"]
    for j, row in enumerate(rows):
        fp = sum(conf[i][j] for i in range(4)) - conf[j][j]
        assert row["cfps_adv"] == pytest.approx(fp / r.meta["errors"]["pgd@0.1"])
        assert row["support"] == sum(conf[j]) and row["adv"] == pytest.approx(conf[j][j] / sum(conf[j]))
    assert sum(row["cfps_adv"] for row in rows) == pytest.approx(1.0)
    # the attack lowers the overall accuracy; the attractor ranking follows the attacked CFPS
    assert sum(conf[j][j] for j in range(4)) < sum(r.meta["confusion"]["clean"][j][j] for j in range(4))
    top = max(rows, key=lambda row: row["cfps_adv"])["cfps_adv"]
    assert next(row for row in rows if row["class"] == r.meta["attractors"]["pgd@0.1"][0])["cfps_adv"] == top
    assert len(r.rows) == 8 and {row["attack"] for row in r.rows} == {"pgd", "fgsm"}


def test_classwise_clean_only(trained_multiclass):
    t = trained_multiclass
    r = classwise(t.model, t.task, (t.x, t.y), None)
    assert len(r.rows) == 4 and all(row["attack"] is None and row["adv"] is None for row in r.rows)
    assert list(r.meta["confusion"]) == ["clean"]
    # the columns the HTML report reads, nothing else
    assert list(r.rows[0]) == ["attack", "budget", "class", "support", "clean", "adv", "cfps_clean", "cfps_adv"]
    assert r.meta["per_class"]["clean"]["recall"] == [row["clean"] for row in r.rows]


def test_classwise_multilabel_has_cfns_and_induced_flips(trained_multilabel):
    t = trained_multilabel
    attacks = _attacks(t.task)
    r = classwise(t.model, t.task, (t.x, t.y), attacks)
    assert r.meta["metric"] == "label_accuracy"
    adv = (t.model(attacks["fgsm"](t.model, t.x, t.y).x_adv) > 0).float().detach()
    with torch.no_grad():
        clean = (t.model(t.x) > 0).float()
    rows = [row for row in r.rows if row["attack"] == "fgsm"]
    fp = ((t.y == 0) & (adv == 1)).sum(0)
    fn = ((t.y == 1) & (adv == 0)).sum(0)
    per_class = r.meta["per_class"]["fgsm@0.1"]
    for j, row in enumerate(rows):
        assert row["cfps_adv"] == pytest.approx(float(fp[j] / fp.sum()))
        assert row["cfns_adv"] == pytest.approx(float(fn[j] / fn.sum()))
        assert per_class["fp_induced"][j] == int(((t.y[:, j] == 0) & (clean[:, j] == 0) & (adv[:, j] == 1)).sum())
        assert row["adv"] == pytest.approx(float((adv[:, j] == t.y[:, j]).float().mean()))
    assert sum(row["cfps_adv"] for row in rows) == pytest.approx(1.0)
    assert r.meta["confusion"]["fgsm@0.1"] == pair_matrix(t.y, adv).tolist()


def test_classwise_segmentation_voxel_confusion_with_and_without_background(trained_seg2d):
    t = trained_seg2d
    r = classwise(t.model, t.task, (t.x, t.y), {"fgsm": FGSM(t.task, Linf(0.1, bounds=(0.0, 1.0)))})
    conf = torch.tensor(r.meta["confusion"]["fgsm@0.1"])
    assert int(conf.sum()) == t.y.numel()  # every voxel counted once
    rows = [row for row in r.rows if row["background"] == "included"]
    excluded = [row for row in r.rows if row["background"] == "excluded"]
    assert [row["class"] for row in rows] == [0, 1, 2] and [row["class"] for row in excluded] == [1, 2]
    fg = conf[1:, 1:]  # background's row and column dropped
    fp_fg = fg.sum(0) - fg.diagonal()
    expected = (fp_fg / (fg.sum() - fg.trace())).tolist()
    assert [row["cfps_adv"] for row in excluded] == pytest.approx(expected)
    assert sum(row["cfps_adv"] for row in rows) == pytest.approx(1.0)
    assert r.meta["per_class"]["fgsm@0.1"]["cfps_fg"][1:] == pytest.approx(expected)
    # Dice per class: macro over the cases, a class absent from both maps left out
    with torch.no_grad():
        pred = t.model(t.x).argmax(1)
    for j in range(3):
        per_case = [2 * ((pred[i] == j) & (t.y[i] == j)).sum() / ((pred[i] == j).sum() + (t.y[i] == j).sum())
                    for i in range(t.y.shape[0]) if ((pred[i] == j).sum() + (t.y[i] == j).sum()) > 0]
        assert rows[j]["clean"] == pytest.approx(float(torch.stack(per_case).mean()))
