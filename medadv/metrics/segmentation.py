"""Segmentation metrics per class: Dice and HD95 (2-D and 3-D), MONAI's definitions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["dice_per_class", "hd95_per_class", "confusion_counts", "dice_from_confusion"]


def _check(pred: Tensor, y: Tensor, num_classes: int) -> None:
    if pred.shape != y.shape:
        raise ValueError(f"`pred` {tuple(pred.shape)} and `y` {tuple(y.shape)} must both be (N, *spatial) label maps")
    if pred.ndim not in (3, 4):
        raise ValueError(f"label maps must be (N, H, W) or (N, D, H, W), got {tuple(pred.shape)}")
    if num_classes < 2:
        raise ValueError(f"`num_classes` must be >= 2, got {num_classes}")


def dice_per_class(pred: Tensor, y: Tensor, num_classes: int) -> Tensor:
    """Dice ``(N, C)`` of label maps; 1 where a class is absent from both prediction and label.

    The same values as MONAI's ``compute_dice(include_background=True, ignore_empty=False)``, computed by
    :meth:`medadv.tasks.Segmentation.dice` (one confusion count, no one-hot tensors).
    """
    _check(pred, y, num_classes)
    return dice_from_confusion(confusion_counts(pred, y.long(), num_classes))


def confusion_counts(pred: Tensor, y: Tensor, num_classes: int, mask: Tensor | None = None) -> Tensor:
    """Per-sample confusion counts ``(N, C, C)`` of label maps: ``[n, i, j]`` = voxels labelled i, predicted j.

    ``y``: int64 labels in ``[0, C)``; ``mask`` (bool, like ``y``): only these voxels count. One scatter-add over
    the voxels, no one-hot tensors and no host sync: it runs inside attack loops (restart scoring, the active set,
    :meth:`medadv.tasks.Segmentation.confusion`) and on every result.
    """
    c = num_classes
    key = (y * c + pred.long()).reshape(y.shape[0], -1)
    # integer counts stay exact beyond 2**24 voxels (whole-body CT), where float32 would round
    weight = torch.ones_like(key) if mask is None else mask.reshape(key.shape).long()
    counts = torch.zeros(y.shape[0], c * c, dtype=torch.int64, device=key.device)
    return counts.scatter_add_(1, key, weight).reshape(-1, c, c)


def dice_from_confusion(conf: Tensor) -> Tensor:
    """Hard Dice ``(N, C)`` from confusion counts ``(N, C, C)`` (:func:`confusion_counts`); 1 where a class is
    absent from both label and prediction."""
    inter = conf.diagonal(dim1=1, dim2=2).float()
    total = (conf.sum(dim=2) + conf.sum(dim=1)).float()
    return torch.where(total > 0, 2.0 * inter / total.clamp_min(1.0), torch.ones_like(total))


def hd95_per_class(pred: Tensor, y: Tensor, num_classes: int,
                   spacing: float | Sequence[float] | Sequence[Sequence[float]] | None = None,
                   mask: Tensor | None = None) -> Tensor:
    """95th-percentile Hausdorff distance ``(N, C)`` in the units of ``spacing`` (voxels if None).

    ``spacing``: a scalar, one value per spatial axis, or one per-axis sequence per sample. NaN where the
    class is absent from the label or the prediction (HD undefined; MONAI returns inf/nan there). ``mask``
    (bool, like ``y``) restricts both maps to valid voxels (ignore_index). The values of MONAI's
    ``compute_hausdorff_distance(include_background=True, percentile=95)``, computed batched on the tensors'
    device by :func:`medadv.metrics.surface.surface_distance_per_class` (a KD-tree on CPU tensors).
    """
    _check(pred, y, num_classes)
    from .surface import surface_distance_per_class

    return surface_distance_per_class(pred, y, num_classes, spacing, mask, metric="hd", percentile=95.0)
