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
