"""Paschali's DAG type B (issue 32, item 1): the target is built on the clean prediction, not on the label map.

The finding these tests pin. Type B retargets ~5 % of the foreground voxels to one foreground class. Built on the
*label map*, the target agrees with the true labels on the other ~95 % of voxels, and DAG's default target region
(no ``target_mask``: every voxel whose clean prediction differs from the target, which is how
:func:`medadv.evaluate` runs it) then holds every voxel the clean model gets wrong: DAG steers those toward their true
label, and the "attack" raises Dice against the label above the clean Dice (the recipe's 0.758 vs clean 0.697). The
paper's DAG attacks only its target set ("alter the prediction from the correct class to the incorrect target
class"): voxels whose target equals their label contribute nothing. Built on the clean prediction
(``dag_target_b(..., prediction=...)``), the target differs from the prediction only on the retargeted voxels, so
the default region is exactly the paper's target set, and the attack lowers Dice, against the label and against
the clean prediction.
"""

from __future__ import annotations

import pytest
import torch

from medadv.attacks.dag import DAG, DAGDetails, dag_target_b
from medadv.evaluation import evaluate
from medadv.threats import Box

UNIT = Box(0.0, 1.0)


def _labels(seed: int = 0) -> torch.Tensor:
    # three foreground classes in slabs plus background, 2 samples of 24^3
    y = torch.zeros(2, 24, 24, 24, dtype=torch.long)
    y[:, 2:9] = 1
    y[:, 9:15] = 2
    y[:, 15:20] = 3
    return y


def _prediction(y: torch.Tensor, error: float, seed: int = 1) -> torch.Tensor:
    # a prediction that is wrong on a share `error` of the voxels (a random class there)
    g = torch.Generator().manual_seed(seed)
    wrong = torch.rand(y.shape, generator=g) < error
    return torch.where(wrong, torch.randint(0, 4, y.shape, generator=g), y)


def _mean_dice(task, pred: torch.Tensor, ref: torch.Tensor) -> float:
    # mean Dice over the classes, as the results' `mean_dice` columns (ref: the label or the clean prediction)
    return float(task.mean_dice(pred, ref).mean())


# --- the target map ---------------------------------------------------------------------------------------------
def test_prediction_based_target_differs_from_the_prediction_exactly_on_five_percent_of_the_foreground():
    y = _labels()
    pred = _prediction(y, 0.3)
    y0, p0 = y.clone(), pred.clone()
    ya, mask = dag_target_b(y, generator=torch.Generator().manual_seed(0), prediction=pred)
    assert torch.equal(y, y0) and torch.equal(pred, p0)  # neither input is written
    assert torch.equal(ya != pred, mask)  # the only voxels DAG must move are the mask's
    for i in range(y.shape[0]):
        c = torch.unique(ya[i][mask[i]])
        assert c.numel() == 1 and int(c) in (1, 2, 3)  # one adversarial foreground class
        assert (y[i][mask[i]] != 0).all() and (y[i][mask[i]] != c).all()  # chosen from the label's foreground
        eligible = (y[i] != 0) & (y[i] != c) & (pred[i] != c)
        assert 0.04 < float(mask[i].sum() / eligible.sum()) < 0.06  # ~5 % of it, the default fraction
        # outside the mask the target is the prediction, mistakes included: nothing there is "repaired"
        assert torch.equal(ya[i][~mask[i]], pred[i][~mask[i]])


def test_prediction_based_target_draws_the_same_voxels_and_class_as_the_label_based_one():
    y = _labels()
    pred = _prediction(y, 0.3)
    ya_label, mask_label = dag_target_b(y, generator=torch.Generator().manual_seed(3))
    ya_pred, mask_pred = dag_target_b(y, generator=torch.Generator().manual_seed(3), prediction=pred)
    # the same draws; the voxels already predicted as the adversarial class have nothing to flip and drop out
    assert torch.equal(mask_pred, mask_label & (pred != ya_label))
    assert torch.equal(ya_pred[mask_pred], ya_label[mask_pred])
    # with the label map as "prediction" the construction is the label-based one
    ya_same, mask_same = dag_target_b(y, generator=torch.Generator().manual_seed(3), prediction=y)
    assert torch.equal(ya_same, ya_label) and torch.equal(mask_same, mask_label)


