"""Orthonormal block DCT-II / IDCT for 2-D and 3-D batches, as matrix products.

Shared by VAFA (per-block quantisation), VAFT (frequency consistency of logits) and the frequency
analysis of perturbations. Blocks are formed by ``view``/``permute`` (no Python loop over blocks) and
the transform along each block axis is one batched matmul with a precomputed orthonormal basis

    C_n[k, i] = sqrt(2 / n) * λ_k * cos(π (2i + 1) k / (2n)),   λ_0 = 1/√2, λ_k = 1 otherwise,

so ``C_n @ C_n.T = I`` and the inverse is the transpose. Per block this equals
``scipy.fft.dctn(block, type=2, norm="ortho")``. Block order is C-order over the block grid, the order
of MONAI ``dense_patch_slices`` for non-overlapping tiles.

Shapes: an input ``(N, C, *spatial)`` with ``k`` spatial dims and a block ``(b_1..b_k)`` gives blocks
``(N, C, n_blocks, b_1..b_k)``. Spatial sizes that are not block multiples are padded (edge replicate)
by :func:`pad_to_multiple` and cropped back by :func:`crop`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "dct_matrix",
    "normalize_block",
    "pad_to_multiple",
    "crop",
    "to_blocks",
    "from_blocks",
    "dct_blocks",
    "idct_blocks",
    "block_dct",
    "block_idct",
    "dct",
    "idct",
]


@lru_cache(maxsize=64)
def _dct_matrix_cpu64(n: int) -> Tensor:
    k = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    c = math.sqrt(2.0 / n) * torch.cos(math.pi * (2 * i + 1) * k / (2 * n))
    c[0] /= math.sqrt(2.0)
    return c


@lru_cache(maxsize=64)
def _dct_matrix_on(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    # cached per device: attack loops reuse it every step without a host-to-device copy
    return _dct_matrix_cpu64(n).to(dtype=dtype, device=device)


def dct_matrix(n: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> Tensor:
    """The ``(n, n)`` orthonormal DCT-II matrix (rows are frequencies); its transpose is the inverse.

    The returned tensor is cached and shared: do not modify it in place.
    """
    if int(n) < 1:
        raise ValueError(f"`n` must be >= 1, got {n}")
    return _dct_matrix_on(int(n), dtype, torch.device(device if device is not None else "cpu"))


def normalize_block(block: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    """A block size as a tuple of ``ndim`` positive ints (an int means a cube)."""
    if isinstance(block, int):
        block = (block,) * ndim
    block = tuple(int(b) for b in block)
    if len(block) != ndim:
        raise ValueError(f"`block` must have {ndim} sizes for {ndim} spatial dims, got {block}")
    if any(b < 1 for b in block):
        raise ValueError(f"`block` sizes must be >= 1, got {block}")
    return block


def _check(x: Tensor, ndim: int) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"`x` must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"`x` must be a floating-point tensor, got dtype {x.dtype}")
    if ndim not in (1, 2, 3) or x.ndim != ndim + 2:
        raise ValueError(f"`x` must be (N, C, *spatial) with {ndim} spatial dims, got shape {tuple(x.shape)}")


def pad_to_multiple(x: Tensor, block: Sequence[int]) -> Tensor:
    """Pad the trailing ``len(block)`` dims at their end (edge replicate) to multiples of ``block``.

    Replicate padding keeps the padded blocks free of artificial edges, so no spurious high-frequency
    content appears in the coefficients of border blocks.
    """
    k = len(block)
    spatial = x.shape[-k:]
    pads: list[int] = []
    for s, b in zip(reversed(spatial), reversed(block), strict=True):
        pads += [0, (-s) % b]
    if not any(pads):
        return x
    return F.pad(x, pads, mode="replicate")


def crop(x: Tensor, spatial: Sequence[int]) -> Tensor:
    """Crop the trailing dims of ``x`` back to ``spatial`` (undoes :func:`pad_to_multiple`)."""
    idx = (Ellipsis,) + tuple(slice(0, int(s)) for s in spatial)
    return x[idx]


def to_blocks(x: Tensor, block: Sequence[int]) -> Tensor:
    """``(N, C, *spatial)`` with spatial sizes divisible by ``block`` -> ``(N, C, n_blocks, *block)``."""
    k = len(block)
    lead, spatial = x.shape[:-k], x.shape[-k:]
    if any(s % b for s, b in zip(spatial, block, strict=True)):
        raise ValueError(f"spatial shape {tuple(spatial)} is not a multiple of block {tuple(block)}; pad first")
    grid = [s // b for s, b in zip(spatial, block, strict=True)]
    shape = list(lead)
    for g, b in zip(grid, block, strict=True):
        shape += [g, b]
    m = len(lead)
    perm = list(range(m)) + [m + 2 * i for i in range(k)] + [m + 2 * i + 1 for i in range(k)]
    return x.reshape(shape).permute(perm).reshape(*lead, math.prod(grid), *block)


def from_blocks(blocks: Tensor, spatial: Sequence[int]) -> Tensor:
    """Inverse of :func:`to_blocks`: ``(N, C, n_blocks, *block)`` -> ``(N, C, *spatial)``."""
    k = len(spatial)
    block = blocks.shape[-k:]
    lead = blocks.shape[:-k - 1]
    grid = [int(s) // b for s, b in zip(spatial, block, strict=True)]
    if math.prod(grid) != blocks.shape[-k - 1] or any(int(s) % b for s, b in zip(spatial, block, strict=True)):
        raise ValueError(f"{blocks.shape[-k - 1]} blocks of {tuple(block)} do not tile spatial shape {tuple(spatial)}")
    m = len(lead)
    t = blocks.reshape(*lead, *grid, *block)
    perm = list(range(m))
    for i in range(k):
        perm += [m + i, m + k + i]
    return t.permute(perm).reshape(*lead, *spatial)


def _apply(t: Tensor, ndim: int, inverse: bool) -> Tensor:
    """Separable transform over the last ``ndim`` dims: one matmul per axis, no permutes.

    Axis j of a block ``(b_1..b_k)`` is transformed by viewing the block as ``(pre, b_j, post)`` and
    left-multiplying by C (broadcast over the leading dims); the last axis is a right-multiply by Cᵀ.
    """
    if not t.is_floating_point():
        raise TypeError(f"DCT input must be floating point, got {t.dtype}")
    block = t.shape[-ndim:]
    lead = t.shape[:-ndim]
    for j, n in enumerate(block):
        c = dct_matrix(n, dtype=t.dtype, device=t.device)
        if inverse:
            c = c.T
        if j == ndim - 1:
            t = t @ c.T
        else:
            pre = math.prod(block[:j])
            post = math.prod(block[j + 1:])
            t = (c @ t.reshape(*lead, pre, n, post)).reshape(*lead, *block)
    return t


def dct_blocks(blocks: Tensor, ndim: int) -> Tensor:
    """Orthonormal DCT-II over the last ``ndim`` dims of ``blocks`` (any leading dims)."""
    return _apply(blocks, ndim, inverse=False)


def idct_blocks(coeffs: Tensor, ndim: int) -> Tensor:
    """Inverse of :func:`dct_blocks` (orthonormal DCT-III)."""
    return _apply(coeffs, ndim, inverse=True)


def block_dct(x: Tensor, block: int | Sequence[int]) -> Tensor:
    """Block DCT of ``x`` ``(N, C, *spatial)``, padded to a block multiple: ``(N, C, n_blocks, *block)``.

    The spatial rank is ``len(block)`` when ``block`` is a sequence, else ``x.ndim - 2``.
    """
    ndim = len(block) if not isinstance(block, int) else x.ndim - 2
    _check(x, ndim)
    b = normalize_block(block, ndim)
    return dct_blocks(to_blocks(pad_to_multiple(x, b), b), ndim)


def block_idct(coeffs: Tensor, spatial: Sequence[int]) -> Tensor:
    """Inverse of :func:`block_dct`: coefficients ``(N, C, n_blocks, *block)`` -> ``(N, C, *spatial)``."""
    k = len(spatial)
    block = tuple(coeffs.shape[-k:])
    padded = [math.ceil(int(s) / b) * b for s, b in zip(spatial, block, strict=True)]
    return crop(from_blocks(idct_blocks(coeffs, k), padded), spatial)


def dct(x: Tensor, ndim: int | None = None) -> Tensor:
    """Orthonormal DCT-II of each ``(N, C)`` item over its whole spatial extent (one block)."""
    ndim = x.ndim - 2 if ndim is None else int(ndim)
    _check(x, ndim)
    return dct_blocks(x, ndim)


def idct(coeffs: Tensor, ndim: int | None = None) -> Tensor:
    """Inverse of :func:`dct`."""
    ndim = coeffs.ndim - 2 if ndim is None else int(ndim)
    _check(coeffs, ndim)
    return idct_blocks(coeffs, ndim)
