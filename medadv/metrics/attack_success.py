"""Attack success rates for segmentation (Malik et al., BMVC 2024, Eq. 1–2) and per-class Dice / HD95.

The paper writes ASR as a mean of per-case absolute differences,

    ASR-D = (1/|D|) Σ |DSC(F(x), y) − DSC(F(x'), y)|,   ASR-H = (1/|D|) Σ |HD95(F(x'), y) − HD95(F(x), y)|,

but every number in its tables is the *signed difference of dataset means* (mean clean DSC − mean
adversarial DSC; mean adversarial HD95 − mean clean HD95; negative values occur). medadv implements
both: ``mode="mean_diff"`` (default, reproduces the tables) and ``mode="per_case_abs"`` (Eq. 1–2 as
printed). Always report the raw clean and adversarial scores next to an ASR.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .segmentation import dice_per_class, hd95_per_class

if TYPE_CHECKING:  # type-only: medadv.metrics sits below medadv.tasks (tests/test_layout.py)
    from ..tasks import Task

__all__ = ["attack_success_rate", "segmentation_asr"]


def attack_success_rate(clean: Tensor, adversarial: Tensor, *, higher_is_better: bool = True,
                        mode: str = "mean_diff") -> Tensor:
    """ASR from per-case scores ``(N,)`` (NaN cases are skipped), as a 0-d tensor in the scores' units.

    Args:
        clean, adversarial: per-case scores on clean and attacked inputs (e.g. Dice in %, HD95 in mm).
        higher_is_better: True for Dice (ASR = clean − adv), False for distances like HD95 (adv − clean).
        mode: ``"mean_diff"`` — signed difference of means (Malik et al.'s tables; default) — or
            ``"per_case_abs"`` — mean of per-case absolute differences (their Eq. 1–2).
    """
    if not isinstance(clean, Tensor) or not isinstance(adversarial, Tensor):
        raise TypeError("`clean` and `adversarial` must be tensors of per-case scores")
    if clean.shape != adversarial.shape:
        raise ValueError(f"`clean` and `adversarial` must have the same shape, got {tuple(clean.shape)} and "
                         f"{tuple(adversarial.shape)}")
    c, a = clean.double(), adversarial.double()
    if mode == "mean_diff":
        diff = c.nanmean() - a.nanmean()
    elif mode == "per_case_abs":
        ok = ~(c.isnan() | a.isnan())
        diff = (c[ok] - a[ok]).abs().mean()
        return diff
    else:
        raise ValueError(f"`mode` must be 'mean_diff' or 'per_case_abs', got {mode!r}")
    return diff if higher_is_better else -diff


def _hd95_filled(pred: Tensor, y: Tensor, num_classes: int, spacing: float | Sequence[float] | None) -> Tensor:
    """HD95 ``(N, C)``; a class in the label but missing from the prediction gets the volume diagonal.

    Without the fill such a case is NaN and silently drops out of the mean, which would make an attack
    that erases an organ look harmless in ASR-H (spec 003, ambiguity 4).
    """
    with warnings.catch_warnings():
        # MONAI warns that an empty class gives inf/nan: handled just below
        warnings.filterwarnings("ignore", message=".*is all 0, this may result in nan/inf distance")
        warnings.filterwarnings("ignore", message=".*always_return_as_numpy", category=FutureWarning)
        hd = hd95_per_class(pred, y, num_classes, spacing)
    ndim = y.ndim - 1
    sp = [1.0] * ndim if spacing is None else (
        [float(spacing)] * ndim if isinstance(spacing, (int, float)) else [float(s) for s in spacing])
    diag = float(torch.tensor([(s - 1) * d for s, d in zip(y.shape[1:], sp, strict=True)]).norm())
    classes = torch.arange(num_classes, device=y.device).reshape(1, -1, *([1] * ndim))
    gt = (y.unsqueeze(1) == classes).flatten(2).any(dim=2)
    pr = (pred.unsqueeze(1) == classes).flatten(2).any(dim=2)
    hd = hd.to(gt.device)
    return torch.where(gt & ~pr, torch.full_like(hd, diag), hd)


def segmentation_asr(task: Task, logits_clean: Tensor, logits_adv: Tensor, y: Tensor, *,
                     spacing: float | Sequence[float] | None = None, mode: str = "mean_diff",
                     include_background: bool | None = None, percent: bool = True) -> dict[str, Tensor]:
    """Per-case Dice and HD95 on clean and attacked predictions, and ASR-D / ASR-H.

    Per case, scores are the nanmean over the classes present in the label (background per
    ``include_background``, default the task's setting; Malik et al. include it). Dice is in percent when ``percent`` (as in the paper).
    Returns ``dice_clean``, ``dice_adv``, ``hd95_clean``, ``hd95_adv`` ``(N,)`` and ``asr_d``, ``asr_h``.
    """
    traits = getattr(task, "traits", None)
    if traits is None or not traits.metrics.class_dice:  # the kind declares per-class Dice on label maps
        raise TypeError(f"`task` must be a Segmentation task (a kind scored by per-class Dice on label maps), "
                        f"got {task!r}")
    seg: Any = task  # num_classes, safe_labels, include_background: what `class_dice` kinds have
    k = seg.num_classes
    valid = seg.valid_mask(y)
    # ignored voxels (ignore_index) become an extra class k in both maps, then that column is dropped
    kk = k if valid is None else k + 1
    y = seg.safe_labels(y) if valid is None else torch.where(valid, seg.safe_labels(y), torch.full_like(y, k).long())
    classes = torch.arange(k, device=y.device).reshape(1, -1, *([1] * (y.ndim - 1)))
    # Malik et al. use MONAI DiceMetric's default: classes absent from the label are skipped (NaN)
    gt_present = (y.unsqueeze(1) == classes).flatten(2).any(dim=2)
    inc = seg.include_background if include_background is None else bool(include_background)
    first = 0 if inc else 1
    out: dict[str, Tensor] = {}
    for tag, z in (("clean", logits_clean), ("adv", logits_adv)):
        pred = seg.predict(z)
        if valid is not None:
            pred = torch.where(valid, pred, torch.full_like(pred, k))
        d = dice_per_class(pred, y, kk)[:, :k]
        d = torch.where(gt_present, d.to(gt_present.device), torch.full_like(d, float("nan")))[:, first:].nanmean(dim=1)
        out[f"dice_{tag}"] = d * 100 if percent else d
        out[f"hd95_{tag}"] = _hd95_filled(pred, y, kk, spacing)[:, first:k].nanmean(dim=1)
    out["asr_d"] = attack_success_rate(out["dice_clean"], out["dice_adv"], mode=mode)
    out["asr_h"] = attack_success_rate(out["hd95_clean"], out["hd95_adv"], higher_is_better=False, mode=mode)
    return out
