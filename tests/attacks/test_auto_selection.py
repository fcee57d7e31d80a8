"""``auto`` on segmentation: the worst case kept by the chosen metric, per-metric worst cases, early stops, SEA's
masked losses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from medadv.attacks.apgd import APGD
from medadv.attacks.auto import AutoEvaluation
from medadv.attacks.engine import StepContext
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, Segmentation
from medadv.threats import Linf

MEMBERS = ["apgd-ce", "apgd-masked-ce"]
COLUMN = {"dice": "mean_dice", "accuracy": "pixel_accuracy", "miou": "miou"}


@pytest.fixture(scope="module")
def seg():
    ex = Segmentation.examples()[1]  # the 3-D example: 3 classes
    return ex


def _auto(task, **kw):
    base = {"version": "custom", "attacks": MEMBERS, "steps": 4, "checks": False, "seed": 3,
            "progressive_radius": False}
    return AutoEvaluation(task, Linf(0.1, bounds=(0.0, 1.0)), **{**base, **kw})


def _metric(task, model, x, y, column):
    with torch.no_grad():
        return task.outcome(model(x), y).columns[column].float()


@pytest.mark.parametrize("metric", ["dice", "accuracy", "miou"])
def test_kept_result_is_the_worst_by_the_chosen_metric(seg, metric):
    task, model, x, y = seg.task, seg.model, seg.x, seg.y
    res = _auto(task, metric=metric)(model, x, y)
    col = COLUMN[metric]
    kept = _metric(task, model, res.x_adv, y, col)
    candidates = [_metric(task, model, x, y, col)]
    for k, m in enumerate(MEMBERS):  # member k of auto is seeded seed + k: the same run alone
        alone = _auto(task, attacks=[m], metric=metric, seed=3 + k)(model, x, y)
        candidates.append(_metric(task, model, alone.x_adv, y, col))
    assert torch.allclose(kept, torch.stack(candidates).min(dim=0).values, atol=1e-6)
    assert torch.allclose(res.details.metric_after[:, -1], kept, atol=1e-6)
    assert res.details.metric == col


def test_worst_of_records_each_metrics_own_worst_case(seg):
    task, model, x, y = seg.task, seg.model, seg.x, seg.y
    res = _auto(task, metric="worst-of")(model, x, y)
    det = res.details
    assert det.worst_of_columns == ["mean_dice", "pixel_accuracy", "miou"]
    for i, col in enumerate(det.worst_of_columns):
        candidates = [_metric(task, model, x, y, col)]
        for k, m in enumerate(MEMBERS):
            alone = _auto(task, attacks=[m], seed=3 + k)(model, x, y)
            candidates.append(_metric(task, model, alone.x_adv, y, col))
        expect = torch.stack(candidates).min(dim=0).values
        assert torch.allclose(det.worst_of[:, i], expect, atol=1e-6), col
        # never above the metric of the example kept (by Dice)
        assert bool((det.worst_of[:, i] <= _metric(task, model, res.x_adv, y, col) + 1e-6).all())


def test_stop_below_ends_samples_early_and_stop_on_no_gain_skips_later_members(seg):
    task, model, x, y = seg.task, seg.model, seg.x, seg.y
    res = _auto(task, stop_below=1.0, metric="dice")(model, x, y)  # every sample is at or below Dice 1: none attacked
    assert not bool(res.details.attacked.any()) and torch.equal(res.x_adv, x)
    clean = _metric(task, model, x, y, "mean_dice")
    first = _auto(task, attacks=MEMBERS[:1], metric="dice")(model, x, y).details.metric_after[:, 0]
    assert bool((first < clean).all()), "the first member lowers every sample's Dice"
    threshold = float(first.median())
    res = _auto(task, stop_below=threshold, metric="dice")(model, x, y)
    assert torch.equal(res.details.attacked[:, 0], clean > threshold)
    assert torch.equal(res.details.attacked[:, 1], res.details.metric_after[:, 0] > threshold)

    constant = torch.nn.Sequential(torch.nn.Conv3d(1, 3, 1))
    with torch.no_grad():
        constant[0].weight.zero_()  # output independent of the input: no member can lower the metric
    res = _auto(task, stop_on_no_gain=True)(constant, x, y)
    assert bool(res.details.attacked[:, 0].all()) and not bool(res.details.attacked[:, 1].any())
    res = _auto(task)(constant, x, y)  # off: every member runs
    assert bool(res.details.attacked.all())


def test_metric_is_refused_where_it_does_not_apply():
    ex = MultiClass.example()
    with pytest.raises(InvalidParameterError, match="`metric` of auto"):
        AutoEvaluation(ex.task, Linf(0.1, bounds=(0.0, 1.0)), metric="dice")
    with pytest.raises(InvalidParameterError, match="metric"):
        AutoEvaluation(Segmentation(3), Linf(0.1, bounds=(0.0, 1.0)), metric="dise")


def test_masked_losses_count_only_the_voxels_still_at_their_label():
    task = Segmentation(3, include_background=True)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 6, 6, generator=g)
    y = torch.randint(0, 3, (2, 6, 6), generator=g)
    correct = (logits.argmax(1) == y).float()
    ce = F.cross_entropy(logits, y, reduction="none")
    atk = APGD(task, Linf(0.1, bounds=(0.0, 1.0)), loss="masked-ce", steps=2)
    ctx = StepContext(step=0, steps=2, restart=0, index=torch.arange(2), x=torch.zeros(2, 1, 6, 6), y=y,
                      clean_logits=None)
    value = atk.logits_objective(logits, ctx)
    assert torch.allclose(value, (ce * correct).flatten(1).mean(1), atol=1e-6)
    ctx.step = -1  # the final scoring is unmasked
    assert torch.allclose(atk.logits_objective(logits, ctx), ce.flatten(1).mean(1), atol=1e-6)
    with pytest.raises(TypeError, match="label map"):
        APGD(MultiClass(), Linf(0.1, bounds=(0.0, 1.0)), loss="masked-ce")


def test_mean_iou_matches_monai():
    from monai.metrics import compute_iou

    task = Segmentation(4, include_background=True)
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 4, (5, 9, 9), generator=g)
    p = torch.randint(0, 4, (5, 9, 9), generator=g)
    p[0, :] = 0  # classes absent from the prediction
    y[0, :] = 0
    onehot = lambda a: F.one_hot(a, 4).movedim(-1, 1)  # noqa: E731
    ref = compute_iou(onehot(p), onehot(y), include_background=True, ignore_empty=False)
    assert torch.allclose(task.mean_iou(p, y), ref.nanmean(dim=1).float(), atol=1e-6)
    assert "miou" in task.outcome(F.one_hot(p, 4).movedim(-1, 1).float(), y).columns


def test_selection_metric_through_the_config_evaluate_and_the_report(seg, tmp_path):
    from medadv.config import build_attacks
    from medadv.evaluation import evaluate
    from medadv.report import write_html_report

    cfg = {"threat": {"norm": "linf", "eps": 0.1, "bounds": [0.0, 1.0]},
           "attacks": [{"name": "auto", "version": "custom", "attacks": MEMBERS, "steps": 3, "checks": False,
                        "metric": "accuracy"}]}
    attacks = build_attacks(cfg, seg.task)
    atk = next(iter(attacks.values()))
    assert atk.get_params()["metric"] == "accuracy"
    res = evaluate(seg.model, seg.task, (seg.x, seg.y), attacks)
    row = res.rows[0]
    assert {"clean_mean_dice", "adv_pixel_accuracy", "adv_miou"} <= set(row)  # all three, whatever the choice
    assert row["attack_metric"] == "pixel_accuracy"
    table = res.worst_of_table()
    assert [c for c in table[0] if c.startswith("worst_")] == ["worst_mean_dice", "worst_pixel_accuracy", "worst_miou"]
    # the example kept is the worst by accuracy: its accuracy is the per-metric worst case
    assert abs(table[0]["worst_pixel_accuracy"] - table[0]["adv_pixel_accuracy"]) < 1e-6
    assert res.ensemble_table()[-1]["robust_pixel_accuracy"] == pytest.approx(table[0]["adv_pixel_accuracy"])
    html = write_html_report(res, tmp_path).read_text()
    assert "Worst case of each metric" in html and "pixel accuracy" in html
