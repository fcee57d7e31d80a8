import pytest
import torch

from medadv.data.mni152 import TISSUE_CLASSES, load_tissue_map, tissue_patches


def test_tissue_map_is_real_anatomy_with_four_classes():
    vol, lab = load_tissue_map(4)
    assert vol.shape == lab.shape and vol.ndim == 3
    assert 0.0 <= vol.min() and vol.max() <= 1.0
    counts = torch.bincount(lab.flatten(), minlength=len(TISSUE_CLASSES))
    assert (counts > 0).all()
    # grey and white matter are brighter than background on T1 and WM brighter than GM
    assert vol[lab == 2].mean() > vol[lab == 1].mean() > vol[lab == 0].mean()


def test_patches_split_by_hemisphere_and_contain_brain():
    x_tr, y_tr = tissue_patches(3, size=16, spacing_mm=4, split="train", seed=0)
    x_te, y_te = tissue_patches(3, size=16, spacing_mm=4, split="test", seed=0)
    assert x_tr.shape == (3, 1, 16, 16, 16) and y_tr.shape == (3, 16, 16, 16)
    assert y_tr.dtype == torch.int64
    assert ((y_tr > 0).flatten(1).any(1)).all() and ((y_te > 0).flatten(1).any(1)).all()
    assert not torch.equal(x_tr, x_te)


def test_2d_kinds_are_slices_of_the_template_with_their_labels():
    from medadv.data.mni152 import KINDS, tissue_classes, tissue_labels, tissue_slices

    assert set(KINDS) == {"patches", "slices", "classes", "labels"}
    x, seg = tissue_slices(6, size=24, seed=3)
    assert x.shape == (6, 1, 24, 24) and seg.shape == (6, 24, 24) and int(seg.max()) <= 3
    x, y = tissue_classes(9, size=24, split="test", seed=1)
    assert x.shape == (9, 1, 24, 24) and y.tolist() == [0, 1, 2] * 3
    # the label is the tissue at the patch centre: on T1, white matter is brighter than grey matter there
    x, y = tissue_classes(60, size=24, seed=2)
    centre = x[:, 0, 12, 12]
    assert float(centre[y == 1].mean()) > float(centre[y == 0].mean()) + 0.05
    x, y = tissue_labels(16, seed=0, min_fraction=0.3)
    _, seg = tissue_slices(16, seed=0)
    assert torch.equal(y, torch.stack([(seg == k).flatten(1).float().mean(1) >= 0.3 for k in (0, 1, 2)], 1).float())
    assert 0 < float(y.mean()) < 1
    with pytest.raises(ValueError, match="min_fraction"):
        tissue_labels(2, min_fraction=1.5)
