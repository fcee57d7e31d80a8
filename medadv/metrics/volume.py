"""Clinical endpoints of a segmentation: per-class volumes in millilitres, batched on the device.

A structure's volume is its voxel count times the voxel volume, ``prod(spacing)`` mm³, over 1000 (1 ml =
1000 mm³). For brain extraction (deepbet, Fisch et al., Computers in Biology and Medicine 2024) the brain
class's volume is the total intracranial volume (TIV), the clinical output of the model.

* :func:`voxel_volume_ml` — the voxel volume of each case, ``(N,)`` ml, from a spacing in mm (scalar, per
  axis, or one row per case as :func:`medadv.evaluation.evaluate` reads them from image headers);
* :func:`class_volumes` — hard volumes ``(N, C)`` ml of a label map (one scatter-add, no one-hot tensor);
* :func:`soft_volumes` — the differentiable volumes ``(N, C)`` ml of class probabilities (their sum over the
  voxels, times the voxel volume): the endpoint the ``volume`` attack loss moves;
* :func:`volume_change` — attacked minus clean, in ml and in % of the clean volume.

Everything stays on the tensors' device; the spacing table is built on the host once per batch (it comes
from the headers there) and copied to the device with the labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["voxel_volume_ml", "class_volumes", "soft_volumes", "volume_change", "MM3_PER_ML"]

#: cubic millimetres per millilitre
MM3_PER_ML = 1000.0


def voxel_volume_ml(spacing: float | Sequence[float] | Sequence[Sequence[float]] | Tensor, n: int, ndim: int = 3,
                    device: torch.device | str | None = None) -> Tensor:
    """The voxel volume of each of ``n`` cases, ``(n,)`` float64 ml: ``prod(spacing) / 1000``.

    Args:
        spacing: voxel size in mm: one number (isotropic), ``ndim`` numbers (one per spatial axis, every case),
            or ``n`` rows of ``ndim`` numbers (one row per case, e.g. read from NIfTI affines). Finite and > 0.
        n: the number of cases.
        ndim: spatial dimensions (3 for volumes).
        device: where the result lives (the labels' device).
    """
    from .surface import _spacing_table  # the one parser of a spacing argument (HD95 reads it the same way)

    table = _spacing_table(spacing, n, ndim)  # (n, ndim) float64, ValueError naming `spacing` when malformed
    return (table.prod(dim=1) / MM3_PER_ML).to(device if device is not None else "cpu")


def _check_map(labels: Tensor, name: str) -> None:
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.dtype == torch.bool:
        got = labels.dtype if isinstance(labels, Tensor) else type(labels).__name__
        raise TypeError(f"`{name}` must be an integer (N, D, H, W) label map, got {got}")
    if labels.ndim != 4:
        raise ValueError(f"`{name}` must be a 3-D label map (N, D, H, W) for volumes in ml, got shape "
                         f"{tuple(labels.shape)}")


def class_volumes(labels: Tensor, num_classes: int, spacing: Any, mask: Tensor | None = None) -> Tensor:
    """Per-case, per-class volume ``(N, C)`` float64 in ml of an integer label map ``(N, D, H, W)``.

    ``count(labels == c) × prod(spacing) / 1000`` per case, counted exactly in int64 (whole-body CT exceeds
    float32's 2**24) by one scatter-add on the labels' device. ``mask`` (bool, like ``labels``) counts only
    those voxels (a segmentation's ``ignore_index`` voxels are left out of a reference volume); labels outside
    ``[0, C)`` are refused.
    """
    _check_map(labels, "labels")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"`num_classes` must be an int >= 1, got {num_classes!r}")
    if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != labels.shape):
        raise ValueError(f"`mask` must be a bool tensor shaped like `labels` {tuple(labels.shape)}")
    valid = labels if mask is None else labels[mask]
    if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= num_classes):  # the one check (host sync)
        raise ValueError(f"`labels` must hold class indices in [0, {num_classes - 1}]")
    return _volumes(labels, num_classes, spacing, mask)


def _volumes(labels: Tensor, num_classes: int, spacing: Any, mask: Tensor | None = None) -> Tensor:
    """:func:`class_volumes` of a map already known to be in range (a task's prediction or validated labels):
    no host synchronisation, so evaluation computes every volume of a batch on the device."""
    n = labels.shape[0]
    flat = labels.reshape(n, -1).long()
    weight = torch.ones_like(flat) if mask is None else mask.reshape(n, -1).long()
    if mask is not None:
        flat = flat * weight  # masked voxels (possibly ignore_index): index 0, counted with weight 0
    counts = torch.zeros(n, num_classes, dtype=torch.int64, device=labels.device)
    counts.scatter_add_(1, flat, weight)
    return counts.double() * voxel_volume_ml(spacing, n, 3, labels.device).unsqueeze(1)


def soft_volumes(probs: Tensor, voxel_ml: float | Tensor) -> Tensor:
    """Differentiable per-class volume ``(N, C)`` ml of class probabilities ``(N, C, D, H, W)``.

    ``Σ_v p_c(v) × voxel volume``: the expected volume under the model's per-voxel class distribution. It
    equals :func:`class_volumes` of the arg-max map when the probabilities are one-hot, and its gradient
    reaches every voxel (the hard count has none), which is what an attack on the volume ascends.
    ``voxel_ml``: one voxel volume in ml, or ``(N,)`` per case.
    """
    if probs.ndim < 3:
        raise ValueError(f"`probs` must be (N, C, *spatial) class probabilities, got shape {tuple(probs.shape)}")
    per = probs.reshape(probs.shape[0], probs.shape[1], -1).sum(dim=2)
    if isinstance(voxel_ml, Tensor):
        return per * voxel_ml.to(per.device, per.dtype).reshape(-1, 1)
    return per * float(voxel_ml)


def volume_change(clean: Tensor, adv: Tensor) -> tuple[Tensor, Tensor]:
    """``(attacked − clean in ml, 100 × (attacked − clean) / clean in %)``, elementwise; the % is NaN where the
    clean volume is 0 (a structure the clean prediction does not contain has no relative change)."""
    if clean.shape != adv.shape:
        raise ValueError(f"`clean` {tuple(clean.shape)} and `adv` {tuple(adv.shape)} volumes must have one shape")
    diff = adv - clean
    pct = torch.where(clean > 0, 100.0 * diff / clean.clamp_min(torch.finfo(clean.dtype).tiny),
                      torch.full_like(diff, float("nan")))
    return diff, pct