def test_label_based_target_differs_from_an_imperfect_prediction_far_beyond_the_mask():
    # the root of the finding, without a model: the label-based target disagrees with a 70 %-right prediction on
    # ~30 % of the voxels, six times the 5 % it retargets, and DAG's default region is that disagreement
    y = _labels()
    pred = _prediction(y, 0.3)
    ya, mask = dag_target_b(y, generator=torch.Generator().manual_seed(0))
    default_region = ya != pred
    assert float(default_region.sum()) > 4 * float(mask.sum())
    assert float((default_region & (ya == y)).sum()) > 3 * float(mask.sum())  # voxels whose target is the truth


def test_bad_prediction_is_refused_with_one_line_naming_it():
    y = _labels()
    with pytest.raises(ValueError, match="`prediction` must have the shape of `y`"):
        dag_target_b(y, prediction=y[:1])
    with pytest.raises(TypeError, match="`prediction` must be an integer label map"):
        dag_target_b(y, prediction=y.float())
    with pytest.raises(TypeError, match="`prediction` must be a torch.Tensor"):
        dag_target_b(y, prediction=y.numpy())


# --- the attack on a trained segmenter -------------------------------------------------------------------------
def test_label_based_type_b_without_target_mask_repairs_the_prediction(trained_seg3d):
    """The finding: DAG's default region for the label-based map holds the clean mistakes, and Dice rises."""
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    with torch.no_grad():
        clean = m(x).argmax(1)
    ya, mask = dag_target_b(y, generator=torch.Generator().manual_seed(0))
    res = DAG(task, UNIT, step_size=0.01, steps=100)(m, x, ya)
    assert isinstance(res.details, DAGDetails)
    # the region DAG works on is several times the retargeted voxels: it is every clean mistake as well
    assert float(res.details.target_region_size.sum()) > 3 * float(mask.sum())
    clean_dice = _mean_dice(task, clean, y)
    assert clean_dice < 0.9  # the fixture's model makes mistakes to repair
    assert _mean_dice(task, res.logits.argmax(1), y) > clean_dice + 0.05  # "attacked" Dice above the clean Dice


def test_prediction_based_type_b_lowers_dice_against_the_label_and_the_clean_prediction(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    x_before = x.clone()
    with torch.no_grad():
        clean = m(x).argmax(1)
    ya, mask = dag_target_b(y, generator=torch.Generator().manual_seed(0), prediction=clean)
    res = DAG(task, UNIT, step_size=0.01, steps=100)(m, x, ya)
    assert torch.equal(x, x_before)
    assert isinstance(res.details, DAGDetails)
    # the default region is exactly the paper's target set
    assert torch.equal(res.details.target_region_size, mask.flatten(1).sum(1))
    assert float(res.details.fooled_fraction.nanmean()) >= 0.8
    adv = res.logits.argmax(1)
    assert _mean_dice(task, adv, clean) < 0.95  # the prediction moved away from the clean one
    assert _mean_dice(task, adv, y) < _mean_dice(task, clean, y) - 0.02  # and away from the label: no repair
    outside = ~mask
    assert float((adv[outside] == clean[outside]).float().mean()) >= 0.95  # the rest keeps its prediction


def test_through_evaluate_the_prediction_based_target_drops_dice_and_the_label_based_one_raises_it(trained_seg3d):
    """The pipeline path (``evaluate`` calls ``target_fn(x, y, clean_logits)`` and DAG without ``target_mask``)."""
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y

    def from_label(x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return dag_target_b(y, generator=torch.Generator().manual_seed(0))[0]

    def from_prediction(x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return dag_target_b(y, generator=torch.Generator().manual_seed(0), prediction=task.predict(logits))[0]

    dag = DAG(task, UNIT, step_size=0.01, steps=100)
    res = evaluate(m, task, (x, y), {"label": dag, "pred": dag},
                   target_fn={"label": from_label, "pred": from_prediction})
    rows = {name: [r for r in res.rows if r["attack"] == name] for name in ("label", "pred")}

    def mean(name: str, col: str) -> float:
        return sum(float(r[col]) for r in rows[name]) / len(rows[name])

    assert mean("label", "adv_mean_dice") > mean("label", "clean_mean_dice")  # the suspect number
    assert mean("pred", "adv_mean_dice") < mean("pred", "clean_mean_dice")  # the fixed one
    assert mean("pred", "dice_to_clean") < 0.95
