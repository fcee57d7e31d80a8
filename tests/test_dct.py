"""Block DCT: equals scipy's orthonormal DCT per block, inverts exactly, blocks in MONAI tile order."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft
import torch

from medadv.dct import block_dct, block_idct, dct, dct_matrix, from_blocks, idct, pad_to_multiple, to_blocks


@pytest.mark.parametrize("b", [4, 8, 32])
def test_dct_matrix_orthonormal(b):
    c = dct_matrix(b, dtype=torch.float64)
    assert torch.allclose(c @ c.T, torch.eye(b, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("block", [(8, 8, 8), (4, 8, 2), (32, 32, 32)])
def test_block_dct3d_matches_scipy_and_inverts(block):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 2, 32, 32, 32, generator=g)
    ref = scipy.fft.dctn(to_blocks(x, block).double().numpy(), type=2, norm="ortho", axes=(-3, -2, -1))
    np.testing.assert_allclose(block_dct(x.double(), block).numpy(), ref, atol=1e-10)
    c = block_dct(x, block)  # float32: what the attacks use
    np.testing.assert_allclose(c.double().numpy(), ref, atol=1e-5, rtol=1e-6)
    assert (block_idct(c, x.shape[2:]) - x).abs().max() < 1e-5


def test_block_dct2d_matches_scipy_and_pads_odd_sizes():
    x = torch.rand(3, 1, 19, 13, generator=torch.Generator().manual_seed(1))
    c = block_dct(x, (8, 8))
    assert c.shape == (3, 1, 3 * 2, 8, 8)  # padded to 24 x 16
    ref = scipy.fft.dctn(to_blocks(pad_to_multiple(x, (8, 8)), (8, 8)).double().numpy(), type=2, norm="ortho",
                         axes=(-2, -1))
    np.testing.assert_allclose(c.double().numpy(), ref, atol=1e-5)
    back = block_idct(c, x.shape[2:])
    assert back.shape == x.shape and (back - x).abs().max() < 1e-5


def test_block_order_is_monai_dense_patch_order():
    from monai.data.utils import dense_patch_slices

    x = torch.arange(16 * 8 * 24, dtype=torch.float32).reshape(1, 1, 16, 8, 24)
    blocks = to_blocks(x, (8, 8, 8))
    for i, sl in enumerate(dense_patch_slices((16, 8, 24), (8, 8, 8), (8, 8, 8))):
        assert torch.equal(blocks[0, 0, i], x[(0, 0, *sl)])
    assert torch.equal(from_blocks(blocks, (16, 8, 24)), x)


def test_whole_volume_dct_roundtrip_and_energy():
    x = torch.randn(1, 3, 12, 10, 6, dtype=torch.float64)
    f = dct(x)
    assert torch.allclose(f.pow(2).sum(), x.pow(2).sum())  # Parseval: orthonormal
    assert torch.allclose(idct(f), x, atol=1e-12)


def test_bad_input():
    with pytest.raises(TypeError, match="floating"):
        block_dct(torch.zeros(1, 1, 8, 8, dtype=torch.long), (8, 8))
    with pytest.raises(ValueError, match="3 spatial dims"):
        block_dct(torch.zeros(1, 1, 8, 8), (8, 8, 8))
    with pytest.raises(ValueError, match="multiple"):
        to_blocks(torch.zeros(1, 1, 9, 8), (8, 8))
