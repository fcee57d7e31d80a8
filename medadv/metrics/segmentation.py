"""Segmentation metrics per class: Dice and HD95 (2-D and 3-D), MONAI's definitions."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

__all__ = ["dice_per_class", "hd95_per_class"]


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
