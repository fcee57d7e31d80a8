"""Image similarity metrics: SSIM agrees with scikit-image, PSNR/MSE formulas, LPIPS without weights is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from skimage.metrics import structural_similarity

from medadv.metrics.image import lpips, mse, psnr, ssim


def _noisy(shape, sigma=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(shape, generator=g, dtype=torch.float64)
    return a, (a + sigma * torch.randn(shape, generator=g, dtype=torch.float64)).clamp(0, 1)


@pytest.mark.parametrize("shape", [(2, 1, 40, 36), (1, 1, 24, 24, 24)])
def test_ssim_matches_skimage(shape):
    a, b = _noisy(shape)
    got = ssim(a, b, data_range=1.0)
    for i in range(shape[0]):
        ref = structural_similarity(a[i, 0].numpy(), b[i, 0].numpy(), data_range=1.0, gaussian_weights=True,
                                    sigma=1.5, use_sample_covariance=False)
        assert math.isclose(float(got[i]), ref, abs_tol=1e-6)


def test_ssim_identity_multichannel_and_ordering():
    a, b = _noisy((2, 3, 16, 16, 16), sigma=0.05)
    _, c = _noisy((2, 3, 16, 16, 16), sigma=0.3)
    assert torch.allclose(ssim(a, a, win_size=3), torch.ones(2, dtype=a.dtype))
    assert (ssim(a, b, win_size=3) > ssim(a, c, win_size=3)).all()


def test_ssim_is_differentiable():
    a, b = _noisy((1, 1, 12, 12))
    b.requires_grad_(True)
    (g,) = torch.autograd.grad(ssim(a, b, win_size=3).sum(), b)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_mse_psnr():
    x = torch.zeros(2, 1, 4, 4)
    y = x.clone()
    y[0] += 0.1
    np.testing.assert_allclose(mse(x, y).numpy(), [0.01, 0.0], atol=1e-7)
    p = psnr(x, y, data_range=1.0)
    assert math.isclose(float(p[0]), 20.0, abs_tol=1e-4) and math.isinf(float(p[1]))


def test_bad_input_and_lpips_refused():
    with pytest.raises(ValueError, match="same shape"):
        ssim(torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 9))
    with pytest.raises(ValueError, match="win_size"):
        ssim(torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8), win_size=4)
    with pytest.raises(TypeError, match="floating"):
        mse(torch.zeros(1, 1, 4, 4, dtype=torch.long), torch.zeros(1, 1, 4, 4, dtype=torch.long))
    with pytest.raises(FileNotFoundError, match="offline"):  # LPIPS needs local weight files (test_lpips.py)
        lpips(torch.zeros(1, 1, 32, 32), torch.zeros(1, 1, 32, 32), weights="/nonexistent/lpips")
