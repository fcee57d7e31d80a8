import pytest
import torch

from medadv.metrics.segmentation import dice_per_class, hd95_per_class


def test_dice_per_class_hand_computed():
    y = torch.zeros(1, 4, 4, dtype=torch.long)
    y[0, :2, :2] = 1  # 4 pixels of class 1
    pred = torch.zeros_like(y)
    pred[0, :2, :1] = 1  # 2 of them found
    d = dice_per_class(pred, y, 2)
    assert d[0, 1].item() == pytest.approx(2 * 2 / (2 + 4))
    assert d[0, 0].item() == pytest.approx(2 * 12 / (14 + 12))


def test_hd95_in_spacing_units_and_nan_for_absent_class():
    y = torch.zeros(1, 8, 8, 8, dtype=torch.long)
    y[0, 2:4, 2:4, 2:4] = 1
    pred = torch.roll(y, shifts=1, dims=1)
    hd_vox = hd95_per_class(pred, y, 3)
    hd_mm = hd95_per_class(pred, y, 3, spacing=2.0)
    assert hd_vox[0, 1].item() == pytest.approx(1.0)
    assert hd_mm[0, 1].item() == pytest.approx(2.0)
    assert torch.isnan(hd_vox[0, 2])


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="pred"):
        dice_per_class(torch.zeros(1, 4, 4, dtype=torch.long), torch.zeros(1, 4, 5, dtype=torch.long), 2)
