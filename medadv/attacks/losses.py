"""Per-element weightings and divergences of the attack objectives, shared by the attacks that use them.

Every function works on a task's element grid (samples for multi-class, labels for multi-label, voxels for
segmentation), so PGD-style attacks (CosPGD, SegPGD) and APGD's losses read the same definitions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tasks import Segmentation, Task

__all__ = ["cosine_weights", "segpgd_weights", "balanced_weights", "js_divergence"]


def cosine_weights(task: Task, logits: Tensor, y: Tensor, targeted: bool = False) -> Tensor:
    """CosPGD's weight (Agnihotri et al., ICML 2024): ``cos(softmax(z), onehot(y))`` per element, detached.

    Untargeted: elements still predicted confidently as their label weigh most and fooled ones fade out;
    targeted: ``1 − cos`` (elements still far from the target weigh most).
    """
    cos = task.target_cosine(logits.detach(), y)
    return 1.0 - cos if targeted else cos


def segpgd_weights(task: Task, logits: Tensor, y: Tensor, step: int, steps: int, targeted: bool = False) -> Tensor:
    """SegPGD's weight (Gu et al., ECCV 2022): ``1 − λ`` on correct elements, ``λ`` on wrong ones, detached.

    ``λ = (t − 1) / (2T)`` with ``t = step + 1`` (``step`` is 0-based): early steps push the still-correct
    elements over the boundary, later ones also keep the fooled ones fooled. Targeted: the two swap.
    """
    lam = step / (2.0 * steps)
    correct = task.element_correct(logits.detach(), y).to(logits.dtype)
    if targeted:  # "correct" = already at the target: de-emphasise those first
        return lam * correct + (1.0 - lam) * (1.0 - correct)
    return (1.0 - lam) * correct + lam * (1.0 - correct)


def balanced_weights(task: Segmentation, y: Tensor) -> Tensor:
    """Class-balanced voxel weights: every class present in a sample's label map counts the same.

    ``w_v = n_valid / (K · n_c(v))`` with ``n_c`` the valid voxels of the voxel's class in that sample and
    ``K`` the number of classes present, so :meth:`Task.reduce` of ``w · ℓ`` is the mean over present
    classes of each class's mean loss (the balanced CE of Croce, Singh, Hein, ECCV 2024). A small organ
    weighs as much as the background instead of vanishing in the voxel average.
    """
    labels = task.safe_labels(y).reshape(y.shape[0], -1)
    mask = task.valid_mask(y)
    valid = torch.ones_like(labels, dtype=torch.float32) if mask is None else \
        mask.reshape(labels.shape).to(torch.float32)
    counts = torch.zeros(y.shape[0], task.num_classes, device=y.device, dtype=torch.float32)
    counts.scatter_add_(1, labels, valid)
    present = (counts > 0).sum(dim=1, keepdim=True).clamp_min(1).to(torch.float32)
    n_valid = valid.sum(dim=1, keepdim=True)
    per_voxel = counts.gather(1, labels).clamp_min(1.0)
    return (n_valid / (present * per_voxel)).reshape(y.shape)


def js_divergence(task: Task, logits: Tensor, y: Tensor) -> Tensor:
    """Jensen–Shannon divergence between the predicted and the label distribution, per element.

    ``JS(p, t) = ½ KL(p ‖ m) + ½ KL(t ‖ m)``, ``m = (p + t) / 2``, over the class axis of
    :meth:`Task.distributions` (softmax for multi-class and segmentation, the Bernoulli pair per label for
    multi-label). Bounded by ``log 2``, so confidently wrong elements cannot dominate the sum as they do
    under cross-entropy (Croce, Singh, Hein, ECCV 2024); ``0 · log 0 = 0``.

    Value and gradient are finite even where a probability underflows to exactly 0 (saturated softmax, e.g.
    a model fed HU-range CT): ``torch.xlogy(p, p)`` is 0 there but its backward is ``p / p = 0 / 0 = NaN``,
    which made APGD's ``js`` loss (and ``auto``'s ``apgd-js`` member) return NaN inputs. Each term is
    written ``q · (log max(q, tiny) − log max(m, tiny))`` instead: the same value for ``q ≥ tiny``, 0 at
    ``q = 0``, and a finite derivative everywhere.
    """
    p, t = task.distributions(logits, y)
    m = 0.5 * (p + t)
    tiny = torch.finfo(p.dtype).tiny
    log_m = m.clamp_min(tiny).log()  # m > 0 wherever p or t is; the clamp only guards m = 0 (then p = t = 0)
    kl_p = p * (p.clamp_min(tiny).log() - log_m)
    kl_t = t * (t.clamp_min(tiny).log() - log_m)
    return 0.5 * (kl_p + kl_t).sum(dim=1)
