"""Certified metrics at a list of L2 radii: the share of the metric that no perturbation of norm ≤ r can lower.

An element counts at radius ``r`` only where the smoothed model does not abstain, its certified radius is at
least ``r`` and its certified class is the label; abstentions count as errors (Cohen et al., ICML 2019, certified
accuracy; Fischer et al., ICML 2021, certified per-voxel accuracy and Dice of the abstaining segmenter). Note for
Dice: an abstained voxel is a false negative of its label's class and a false positive of no class, so certified
Dice bounds the Dice of the *abstaining* smoothed segmenter, as in SegCertify.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..params import InvalidParameterError, Options, Real
from .smoothing import CertifyResult

__all__ = ["certified_accuracy", "certified_dice"]

_REDUCTION = Options("mean", "none")


def _radii(radii: Sequence[float] | Tensor, owner: str, device: torch.device) -> Tensor:
    values = radii.tolist() if isinstance(radii, Tensor) else radii
    if isinstance(values, int | float) or not isinstance(values, Sequence) or len(values) == 0:
        raise InvalidParameterError(f"`radii` of {owner} must be a non-empty list of radii >= 0 (data units), "
                                    f"got {radii!r}")
    checked = [Real(low=0.0).check(r, "radii", owner) for r in values]
    return torch.tensor(checked, dtype=torch.float32, device=device)


def _check(result: object, y: object, owner: str) -> tuple[CertifyResult, Tensor]:
    if not isinstance(result, CertifyResult):
        raise TypeError(f"`result` of {owner} must be a CertifyResult (RandomizedSmoothing.certify), "
                        f"got {type(result).__name__}")
    if y is None:
        y = result.y
    if not isinstance(y, Tensor):
        raise TypeError(f"`y` of {owner} must be a label tensor (or given to certify), got {type(y).__name__}")
    if tuple(y.shape) != tuple(result.prediction.shape):
        raise ValueError(f"`y` of {owner} must have shape {tuple(result.prediction.shape)} (the task's labels), "
                         f"got {tuple(y.shape)}")
    return result, y.to(result.prediction.device)


def _reduce(per_sample: Tensor, reduction: str, owner: str) -> Tensor:
    if _REDUCTION.check(reduction, "reduction", owner) == "mean":
        return per_sample.mean(dim=0)
    return per_sample


def certified_accuracy(result: CertifyResult, y: Tensor | None, radii: Sequence[float] | Tensor, *,
                       reduction: str = "mean") -> Tensor:
    """Certified accuracy at each radius (float32; ``(R,)`` averaged over samples, or ``(N, R)`` with
    ``reduction="none"``).

    Multi-class: certified and right with radius ≥ r (Cohen et al.). Multi-label: certified exact match — every
    label certified with radius ≥ r and right. Segmentation: the share of valid voxels (``ignore_index`` excluded)
    certified with radius ≥ r and right (pixel accuracy, abstentions as errors). ``y=None`` uses the labels
    given to ``certify``.
    """
    owner = "certified_accuracy"
    result, y = _check(result, y, owner)
    r = _radii(radii, owner, y.device)
    task = result.task
    right = ~result.abstain & (result.prediction == y.long())
    n = right.shape[0]
    flat_right = right.reshape(n, 1, -1)
    ok = flat_right & (result.radius.reshape(n, 1, -1) >= r.view(1, -1, 1))  # (N, R, E)
    if result.family == "multiclass":
        per = ok[..., 0].float()
    elif result.family == "multilabel":
        per = ok.all(dim=2).float()
    else:
        mask = task.valid_mask(y)
        if mask is None:
            per = ok.float().mean(dim=2)
        else:
            m = mask.reshape(n, 1, -1).float()
            per = (ok.float() * m).sum(dim=2) / m.sum(dim=2).clamp_min(1.0)
    return _reduce(per, reduction, owner)


def certified_dice(result: CertifyResult, y: Tensor | None, radii: Sequence[float] | Tensor, *,
                   reduction: str = "mean") -> Tensor:
    """Certified mean Dice of a segmentation at each radius (float32; ``(R,)`` or ``(N, R)``).

    At radius ``r`` every voxel not certified with radius ≥ r is an abstention (an error: a false negative of its
    label's class). Dice per class over valid voxels, averaged as the task's ``mean_dice`` (classes present in the
    label or the certified map; background only with ``include_background``; 1 when no counted class is present).
    """
    owner = "certified_dice"
    result, y = _check(result, y, owner)
    if result.family != "segmentation" or not result.task.traits.metrics.class_dice:
        raise ValueError(f"`result` of {owner} must come from a Segmentation task (a kind scored by per-class "
                         f"Dice), got a {result.family} result (use certified_accuracy)")
    r = _radii(radii, owner, y.device)
    task: Any = result.task  # declares class_dice: num_classes, safe_labels, include_background (MetricTraits)
    c = task.num_classes
    n = y.shape[0]
    labels = task.safe_labels(y).reshape(n, 1, -1)
    mask = task.valid_mask(y)
    weight = (torch.ones_like(labels) if mask is None else mask.reshape(n, 1, -1).long()).expand(n, len(r), -1)
    cert = ~result.abstain.reshape(n, 1, -1) & (result.radius.reshape(n, 1, -1) >= r.view(1, -1, 1))
    pred = torch.where(cert, result.prediction.reshape(n, 1, -1), torch.full_like(cert, c, dtype=torch.int64))
    key = labels * (c + 1) + pred  # (N, R, V); the extra column c is "abstained"
    conf = torch.zeros(n, len(r), c * (c + 1), dtype=torch.int64, device=y.device)
    conf = conf.scatter_add_(2, key, weight).reshape(n, len(r), c, c + 1)
    inter = conf.diagonal(dim1=2, dim2=3).float()  # (N, R, C)
    in_label = conf.sum(dim=3).float()
    in_pred = conf[..., :c].sum(dim=2).float()
    total = in_label + in_pred
    dice = torch.where(total > 0, 2.0 * inter / total.clamp_min(1.0), torch.ones_like(total))
    present = total > 0
    if not task.include_background:
        dice, present = dice[..., 1:], present[..., 1:]
    count = present.sum(dim=2)
    mean = torch.where(count > 0, (dice * present).sum(dim=2) / count.clamp_min(1), torch.ones_like(dice[..., 0]))
    return _reduce(mean, reduction, owner)
