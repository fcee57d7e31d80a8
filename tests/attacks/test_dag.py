"""DAG and Paschali's target types A/B/C on small trained 3-D and 2-D segmenters."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch

from medadv.attacks.base import get_attack
from medadv.attacks.dag import DAG, DAGDetails, calibrate_step_size, dag_target_a, dag_target_b, dag_target_c
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, Segmentation
from medadv.threats import Box, Linf

UNIT = Box(0.0, 1.0)


def test_target_a_everything_to_background():
    y = torch.tensor([[[0, 1], [2, 1]]])
    ya, mask = dag_target_a(y)
    assert (ya == 0).all() and torch.equal(mask, y != 0)


def test_target_b_one_class_random_fraction_seeded():
    y = torch.zeros(2, 20, 20, 20, dtype=torch.long)
    y[:, :10] = 1
    y[:, 10:15] = 2
    y_before = y.clone()
    ya, mask = dag_target_b(y, fraction=0.2, generator=torch.Generator().manual_seed(0))
    ya2, mask2 = dag_target_b(y, fraction=0.2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(y, y_before)  # input untouched
    assert torch.equal(ya, ya2) and torch.equal(mask, mask2)  # seeded
    for i in range(2):
        changed = ya[i] != y[i]
        assert torch.equal(changed, mask[i])
        c = torch.unique(ya[i][mask[i]])
        assert c.numel() == 1 and int(c) in (1, 2)  # one adversarial foreground class
        eligible = (y[i] != 0) & (y[i] != c)
        assert (y[i][mask[i]] != 0).all()  # background never targeted
        frac = mask[i].sum() / eligible.sum()
        assert 0.15 < float(frac) < 0.25


@pytest.mark.parametrize("ndim", [2, 3])
def test_target_c_is_cross_dilation(ndim):
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (1,) + (12,) * ndim, generator=g)
    yc, mask = dag_target_c(y, cls=2, iterations=2)
    ref = ndi.binary_dilation((y[0] == 2).numpy(), structure=ndi.generate_binary_structure(ndim, 1), iterations=2)
    expect = torch.from_numpy(ref) & (y[0] != 2) & (y[0] != 0)
    assert torch.equal(mask[0], expect)
    assert (yc[mask] == 2).all() and torch.equal(yc[~mask], y[~mask])
    yc_bg, mask_bg = dag_target_c(y, cls=2, iterations=2, include_background=True)
    assert torch.equal(mask_bg[0], torch.from_numpy(ref) & (y[0] != 2))


def test_dag_type_a_drives_voxels_to_background(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    x_before = x.clone()
    ya, mask = dag_target_a(y)
    res = DAG(task, UNIT, step_size=0.01, steps=200)(m, x, ya, target_mask=mask)
    assert torch.equal(x, x_before)
    pred = res.logits.argmax(1)
    assert float((pred == 0).float().mean()) >= 0.9  # >= 90 % of all voxels at the target
    assert float(res.extras["fooled_fraction"].mean()) >= 0.9
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    for k in ("mse", "linf", "l2", "ssim", "fooled_fraction", "iterations"):
        assert res.extras[k].shape == (x.shape[0],)
    torch.testing.assert_close(res.extras["linf"], res.linf)
    assert (res.extras["ssim"] < 1).all() and (res.extras["mse"] > 0).all()


def test_dag_types_b_and_c_change_the_target_and_keep_the_rest(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    with torch.no_grad():
        pred0 = m(x).argmax(1)
    for ya, mask, need in (
        (*dag_target_b(y, fraction=0.1, generator=torch.Generator().manual_seed(0)), 0.3),
        (*dag_target_c(y, cls=2, iterations=2), 0.9),
    ):
        clean_hit = ((pred0 == ya) & mask).sum() / mask.sum()
        res = DAG(task, UNIT, step_size=0.01, steps=100)(m, x, ya, target_mask=mask)
        assert float(res.extras["fooled_fraction"].mean()) >= max(need, float(clean_hit) + 0.2)
        kept = ((res.logits.argmax(1) == pred0) | mask).float().mean()
        assert float(kept) >= 0.95  # voxels outside the target region mostly keep their prediction


def test_dag_stops_early_and_bounded_variant(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    ya, mask = dag_target_c(y, cls=2, iterations=1)
    res = DAG(task, UNIT, step_size=0.02, steps=200, stop_fraction=0.05)(m, x, ya, target_mask=mask)
    assert (res.extras["iterations"] < 200).all()
    assert (res.extras["fooled_fraction"] >= 0.95).all()
    eps = 4 / 255
    ya, mask = dag_target_a(y)
    res_b = DAG(task, Linf(eps, bounds=(0, 1)), step_size=0.01, steps=30)(m, x, ya, target_mask=mask)
    assert (res_b.linf <= eps + 1e-6).all()
    assert res_b.x_adv.min() >= 0 and res_b.x_adv.max() <= 1


def test_dag_2d_multichannel(trained_seg2d):
    m, task, x, y = trained_seg2d.model, trained_seg2d.task, trained_seg2d.x, trained_seg2d.y
    ya, mask = dag_target_c(y, cls=2, iterations=2)
    res = DAG(task, UNIT, step_size=0.01, steps=100)(m, x, ya, target_mask=mask)
    assert res.x_adv.shape == x.shape
    assert float(res.extras["fooled_fraction"].mean()) >= 0.8


def test_dag_l2_steps_have_length_gamma(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x[:1], trained_seg3d.y[:1]
    ya, mask = dag_target_a(y)
    res = DAG(task, Box.unbounded(), step_size=0.01, steps=1, norm="l2")(m, x, ya, target_mask=mask)
    np.testing.assert_allclose(res.l2.numpy(), [0.01], rtol=1e-4)


def test_dag_bad_input(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    with pytest.raises(TypeError, match="Segmentation"):
        DAG(MultiClass())
    with pytest.raises(ValueError, match="step_size"):
        DAG(task, UNIT, step_size=0)
    with pytest.raises(ValueError, match="norm"):
        DAG(task, UNIT, norm="l1")
    with pytest.raises(ValueError, match="target"):
        DAG(task, UNIT)(m, x)
    with pytest.raises(ValueError, match="bounds"):
        DAG(task, UNIT)(m, x + 2, y)
    with pytest.raises(ValueError, match="target_mask"):
        DAG(task, UNIT)(m, x, y, target_mask=torch.ones(1, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="out of range"):
        DAG(Segmentation(3), UNIT)(m, x, y + 5)


def test_calibrate_gamma_hits_the_reported_mse(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x[:2], trained_seg3d.y[:2]
    ya, mask = dag_target_a(y)
    gamma, res = calibrate_step_size(m, task, x, ya, mask, threat=UNIT, target_mse=0.002, iters=5, steps=30)
    assert 1e-4 < gamma < 0.05
    assert abs(float(res.extras["mse"].mean()) - 0.002) < 0.001
    with pytest.raises(ValueError, match="target_mse"):
        calibrate_step_size(m, task, x, ya, target_mse=0)


def test_dag_declared_params_vocabulary_and_aliases():
    task = Segmentation(3)
    with pytest.raises(InvalidParameterError, match="steps"):
        DAG(task, UNIT, steps=2.5)  # an error, never a silent 2
    with pytest.raises(InvalidParameterError, match="stop_fraction"):
        DAG(task, UNIT, stop_fraction=1.0)
    with pytest.warns(FutureWarning, match="max_iter"), pytest.warns(FutureWarning, match="gamma"):
        old = DAG(task, UNIT, max_iter=7, gamma=0.02)
    assert (old.steps, old.step_size) == (7, 0.02)
    with pytest.warns(FutureWarning, match="bounds"):
        legacy = DAG(task, bounds=(0.0, 1.0))
    assert legacy.box == UNIT and legacy.threat is None
    with pytest.raises(InvalidParameterError, match="once"):
        DAG(task, UNIT, bounds=(0.0, 1.0))
    DAG.check_declarations()
    atk = DAG(task, UNIT, steps=5)
    params = atk.get_params()
    assert params["steps"] == 5 and params["step_size"] is None and "targeted" not in params
    assert atk.targeted  # DAG's y is always the target map
    # the default step is 0.5/255 of the data range (Xie's 0.5 grey levels), in data units
    assert DAG(task, UNIT).alpha == pytest.approx(0.5 / 255)
    assert DAG(task, Box(-1000.0, 1000.0)).alpha == pytest.approx(2000 * 0.5 / 255)
    with pytest.raises(InvalidParameterError, match="step_size"):
        DAG(task, Box.unbounded())  # no data range: the step must be given
    # settings and the box reach the fingerprint; set_params keeps the box
    assert atk.fingerprint() != atk.set_params(steps=6).fingerprint()
    assert atk.fingerprint() != DAG(task, Box(0.0, 2.0), steps=5).fingerprint()
    assert atk.set_params(stop_fraction=0.1).box == UNIT


def test_dag_from_the_registry_with_defaults(trained_seg2d):
    m, task, x, y = trained_seg2d.model, trained_seg2d.task, trained_seg2d.x[:2], trained_seg2d.y[:2]
    atk = get_attack("dag", task, UNIT)
    assert isinstance(atk, DAG) and atk.steps == 200 and atk.norm == "linf"
    with pytest.warns(FutureWarning):
        assert get_attack("dag", task, UNIT, max_iter=3).steps == 3
    ya, mask = dag_target_c(y, cls=2, iterations=1)
    res = get_attack("dag", task, UNIT, steps=3)(m, x, ya, target_mask=mask)
    assert (res.details.iterations <= 3).all()


def test_dag_typed_details_and_rows(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x[:2], trained_seg3d.y[:2]
    ya, mask = dag_target_c(y, cls=2, iterations=1)
    res = DAG(task, UNIT, step_size=0.02, steps=20)(m, x, ya, target_mask=mask)
    d = res.details
    assert isinstance(d, DAGDetails)
    assert set(DAGDetails.columns) == {"fooled_fraction", "iterations", "mse", "ssim", "target_region_size"}
    torch.testing.assert_close(d.target_region_size, mask.flatten(1).sum(1))
    hit = ((res.logits.argmax(1) == ya) & mask).flatten(1).sum(1) / mask.flatten(1).sum(1)
    torch.testing.assert_close(d.fooled_fraction, hit.float())
    rows = res.rows()
    assert len(rows) == 2 and set(rows[0]) == set(DAGDetails.columns)
    assert rows[1]["iterations"] == int(d.iterations[1])


def test_dag_stopped_sample_never_moves_and_empty_region(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x[:3], trained_seg3d.y[:3]
    ya, mask = dag_target_a(y)
    mask[1] = False  # nothing to change in sample 1: it stops at once
    res = DAG(task, UNIT, step_size=0.01, steps=40, check_every=4, record_trace=True)(m, x, ya, target_mask=mask)
    assert int(res.details.iterations[1]) == 0 and torch.equal(res.x_adv[1], x[1])
    assert (res.details.iterations[[0, 2]] > 0).all()
    trace = res.trace["objective"]
    assert trace.shape == (40, 3) and torch.isnan(trace[4:, 1]).all()  # left the batch at the first check
    # the other samples ran exactly as alone (per-sample stop, batch compaction)
    alone = DAG(task, UNIT, step_size=0.01, steps=40, check_every=4)(m, x[[0]], ya[[0]], target_mask=mask[[0]])
    torch.testing.assert_close(alone.x_adv[0], res.x_adv[0], atol=1e-5, rtol=0)


def test_empty_target_region_reports_nan_not_zero(trained_seg2d):
    # nothing to flip: the target already equals the prediction; the share is undefined, not a failure
    m, task, x = trained_seg2d.model, trained_seg2d.task, trained_seg2d.x[:2]
    with torch.no_grad():
        pred = m(x).argmax(1)
    mask = torch.zeros_like(pred, dtype=torch.bool)
    mask[1, :2, :2] = pred[1, :2, :2] != 0
    res = DAG(task, UNIT, step_size=0.01, steps=5)(m, x, torch.where(mask, torch.zeros_like(pred), pred),
                                                   target_mask=mask)
    assert torch.isnan(res.details.fooled_fraction[0])
    assert res.details.target_region_size[0] == 0
