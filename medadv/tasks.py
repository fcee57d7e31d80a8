"""Tasks: what a model's output means.

A :class:`Task` turns logits and labels into the quantities every attack, defense and metric needs:
an *unreduced per-element loss* (per sample for multi-class, per label for multi-label, per voxel for
segmentation), predictions, a per-sample "fooled" test and clean metrics. Attacks never special-case a
task: CosPGD and SegPGD are weightings of :meth:`Task.element_loss`, so one loop attacks a 14-label
chest X-ray classifier (per label) and a 3-D organ segmenter (per voxel).

Shapes (``E`` is the task's element grid):

=============  ====================  ====================  ======================
task           logits                ``y``                 element grid ``E``
=============  ====================  ====================  ======================
MultiClass     ``(N, K)``            ``(N,)`` int64        ``(N,)``
MultiLabel     ``(N, L)``            ``(N, L)`` float 0/1  ``(N, L)``
Segmentation   ``(N, C, *spatial)``  ``(N, *spatial)`` int  ``(N, *spatial)``
=============  ====================  ====================  ======================
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from .runtime import all_finite

__all__ = ["Task", "Outcome", "MultiClass", "MultiLabel", "Segmentation", "task_family"]


def _check_finite(name: str, t: Tensor) -> None:
    if not all_finite(t):
        raise ValueError(f"`{name}` contains NaN or Inf values")


@dataclass(frozen=True)
class Outcome:
    """What an evaluation reads from one model output, computed once, batched, on the output's device.

    Attributes:
        pred: the hard prediction (:meth:`Task.predict`), shaped like ``y``.
        wrong: ``(N,)`` bool, the task's untargeted "fooled" test against ``y`` (the prediction is wrong).
        columns: per-sample metric tensors with leading dim N (``(N,)`` or ``(N, K)``); result rows store them
            as ``clean_<key>`` / ``adv_<key>``. Bool tensors become ``True``/``False``, integer tensors ints,
            floating tensors floats (NaN as ``None``).
    """

    pred: Tensor
    wrong: Tensor
    columns: dict[str, Tensor] = field(default_factory=dict)


def _argmax1(logits: Tensor) -> Tensor:
    """Arg-max over the class axis (first maximum on ties, like ``argmax``).

    ``max(dim=1).indices`` is the same index but 5-9x faster than ``argmax(dim=1)`` on CPU for
    ``(N, C, *spatial)`` logits (7 ms vs 1 ms at 2x3x32^3); SegPGD calls it every step.
    """
    return logits.max(dim=1).indices


def _onehot_cosine(p: Tensor, y: Tensor) -> Tensor:
    """``cos(p, onehot(y)) = p_y / ||p||`` over the class axis (dim 1); ``||p|| > 0`` for a softmax."""
    return p.gather(1, y.unsqueeze(1)).squeeze(1) * (p * p).sum(dim=1).rsqrt()


class Task(ABC):
    """Base class of all tasks. Subclasses define the element grid and its loss."""

    #: number of leading dims of the element grid that are not spatial (for reductions)
    name: str = "task"

    # --- validation -------------------------------------------------------------------------------
    @abstractmethod
    def validate_logits(self, logits: Tensor) -> None:
        """Raise ``ValueError`` if ``logits`` cannot be the output of a model for this task."""

    @abstractmethod
    def validate_labels(self, logits: Tensor, y: Tensor, name: str = "y") -> None:
        """Raise ``ValueError``/``TypeError`` if ``y`` does not fit ``logits`` for this task."""

    def validate(self, logits: Tensor, y: Tensor | None, name: str = "y") -> None:
        if not isinstance(logits, Tensor):
            raise TypeError(f"model output must be a Tensor of logits, got {type(logits).__name__} "
                            "(wrap models that return tuples or dicts so that forward returns the logits)")
        self.validate_logits(logits)
        if y is not None:
            if not isinstance(y, Tensor):
                raise TypeError(f"`{name}` must be a torch.Tensor, got {type(y).__name__}")
            self.validate_labels(logits, y, name)

    # --- core quantities ----------------------------------------------------------------------------
    @abstractmethod
    def element_loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """Unreduced loss on the element grid (no weighting, no ignore mask applied)."""

    @abstractmethod
    def predict(self, logits: Tensor) -> Tensor:
        """Hard prediction with the dtype and shape of ``y``."""

    @abstractmethod
    def distributions(self, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Predicted and target distributions, class axis at dim 1, for per-element similarity.

        Multi-label labels are treated as independent Bernoulli variables, so both tensors are
        ``(N, 2, L)`` (``[p, 1 - p]`` against ``[y, 1 - y]``).
        """

    def log_probs(self, logits: Tensor) -> Tensor:
        """Log of the predicted distribution, class axis at dim 1 (``(N, 2, L)`` Bernoulli pairs for multi-label)."""
        return logits.log_softmax(dim=1)

    def least_likely(self, logits: Tensor) -> Tensor:
        """The labels farthest from the prediction, shaped like ``y`` (GAP's untargeted objective)."""
        return logits.argmin(dim=1)

    def target_cosine(self, logits: Tensor, y: Tensor) -> Tensor:
        """Per-element cosine similarity of the predicted and target distributions (the CosPGD weight).

        Element grid shaped; equals ``F.cosine_similarity(*self.distributions(logits, y), dim=1)``.
        Subclasses compute it in closed form: with a one-hot target it is ``p_y / ||p||``, which avoids
        a norm over the class axis (a slow strided reduction on CPU for ``(N, C, *spatial)`` tensors).
        """
        p, t = self.distributions(logits, y)
        return F.cosine_similarity(p, t, dim=1, eps=1e-12)

    @abstractmethod
    def element_correct(self, logits: Tensor, y: Tensor) -> Tensor:
        """Boolean element grid: prediction equals the label."""

    @abstractmethod
    def fooled(self, logits: Tensor, y: Tensor, targeted: bool = False) -> Tensor:
        """``(N,)`` bool: untargeted — the prediction left ``y``; targeted — it reached ``y``."""

    @abstractmethod
    def metrics(self, logits: Tensor, y: Tensor) -> dict[str, Tensor]:
        """Per-sample clean metrics, each a tensor with leading dim N."""

    def valid_mask(self, y: Tensor) -> Tensor | None:
        """Element mask of labels that count (``None``: all count)."""
        return None

    #: the lowest value :meth:`robust_metric` can take (a sample there cannot be made worse)
    metric_floor: float = 0.0
    #: the name of :meth:`robust_metric` in results tables
    robust_metric_name: str = "metric"

    def robust_metric(self, logits: Tensor, y: Tensor) -> Tensor:
        """``(N,)`` float: the per-sample metric a worst-case robustness evaluation minimises (``auto``).

        Multi-class: correct (1) or not (0); multi-label: exact match (1 when every label is right);
        segmentation: mean Dice. At :attr:`metric_floor` a sample cannot be made worse.
        """
        raise NotImplementedError(f"{type(self).__name__} defines no robust metric (implement `robust_metric`)")

    # --- evaluation columns: batched on the device, one host copy per batch (medadv.evaluation) ----------------------
    def decide(self, logits: Tensor, y: Tensor, targeted: bool = False) -> tuple[Tensor, Tensor]:
        """``(prediction, fooled)`` of one output: :meth:`predict` and :meth:`fooled` (the built-in tasks derive the
        test from the one prediction; attacks return both, so an evaluation does not predict again)."""
        return self.predict(logits), self.fooled(logits, y, targeted)

    def outcome(self, logits: Tensor, y: Tensor, pred: Tensor | None = None) -> Outcome:
        """The prediction, the "wrong" test and the per-sample metric columns of one output (:class:`Outcome`).

        ``pred``: :meth:`predict` of ``logits`` when the caller has it already (an attack's result carries it).
        The default reads :meth:`predict`, :meth:`fooled` and :meth:`metrics`; the built-in tasks compute all three
        from one prediction. Everything stays on the device of ``logits``.
        """
        pred = self.predict(logits) if pred is None else pred
        return Outcome(pred, self.fooled(logits, y), dict(self.metrics(logits, y)))

    def sample_columns(self, y: Tensor, clean: Outcome, adv: Outcome) -> dict[str, Tensor]:
        """The per-sample columns of result rows for one attacked batch, in row order, as device tensors.

        ``changed``: the adversarial prediction differs from the clean one; ``flipped``: right before the attack and
        wrong after (untargeted test against ``y``); then ``clean_<k>``/``adv_<k>`` for every metric column ``k``.
        Tasks add their own columns (the label, the share of labels or voxels that changed) by overriding this.
        """
        return {"changed": self.changed(clean.pred, adv.pred, y), **self._paired_columns(clean, adv)}

    def changed(self, clean_pred: Tensor, adv_pred: Tensor, y: Tensor) -> Tensor:
        """``(N,)`` bool: the adversarial prediction differs from the clean one (default: in any element)."""
        n = clean_pred.shape[0]
        return (clean_pred != adv_pred).reshape(n, -1).any(dim=1)

    @staticmethod
    def _paired_columns(clean: Outcome, adv: Outcome) -> dict[str, Tensor]:
        """``flipped`` and the ``clean_<k>``/``adv_<k>`` pairs of every metric column."""
        cols = {"flipped": ~clean.wrong & adv.wrong}
        for k, v in clean.columns.items():
            cols[f"clean_{k}"] = v
            cols[f"adv_{k}"] = adv.columns[k]
        return cols

    def loss(self, logits: Tensor, y: Tensor, weight: Tensor | None = None) -> Tensor:
        """Per-sample loss ``(N,)``: element loss, optionally weighted, averaged over valid elements."""
        return self.reduce(self.element_loss(logits, y), y, weight)

    def reduce(self, element: Tensor, y: Tensor, weight: Tensor | None = None) -> Tensor:
        """Average an element-grid tensor to ``(N,)``, honouring weights and ignored labels."""
        if weight is not None:
            element = element * weight
        mask = self.valid_mask(y)
        flat = element.reshape(element.shape[0], -1)
        if mask is None:
            return flat.mean(dim=1)
        m = mask.reshape(mask.shape[0], -1).to(flat.dtype)
        return (flat * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)

    def to_target(self, y: Tensor, logits: Tensor) -> Tensor:
        """Labels in the dtype the loss expects (used for clean predictions as labels)."""
        return y

    def element_margin(self, logits: Tensor, y: Tensor) -> Tensor:
        """Per-element logit margin on the element grid: the label's logit minus the best other logit.

        Positive where the element is predicted as its label, negative where it is not, in logit units
        (the margin/DLR family of attack objectives: Carlini & Wagner 2017; Croce & Hein 2020). Ignored
        labels are not masked here; :meth:`margin` masks them through :meth:`reduce`.
        """
        raise NotImplementedError(f"{type(self).__name__} defines no logit margin (implement `element_margin`)")

    def margin(self, logits: Tensor, y: Tensor, weight: Tensor | None = None) -> Tensor:
        """Per-sample margin ``(N,)``: :meth:`element_margin` averaged by :meth:`reduce` (valid elements only,
        optionally weighted). Untargeted attacks descend it, targeted attacks ascend it towards the target."""
        return self.reduce(self.element_margin(logits, y), y, weight)


