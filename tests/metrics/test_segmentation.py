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


def test_missed_and_absent_structures_per_class():
    """Issue 28 item 7: per class, missed = in the reference and not predicted, absent = in neither (both have no
    HD95); ignore_index voxels do not count; they become clean_/adv_ columns of a segmentation's rows."""
    import torch

    from medadv.tasks import Segmentation
    from medadv.tasks.base import Outcome

    y = torch.tensor([[[1, 1], [0, 0]], [[2, 255], [0, 0]]])
    pred = torch.tensor([[[0, 0], [0, 0]], [[0, 2], [2, 0]]])
    task = Segmentation(4, ignore_index=255)
    missed, absent = task.missed_absent(pred, y)
    assert missed.tolist() == [[False, True, False, False], [False, False, False, False]]
    assert absent.tolist() == [[False, False, True, True], [False, True, False, True]]
    # the 2 predicted under the ignored voxel does not count: class 2 missed when only that voxel predicts it
    missed2, _ = task.missed_absent(torch.tensor([[[0, 0], [0, 0]], [[0, 2], [0, 0]]]), y)
    assert missed2[1].tolist() == [False, False, True, False]
    out = task.outcome(torch.zeros(2, 4, 2, 2), y)
    cols = task.sample_columns(y, out, Outcome(pred, out.wrong, out.columns))
    assert torch.equal(cols["adv_missed"], missed) and torch.equal(cols["adv_absent"], absent)
