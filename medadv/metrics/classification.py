"""Classification metrics for single- and multi-label models (Xu et al., MedIA 2021, §5)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["accuracy", "roc_auc", "macro_auc", "multiclass_auc", "fooling_rate", "flip_probability"]


def accuracy(pred: Tensor, y: Tensor) -> Tensor:
    """Fraction of correct predictions; for multi-label ``(N, L)`` the mean per-label (Hamming) accuracy."""
    if pred.shape != y.shape:
        raise ValueError(f"`pred` {tuple(pred.shape)} and `y` {tuple(y.shape)} must have the same shape")
    return (pred == y.to(pred.dtype)).float().mean()


def roc_auc(scores: Tensor, labels: Tensor) -> Tensor:
    """ROC AUC per column (Mann–Whitney U with tied scores averaged).

    Args:
        scores: ``(N,)`` or ``(N, L)`` real-valued scores (logits or probabilities).
        labels: same shape, binary {0, 1}.

    Returns:
        ``()`` or ``(L,)`` AUC; NaN for a column whose labels are all 0 or all 1 (AUC undefined).
    """
    if scores.shape != labels.shape:
        raise ValueError(f"`scores` {tuple(scores.shape)} and `labels` {tuple(labels.shape)} must have the same shape")
    squeeze = scores.ndim == 1
    s = scores.reshape(scores.shape[0], -1).double()
    t = labels.reshape(labels.shape[0], -1).double()
    if not ((t == 0) | (t == 1)).all():
        raise ValueError("`labels` must be binary (0 or 1)")
    n = s.shape[0]
    out = []
    for j in range(s.shape[1]):
        col = s[:, j]
        sorted_s, order = col.sort()
        ranks = torch.empty(n, dtype=torch.float64, device=col.device)
        ranks[order] = torch.arange(1, n + 1, dtype=torch.float64, device=col.device)
        # average ranks over ties
        uniq, inverse, counts = torch.unique(sorted_s, return_inverse=True, return_counts=True)
        first = torch.cumsum(counts, 0) - counts + 1
        avg = first + (counts - 1) / 2.0
        ranks[order] = avg[inverse].double()
        pos = t[:, j] == 1
        n_pos, n_neg = int(pos.sum()), int((~pos).sum())
        if n_pos == 0 or n_neg == 0:
            out.append(torch.tensor(float("nan"), dtype=torch.float64))
            continue
        u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0
        out.append((u / (n_pos * n_neg)).cpu())
    res = torch.stack(out).float()
    return res[0] if squeeze else res


def macro_auc(scores: Tensor, labels: Tensor) -> Tensor:
    """Mean of the per-label AUCs over labels where the AUC is defined."""
    return roc_auc(scores, labels).nanmean()


def multiclass_auc(scores: Tensor, labels: Tensor) -> Tensor:
    """Macro one-vs-rest ROC AUC of a multi-class classifier (Xu et al., MedIA 2021, §5.1; spec 000, A9).

    Class ``k``'s AUC ranks every sample by ``scores[:, k]`` against "label is ``k``"; the macro AUC is their
    unweighted mean. Computed by MONAI's ``compute_roc_auc(average="none")`` on the one-hot labels (the values of
    scikit-learn's ``roc_auc_score(labels, scores, multi_class="ovr", average="macro")``).

    Absent classes: a class that no sample has (or that every sample has) has no defined OvR AUC; it is left
    out of the mean (scikit-learn raises instead). NaN when no class is defined (fewer than two classes present).

    Args:
        scores: ``(N, K)`` class scores (softmax probabilities; any monotone score per class works).
        labels: ``(N,)`` integer class indices in ``[0, K)``.

    Returns:
        ``()`` float64 tensor on the CPU.
    """
    import warnings

    from monai.metrics import compute_roc_auc

    if scores.ndim != 2:
        raise ValueError(f"`scores` must be (N, K) class scores, got shape {tuple(scores.shape)}")
    if labels.ndim != 1 or labels.shape[0] != scores.shape[0]:
        raise ValueError(f"`labels` must be ({scores.shape[0]},) class indices, got shape {tuple(labels.shape)}")
    if labels.is_floating_point() and not bool((labels == labels.round()).all()):
        raise ValueError("`labels` must hold integer class indices")
    k = scores.shape[1]
    idx = labels.long().cpu()
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= k):
        raise ValueError(f"`labels` has class indices out of range [0, {k - 1}]")
    onehot = torch.nn.functional.one_hot(idx, k).double()
    with warnings.catch_warnings():  # MONAI warns for each class without positives or negatives: NaN, skipped
        warnings.filterwarnings("ignore", message="y values can not be all")
        per_class = compute_roc_auc(scores.detach().double().cpu(), onehot, average="none")
    return torch.tensor(per_class, dtype=torch.float64).nanmean()


def fooling_rate(clean_pred: Tensor, adv_pred: Tensor, y: Tensor | None = None, denominator: str = "all") -> Tensor:
    """Fraction of predictions that change under attack (Xu et al., footnote 2).

    For multi-label ``(N, L)`` predictions this is the mean per-label flip rate (FR_ML). With
    ``denominator="correct"`` only samples (labels) that were correct on the clean input count.
    """
    if clean_pred.shape != adv_pred.shape:
        raise ValueError(f"`clean_pred` {tuple(clean_pred.shape)} and `adv_pred` {tuple(adv_pred.shape)} differ in shape")
    if denominator not in ("all", "correct"):
        raise ValueError(f"`denominator` must be 'all' or 'correct', got {denominator!r}")
    changed = (clean_pred != adv_pred).float()
    if denominator == "all":
        return changed.mean()
    if y is None:
        raise ValueError("`y` is required when denominator='correct'")
    correct = (clean_pred == y.to(clean_pred.dtype)).float()
    return (changed * correct).sum() / correct.sum().clamp_min(1.0)


def flip_probability(preds: Tensor, reference: str = "previous") -> Tensor:
    """Flip probability FP over perturbation sequences (Xu et al., Eq. 5).

    Args:
        preds: ``(n_frames, N)`` class predictions or ``(n_frames, N, L)`` multi-label predictions;
            frame 0 is the clean input.
        reference: ``"previous"`` compares frame j with j-1 (Eq. 5); ``"first"`` with frame 0
            (ImageNet-P convention for noise sequences).
    """
    if preds.ndim < 2 or preds.shape[0] < 2:
        raise ValueError(f"`preds` must be (n_frames >= 2, N, ...), got shape {tuple(preds.shape)}")
    if reference not in ("previous", "first"):
        raise ValueError(f"`reference` must be 'previous' or 'first', got {reference!r}")
    ref = preds[:-1] if reference == "previous" else preds[:1].expand_as(preds[1:])
    return (preds[1:] != ref).float().mean()