def _class_margin(logits: Tensor, y: Tensor) -> Tensor:
    """``z_y − max_{j≠y} z_j`` over the class axis (dim 1), element-grid shaped; ``y`` int64, element-grid shaped."""
    idx = y.unsqueeze(1)
    own = logits.gather(1, idx).squeeze(1)
    # the label's own logit masked out; max(dim).values, not amax: one index gets the gradient on ties
    others = logits.scatter(1, idx, float("-inf")).max(dim=1).values
    return own - others


class MultiClass(Task):
    """Single-label classification with softmax cross-entropy.

    Labels are class indices ``(N,)``; ``fooled`` means the arg-max left the label (untargeted) or
    reached the target class (targeted).
    """

    name = "multiclass"

    def validate_logits(self, logits: Tensor) -> None:
        if logits.ndim != 2 or logits.shape[1] < 2:
            raise ValueError(
                f"model output must be (N, K) logits with K >= 2 for MultiClass, got shape {tuple(logits.shape)}"
            )
        _check_finite("model output", logits)

    def validate_labels(self, logits: Tensor, y: Tensor, name: str = "y") -> None:
        if y.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise TypeError(f"`{name}` must hold integer class indices for MultiClass, got dtype {y.dtype}")
        if tuple(y.shape) != (logits.shape[0],):
            raise ValueError(f"`{name}` must have shape ({logits.shape[0]},) for MultiClass, got {tuple(y.shape)}")
        k = logits.shape[1]
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= k):
            raise ValueError(f"`{name}` has labels out of range [0, {k - 1}]")

    def element_loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits, y.long(), reduction="none")

    def element_margin(self, logits: Tensor, y: Tensor) -> Tensor:
        """``z_y − max_{j≠y} z_j`` per sample ``(N,)`` (positive: classified as ``y``)."""
        return _class_margin(logits, y.long())

    def dlr(self, logits: Tensor, y: Tensor) -> Tensor:
        """Difference of logits ratio (Croce & Hein, ICML 2020), per sample ``(N,)``, sign as :meth:`margin`.

        ``(z_y − max_{j≠y} z_j) / (z_π1 − z_π3 + 1e-12)`` with ``z_π1 ≥ z_π2 ≥ z_π3`` the sorted logits: the
        margin made invariant to shifting and rescaling the logits. AutoAttack's DLR loss is its negative.
        Needs K >= 3 classes.
        """
        if logits.shape[1] < 3:
            raise ValueError(f"the DLR loss needs at least 3 classes (z_π3), got {logits.shape[1]}; use the margin")
        srt = logits.sort(dim=1).values
        return self.element_margin(logits, y) / (srt[:, -1] - srt[:, -3] + 1e-12)

    def predict(self, logits: Tensor) -> Tensor:
        return _argmax1(logits)

    def distributions(self, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        p = logits.softmax(dim=1)
        return p, F.one_hot(y.long(), logits.shape[1]).to(p.dtype)

    def target_cosine(self, logits: Tensor, y: Tensor) -> Tensor:
        return _onehot_cosine(logits.softmax(dim=1), y.long())

    def element_correct(self, logits: Tensor, y: Tensor) -> Tensor:
        return self.predict(logits) == y

    def fooled(self, logits: Tensor, y: Tensor, targeted: bool = False) -> Tensor:
        return self.decide(logits, y, targeted)[1]

    def decide(self, logits: Tensor, y: Tensor, targeted: bool = False) -> tuple[Tensor, Tensor]:
        pred = self.predict(logits)
        hit = pred == y
        return pred, (hit if targeted else ~hit)

    def metrics(self, logits: Tensor, y: Tensor) -> dict[str, Tensor]:
        return {"correct": (self.predict(logits) == y).float()}

    def outcome(self, logits: Tensor, y: Tensor, pred: Tensor | None = None) -> Outcome:
        pred = self.predict(logits) if pred is None else pred
        correct = pred == y
        return Outcome(pred, ~correct, {"pred": pred, "correct": correct})

    def sample_columns(self, y: Tensor, clean: Outcome, adv: Outcome) -> dict[str, Tensor]:
        return {"label": y, **super().sample_columns(y, clean, adv)}

    robust_metric_name = "accuracy"

    def robust_metric(self, logits: Tensor, y: Tensor) -> Tensor:
        return (self.predict(logits) == y).to(torch.float32)

    def __repr__(self) -> str:
        return "MultiClass()"


class MultiLabel(Task):
    """Multi-label classification with independent sigmoid outputs and per-label BCE.

    Args:
        threshold: probability above which a label is predicted present (0 < threshold < 1).

    Labels are multi-hot floats ``(N, L)`` in {0, 1}. Untargeted ``fooled``: any label flipped;
    targeted: every label equals the target vector.
    """

    name = "multilabel"

    def __init__(self, threshold: float = 0.5) -> None:
        if not 0.0 < float(threshold) < 1.0:
            raise ValueError(f"`threshold` must be in (0, 1), got {threshold}")
        self.threshold = float(threshold)
        self._logit_threshold = float(torch.logit(torch.tensor(self.threshold, dtype=torch.float64)))

    def validate_logits(self, logits: Tensor) -> None:
        if logits.ndim != 2:
            raise ValueError(f"model output must be (N, L) logits for MultiLabel, got shape {tuple(logits.shape)}")
        _check_finite("model output", logits)

    def validate_labels(self, logits: Tensor, y: Tensor, name: str = "y") -> None:
        if tuple(y.shape) != tuple(logits.shape):
            raise ValueError(
                f"`{name}` must be multi-hot with shape {tuple(logits.shape)} for MultiLabel, got {tuple(y.shape)}"
            )
        if y.is_floating_point():
            _check_finite(name, y)
        if y.dtype == torch.bool:
            return
        if y.numel() and not ((y == 0) | (y == 1)).all():
            raise ValueError(f"`{name}` must contain only 0 and 1 for MultiLabel")

    def element_loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype), reduction="none")

    def element_margin(self, logits: Tensor, y: Tensor) -> Tensor:
        """Per label ``(N, L)``: ``(2y − 1)·(z − logit(threshold))``.

        Each label is the Bernoulli pair with logits ``[z, 0]`` (:meth:`log_probs`), so the pair's margin is
        ``(2y − 1)·z``; it is measured from the decision threshold so that it is positive exactly where the
        label is predicted correctly (the same as ``(2y − 1)·z`` at the default threshold 0.5).
        """
        return (2.0 * y.to(logits.dtype) - 1.0) * (logits - self._logit_threshold)

    def predict(self, logits: Tensor) -> Tensor:
        return (logits > self._logit_threshold).to(logits.dtype)

    def distributions(self, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        p = logits.sigmoid()
        t = y.to(p.dtype)
        return torch.stack((p, 1 - p), dim=1), torch.stack((t, 1 - t), dim=1)

    def log_probs(self, logits: Tensor) -> Tensor:
        return torch.stack((F.logsigmoid(logits), F.logsigmoid(-logits)), dim=1)

    def least_likely(self, logits: Tensor) -> Tensor:
        return 1.0 - self.predict(logits)  # every label flipped

    def target_cosine(self, logits: Tensor, y: Tensor) -> Tensor:
        p, t = logits.sigmoid(), y.to(logits.dtype)
        q, u = 1 - p, 1 - t
        return (p * t + q * u) * ((p * p + q * q) * (t * t + u * u)).rsqrt()

    def element_correct(self, logits: Tensor, y: Tensor) -> Tensor:
        return self.predict(logits) == y.to(logits.dtype)

    def fooled(self, logits: Tensor, y: Tensor, targeted: bool = False) -> Tensor:
        return self.decide(logits, y, targeted)[1]

    def decide(self, logits: Tensor, y: Tensor, targeted: bool = False) -> tuple[Tensor, Tensor]:
        pred = self.predict(logits)
        same = (pred == y.to(pred.dtype)).all(dim=1)
        return pred, (same if targeted else ~same)

    def metrics(self, logits: Tensor, y: Tensor) -> dict[str, Tensor]:
        correct = self.element_correct(logits, y).float()
        return {"label_accuracy": correct.mean(dim=1), "exact_match": correct.min(dim=1).values}

    def outcome(self, logits: Tensor, y: Tensor, pred: Tensor | None = None) -> Outcome:
        pred = self.predict(logits) if pred is None else pred
        correct = pred == y.to(pred.dtype)
        exact = correct.all(dim=1)
        return Outcome(pred, ~exact, {"pred": pred, "scores": logits.sigmoid(),
                                      "label_accuracy": correct.float().mean(dim=1), "exact_match": exact})

    def sample_columns(self, y: Tensor, clean: Outcome, adv: Outcome) -> dict[str, Tensor]:
        flip_rate = (clean.pred != adv.pred).float().mean(dim=1)
        return {"label": y, **super().sample_columns(y, clean, adv), "flip_rate": flip_rate}

    robust_metric_name = "exact_match"

    def robust_metric(self, logits: Tensor, y: Tensor) -> Tensor:
        return self.element_correct(logits, y).all(dim=1).to(torch.float32)

    def to_target(self, y: Tensor, logits: Tensor) -> Tensor:
        return y.to(logits.dtype)

    def make_target(
        self,
        reference: Tensor,
        present: Sequence[int | str] = (),
        absent: Sequence[int | str] = (),
        label_names: Sequence[str] | None = None,
    ) -> Tensor:
        """Target vectors for a targeted attack: some labels forced on or off, the rest kept.

        ``task.make_target(task.predict(model(x)), present=["Hernia", "Mass"], label_names=NAMES)``
        asks the attack to make Hernia and Mass present while every other label keeps its clean
        prediction.

        Args:
            reference: ``(N, L)`` 0/1 labels to start from (usually the clean prediction).
            present: labels (indices, or names when ``label_names`` is given) set to 1.
            absent: labels set to 0.
            label_names: the L label names, to allow names in ``present``/``absent``.

        Returns:
            a new float ``(N, L)`` tensor; ``reference`` is not modified.
        """
        if not isinstance(reference, Tensor) or reference.ndim != 2:
            got = tuple(reference.shape) if isinstance(reference, Tensor) else type(reference).__name__
            raise ValueError(f"`reference` must be an (N, L) tensor of 0/1 labels, got {got}")
        num = reference.shape[1]
        if label_names is not None and len(label_names) != num:
            raise ValueError(f"`label_names` has {len(label_names)} names for {num} labels")

        def index(v: int | str, arg: str) -> int:
            if isinstance(v, str):
                if label_names is None or v not in label_names:
                    raise ValueError(f"`{arg}` names unknown label {v!r} (pass `label_names` to use names)")
                return list(label_names).index(v)
            if not 0 <= int(v) < num:
                raise ValueError(f"`{arg}` has label index {v} out of range [0, {num - 1}]")
            return int(v)

        on = [index(v, "present") for v in present]
        off = [index(v, "absent") for v in absent]
        if set(on) & set(off):
            raise ValueError(f"labels {sorted(set(on) & set(off))} are both `present` and `absent`")
        target = reference.detach().to(torch.float32 if not reference.is_floating_point() else reference.dtype)
        target = target.clone()
        target[:, on] = 1.0
        target[:, off] = 0.0
        return target

    def __repr__(self) -> str:
        return f"MultiLabel(threshold={self.threshold})"


class Segmentation(Task):
    """Dense segmentation, 2-D ``(N, C, H, W)`` or 3-D ``(N, C, D, H, W)`` logits.

    Args:
        num_classes: number of output channels C (background included), ``>= 2``.
        include_background: whether class 0 counts in Dice-based losses, metrics and ``fooled``.
        ignore_index: label value excluded from losses and metrics (e.g. 255), or ``None``.
        loss: ``"ce"`` (per-voxel cross-entropy), ``"dice"`` or ``"dicece"`` (MONAI soft Dice, plus CE).
        dice_threshold: untargeted ``fooled`` — mean Dice of the prediction against ``y`` below this.
        target_fraction: targeted ``fooled`` — at least this fraction of valid voxels at the target.
        squared_pred: square the probabilities and targets in the Dice denominator (MONAI's
            ``squared_pred``; Hanif et al.'s and Malik et al.'s VAFA code use it with ``loss="dicece"``).
    """

    name = "segmentation"

    def __init__(
        self,
        num_classes: int,
        include_background: bool = False,
        ignore_index: int | None = None,
        loss: str = "ce",
        dice_threshold: float = 0.5,
        target_fraction: float = 0.99,
        squared_pred: bool = False,
    ) -> None:
        if int(num_classes) < 2:
            raise ValueError(f"`num_classes` must be >= 2, got {num_classes}")
        if loss not in ("ce", "dice", "dicece"):
            raise ValueError(f"`loss` must be one of 'ce', 'dice', 'dicece', got {loss!r}")
        if not 0.0 <= dice_threshold <= 1.0:
            raise ValueError(f"`dice_threshold` must be in [0, 1], got {dice_threshold}")
        if not 0.0 < target_fraction <= 1.0:
            raise ValueError(f"`target_fraction` must be in (0, 1], got {target_fraction}")
        self.num_classes = int(num_classes)
        self.include_background = bool(include_background)
        self.ignore_index = ignore_index
        self.loss_name = loss
        self.dice_threshold = float(dice_threshold)
        self.target_fraction = float(target_fraction)
        if not isinstance(squared_pred, bool):
            raise TypeError(f"`squared_pred` must be True or False, got {squared_pred!r}")
        self.squared_pred = squared_pred

    # --- validation ---------------------------------------------------------------------------------
    def validate_logits(self, logits: Tensor) -> None:
        if logits.ndim not in (4, 5) or logits.shape[1] != self.num_classes:
            raise ValueError(
                f"model output must be (N, {self.num_classes}, *spatial) logits with 2 or 3 spatial dims "
                f"for Segmentation(num_classes={self.num_classes}), got shape {tuple(logits.shape)}"
            )
        _check_finite("model output", logits)

    def validate_labels(self, logits: Tensor, y: Tensor, name: str = "y") -> None:
        if y.is_floating_point() or y.dtype == torch.bool:
            raise TypeError(f"`{name}` must be an integer label map for Segmentation, got dtype {y.dtype}")
        expected = (logits.shape[0], *logits.shape[2:])
        if tuple(y.shape) != expected:
            raise ValueError(f"`{name}` must have shape {expected} (N, *spatial), got {tuple(y.shape)}")
        valid = y if self.ignore_index is None else y[y != self.ignore_index]
        if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= self.num_classes):
            raise ValueError(
                f"`{name}` has labels out of range [0, {self.num_classes - 1}]"
                + ("" if self.ignore_index is None else f" (ignore_index={self.ignore_index})")
            )

    def valid_mask(self, y: Tensor) -> Tensor | None:
        return None if self.ignore_index is None else y != self.ignore_index

    def safe_labels(self, y: Tensor) -> Tensor:
        """Labels as int64 with ignored voxels set to 0 (safe for one-hot and indexing; mask them out)."""
        y = y.long()
        return y if self.ignore_index is None else y.masked_fill(y == self.ignore_index, 0)

    def one_hot(self, y: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """``(N, C, *spatial)`` one-hot of a label map; ignored voxels are all-zero."""
        oh = F.one_hot(self.safe_labels(y), self.num_classes).movedim(-1, 1).to(dtype)
        mask = self.valid_mask(y)
        return oh if mask is None else oh * mask.unsqueeze(1).to(dtype)

    # --- losses -------------------------------------------------------------------------------------
    def element_loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits, self.safe_labels(y), reduction="none")

    def element_margin(self, logits: Tensor, y: Tensor) -> Tensor:
        """Per voxel ``(N, *spatial)``: ``z_y − max_{c≠y} z_c`` over all C channels.

        Like the cross-entropy, the margin counts every valid voxel and :meth:`margin` averages it with
        :meth:`reduce` (``ignore_index`` voxels excluded). ``include_background=False`` does not drop the
        background channel or background voxels: the prediction is an arg-max over every channel, and a
        background voxel pushed to an organ class is a false positive that lowers that organ's Dice.
        """
        return _class_margin(logits, self.safe_labels(y))

    def _dice_loss(self, logits: Tensor, y: Tensor, weight: Tensor | None) -> Tensor:
        """Soft Dice loss per sample ``(N,)`` (MONAI's DiceLoss when unweighted)."""
        target = self.one_hot(y, logits.dtype)
        probs = logits.softmax(dim=1)
        mask = self.valid_mask(y)
        if mask is not None:
            probs = probs * mask.unsqueeze(1).to(probs.dtype)
        if weight is None:
            from monai.losses import DiceLoss

            per = DiceLoss(include_background=self.include_background, squared_pred=self.squared_pred,
                           reduction="none")(probs, target)
            return per.reshape(per.shape[0], -1).mean(dim=1)
        # Voxel-weighted soft Dice (for CosPGD/SegPGD weightings): weights enter both sums, which
        # reduces exactly to MONAI's formula (smooth_nr = smooth_dr = 1e-5) when all weights are 1.
        w = weight.unsqueeze(1).to(probs.dtype)
        dims = tuple(range(2, probs.ndim))
        inter = (w * probs * target).sum(dims)
        p2, t2 = (probs * probs, target * target) if self.squared_pred else (probs, target)
        denom = (w * p2).sum(dims) + (w * t2).sum(dims)
        dice = 1.0 - (2.0 * inter + 1e-5) / (denom + 1e-5)
        if not self.include_background:
            dice = dice[:, 1:]
        return dice.mean(dim=1)

    def loss(self, logits: Tensor, y: Tensor, weight: Tensor | None = None) -> Tensor:
        if self.loss_name == "ce":
            return super().loss(logits, y, weight)
        dice = self._dice_loss(logits, y, weight)
        if self.loss_name == "dice":
            return dice
        return dice + super().loss(logits, y, weight)

    # --- predictions and tests ------------------------------------------------------------------------
    def predict(self, logits: Tensor) -> Tensor:
        return _argmax1(logits)

    def distributions(self, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        p = logits.softmax(dim=1)
        return p, self.one_hot(y, p.dtype)

    def target_cosine(self, logits: Tensor, y: Tensor) -> Tensor:
        cos = _onehot_cosine(logits.softmax(dim=1), self.safe_labels(y))
        mask = self.valid_mask(y)
        return cos if mask is None else cos * mask.to(cos.dtype)  # ignored voxels: all-zero target

    def element_correct(self, logits: Tensor, y: Tensor) -> Tensor:
        return self.predict(logits) == y

    def confusion(self, pred: Tensor, y: Tensor) -> Tensor:
        """Per-sample confusion counts ``(N, C, C)``: ``[n, i, j]`` = valid voxels labelled i, predicted j.

        One scatter-add over the voxels, no one-hot tensors and no host sync: this runs inside attack
        loops (restart scoring, the active set) and on every result.
        """
        c = self.num_classes
        key = (self.safe_labels(y) * c + pred.long()).reshape(y.shape[0], -1)
        mask = self.valid_mask(y)
        # integer counts stay exact beyond 2**24 voxels (whole-body CT), where float32 would round
        weight = torch.ones_like(key) if mask is None else mask.reshape(key.shape).long()
        counts = torch.zeros(y.shape[0], c * c, dtype=torch.int64, device=key.device)
        return counts.scatter_add_(1, key, weight).reshape(-1, c, c)

    def dice(self, pred: Tensor, y: Tensor) -> Tensor:
        """Hard Dice per sample and class ``(N, C)`` over valid voxels; 1 where a class is absent from both.

        Same values as MONAI's ``compute_dice(..., include_background=True, ignore_empty=False)``.
        """
        return self._dice_from_confusion(self.confusion(pred, y))

    @staticmethod
    def _dice_from_confusion(conf: Tensor) -> Tensor:
        inter = conf.diagonal(dim1=1, dim2=2).float()
        total = (conf.sum(dim=2) + conf.sum(dim=1)).float()
        return torch.where(total > 0, 2.0 * inter / total.clamp_min(1.0), torch.ones_like(total))

    def mean_dice(self, pred: Tensor, y: Tensor) -> Tensor:
        """``(N,)`` Dice averaged over the counted classes present (in valid voxels) in ``y`` or the prediction.

        A sample where no counted class is present in either map (a background-only patch predicted as
        background) scores 1: the prediction is perfect.
        """
        return self._mean_dice_from_confusion(self.confusion(pred, y))

    def make_target(self, reference: Tensor, replace: Mapping[int, int] | None = None,
                    mask: Tensor | None = None, fill: int | None = None) -> Tensor:
        """Target label map for a targeted attack, derived from a reference map.

        ``task.make_target(pred, replace={1: 0})`` asks the attack to erase organ 1 (relabel it as
        background); ``task.make_target(pred, mask=lesion, fill=2)`` asks it to paint class 2 into
        the region ``mask``. Voxels not touched keep the reference label.

        Args:
            reference: ``(N, *spatial)`` integer label map (usually the clean prediction).
            replace: ``{source_class: target_class}`` relabelling applied to the reference.
            mask: boolean ``(N, *spatial)`` (or broadcastable) region set to ``fill``.
            fill: the class written into ``mask``.

        Returns:
            a new int64 label map; ``reference`` is not modified.
        """
        if not isinstance(reference, Tensor) or reference.is_floating_point() or reference.ndim not in (3, 4):
            raise ValueError("`reference` must be an integer (N, *spatial) label map with 2 or 3 spatial dims")
        if (mask is None) != (fill is None):
            raise ValueError("`mask` and `fill` must be given together")
        checks = [(v, "replace") for pair in (replace or {}).items() for v in pair]
        for v, arg in checks + ([] if fill is None else [(fill, "fill")]):
            if not 0 <= int(v) < self.num_classes:
                raise ValueError(f"`{arg}` has class {v} out of range [0, {self.num_classes - 1}]")
        ref = reference.detach().long()
        target = ref.clone()
        for src, dst in (replace or {}).items():
            target[ref == int(src)] = int(dst)  # relabel from the reference so swaps (1->2, 2->1) work
        if mask is not None:
            assert fill is not None  # given together (checked above)
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                raise TypeError("`mask` must be a boolean tensor")
            try:
                mask = mask.to(target.device).expand_as(target)
            except RuntimeError:
                raise ValueError(
                    f"`mask` of shape {tuple(mask.shape)} does not broadcast to `reference` {tuple(ref.shape)}"
                ) from None
            target = target.masked_fill(mask, int(fill))
        return target

    def fooled(self, logits: Tensor, y: Tensor, targeted: bool = False) -> Tensor:
        return self.decide(logits, y, targeted)[1]

    def decide(self, logits: Tensor, y: Tensor, targeted: bool = False) -> tuple[Tensor, Tensor]:
        pred = self.predict(logits)
        if targeted:
            return pred, self.reduce((pred == y).float(), y) >= self.target_fraction
        return pred, self.mean_dice(pred, y) < self.dice_threshold

    def metrics(self, logits: Tensor, y: Tensor) -> dict[str, Tensor]:
        return dict(self.outcome(logits, y).columns)

    def _mean_dice_from_confusion(self, conf: Tensor) -> Tensor:
        d = self._dice_from_confusion(conf)
        present = (conf.sum(dim=2) > 0) | (conf.sum(dim=1) > 0)
        if not self.include_background:
            d, present = d[:, 1:], present[:, 1:]
        d = torch.where(present, d, torch.zeros_like(d))
        n = present.sum(dim=1)
        return torch.where(n > 0, d.sum(dim=1) / n.clamp_min(1), torch.ones_like(d[:, 0]))

    def outcome(self, logits: Tensor, y: Tensor, pred: Tensor | None = None) -> Outcome:
        # one arg-max and one confusion count give Dice, mean Dice, pixel accuracy and the fooled test
        pred = self.predict(logits) if pred is None else pred
        conf = self.confusion(pred, y)
        mean_dice = self._mean_dice_from_confusion(conf)
        correct = conf.diagonal(dim1=1, dim2=2).sum(dim=1)
        accuracy = correct.double() / conf.sum(dim=(1, 2)).clamp_min(1).double()
        return Outcome(pred, mean_dice < self.dice_threshold,
                       {"dice": self._dice_from_confusion(conf), "mean_dice": mean_dice,
                        "pixel_accuracy": accuracy.to(torch.float32)})

    def sample_columns(self, y: Tensor, clean: Outcome, adv: Outcome) -> dict[str, Tensor]:
        # among valid voxels (ignore_index voxels do not count)
        changed_fraction = self.reduce((clean.pred != adv.pred).float(), y)
        dice_to_clean = self.dice_to_clean(clean.pred, adv.pred, y)
        return {"changed": dice_to_clean < self.dice_threshold, **self._paired_columns(clean, adv),
                "changed_fraction": changed_fraction, "dice_to_clean": dice_to_clean}

    def dice_to_clean(self, clean_pred: Tensor, adv_pred: Tensor, y: Tensor) -> Tensor:
        """``(N,)`` mean Dice of the adversarial prediction against the clean prediction (1: unchanged), over the
        voxels that are valid in ``y``, with the classes counted as in :meth:`mean_dice`."""
        mask = self.valid_mask(y)
        ref = clean_pred if mask is None else torch.where(mask, clean_pred, torch.as_tensor(self.ignore_index))
        return self.mean_dice(adv_pred, ref)

    def changed(self, clean_pred: Tensor, adv_pred: Tensor, y: Tensor) -> Tensor:
        """``(N,)`` bool: the segmentation changed in substance — the mean Dice between the clean and the adversarial
        prediction is below ``dice_threshold`` (the threshold of ``fooled``). A single flipped voxel does not count:
        ``changed_fraction`` and ``dice_to_clean`` measure the size of the change."""
        return self.dice_to_clean(clean_pred, adv_pred, y) < self.dice_threshold

    robust_metric_name = "mean_dice"

    def robust_metric(self, logits: Tensor, y: Tensor) -> Tensor:
        return self.mean_dice(self.predict(logits), y).to(torch.float32)

    def __repr__(self) -> str:
        return (
            f"Segmentation(num_classes={self.num_classes}, include_background={self.include_background}, "
            f"ignore_index={self.ignore_index}, loss={self.loss_name!r}"
            + (", squared_pred=True" if self.squared_pred else "") + ")"
        )


def task_family(task: object) -> str | None:
    """``"multiclass"``, ``"multilabel"`` or ``"segmentation"``: which built-in task ``task`` is (subclasses
    included), or ``None`` for anything else (a user-defined task). Callers that need one of the three say so
    in their own error."""
    for cls in (Segmentation, MultiLabel, MultiClass):
        if isinstance(task, cls):
            return cls.name
    return None
