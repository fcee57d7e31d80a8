"""Paschali's DAG target Type C, pinned to the paper's definition (``specs/001_paschali2018.md`` §2.4, §9 row 7).

Paper: "modify (dilate) only a particular target class while keeping all other classes intact". The authors' group
port (Naeem & Paschali) and the spec make it precise: ``scipy.ndimage.binary_dilation`` of the class mask, **6
iterations** of scipy's default (cross, connectivity-1) structuring element (4-connected in 2-D, 6-connected in
3-D), the dilated class overwriting every other label it grows into; the target set is the newly claimed pixels,
non-background ones by default (the paper's "target set of non-background pixels").

medadv's ``dag_target_c`` agrees on the element, the count, the class and the overwrite rule. One representation
choice differs and is pinned here: with ``include_background=False`` the background pixels inside the grown ring
keep label 0 in ``y_adv`` (they are not in the target set either, so ``y_adv`` differs from ``y`` exactly on the
target mask), where the port writes the class there too; DAG attacks only the target set, so the attack is the same.
With ``include_background=True`` ``y_adv`` is the port's map exactly.
"""

from __future__ import annotations

import inspect

import pytest
import scipy.ndimage as ndi
import torch

from medadv.attacks.dag import dag_target_c


def _labels(ndim: int, size: int, seed: int = 0) -> torch.Tensor:
    """Two samples of blocky labels 0-3, touching the border (the dilation's edge handling counts)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randint(0, 4, (2,) + (size // 4,) * ndim, generator=g)
    y = coarse
    for a in range(1, ndim + 1):
        y = y.repeat_interleave(4, dim=a)
    return y


def test_default_is_six_iterations():
    assert inspect.signature(dag_target_c).parameters["iterations"].default == 6


@pytest.mark.parametrize("ndim,size", [(2, 32), (3, 16)])
@pytest.mark.parametrize("cls", [1, 3])
def test_type_c_is_scipy_binary_dilation_with_the_default_element(ndim, size, cls):
    y = _labels(ndim, size)
    before = y.clone()
    y_adv, mask = dag_target_c(y, cls=cls)
    y_bg, mask_bg = dag_target_c(y, cls=cls, include_background=True)
    assert torch.equal(y, before)  # never in place
    for i in range(y.shape[0]):
        grown = torch.from_numpy(ndi.binary_dilation((y[i] == cls).numpy(), iterations=6))  # scipy's defaults
        # the port's target map: the dilated class wins over every label it grows into, background included
        assert torch.equal(y_bg[i], torch.where(grown, torch.full_like(y[i], cls), y[i]))
        assert torch.equal(mask_bg[i], grown & (y[i] != cls))
        # default target set: the newly claimed non-background pixels; y_adv differs from y exactly there
        assert torch.equal(mask[i], grown & (y[i] != cls) & (y[i] != 0))
        assert torch.equal(y_adv[i] != y[i], mask[i])
        assert (y_adv[i][mask[i]] == cls).all()
        # every other class is kept outside the dilated region
        assert torch.equal(y_adv[i][~grown], y[i][~grown])
    assert int(mask.sum()) > 0 and int((mask_bg & ~mask).sum()) > 0  # both cases occur


def test_dilation_grows_by_the_l1_radius():
    """Six cross-element iterations from one pixel give the L1 ball of radius 6 (a diamond), not a square."""
    y = torch.zeros(1, 21, 21, dtype=torch.long)
    y[0, 10, 10] = 1
    _, mask = dag_target_c(y, cls=1, include_background=True)
    ii, jj = torch.meshgrid(torch.arange(21), torch.arange(21), indexing="ij")
    diamond = ((ii - 10).abs() + (jj - 10).abs() <= 6) & ~((ii == 10) & (jj == 10))
    assert torch.equal(mask[0], diamond)


# --- built on the clean prediction (issue 32): the default DAG region is the claimed voxels only ----------------
@pytest.mark.parametrize("ndim", [2, 3])
def test_prediction_based_type_c_differs_from_the_prediction_exactly_on_the_claimed_voxels(ndim):
    y = _labels(ndim, 16 if ndim == 2 else 12)
    g = torch.Generator().manual_seed(5)
    wrong = torch.rand(y.shape, generator=g) < 0.3
    pred = torch.where(wrong, torch.randint(0, 4, y.shape, generator=g), y)  # a 70 %-right prediction
    y0, p0 = y.clone(), pred.clone()
    ya_label, mask_label = dag_target_c(y, cls=2)
    ya, mask = dag_target_c(y, cls=2, prediction=pred)
    assert torch.equal(y, y0) and torch.equal(pred, p0)  # neither input is written
    # the claimed voxels come from the label's dilation; those already predicted as the class drop out
    assert torch.equal(mask, mask_label & (pred != 2))
    assert torch.equal(ya != pred, mask) and (ya[mask] == 2).all()
    # the label-based map disagrees with the prediction on the clean mistakes too: DAG's default region
    # (a wrong voxel keeps a wrong class 3 times in 4 here: ~22 % of the unclaimed voxels)
    outside = ~mask_label
    assert float(((ya_label != pred) & outside).sum() / outside.sum()) > 0.15
    # with the label map as "prediction" the construction is the label-based one
    ya_same, mask_same = dag_target_c(y, cls=2, prediction=y)
    assert torch.equal(ya_same, ya_label) and torch.equal(mask_same, mask_label)


def test_prediction_based_type_c_region_in_dag_is_the_mask(trained_seg3d):
    from medadv.attacks.dag import DAG, DAGDetails
    from medadv.threats import Box

    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    with torch.no_grad():
        clean = m(x).argmax(1)
    attack = DAG(task, Box(0.0, 1.0), step_size=0.01, steps=30)
    ya_label, mask_label = dag_target_c(y, cls=2, iterations=2)
    ya, mask = dag_target_c(y, cls=2, iterations=2, prediction=clean)
    res_label, res = attack(m, x, ya_label), attack(m, x, ya)
    assert isinstance(res.details, DAGDetails) and isinstance(res_label.details, DAGDetails)
    assert torch.equal(res.details.target_region_size, mask.flatten(1).sum(1))
    # label-based, without a target_mask, DAG also works on every clean mistake outside the claimed voxels
    assert int(res_label.details.target_region_size.sum()) > int(mask_label.sum())


def test_bad_prediction_for_type_c_is_refused():
    y = _labels(2, 8)
    with pytest.raises(ValueError, match="`prediction` must have the shape of `y`"):
        dag_target_c(y, cls=1, prediction=y[:1])
    with pytest.raises(TypeError, match="`prediction` must be an integer label map"):
        dag_target_c(y, cls=1, prediction=y.bool())
