"""Segmentation metrics per class through MONAI: Dice and HD95 (2-D and 3-D)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["dice_per_class", "hd95_per_class"]


def _one_hot(labels: Tensor, num_classes: int) -> Tensor:
    from monai.networks.utils import one_hot

    return one_hot(labels.long().unsqueeze(1), num_classes)


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
    from ..tasks import Segmentation

    return Segmentation(num_classes).dice(pred, y)


def hd95_per_class(pred: Tensor, y: Tensor, num_classes: int, spacing: float | Sequence[float] | None = None,
                   mask: Tensor | None = None) -> Tensor:
    """95th-percentile Hausdorff distance ``(N, C)`` in the units of ``spacing`` (voxels if None).

    NaN where the class is absent from the label or the prediction (HD undefined; MONAI returns
    inf/nan there). ``mask`` (bool, like ``y``) restricts both maps to valid voxels (ignore_index).
    """
    _check(pred, y, num_classes)
    from monai.metrics import compute_hausdorff_distance

    if mask is not None:
        # ignored voxels may hold any label value (255, -1): zero them out of both one-hot maps
        pred, y = torch.where(mask, pred, 0), torch.where(mask, y, 0)
    oh_pred, oh_y = _one_hot(pred, num_classes).float(), _one_hot(y, num_classes).float()
    if mask is not None:
        m = mask.unsqueeze(1).float()
        oh_pred, oh_y = oh_pred * m, oh_y * m
    hd = compute_hausdorff_distance(oh_pred, oh_y, include_background=True, percentile=95, spacing=spacing)
    return torch.where(torch.isfinite(hd), hd, torch.full_like(hd, float("nan")))
