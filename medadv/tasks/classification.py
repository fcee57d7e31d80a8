"""Classification task kinds: :class:`MultiClass` (softmax, one class per sample) and :class:`MultiLabel`
(independent sigmoids, a 0/1 vector per sample)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from ..schema_base import OUTPUTS_OPTION, ClassNames, Number, _Section
from .base import (
    Outcome,
    Task,
    TaskExample,
    _argmax1,
    _check_finite,
    _class_margin,
    _onehot_cosine,
    register_task,
    tiny_net,
)

__all__ = ["MultiClass", "MultiLabel"]

_OUTPUTS = 4  # classes / labels of the examples' classifiers


def _index_labels(task: Task, y: Tensor, squeeze_ndim: int) -> Tensor:
    """Class indices from a loader's labels: a singleton channel (``y.ndim == squeeze_ndim``, dim 1 of size 1) is
    dropped; integral floats become int64; non-integral values are refused (interpolated label maps)."""
    if y.ndim == squeeze_ndim and y.ndim >= 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.is_floating_point():
        if y.numel() and not bool((y == y.round()).all()):
            raise ValueError(f"`y` of a {type(task).__name__} batch must hold class indices; got non-integer "
                             "values (interpolated labels? resample label maps with mode='nearest')")
        y = y.long()
    return y


# --- the kinds' `task:` config sections (Task.config_schema; re-exported by medadv.config_schema) -----------
class MultiClassTask(_Section):
    """The ``task:`` section of a multi-class config (:meth:`MultiClass.config_schema`)."""

    type: Literal["multiclass"]
    outputs: OUTPUTS_OPTION | None = None  # Task.outputs
    class_names: ClassNames | None = None  # one per model output, in output order (report only)


class MultiLabelTask(_Section):
    """The ``task:`` section of a multi-label config (:meth:`MultiLabel.config_schema`)."""

    type: Literal["multilabel"]
    threshold: Number = Field(0.5, gt=0.0, lt=1.0)
    outputs: OUTPUTS_OPTION | None = None  # Task.outputs
    class_names: ClassNames | None = None  # one per label, in output order (default: a CSV's label columns)


@register_task("multiclass")
class MultiClass(Task):
    """Single-label classification with softmax cross-entropy.

    Labels are class indices ``(N,)``; ``fooled`` means the arg-max left the label (untargeted) or
    reached the target class (targeted).
    """

    name = "multiclass"
    traits = Task.traits.but(
        outputs={"exclusive_classes": True},
        labels={"label_source": "index"},
        metrics={"headline": "correct", "robust_metric_name": "accuracy", "robust_metric_column": "correct",
                 "robust_metric_binary": True},
        attacks={"auto_members": ("apgd-ce", "apgd-t", "fab-t", "square", "apgd-dlr", "fab"),
                 "auto_versions": {
                     "standard": {"attacks": ("apgd-ce", "apgd-t", "fab-t", "square"), "steps": 100, "targets": 9,
                                  "queries": 5000},
                     "fast": {"attacks": ("apgd-ce", "apgd-t", "square"), "steps": 20, "targets": 3, "queries": 500}},
                 "auto_runner": "pyautoattack",
                 # ``medadv tasks --params``: the members' losses by class count (``medadv.attacks.autoattack``)
                 "auto_note": (
                     "any K >= 2: APGD-CE; APGD-T and FAB-T try min(targets, K - 1) classes; APGD-T's loss is "
                     "AutoAttack's targeted DLR for K >= 4, DLR normalised by z_pi1 - (z_pi2 + z_pi3)/2 for K = 3, "
                     "targeted CE for K = 2 (where apgd-dlr ascends the logit margin); a single sigmoid logit is the "
                     "multilabel task with one label")},
        report={"title": "multi-class classification", "shapes": "logits (N, K), K >= 2; y (N,) class indices",
                "case_view": "classes", "classwise_view": "classes"},
        certify={"family": "multiclass"},
        toolkits={"adapters": frozenset({"torchattacks", "foolbox", "art", "robustbench"}),
                  "support_columns": {"multiclass": "multi-class"}},
    )

    def validate_logits(self, logits: Tensor) -> None:
        if logits.ndim != 2 or logits.shape[1] < 2:
            one = logits.ndim == 1 or (logits.ndim == 2 and logits.shape[1] == 1)
            hint = ("; a single-logit sigmoid head is the multilabel task with one label (its output (N, 1), y (N, 1) "
                    "of 0/1)" if one else "")
            raise ValueError(
                f"model output must be (N, K) logits with K >= 2 for MultiClass, got shape {tuple(logits.shape)}{hint}"
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

    def softmax_labels(self, y: Tensor) -> Tensor:
        """The labels as ``(N,)`` class indices of :meth:`softmax_logits` (what pyautoattack's ``autoattack``
        takes): the labels themselves."""
        return y.long()

    def softmax_logits(self, logits: Tensor) -> Tensor:
        """The output as ``(N, K)`` softmax logits, K >= 2 (what ``autoattack`` attacks): the logits themselves."""
        return logits

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
        # the softmax scores give the dataset-level macro one-vs-rest AUC (Results.summary, Xu et al. §5.1)
        return Outcome(pred, ~correct, {"pred": pred, "correct": correct, "scores": logits.softmax(dim=1)})

    def sample_columns(self, y: Tensor, clean: Outcome, adv: Outcome) -> dict[str, Tensor]:
        return {"label": y, **super().sample_columns(y, clean, adv)}

    def robust_metric(self, logits: Tensor, y: Tensor) -> Tensor:
        return (self.predict(logits) == y).to(torch.float32)

    # --- hooks (see Task) ----------------------------------------------------------------------------------------------
    def parse_labels(self, y: Tensor, x: Tensor) -> Tensor:
        return _index_labels(self, y, 2)

    def case_scores(self, logits: Tensor) -> Tensor | None:
        return logits.softmax(dim=1)

    def outcome_of_pred(self, pred: Tensor, y: Tensor) -> Outcome | None:
        correct = pred == y
        return Outcome(pred, ~correct, {"correct": correct})

    def case_note(self, y: Tensor, clean_pred: Tensor, adv_pred: Tensor) -> str:
        ok = lambda p: "correct" if int(p) == int(y) else "wrong"  # noqa: E731
        return f"clean: {ok(clean_pred)} → attacked: {ok(adv_pred)}"

    def sample_group(self, y: Tensor, names: Sequence[Any]) -> Any:
        return names[int(y)]

    def explained_class(self, y: Tensor, scores: Tensor) -> Tensor:
        return y.long()

    def flip_goal(self, y: Tensor, label: Tensor, clean_logits: Tensor | None, targeted: bool) -> Tensor | None:
        if targeted:
            return y
        # the runner-up class of the clean output: the nearest other class
        assert clean_logits is not None, "an untargeted flip of a multi-class output needs the clean logits"
        return clean_logits.scatter(1, y.long()[:, None], float("-inf")).argmax(dim=1)

    def flip_loss(self, logits: Tensor, y: Tensor, label: Tensor, goal: Tensor | None, targeted: bool) -> Tensor:
        assert goal is not None
        return F.cross_entropy(logits, goal.long(), reduction="none")

    @classmethod
    def config_schema(cls) -> type:
        return MultiClassTask

    @classmethod
    def examples(cls, seed: int = 0) -> list[TaskExample]:
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(3, 1, 8, 8, generator=g)
        return [TaskExample("multiclass", cls(), tiny_net(1, _OUTPUTS, 2, dense=False, seed=seed), x,
                            torch.arange(3) % _OUTPUTS, target=torch.zeros(3, dtype=torch.long))]

    def __repr__(self) -> str:
        return "MultiClass()"


@register_task("multilabel")
class MultiLabel(Task):
    """Multi-label classification with independent sigmoid outputs and per-label BCE.

    Args:
        threshold: probability above which a label is predicted present (0 < threshold < 1).
        outputs: ``"probabilities"`` for a model ending in a sigmoid (read as ``logit(p)``), ``"logits"``, or
            ``None``: logits, and sigmoid-like outputs are refused (:attr:`Task.outputs`).

    Labels are multi-hot floats ``(N, L)`` in {0, 1}. Untargeted ``fooled``: any label flipped;
    targeted: every label equals the target vector.
    """

    name = "multilabel"
    traits = Task.traits.but(
        labels={"label_source": "vector"},
        metrics={"headline": "label_accuracy", "robust_metric_name": "exact_match",
                 "robust_metric_column": "exact_match", "tiebreak_column": "label_accuracy",
                 "robust_metric_binary": True},
        attacks={"auto_members": ("apgd-ce", "apgd-margin", "apgd-flip", "square", "apgd-js", "apgd-cospgd",
                                  "apgd-segpgd"),
                 "auto_versions": {
                     "standard": {"attacks": ("apgd-ce", "apgd-margin", "apgd-flip", "square"), "steps": 100,
                                  "targets": 3, "queries": 1000, "square_loss": "min-margin"},
                     "fast": {"attacks": ("apgd-ce", "apgd-margin", "apgd-flip", "square"), "steps": 20,
                              "targets": 1, "queries": 500, "square_loss": "min-margin"}},
                 # ``medadv tasks --params``: a single-logit sigmoid head is this kind with one label
                 "auto_note": (
                     "one label (a single-logit sigmoid head, output and y (N, 1)): APGD on the BCE, APGD on the "
                     "signed margin (2y - 1)(z - logit(threshold)), APGD flipping the label, Square on that margin; "
                     "`autoattack` attacks it as the 2 classes [logit(threshold), z]"),
                 "flip_targeted": False},  # the flip changes the one chosen label
        report={"title": "multi-label classification",
                "shapes": "logits (N, L); y (N, L) 0/1 (L = 1: a single-logit sigmoid head)",
                "case_view": "labels", "classwise_view": "labels"},
        certify={"family": "multilabel"},
        toolkits={"adapters": frozenset({"torchattacks", "foolbox", "art"}),
                  "support_columns": {"multilabel": "multi-label"}},
    )

    def __init__(self, threshold: float = 0.5, outputs: str | None = None) -> None:
        super().__init__(outputs=outputs)  # "probabilities": a model ending in a sigmoid (Task.outputs)
        if not 0.0 < float(threshold) < 1.0:
            raise ValueError(f"`threshold` must be in (0, 1), got {threshold}")
        self.threshold = float(threshold)
        self._logit_threshold = float(torch.logit(torch.tensor(self.threshold, dtype=torch.float64)))

    def validate_logits(self, logits: Tensor) -> None:
        if logits.ndim != 2:
            hint = (" (a single-logit sigmoid head returning (N,): return logits.unsqueeze(1), (N, 1), with y (N, 1))"
                    if logits.ndim == 1 else "")
            raise ValueError(f"model output must be (N, L) logits for MultiLabel, got shape {tuple(logits.shape)}{hint}")
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

    def parse_labels(self, y: Tensor, x: Tensor) -> Tensor:
        """A vector ``(N,)`` of 0/1 is one label per sample, ``(N, 1)`` (a single-logit sigmoid head's labels as a
        data file usually holds them); other shapes are kept (and checked against the output by :meth:`validate`)."""
        return y[:, None] if y.ndim == 1 else y

    def softmax_labels(self, y: Tensor) -> Tensor:
        """One label (a single-logit sigmoid head, ``y`` ``(N, 1)``) as ``(N,)`` class indices of
        :meth:`softmax_logits` (1: present); several labels have no softmax form (``ValueError``).

        This is how a binary classifier with one sigmoid logit reaches softmax-only code (pyautoattack's
        ``autoattack``): the same model seen as 2 classes, decided by the same threshold.
        """
        if y.ndim != 2 or y.shape[1] != 1:
            raise ValueError(f"`y` of MultiLabel must hold one label, shape (N, 1), to be seen as a 2-class softmax "
                             f"(a single-logit sigmoid head), got shape {tuple(y.shape)}; several independent "
                             "labels have no softmax form: use `auto` (its multi-label members)")
        return y[:, 0].long()

    def softmax_logits(self, logits: Tensor) -> Tensor:
        """One label's logit ``z`` ``(N, 1)`` as the 2-class softmax logits ``[logit(threshold), z]``.

        ``softmax = [1 − σ(z − t), σ(z − t)]`` with ``t = logit(threshold)``: the arg-max is :meth:`predict` (a tie
        ``z = t`` is class 0, absent, as ``z > t`` is required), the cross-entropy is the BCE of ``z`` measured from
        the threshold (exactly :meth:`element_loss` at threshold 0.5) and the 2-class margin is
        :meth:`element_margin`. Several labels are refused (``ValueError``).
        """
        if logits.ndim != 2 or logits.shape[1] != 1:
            raise ValueError(f"a MultiLabel output has a 2-class softmax form only with one label (N, 1), got shape "
                             f"{tuple(logits.shape)}")
        return torch.cat((torch.full_like(logits, self._logit_threshold), logits), dim=1)

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

    # --- hooks (see Task) ----------------------------------------------------------------------------------------------
    def case_scores(self, logits: Tensor) -> Tensor | None:
        return logits.sigmoid()

    def outcome_of_pred(self, pred: Tensor, y: Tensor) -> Outcome | None:
        correct = pred == y.to(pred.dtype)
        exact = correct.all(dim=1)
        return Outcome(pred, ~exact, {"label_accuracy": correct.float().mean(dim=1), "exact_match": exact})

    def case_note(self, y: Tensor, clean_pred: Tensor, adv_pred: Tensor) -> str:
        acc = lambda p: float((p == y.to(p.dtype)).double().mean())  # noqa: E731
        return f"label accuracy {acc(clean_pred):.2f} → {acc(adv_pred):.2f}"

    def sample_group(self, y: Tensor, names: Sequence[Any]) -> Any:
        return "+".join(str(names[j]) for j in range(y.shape[0]) if y[j] > 0.5) or "none"

    def flip_goal(self, y: Tensor, label: Tensor, clean_logits: Tensor | None, targeted: bool) -> Tensor | None:
        return 1.0 - y.gather(1, label[:, None])[:, 0]  # the chosen label, the other way

    def flip_loss(self, logits: Tensor, y: Tensor, label: Tensor, goal: Tensor | None, targeted: bool) -> Tensor:
        assert goal is not None
        z = logits.gather(1, label[:, None])[:, 0]
        return F.binary_cross_entropy_with_logits(z, goal.to(z.dtype), reduction="none")

    def flipped(self, logits: Tensor, y: Tensor, label: Tensor, goal: Tensor | None, targeted: bool) -> Tensor:
        assert goal is not None
        pred = self.predict(logits).gather(1, label[:, None])[:, 0]
        return pred == goal.to(pred.dtype)

    @classmethod
    def config_schema(cls) -> type:
        return MultiLabelTask

    @classmethod
    def examples(cls, seed: int = 0) -> list[TaskExample]:
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(3, 1, 8, 8, generator=g)
        y = torch.randint(0, 2, (3, _OUTPUTS), generator=g).float()
        return [TaskExample("multilabel", cls(), tiny_net(1, _OUTPUTS, 2, dense=False, seed=seed), x, y,
                            target=torch.zeros(3, _OUTPUTS))]

    def __repr__(self) -> str:
        return f"MultiLabel(threshold={self.threshold})"
