"""The real chest X-ray loader (pydicom-data) and the in-model ImageNet normalisation."""

from __future__ import annotations

import pytest
import torch

from medadv.data.chest_xray import ImageNetNormalize, load_chest_xray, load_fundus


def test_chest_xray_is_real_inverted_and_in_range():
    x = load_chest_xray(size=64)
    assert x.shape == (1, 64, 64) and x.dtype == torch.float32
    assert x.min() >= 0 and x.max() <= 1 and x.std() > 0.1
    # MONOCHROME1 inverted: the lung fields (left/right of centre, mid-height) are darker than the mediastinum
    lungs = torch.stack([x[0, 20:40, 10:22].mean(), x[0, 20:40, 42:54].mean()])
    mediastinum = x[0, 20:40, 28:36].mean()
    assert (lungs < mediastinum).all()
    x3 = load_chest_xray(size=32, channels=3)
    assert x3.shape == (3, 32, 32) and torch.equal(x3[0], x3[2])


def test_fundus_and_bad_args():
    f = load_fundus(32)
    assert f.shape == (3, 32, 32) and f[0].mean() > f[2].mean()  # fundus is reddish
    with pytest.raises(ValueError, match="size"):
        load_chest_xray(size=2)
    with pytest.raises(ValueError, match="channels"):
        load_chest_xray(size=32, channels=2)


def test_imagenet_normalize():
    norm = ImageNetNormalize()
    x = torch.full((1, 3, 2, 2), 0.485)
    assert norm(x)[0, 0].abs().max() < 1e-6
    with pytest.raises(ValueError, match="expected"):
        norm(torch.zeros(1, 1, 2, 2))
