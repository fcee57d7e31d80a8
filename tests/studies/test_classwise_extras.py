"""Class-wise extras (Medi et al., spec 004): corruptions as conditions, targeted success per target class, and the
model-to-model cosine similarity of class-wise behaviour; each checked against an independent count."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from medadv import PGD, Linf
from medadv.studies import classwise, run_study
from medadv.studies.classwise import _spearman
from medadv.studies.corruptions import CORRUPTIONS, _apply, _seeds
from medadv.threats import Box

BOX = (0.0, 1.0)


def test_corruptions_are_conditions_with_their_own_confusion(trained_multiclass):
    t = trained_multiclass
    r = classwise(t.model, t.task, (t.x, t.y), None, corruptions=["brightness", "shot_noise"], severity=5,
                  bounds=BOX, seed=3)
    assert {row.get("corruption") for row in r.rows} == {"brightness", "shot_noise"}
    assert all(row["attack"] is None and row["severity"] == 5 for row in r.rows)
    # brightness at severity 5 = +0.3 of the range, clipped: recompute the predictions independently
    with torch.no_grad():
        pred = t.model((t.x + 0.3).clamp(0, 1)).argmax(1)
    conf = [[0] * 4 for _ in range(4)]
    for yi, pi in zip(t.y.tolist(), pred.tolist(), strict=True):
        conf[yi][pi] += 1
    assert r.meta["confusion"]["brightness (severity 5)"] == conf
    rows = [row for row in r.rows if row["corruption"] == "brightness"]
    assert [row["adv"] for row in rows] == pytest.approx([conf[j][j] / sum(conf[j]) for j in range(4)])
    # shot noise: the study's seeded draw, reproduced with the same seeds
    corr = CORRUPTIONS["shot_noise"]
    xc, _ = _apply(corr, corr.levels[4], t.x, {}, _seeds(3, 1, 1, 0, t.x.shape[0]), 1.0, Box(*BOX))
    with torch.no_grad():
        noisy = t.model(xc).argmax(1)
    shot = [row for row in r.rows if row["corruption"] == "shot_noise"]
    for j, row in enumerate(shot):
        assert row["adv"] == pytest.approx(float((noisy[t.y == j] == j).double().mean()))
    assert r.rows == classwise(t.model, t.task, (t.x, t.y), None, corruptions=["brightness", "shot_noise"],
                               severity=5, bounds=BOX, seed=3).rows
    with pytest.raises(ValueError, match="data box"):
        classwise(t.model, t.task, (t.x, t.y), None, corruptions=["brightness"])


def test_a_spatial_corruption_of_a_segmentation_moves_the_truth(voxel_model):
    from medadv import Segmentation
    from medadv.data import segmentation_blobs

    x, y = segmentation_blobs(n=3, num_classes=3, size=16, ndim=2, seed=1)
    x = (0.1 + 0.4 * y.float()).unsqueeze(1)  # the voxel model segments these perfectly
    fixed = dataclasses.replace(CORRUPTIONS["scale"], name="scale_fixed", spatial=False)  # truth left in place
    r = classwise(voxel_model, Segmentation(3), (x, y), None, corruptions=[CORRUPTIONS["scale"], fixed], severity=5,
                  bounds=BOX)
    dice = {name: [row["adv"] for row in r.rows if row["background"] == "included" and row["corruption"] == name]
            for name in ("scale", "scale_fixed")}
    # the scaled image against the scaled label map: only interpolated edges differ; against the unmoved truth
    # every displaced boundary counts as an error
    assert min(dice["scale"]) > 0.75 and sum(dice["scale"]) > sum(dice["scale_fixed"]) + 0.3


def test_targeted_success_per_target_class_matches_a_recount(trained_multiclass):
    t = trained_multiclass
    x, y = t.x[:16], t.y[:16]
    atk = PGD(t.task, Linf(0.1, bounds=BOX), steps=4, targeted=True)
    r = classwise(t.model, t.task, (x, y), {"tpgd": atk}, target_classes=[0, 2], class_names=list("abcd"))
    rows = [row for row in r.rows if "target" in row]
    assert [row["target"] for row in rows] == ["a", "c"]
    assert not [row for row in r.rows if "class" in row and row["attack"] == "tpgd"]  # no target_fn: per target only
    with torch.no_grad():
        clean = t.model(x).argmax(1)
    for row, tc in zip(rows, (0, 2), strict=True):
        pred = atk(t.model, x, torch.full_like(y, tc)).logits.argmax(1)
        eligible = y != tc
        assert row["eligible"] == int(eligible.sum())
        assert row["success"] == pytest.approx(float((pred[eligible] == tc).double().mean()))
        induced = eligible & (clean != tc)
        assert row["success_induced"] == pytest.approx(float((pred[induced] == tc).double().mean()))
        st = r.meta["targeted"]["tpgd@0.1"]["source_target"]
        for s in range(4):
            if s != tc:
                assert st[s][tc] == pytest.approx(float((pred[y == s] == tc).double().mean()))
        assert st[tc][tc] is None
    # the attack reaches its target more than chance (the control: the clean predictions rarely are the target)
    assert sum(row["success"] for row in rows) > sum(float((clean[y != tc] == tc).double().mean()) for tc in (0, 2))
    from medadv.report.html import render_html_report

    html = render_html_report(None, studies=[r])
    assert "Could not draw" not in html and 'alt="targeted success per target class"' in html
    with pytest.raises(ValueError, match="targeted attack"):
        classwise(t.model, t.task, (x, y), {"pgd": PGD(t.task, Linf(0.1, bounds=BOX), steps=1)}, target_classes="all")


def test_spearman_by_hand():
    assert _spearman([0.1, 0.2, 0.3, 0.4], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(0.8)
    assert _spearman([0.1, 0.2], [1.0, 2.0]) is None and _spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None


def test_model_similarity_compares_class_wise_behaviour(trained_multiclass):
    t = trained_multiclass
    other = copy.deepcopy(t.model)  # the same architecture with perturbed weights: different but related
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in other.parameters():
            if prm.numel() > 1:
                prm.add_(1.0 * prm.std() * torch.randn(prm.shape, generator=g))
    models = {"a": t.model, "a_copy": t.model, "b": other}
    atk = {"fgsm": PGD(t.task, Linf(0.1, bounds=BOX), steps=1)}
    r = classwise(models, t.task, (t.x, t.y), atk)
    assert [row["model"] for row in r.rows] == ["a"] * 4 + ["a_copy"] * 4 + ["b"] * 4
    sim = r.meta["similarity"]
    assert sim["models"] == ["a", "a_copy", "b"] and sim["primary"] == "errors"
    for d in ("errors", "cfps", "metric", "agreement"):
        for cond, m in sim["definitions"][d].items():
            assert m[0][1] == pytest.approx(1.0), (d, cond)  # a model against itself
            assert m[0][2] == m[2][0]  # symmetric
    # agreement is the share of equal predictions: recount it
    with torch.no_grad():
        pa, pb = t.model(t.x).argmax(1), other(t.x).argmax(1)
    assert sim["definitions"]["agreement"]["clean"][0][2] == pytest.approx(float((pa == pb).double().mean()))
    # the error-pattern cosine from the two confusion matrices
    ca = torch.tensor(r.meta["confusion"]["a · fgsm@0.1"]).double()
    cb = torch.tensor(r.meta["confusion"]["b · fgsm@0.1"]).double()
    off = ~torch.eye(4, dtype=torch.bool)
    expected = float((ca[off] @ cb[off]) / (ca[off].norm() * cb[off].norm()))
    assert sim["definitions"]["errors"]["fgsm@0.1"][0][2] == pytest.approx(expected)
    assert sim["definitions"]["agreement"]["clean"][0][2] < 1.0  # the perturbed model differs (control)
    spec = run_study("classwise", {"models": ["a", "b"], "corruptions": ["brightness"], "bounds": [0.0, 1.0]},
                     models, t.task, (t.x, t.y), atk)
    assert "brightness (severity 3)" in spec.meta["similarity"]["definitions"]["errors"]
    from medadv.report.html import render_html_report

    html = render_html_report(None, studies=[spec])
    assert "Could not draw" not in html and "model-to-model cosine similarity" in html
    with pytest.raises(Exception, match="not both"):
        run_study("classwise", {"models": ["a", "b"], "model": "a"}, models, t.task, (t.x, t.y), atk)
