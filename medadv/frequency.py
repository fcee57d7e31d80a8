"""Where an attack's damage lives in frequency: DCT-domain filtering of a perturbation (Malik et al. 2024).

The perturbation ``δ = x_adv − x`` is transformed with an orthonormal DCT (over the whole volume, or
per tile of ``tile`` voxels as in the reference code, which uses 96³ tiles), multiplied by a binary
mask ``M`` of kept coefficients and inverted: ``x_freq = clip(x + IDCT(DCT(δ) ⊙ M))``. Evaluating the
model on ``x_freq`` for low-, band- and high-pass masks shows how much of the attack's effect each
band carries (Malik et al. find VAFA's damage is mostly low-frequency).

Mask semantics follow the reference code: ``keep_cube(lo, hi)`` keeps coefficients whose indices are
all in ``[lo, hi)`` along every axis. So Malik's "high (16–96)" on a 96³ tile is the cube
``[16, 96)³`` (80³ coefficients), *not* the complement of the low-pass ``[0, 16)³``; the true
complement is :func:`highpass_mask`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .dct import block_dct, block_idct, normalize_block
from .runtime import attack_mode
from .tasks import Task
from .threats import Bounds, Box

__all__ = ["keep_cube", "lowpass_mask", "highpass_mask", "filter_perturbation", "filtered_attack",
           "frequency_analysis"]


def _shape(shape: int | Sequence[int], ndim: int | None = None) -> tuple[int, ...]:
    if isinstance(shape, int):
        if ndim is None:
            raise ValueError("an int `shape` needs `ndim`")
        return (int(shape),) * ndim
    return tuple(int(s) for s in shape)


def keep_cube(shape: int | Sequence[int], lo: int, hi: int | None = None, ndim: int | None = None) -> Tensor:
    """Bool mask over a coefficient grid keeping indices in ``[lo, hi)`` along every axis.

    Args:
        shape: coefficient grid (the tile or volume size), e.g. ``(96, 96, 96)``.
        lo, hi: index range in coefficients; ``hi=None`` means to the end of each axis.
    """
    shp = _shape(shape, ndim)
    if lo < 0 or (hi is not None and hi <= lo):
        raise ValueError(f"need 0 <= lo < hi, got lo={lo}, hi={hi}")
    m = torch.ones(shp, dtype=torch.bool)
    for a, s in enumerate(shp):
        idx = torch.arange(s)
        keep = (idx >= lo) & (idx < (s if hi is None else hi))
        m = m & keep.reshape([-1 if i == a else 1 for i in range(len(shp))])
    return m


def lowpass_mask(shape: int | Sequence[int], n: int, ndim: int | None = None) -> Tensor:
    """Malik's "low (0–n)": the ``[0, n)`` cube at the DC corner."""
    return keep_cube(shape, 0, n, ndim)


def highpass_mask(shape: int | Sequence[int], n: int, ndim: int | None = None) -> Tensor:
    """The exact complement of :func:`lowpass_mask` (every coefficient with some index ``>= n``)."""
    return ~lowpass_mask(shape, n, ndim)


def filter_perturbation(delta: Tensor, mask: Tensor, tile: int | Sequence[int] | None = None) -> Tensor:
    """Keep only the DCT coefficients of ``delta`` selected by ``mask``.

    Args:
        delta: ``(N, C, *spatial)`` perturbation (2-D or 3-D), data units.
        mask: bool coefficient mask with the tile's shape (the spatial shape when ``tile`` is None).
        tile: DCT tile size (Malik: 96); ``None`` = one DCT over the whole spatial extent. Volumes are
            padded to a tile multiple (edge replicate) and cropped back.
    """
    if not isinstance(delta, Tensor) or not delta.is_floating_point():
        raise TypeError("`delta` must be a floating-point tensor (N, C, *spatial)")
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError("`mask` must be a bool tensor over the DCT coefficient grid")
    ndim = delta.ndim - 2
    spatial = tuple(delta.shape[2:])
    block = spatial if tile is None else normalize_block(tile, ndim)
    if tuple(mask.shape) != tuple(block):
        raise ValueError(f"`mask` must have the tile shape {tuple(block)}, got {tuple(mask.shape)}")
    coeffs = block_dct(delta, block)
    return block_idct(coeffs * mask.to(device=delta.device, dtype=delta.dtype), spatial)


def filtered_attack(x: Tensor, x_adv: Tensor, mask: Tensor, bounds: Box | Bounds | None,
                    tile: int | Sequence[int] | None = None) -> Tensor:
    """``clip(x + IDCT(DCT(x_adv − x) ⊙ mask))``: the attack restricted to a frequency band.

    ``bounds`` is the data box: a :class:`~medadv.threats.Box` or a ``(lo, hi)`` pair in data units
    (scalars or per-channel tensors); ``None``: no clipping.
    """
    if x.shape != x_adv.shape:
        raise ValueError(f"`x` and `x_adv` must have the same shape, got {tuple(x.shape)} and {tuple(x_adv.shape)}")
    out = x + filter_perturbation(x_adv - x, mask, tile)
    return Box.coerce(bounds).clip(out)


def frequency_analysis(
    model: nn.Module,
    task: Task,
    x: Tensor,
    x_adv: Tensor,
    y: Tensor,
    masks: Mapping[str, Tensor],
    *,
    bounds: Box | Bounds | None,
    tile: int | Sequence[int] | None = None,
) -> dict[str, Tensor]:
    """Mean Dice per sample ``(N,)`` on clean, full-attack and each band-filtered attack input.

    Returns ``{"clean": ..., "adversarial": ..., <band>: ...}`` plus ``"<band>_retained"``: the share of
    the attack's Dice drop the band keeps (``(clean − band) / (clean − adversarial)``, NaN where the
    attack did not lower Dice). ``bounds`` is the data box (a :class:`~medadv.threats.Box`, a ``(lo, hi)``
    pair in data units, or ``None``: no clipping) for the filtered inputs. ``model`` may be a whole-volume wrapper
    (:class:`medadv.models.sliding.SlidingWindow`), as in Malik et al.'s evaluation.
    """
    # the kind declares per-class Dice on label maps (what mean_dice needs), not a class test: a new kind that
    # declares it is analysed too
    if not isinstance(task, Task) or not task.traits.metrics.class_dice:
        raise TypeError(f"`task` must be a Segmentation task, got {task!r}")
    seg: Any = task  # declares class_dice: mean_dice over label maps (MetricTraits)

    def dice(inp: Tensor) -> Tensor:
        with attack_mode(model), torch.no_grad():  # eval mode, restored afterwards
            return seg.mean_dice(seg.predict(model(inp)), y)

    out = {"clean": dice(x), "adversarial": dice(x_adv)}
    drop = out["clean"] - out["adversarial"]
    for name, m in masks.items():
        out[name] = dice(filtered_attack(x, x_adv, m, bounds, tile))
        retained = (out["clean"] - out[name]) / drop
        out[f"{name}_retained"] = torch.where(drop > 0, retained, torch.full_like(retained, float("nan")))
    return out
