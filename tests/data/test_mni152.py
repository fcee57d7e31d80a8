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
