"""medadv.data.heads: real T1 heads (Colin27 from Debian mricron-data) and their reference brain masks."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
import torch

from medadv.data.heads import colin27, itk_head


def test_colin27_is_the_t1_head_with_skull_in_grey_levels_and_ch2bet_mask():
    h = colin27()
    assert h.image.shape == (181, 217, 181) and h.image.dtype == torch.float32
    assert h.mask.dtype == torch.bool and h.mask.shape == h.image.shape
    assert h.spacing == (1.0, 1.0, 1.0) and h.with_skull
    assert float(h.image.min()) == 0.0 and float(h.image.max()) == 254.0  # stored uint8 values, unscaled
    assert nib.aff2axcodes(h.affine.numpy()) == ("R", "A", "S")
    assert abs(float(h.mask.sum()) * h.voxel_ml - 1737.2) < 0.1  # ch2bet's brain, ml
    # the skull is in the image and not in the mask: bright voxels outside the brain
    assert float((h.image[~h.mask] > 60).float().mean()) > 0.2
    b = h.batch()
    assert b.shape == (1, 1, 181, 217, 181)
    b += 1
    assert float(h.image.max()) == 254.0  # a copy


def test_colin27_refusals_name_the_argument_and_the_package(tmp_path):
    with pytest.raises(ValueError, match="`resolution` must be 1 or 0.5"):
        colin27(resolution=2)
    with pytest.raises(FileNotFoundError, match="apt-get install mricron-data"):
        colin27(directory=tmp_path)


def test_itk_head_is_reoriented_to_ras_with_spacing_per_canonical_axis(tmp_path):
    # the KmeansTest files are LSA on disk, 2x2x3 mm: written here the same way, with a marked corner
    affine = np.array([[-2.0, 0, 0, 0], [0, 0, 3, -254], [0, 2, 0, 0], [0, 0, 0, 1]])
    image = np.zeros((8, 6, 5), np.int16)
    image[0, 0, 0] = 200  # file voxel (0, 0, 0) has x = 0, the right-most x of the grid (x = -2 i)
    mask = np.zeros((8, 6, 5), np.uint8)
    mask[2:5, 1:4, 1:3] = 6
    nib.save(nib.Nifti1Image(image, affine), tmp_path / "KmeansTest_T1UCharRaw.nii.gz")
    nib.save(nib.Nifti1Image(mask, affine), tmp_path / "KmeansTest_T1RawSkullStrip.nii.gz")
    h = itk_head(tmp_path)
    assert h.image.shape == (8, 5, 6)  # RAS: (x, y <- file axis 2, z <- file axis 1)
    assert h.spacing == (2.0, 3.0, 2.0)
    assert nib.aff2axcodes(h.affine.numpy()) == ("R", "A", "S")
    assert float(h.image[7, 0, 0]) == 200.0  # the x axis flipped: right-most is the last index in RAS
    assert int(h.mask.sum()) == 18 and h.image.dtype == torch.float32
    with pytest.raises(FileNotFoundError, match="apt-get install insighttoolkit5-examples"):
        itk_head(tmp_path / "missing")
