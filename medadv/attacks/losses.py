"""Per-element weightings and divergences of the attack objectives, shared by the attacks that use them.

Every function works on a task's element grid (samples for multi-class, labels for multi-label, voxels for
segmentation), so PGD-style attacks (CosPGD, SegPGD) and APGD's losses read the same definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..params import Constraint, Int, InvalidParameterError, Optional, Options, Real
from ..tasks import Task

__all__ = ["cosine_weights", "segpgd_weights", "balanced_weights", "js_divergence", "VOLUME_GOALS", "VOLUME_PARAMS",
           "VolumeObjective"]


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


def balanced_weights(task: Task, y: Tensor) -> Tensor:
    """Class-balanced voxel weights: every class present in a sample's label map counts the same.

    ``w_v = n_valid / (K · n_c(v))`` with ``n_c`` the valid voxels of the voxel's class in that sample and
    ``K`` the number of classes present, so :meth:`Task.reduce` of ``w · ℓ`` is the mean over present
    classes of each class's mean loss (the balanced CE of Croce, Singh, Hein, ECCV 2024). A small organ
    weighs as much as the background instead of vanishing in the voxel average. ``task`` is a kind declaring
    per-class Dice on label maps (``task.traits.metrics.class_dice``: segmentation).
    """
    if not task.traits.metrics.class_dice:
        raise TypeError(f"`task` of balanced_weights must score label maps class by class "
                        f"(traits.metrics.class_dice, e.g. segmentation), got {task!r}")
    seg: Any = task  # declares class_dice: num_classes and safe_labels (MetricTraits)
    labels = seg.safe_labels(y).reshape(y.shape[0], -1)
    mask = seg.valid_mask(y)
    valid = torch.ones_like(labels, dtype=torch.float32) if mask is None else \
        mask.reshape(labels.shape).to(torch.float32)
    counts = torch.zeros(y.shape[0], seg.num_classes, device=y.device, dtype=torch.float32)
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


#: what the ``volume`` loss does with the soft class volume (see :class:`VolumeObjective`)
VOLUME_GOALS = ("shrink", "grow", "target")

#: the declared parameters of an attack with a ``volume`` loss (APGD, PGD); see :class:`VolumeObjective`
VOLUME_PARAMS: dict[str, Constraint] = {
    "volume_class": Int(low=0),
    "volume_goal": Optional(Options(*VOLUME_GOALS)),
    "volume_target": Optional(Real(low=0.0)),
    "volume_fraction": Optional(Real(low=0.0)),
    "voxel_volume_ml": Real(low=0.0, low_open=True),
}


class VolumeObjective:
    """The ``volume`` attack loss: move a segmentation's soft class volume, the clinical endpoint (ml).

    ``V = Σ_v p_c(v) × voxel volume`` (:meth:`Segmentation.soft_volume`: the class probability summed over the
    voxels, differentiable where the arg-max count is not), per sample. The objective ascended is ``−V``
    (``goal="shrink"``), ``+V`` (``"grow"``) or ``−|V − T|`` (``"target"``: reach ``T`` ml, or ``T = fraction ×``
    the clean soft volume of the class). For brain extraction (deepbet) class 1's volume is the total
    intracranial volume.

    The voxel volume is a parameter (``voxel_volume_ml``, default 0.001 ml = 1 mm³): the attack sees tensors, not
    image headers. It scales the objective only, so the sign steps of L∞ attacks and the L2-normalised steps are
    the same for any value; it matters for a target given in ml.

    Args:
        task: the attacked task; it must declare ``soft_volume(logits, voxel_ml)`` (segmentation does).
        owner: the attack's name, for messages.
        volume_class: the class whose volume moves (>= 1 usually; 0 is the background).
        volume_goal: ``"shrink"``, ``"grow"`` or ``"target"``; ``None``: ``"target"`` when a target is given,
            else ``"shrink"``.
        volume_target: the target volume in ml (``goal="target"``).
        volume_fraction: the target as a fraction of the clean soft volume (``goal="target"``; 0.8 = 20 % smaller).
        voxel_volume_ml: one voxel's volume in ml (``prod(spacing_mm) / 1000``).
        targeted: must be False (the goal is the direction).
    """

    def __init__(self, task: Task, owner: str, *, volume_class: int, volume_goal: str | None,
                 volume_target: float | None,
                 volume_fraction: float | None, voxel_volume_ml: float, targeted: bool) -> None:
        if not callable(getattr(task, "soft_volume", None)):
            raise TypeError(f"`loss='volume'` of {owner} moves a segmentation's class volume "
                            f"(the task's `soft_volume`); {task!r} has none: use loss='ce'")
        if targeted:
            raise TypeError(f"`loss='volume'` of {owner} is untargeted (its `volume_goal` is the direction); use "
                            "volume_goal='target' with `volume_target` (ml) or `volume_fraction` to reach a volume")
        classes = getattr(task, "num_classes", None)
        if isinstance(classes, int) and volume_class >= classes:
            raise InvalidParameterError(f"`volume_class` of {owner} must be a class of {task!r} "
                                        f"(0..{classes - 1}), got {volume_class}")
        given = (volume_target is not None) + (volume_fraction is not None)
        if volume_goal is None:  # a target given is the goal; else the clinically feared direction, a smaller organ
            volume_goal = "target" if given else "shrink"
        if volume_goal == "target" and given != 1:
            raise InvalidParameterError(f"`volume_goal='target'` of {owner} needs exactly one of `volume_target` "
                                        "(ml) and `volume_fraction` (of the clean volume)")
        if volume_goal != "target" and given:
            raise InvalidParameterError(f"`volume_target` / `volume_fraction` of {owner} apply to "
                                        f"volume_goal='target', not {volume_goal!r}")
        self.task, self.cls, self.goal = task, int(volume_class), volume_goal
        self.target, self.fraction, self.voxel_ml = volume_target, volume_fraction, float(voxel_volume_ml)

    @staticmethod
    def check_unused(owner: str, loss: str, volume_target: float | None, volume_fraction: float | None) -> None:
        """Refuse a volume target given to an attack whose loss is not ``volume`` (it would be silently ignored)."""
        if loss != "volume" and (volume_target is not None or volume_fraction is not None):
            raise InvalidParameterError(f"`volume_target` / `volume_fraction` of {owner} apply to loss='volume', "
                                        f"not loss={loss!r}")

    def volume(self, logits: Tensor) -> Tensor:
        """``(n,)`` soft volume of the class in ml."""
        return self.task.soft_volume(logits, self.voxel_ml)[:, self.cls]  # type: ignore[attr-defined]

    def setup(self, forward: Callable[[Tensor], Tensor], state: dict[str, Any], x: Tensor,
              clean_logits: Tensor | None) -> None:
        """Per-sample target volume ``state["volume_target"]`` (ml) for ``goal="target"``: the target in ml, or the
        fraction of the clean soft volume (one clean forward when the caller gave no clean output). The target is
        on the soft (expected) volume, the quantity the loss moves; the arg-max volume lands near it, off by the
        probability mass of the uncertain voxels (the soft volume of a confident model is its arg-max volume)."""
        if self.goal != "target":
            return
        if self.fraction is None:
            assert self.target is not None
            state["volume_target"] = torch.full((x.shape[0],), float(self.target), device=x.device, dtype=x.dtype)
            return
        with torch.no_grad():
            logits = forward(x) if clean_logits is None else clean_logits
            state["volume_target"] = (self.volume(logits) * self.fraction).to(x.dtype).detach()

    def __call__(self, logits: Tensor, state: dict[str, Any]) -> Tensor:
        """The per-sample objective ``(n,)`` to ascend."""
        v = self.volume(logits)
        if self.goal == "shrink":
            return -v
        if self.goal == "grow":
            return v
        return -(v - state["volume_target"].to(v.dtype)).abs()
