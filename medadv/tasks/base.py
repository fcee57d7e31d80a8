"""The task base class and the registry of task kinds.

A :class:`Task` turns logits and labels into the quantities every attack, defense and metric needs:
an *unreduced per-element loss* (per sample for multi-class, per label for multi-label, per voxel for
segmentation, per output for regression), predictions, a per-sample "fooled" test and clean metrics. Attacks
never special-case a task: CosPGD and SegPGD are weightings of :meth:`Task.element_loss`, so one loop attacks a
14-label chest X-ray classifier (per label) and a 3-D organ segmenter (per voxel).

A task *kind* is the one extension point: the class declares what evaluation, data loading, the report, the
studies, ``auto``, certification, the config and the toolkit adapters ask of it, and :func:`register_task` makes it
a name (``get_task("segmentation", num_classes=4)``, ``task: {type: ...}`` in a config, ``medadv tasks``). Nothing
outside :mod:`medadv.tasks` names a task class: a consumer reads a declaration, or builds a kind by name.

The declarations are grouped by consumer in :attr:`Task.traits` (a :class:`TaskTraits`), the way scikit-learn groups
its estimator tags; each group is a small frozen dataclass whose fields say which consumer reads them:

* ``traits.outputs`` (:class:`OutputTraits`): class scores, logits, exclusive classes — the probability checks and
  the attacks built on class distributions;
* ``traits.labels`` (:class:`LabelTraits`): the label form and whether labels lie on the input grid — the file data
  sources, the toolkit adapters, spatial transforms;
* ``traits.metrics`` (:class:`MetricTraits`): the headline column, the robust metric and its column and floor,
  ``auto``'s selection metrics, the masking tolerance, per-class Dice — reports, ``auto``, masking, ASR, certified Dice;
* ``traits.attacks`` (:class:`AttackTraits`): ``auto``'s members, versions and runner, the saliency flip —
  ``auto``, ``medadv attacks``, the saliency attacks;
* ``traits.report`` (:class:`ReportTraits`): title, shapes, case view, class-wise view, scatter columns — ``medadv
  tasks``, report cases, studies, the HTML report;
* ``traits.certify`` (:class:`CertifyTraits`): the randomized-smoothing family — :mod:`medadv.certify`;
* ``traits.toolkits`` (:class:`ToolkitTraits`): the adapters that take the kind and its support-matrix columns —
  :mod:`adapters`.

A kind declares what differs from its parent: ``traits = Task.traits.but(metrics={"headline": "mae"})``. The flat
names of before (``Task.headline``, ``Task.label_source`` ... :data:`FLAT_TRAITS`) read the groups, on the class and
on instances, and flat class attributes in a kind's body are folded into its groups when the class is defined. The
behaviour hooks (:meth:`Task.support_column`, :meth:`Task.config_schema`, :meth:`Task.sample_group` ...) are methods
with defaults, below.
"""

from __future__ import annotations

import copy
import inspect
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..params import InvalidParameterError, closest
from ..runtime import all_finite

__all__ = ["Task", "TaskTraits", "OutputTraits", "LabelTraits", "MetricTraits", "AttackTraits", "ReportTraits",
           "CertifyTraits", "ToolkitTraits", "FLAT_TRAITS", "TOOLKITS", "Outcome", "LogitsOfProbabilities", "OUTPUT_KINDS", "ProbabilityEvidence", "TaskExample",
           "register_task", "task_class", "get_task", "available_tasks", "registered_task_classes", "task_family",
           "tiny_net", "robust_metric_columns", "headline_columns", "lower_is_better"]


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


class ProbabilityEvidence(NamedTuple):
    """What :meth:`Task.probability_evidence` found: ``kind`` ``"softmax"`` (rows summing to 1; ``value`` the
    largest ``|sum - 1|``) or ``"bounded"`` (every output in ``[0, 1]``; ``value`` 1.0), and ``text``, in words."""

    kind: str
    value: float
    text: str


#: what a model may return (:attr:`Task.outputs`)
OUTPUT_KINDS = ("logits", "probabilities")
#: :meth:`Task.probability_evidence`'s defaults: tolerance in output units, and the outputs needed for the
#: "every value in [0, 1]" test of sigmoid heads
PROBABILITY_ATOL = 1e-3
PROBABILITY_MIN_VALUES = 8


# --- the trait groups: what the rest of medadv reads from a task kind -------------------------------------------------
# Grouped the way scikit-learn groups its estimator tags: one small frozen dataclass per consumer family, so a kind's
# declarations read as "what its outputs are", "what its labels are", "how it is scored" ... and a new consumer adds
# one field to one group (with its default) instead of another loose class attribute.
@dataclass(frozen=True)
class OutputTraits:
    """What the model's outputs are (``Task.traits.outputs``).

    Attributes:
        class_scores: the outputs are class scores, so :meth:`Task.distributions`, :meth:`Task.log_probs`,
            :meth:`Task.target_cosine` and :meth:`Task.least_likely` apply. Read by the attacks built on class
            distributions (CosPGD, the relevance attack, APGD's ``js`` / ``cospgd`` losses), which refuse a kind
            without them before any work (regression: values, not scores).
        outputs_are_logits: the model returns logits (a loss on probabilities would saturate). Read by
            :meth:`Task.probability_evidence` and :mod:`medadv.masking`'s probability check.
        exclusive_classes: one class per element (softmax over dim 1). Read by :meth:`Task.probability_evidence`
            and :meth:`Task.logits_from_outputs`.
    """

    class_scores: bool = True
    outputs_are_logits: bool = True
    exclusive_classes: bool = False


@dataclass(frozen=True)
class LabelTraits:
    """What the labels are (``Task.traits.labels``).

    Attributes:
        label_source: the labels a file data source must give (:mod:`medadv.data.sources`) and the form the
            toolkit adapters convert labels to (:mod:`adapters`): ``"map"`` (label images), ``"vector"`` (0/1
            columns), ``"index"`` (one class index per case), ``"values"`` (numbers per case); ``None``: no file
            source.
        spatial_labels: labels lie on the input's spatial grid (label maps): a spatial transform of the input must
            move them too (the data loaders, the defenses' input transforms).
    """

    label_source: str | None = None
    spatial_labels: bool = False


@dataclass(frozen=True)
class MetricTraits:
    """How the kind is scored (``Task.traits.metrics``).

    Attributes:
        headline: the per-sample column (without ``clean_``/``adv_``) a report and the pytest plugin lead with
            (:func:`headline_columns`).
        higher_is_better: whether a larger :attr:`headline` is better (accuracy, Dice) or worse (an error)
            (:func:`lower_is_better`: reports, plots).
        robust_metric_name: the name of :meth:`Task.robust_metric` in results tables (``auto``, results).
        robust_metric_column: the per-sample column of :meth:`Task.robust_metric` (``correct`` for accuracy):
            :func:`robust_metric_columns`, the results, the masking checks.
        robust_metric_binary: :meth:`Task.robust_metric` only takes 0 and 1 (stored as ``True``/``False``).
        metric_floor: the lowest value :meth:`Task.robust_metric` can take (``auto``: a sample there cannot be made
            worse).
        tiebreak_column: a finer per-sample column that orders samples with the same robust-metric drop (report
            cases), or ``None``.
        selection_metrics: the metrics ``auto`` may keep the worst case by (``auto(metric=...)``): name →
            :meth:`Task.outcome` column; empty: only :meth:`Task.robust_metric`.
        unbounded_tolerance: :func:`medadv.masking.check_unbounded`'s default tolerance on the robust metric.
        class_dice: the kind scores label maps class by class (``num_classes``, ``include_background``,
            :meth:`dice`, :meth:`safe_labels`, :meth:`one_hot`, ``dice_threshold``, ``target_fraction``): what
            :func:`medadv.metrics.attack_success.segmentation_asr`, :func:`medadv.certify.certified_dice` and the
            toolkits' segmentation criteria need.
    """

    headline: str | None = None
    higher_is_better: bool = True
    robust_metric_name: str = "metric"
    robust_metric_column: str | None = None
    robust_metric_binary: bool = False
    metric_floor: float = 0.0
    tiebreak_column: str | None = None
    selection_metrics: Mapping[str, str] = field(default_factory=dict)
    unbounded_tolerance: float = 0.05
    class_dice: bool = False


@dataclass(frozen=True)
class AttackTraits:
    """What the attacks ask of the kind (``Task.traits.attacks``).

    Attributes:
        auto_members: ``auto`` (worst-case ensemble, :mod:`medadv.attacks.auto`): every member this kind accepts, in
            the standard order; empty: ``auto`` refuses this kind.
        auto_versions: the members and defaults of each ``auto`` version (``{"standard": {"attacks": (...),
            "steps": 100, ...}, "fast": {...}}``).
        auto_runner: ``auto``'s runner: ``"engine"`` (medadv's APGD/Square members) or ``"pyautoattack"`` (the
            reference code).
        auto_note: one line on how ``auto`` attacks the kind (``medadv attacks``).
        flip_targeted: the saliency attacks' targeted flip is defined (drive the prediction to the target);
            ``False``: the flip changes one chosen label and is untargeted only (multi-label).
    """

    auto_members: tuple[str, ...] = ()
    auto_versions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    auto_runner: str = "engine"
    auto_note: str = ""
    flip_targeted: bool = True


@dataclass(frozen=True)
class ReportTraits:
    """How reports and studies show the kind (``Task.traits.report``).

    Attributes:
        title: what the kind is, in words (``medadv tasks``, report headings).
        shapes: the model output and label shapes, in words (``medadv tasks``).
        case_view: how a report case draws a prediction (:mod:`medadv.report.cases`): ``"classes"`` (one class,
            score bars), ``"labels"`` (multi-hot, score bars), ``"map"`` (a label map over the image), ``"values"``
            (numbers); ``None``: image and perturbation only. A case given the kind's registered name as its view
            draws this view.
        classwise_view: the class-wise study's breakdown (:mod:`medadv.studies.classwise`): ``"classes"``,
            ``"labels"``, ``"map"`` or ``None`` (the study refuses this kind).
        scatter_columns: the per-sample columns the HTML report draws as a clean-vs-attacked scatter (regression:
            the largest error).
    """

    title: str = "custom task"
    shapes: str = ""
    case_view: str | None = None
    classwise_view: str | None = None
    scatter_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class CertifyTraits:
    """What certification asks of the kind (``Task.traits.certify``).

    Attributes:
        family: the randomized-smoothing family that certifies the kind (:data:`medadv.certify.FAMILIES`):
            ``"multiclass"`` (Cohen et al.), ``"multilabel"`` (per label, family-wise error control),
            ``"segmentation"`` (SegCertify, per voxel); ``None``: :class:`~medadv.certify.RandomizedSmoothing`
            refuses the kind.
    """

    family: str | None = None


@dataclass(frozen=True)
class ToolkitTraits:
    """What the third-party toolkit adapters (:mod:`adapters`) ask of the kind (``Task.traits.toolkits``).

    Attributes:
        adapters: the toolkits whose model wrappers take the kind (``"torchattacks"``, ``"foolbox"``, ``"art"``,
            ``"robustbench"``); each wrapper refuses another kind before any work. Which of a toolkit's attacks
            run on the kind is the support tables' business (:meth:`Task.support_column`).
        support_columns: the kind's columns in the toolkits' support tables (``adapters.support.TASK_KINDS``), each
            with its title (``{"seg2d": "2-D seg", "seg3d": "3-D seg"}``); empty: no table has a column for the kind,
            so every toolkit attack is refused on it with the reason.
    """

    adapters: frozenset[str] = frozenset()
    support_columns: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskTraits:
    """Every declaration of a task kind, in groups by consumer (:attr:`Task.traits`).

    ``outputs`` (:class:`OutputTraits`), ``labels`` (:class:`LabelTraits`), ``metrics`` (:class:`MetricTraits`),
    ``attacks`` (:class:`AttackTraits`), ``report`` (:class:`ReportTraits`), ``certify`` (:class:`CertifyTraits`),
    ``toolkits`` (:class:`ToolkitTraits`). The config schema of a kind is its :meth:`Task.config_schema`.
    """

    outputs: OutputTraits = OutputTraits()
    labels: LabelTraits = LabelTraits()
    metrics: MetricTraits = MetricTraits()
    attacks: AttackTraits = AttackTraits()
    report: ReportTraits = ReportTraits()
    certify: CertifyTraits = CertifyTraits()
    toolkits: ToolkitTraits = ToolkitTraits()

    def but(self, **groups: Mapping[str, Any]) -> TaskTraits:
        """These traits with some fields of some groups replaced: ``traits.but(metrics={"headline": "mae"})``.
        An unknown group or field is refused with one line naming it (a typo would otherwise declare nothing)."""
        changes: dict[str, Any] = {}
        for group, values in groups.items():
            if group not in _GROUPS:
                c = closest(group, _GROUPS)
                raise TypeError(f"unknown trait group `{group}`" + (f" — did you mean `{c}`?" if c else "")
                                + f" (groups: {', '.join(_GROUPS)})")
            current = getattr(self, group)
            if not isinstance(values, Mapping):
                raise TypeError(f"`{group}` must map field names to values, got {type(values).__name__}")
            known = [f.name for f in fields(current)]
            for k in values:
                if k not in known:
                    c = closest(str(k), known)
                    raise TypeError(f"unknown trait `{group}.{k}`" + (f" — did you mean `{c}`?" if c else "")
                                    + f" (fields: {', '.join(known)})")
            changes[group] = replace(current, **values)
        return replace(self, **changes)


_GROUPS = ("outputs", "labels", "metrics", "attacks", "report", "certify", "toolkits")
#: the toolkit adapters a kind may declare in :attr:`ToolkitTraits.adapters` (the wrappers of :mod:`adapters`)
TOOLKITS = ("torchattacks", "foolbox", "art", "robustbench")

#: the flat class-attribute names of before, each ``(group, field)`` of :class:`TaskTraits` it reads
FLAT_TRAITS: dict[str, tuple[str, str]] = {
    "class_scores": ("outputs", "class_scores"), "outputs_are_logits": ("outputs", "outputs_are_logits"),
    "exclusive_classes": ("outputs", "exclusive_classes"),
    "label_source": ("labels", "label_source"), "spatial_labels": ("labels", "spatial_labels"),
    "headline": ("metrics", "headline"), "higher_is_better": ("metrics", "higher_is_better"),
    "robust_metric_name": ("metrics", "robust_metric_name"),
    "robust_metric_column": ("metrics", "robust_metric_column"),
    "robust_metric_binary": ("metrics", "robust_metric_binary"), "metric_floor": ("metrics", "metric_floor"),
    "tiebreak_column": ("metrics", "tiebreak_column"), "selection_metrics": ("metrics", "selection_metrics"),
    "unbounded_tolerance": ("metrics", "unbounded_tolerance"),
    "auto_members": ("attacks", "auto_members"), "auto_versions": ("attacks", "auto_versions"),
    "auto_runner": ("attacks", "auto_runner"), "auto_note": ("attacks", "auto_note"),
    "flip_targeted": ("attacks", "flip_targeted"),
    "title": ("report", "title"), "shapes": ("report", "shapes"), "case_view": ("report", "case_view"),
    "classwise_view": ("report", "classwise_view"), "scatter_columns": ("report", "scatter_columns"),
}


class _FlatTrait:
    """A flat name of before (``Task.headline``) reading its field of :attr:`Task.traits`, on the class and on
    instances. A non-data descriptor: an instance attribute of the same name still wins."""

    def __init__(self, group: str, name: str) -> None:
        self.group, self.name = group, name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        holder: Any = owner if obj is None else obj
        return getattr(getattr(holder.traits, self.group), self.name)


class Task(ABC):
    """Base class of all tasks. Subclasses define the element grid and its loss."""

    # --- what the rest of medadv asks of a task kind: the trait groups (:class:`TaskTraits`) ------------------------
    #: the registry name (``get_task(name)``, a config's ``task.type``); set by :func:`register_task`
    name: ClassVar[str] = "task"
    #: every declaration of the kind, in named groups (:class:`TaskTraits`: ``traits.outputs``, ``.labels``,
    #: ``.metrics``, ``.attacks``, ``.report``, ``.certify``, ``.toolkits``); a kind declares
    #: ``traits = Parent.traits.but(metrics={"headline": ...}, ...)``. The flat names of before (``headline``,
    #: ``label_source``, ``case_view`` ...) read these groups; a flat name set in a class body is folded into
    #: the class's groups when the class is defined (:data:`FLAT_TRAITS`)
    traits: ClassVar[TaskTraits] = TaskTraits()

    # the flat names (descriptors reading :attr:`traits`, installed below the class; typed here for mypy)
    title: ClassVar[str]
    shapes: ClassVar[str]
    headline: ClassVar[str | None]
    higher_is_better: ClassVar[bool]
    robust_metric_column: ClassVar[str | None]
    tiebreak_column: ClassVar[str | None]
    robust_metric_binary: ClassVar[bool]
    label_source: ClassVar[str | None]
    class_scores: ClassVar[bool]
    outputs_are_logits: ClassVar[bool]
    exclusive_classes: ClassVar[bool]
    spatial_labels: ClassVar[bool]
    case_view: ClassVar[str | None]
    classwise_view: ClassVar[str | None]
    unbounded_tolerance: ClassVar[float]
    auto_members: ClassVar[tuple[str, ...]]
    auto_versions: ClassVar[Mapping[str, Mapping[str, Any]]]
    selection_metrics: ClassVar[Mapping[str, str]]
    scatter_columns: ClassVar[tuple[str, ...]]
    auto_runner: ClassVar[str]
    auto_note: ClassVar[str]
    flip_targeted: ClassVar[bool]
    metric_floor: ClassVar[float]
    robust_metric_name: ClassVar[str]

    #: what the model returns: ``"logits"`` (what every loss and prediction reads) or ``"probabilities"`` (a model
    #: ending in a softmax or sigmoid, such as deepbet's softmax ``(N, 2, D, H, W)``): then :meth:`logits_model`
    #: turns them into logits before anything reads them (:meth:`logits_from_outputs`). Set per instance by
    #: ``Task(..., outputs=...)`` / a config's ``task: {outputs: probabilities}``. Not declared (the default), the
    #: task reads logits and refuses outputs that look like probabilities (:meth:`check_outputs`); declared
    #: ``"logits"``, it reads them as logits unchecked (a logit model whose outputs all fall in ``[0, 1]``).
    outputs: str = "logits"

    def __init__(self, outputs: str | None = None) -> None:
        """``outputs``: ``"logits"``, ``"probabilities"`` or ``None`` (logits, checked; see :attr:`outputs`).
        Kinds with parameters of their own pass it on with ``super().__init__(outputs=outputs)``."""
        self._set_outputs(outputs)

    def _set_outputs(self, outputs: Any) -> None:
        if outputs is None:  # not declared: the class default, checked (stored nowhere: fingerprints stay as before)
            self.__dict__.pop("outputs", None)
            return
        if not isinstance(outputs, str) or outputs not in OUTPUT_KINDS:
            raise ValueError(f"`outputs` of {type(self).__name__} must be one of {', '.join(map(repr, OUTPUT_KINDS))} "
                             f"(what the model returns), got {outputs!r}")
        if outputs == "probabilities" and not (self.class_scores and self.outputs_are_logits):
            raise ValueError(f"`outputs='probabilities'` needs class scores, and the outputs of "
                             f"{type(self).__name__} are values: leave `outputs` out")
        self.outputs = outputs

    @property
    def outputs_declared(self) -> bool:
        """Whether :attr:`outputs` was declared for this task (``Task(..., outputs=...)``), not left at the default."""
        return "outputs" in self.__dict__

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # flat declarations in the class body (the style of before, a user's kind) become its trait groups, and
        # the flat names read the groups again (so a subclass declaring `traits` is not shadowed by them)
        own = {n: cls.__dict__[n] for n in FLAT_TRAITS
               if n in cls.__dict__ and not isinstance(cls.__dict__[n], _FlatTrait)}
        if own:
            groups: dict[str, dict[str, Any]] = {}
            for n, v in own.items():
                g, f = FLAT_TRAITS[n]
                groups.setdefault(g, {})[f] = v
            cls.traits = cls.traits.but(**groups)
            for n in own:
                delattr(cls, n)
        _DEFINED.append(weakref.ref(cls))  # its declarations (headline) count for reports without registration

    # --- probability outputs: the one detection rule and the one conversion -------------------------------------------
    def probability_evidence(self, out: Tensor, *, atol: float = PROBABILITY_ATOL,
                             min_values: int = PROBABILITY_MIN_VALUES) -> ProbabilityEvidence | None:
        """Why ``out`` (a model output on a batch) looks like probabilities rather than logits, or ``None``.

        The one rule (every consumer asks here: the attacks' entry point and :func:`~medadv.evaluate` through
        :meth:`validate`, and :func:`medadv.masking.check_probability_outputs`):

        * every value lies in ``[-atol, 1 + atol]`` (``atol = 1e-3`` admits half-precision rounding), and
        * ``"softmax"``: exclusive classes (:attr:`exclusive_classes`: multi-class, segmentation) with ``K >= 2``
          classes whose sum over the class axis (dim 1) is within ``atol`` of 1 for every sample and voxel (the
          value is the largest ``|sum - 1|``); or
        * ``"bounded"``: at least ``min_values`` outputs (8) in the batch, for any class-score kind (multi-label
          sigmoids in particular, which do not sum to 1; the value is the share in range, 1.0). An honest logit
          model almost never has every logit of a batch in ``[0, 1]``: absent labels get negative logits, confident
          ones logits beyond 1; ``min_values`` keeps a lone sample with a few small logits from counting.

        Kinds whose outputs are values, not class scores (regression), never match; nor do log-probabilities
        (``<= 0``, valid logits), nor outputs that are all exactly 0 or 1 (one-hot rows: the logits of a constant
        stand-in model as often as a fully saturated softmax). One host read in the common case (the range).
        """
        if not (self.class_scores and self.outputs_are_logits) or not out.is_floating_point() or out.numel() == 0:
            return None
        lo, hi = torch.stack(torch.aminmax(out.detach())).tolist()  # one host read
        if not (lo >= -atol and hi <= 1.0 + atol):
            return None
        if bool(((out == 0) | (out == 1)).all()):  # exact one-hot / 0-1 rows: a stand-in model's logits as often
            return None
        if self.exclusive_classes and out.ndim >= 2 and out.shape[1] >= 2:
            deviation = float((out.detach().double().sum(dim=1) - 1.0).abs().max())
            if deviation <= atol:
                return ProbabilityEvidence(
                    "softmax", deviation, "every output lies in [0, 1] and the class scores sum to 1 over the class "
                    f"axis (largest deviation {deviation:.2g}): softmax probabilities")
        if out.numel() < min_values:
            return None
        what = "per-class sigmoids" if self.exclusive_classes else "sigmoid probabilities"
        return ProbabilityEvidence("bounded", 1.0, f"all {out.numel()} outputs of the batch lie in [0, 1], which "
                                                   f"logits almost never do: {what}")

    def check_outputs(self, out: Tensor, name: str = "model output") -> None:
        """Refuse probability outputs (:meth:`probability_evidence`) when :attr:`outputs` is not declared: a loss on
        probabilities saturates (weak attacks) and a threshold on them is not the task's (a sigmoid of 0.6 read as
        a logit is "present" at threshold 0.5, so every label looks predicted): the numbers would be wrong.

        Refused: softmax outputs of exclusive classes (rows summing to 1: unambiguous), and bounded outputs of
        independent labels (multi-label sigmoids). Per-class sigmoids of an exclusive-class head are left to
        :func:`medadv.masking.check_probability_outputs` (a flag): bounded scores there are no proof, a fresh
        classifier's logits often all lie in ``[0, 1]``. A declared :attr:`outputs` is trusted: ``"probabilities"``
        are converted by :meth:`logits_model`, ``"logits"`` are read as they are."""
        if self.outputs_declared:
            return
        why = self.probability_evidence(out)
        if why is None or (why.kind == "bounded" and self.exclusive_classes):
            return
        raise ValueError(f"the {name} looks like probabilities, not logits ({why.text}): declare `outputs: "
                         f"probabilities` on the task (Python: {type(self).__name__}(..., "
                         "outputs=\"probabilities\")) if the model ends in a sigmoid or softmax, or remove that "
                         "layer; if these are logits, declare `outputs: logits`")

    def logits_from_outputs(self, out: Tensor) -> Tensor:
        """Logits from what the model returns (:attr:`outputs`), differentiably.

        ``"logits"``: ``out`` itself. ``"probabilities"``: exclusive classes (softmax) ``log p`` (valid logits:
        ``softmax(log p) = p``); independent labels (sigmoid) ``logit(p) = log p - log(1 - p)``. Probabilities are
        clamped to ``[eps, 1 - eps]`` first (``eps`` = the dtype's machine epsilon, 1.2e-7 in float32, so logits
        stay within about ±16; half-precision outputs of autocast are converted in float32): a saturated 0 or 1
        has an infinite logit, and the clamp keeps it finite (its gradient is then 0, as the sigmoid's or
        softmax's was).
        """
        if self.outputs == "logits":
            return out
        if out.dtype in (torch.float16, torch.bfloat16):  # autocast: half precision has eps 1e-3..8e-3 (logits ±5)
            out = out.float()
        eps = torch.finfo(out.dtype).eps if out.is_floating_point() else 1e-7
        if self.exclusive_classes:
            return out.clamp_min(eps).log()
        p = out.clamp(eps, 1.0 - eps)
        return p.log() - (-p).log1p()

    def with_outputs(self, outputs: str | None) -> Task:
        """A copy of this task reading ``outputs`` (``"logits"``, ``"probabilities"`` or ``None``: not declared),
        every other setting kept; this one is not modified."""
        new = copy.copy(self)
        new._set_outputs(outputs)
        return new

    def logits_model(self, model: nn.Module) -> nn.Module:
        """The model as this task reads it: ``model`` itself for logits, else a wrapper returning
        :meth:`logits_from_outputs` of its probabilities (idempotent: a wrapped model is not wrapped again).
        The attacks' entry point and :func:`~medadv.evaluate` call it; the wrapper holds no parameters of its own,
        and its submodule names are the model's (a Grad-CAM layer keeps its name)."""
        if self.outputs == "logits" or isinstance(model, LogitsOfProbabilities):
            return model
        return LogitsOfProbabilities(model, self)

    def forward(self, model: nn.Module, x: Tensor) -> Tensor:
        """The logits of ``model`` on ``x`` as this task reads them: :func:`~medadv.runtime.forward_tensor` of
        :meth:`logits_model` (declared probabilities converted, once: a model already wrapped is not converted
        again). Grad mode and the model's mode are the caller's; the output is not checked for undeclared
        probabilities (:meth:`validate` does that)."""
        from ..runtime import forward_tensor

        return forward_tensor(self.logits_model(model), x)

    # --- validation -------------------------------------------------------------------------------
    @abstractmethod
    def validate_logits(self, logits: Tensor) -> None:
        """Raise ``ValueError`` if ``logits`` cannot be the output of a model for this task."""

    @abstractmethod
    def validate_labels(self, logits: Tensor, y: Tensor, name: str = "y") -> None:
        """Raise ``ValueError``/``TypeError`` if ``y`` does not fit ``logits`` for this task."""

    def validate(self, logits: Tensor, y: Tensor | None, name: str = "y") -> None:
        """Refuse a model output this task cannot read (its shape, NaN/Inf, probabilities when :attr:`outputs` is not
        declared: :meth:`check_outputs`) and labels ``y`` that do not fit it. Every attack calls it on its
        first model output, before any step; :func:`~medadv.evaluate` on each clean batch."""
        if not isinstance(logits, Tensor):
            raise TypeError(f"model output must be a Tensor of logits, got {type(logits).__name__} "
                            "(wrap models that return tuples or dicts so that forward returns the logits)")
        self.validate_logits(logits)
        if y is not None:
            if not isinstance(y, Tensor):
                raise TypeError(f"`{name}` must be a torch.Tensor, got {type(y).__name__}")
            self.validate_labels(logits, y, name)
        self.check_outputs(logits)  # after the shapes: a label of the wrong shape is the more specific mistake

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

    def __repr__(self) -> str:
        """``Name(param=value, ...)`` from ``__init__``'s parameters stored under their own names (the built-in kinds
        write their own); a parameter stored under another name is left out."""
        params = [p.name for p in inspect.signature(type(self).__init__).parameters.values()
                  if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        shown = ", ".join(f"{k}={getattr(self, k)!r}" for k in params if k in vars(self))
        return f"{type(self).__name__}({shown})"

    # --- hooks of evaluation, data, report and studies (defaults fit any task) ----------------------------------------
    def parse_labels(self, y: Tensor, x: Tensor) -> Tensor:
        """Labels as this task reads them, from what a data loader yields (``evaluate()`` calls it per batch).

        The default keeps ``y``. Class-index tasks squeeze a singleton channel (``(N, 1)`` columns, MONAI's
        ``(N, 1, *spatial)`` label maps) and turn integral floats into int64; non-integral values are refused.
        """
        return y

    def input_box(self, lo: Any, hi: Any) -> Any:
        """The data box of this task's inputs for a range ``[lo, hi]`` (a config's ``threat.bounds``; ``None``:
        unbounded). The default is a plain :class:`~medadv.threats.Box`; a kind whose inputs carry channels that
        must not move (prompt codes) returns a box that pins them."""
        from ..threats import Box

        return Box.unbounded() if lo is None and hi is None else Box(lo, hi)

    def fixed_input_channels(self) -> int:
        """How many trailing input channels carry no image (a promptable model's prompt code): attacks that
        transform the whole input (VAFA's DCT quantisation, GAP's generator) refuse a task with any."""
        return 0

    def support_column(self, spatial_dims: int | None = None) -> str:
        """The toolkit support tables' column of this task (``adapters.support``): the kind's :attr:`name`;
        segmentation splits by ``spatial_dims``. A kind with no column in a toolkit's table is refused there."""
        return self.name

    def case_scores(self, logits: Tensor) -> Tensor | None:
        """Per-class scores a report case shows as bars (softmax, sigmoid), or ``None``."""
        return None

    def change_fraction(self, clean_pred: Tensor, adv_pred: Tensor) -> Tensor:
        """``(N,)`` share of the prediction's elements the attack changed (a report picks the most changed cases)."""
        n = clean_pred.shape[0]
        return (clean_pred != adv_pred).reshape(n, -1).double().mean(dim=1)

    def case_note(self, y: Tensor, clean_pred: Tensor, adv_pred: Tensor) -> str:
        """One line under a report case: the metric before → after the attack, for one sample (no batch dim)."""
        clean = self.outcome_of_pred(clean_pred.unsqueeze(0), y.unsqueeze(0))
        adv = self.outcome_of_pred(adv_pred.unsqueeze(0), y.unsqueeze(0))
        key = self.headline
        if clean is None or adv is None or key is None or key not in clean.columns:
            return ""
        before, after = float(clean.columns[key].double().mean()), float(adv.columns[key].double().mean())
        return f"{key.replace('_', ' ')} {before:.3g} → {after:.3g}"

    def outcome_of_pred(self, pred: Tensor, y: Tensor) -> Outcome | None:
        """The :class:`Outcome` of a hard prediction alone (no logits), or ``None`` when the task needs logits.
        Report cases call it on stored predictions."""
        return None

    def sample_group(self, y: Tensor, names: Sequence[Any]) -> Any:
        """The group one sample belongs to, named with ``names`` (the correlation study colours by it): its
        class, its set of present labels, its largest structure; ``None`` when the kind has none."""
        return None

    def num_groups(self, logits: Tensor) -> int:
        """How many classes / labels / outputs ``names`` has to name for this task (studies, reports)."""
        return int(logits.shape[1]) if logits.ndim >= 2 else 1

    def check_names(self, names: Any, logits: Tensor, name: str = "class_names") -> None:
        """Refuse ``names`` (a report's class names) that are not one string per class / label / output of
        ``logits`` (:meth:`num_groups`): a name list of another length would label the wrong bars and columns."""
        if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"`{name}` must be a list of strings, one per model output, got {names!r}")
        k = self.num_groups(logits)
        if len(names) != k:
            raise ValueError(f"`{name}` lists {len(names)} names, but the model has {k} outputs for "
                             f"{self!r} (shape {tuple(logits.shape)}): give one name per class or label, in output "
                             "order")

    # --- saliency attacks: the class a map explains, and flipping the prediction (defaults fit any task) --------------

    def explained_class(self, y: Tensor, scores: Tensor) -> Tensor:
        """``(N,)`` the class or label a saliency map explains when none is chosen, from the labels ``y`` and the
        per-sample class scores ``(N, K)``: the highest-scoring one (multi-class: the label)."""
        return scores.argmax(dim=1)

    def flip_goal(self, y: Tensor, label: Tensor, clean_logits: Tensor | None, targeted: bool) -> Tensor | None:
        """What flipping the prediction aims at, per sample (:meth:`flip_loss`, :meth:`flipped`): ``label`` is the
        explained class (:meth:`explained_class`). ``None`` (the default): leave ``y`` (untargeted) or reach it."""
        return None

    def flip_loss(self, logits: Tensor, y: Tensor, label: Tensor, goal: Tensor | None, targeted: bool) -> Tensor:
        """``(N,)`` a loss whose descent flips the prediction towards :meth:`flip_goal`; the default ascends the
        task loss (untargeted) or descends it towards the target ``y``."""
        loss = self.loss(logits, y)
        return loss if targeted else -loss

    def flipped(self, logits: Tensor, y: Tensor, label: Tensor, goal: Tensor | None, targeted: bool) -> Tensor:
        """``(N,)`` bool: the flip happened (default: :meth:`fooled`)."""
        return self.fooled(logits, y, targeted)

    @classmethod
    def config_schema(cls) -> type:
        """The pydantic model of this kind's ``task:`` section in a config.

        The default derives it from ``__init__``'s signature (its type hints and defaults) plus ``type`` and the
        report-only ``class_names``, so a new kind needs nothing more; the built-in kinds declare range checks.
        """
        from ..schema_base import task_schema_from_signature  # pydantic: loaded when a schema is asked for

        return task_schema_from_signature(cls, registered=cls.name in _REGISTRY)

    @classmethod
    def examples(cls, seed: int = 0) -> list[TaskExample]:
        """Small models with data for this kind, one per setting it covers (2-D and 3-D, one or several channels):
        the conformance suite runs every registered attack on each (tests, docs, :mod:`medadv.testing`)."""
        raise NotImplementedError(f"{cls.__name__} defines no examples (implement the classmethod `examples`)")

    @classmethod
    def example(cls, seed: int = 0) -> TaskExample:
        """The first of :meth:`examples`."""
        return cls.examples(seed)[0]


for _flat, (_group, _field) in FLAT_TRAITS.items():
    setattr(Task, _flat, _FlatTrait(_group, _field))


def _class_margin(logits: Tensor, y: Tensor) -> Tensor:
    """``z_y − max_{j≠y} z_j`` over the class axis (dim 1), element-grid shaped; ``y`` int64, element-grid shaped."""
    idx = y.unsqueeze(1)
    own = logits.gather(1, idx).squeeze(1)
    # the label's own logit masked out; max(dim).values, not amax: one index gets the gradient on ties
    others = logits.scatter(1, idx, float("-inf")).max(dim=1).values
    return own - others


# --- examples ---------------------------------------------------------------------------------------------------------
@dataclass
class TaskExample:
    """A small model with a batch for one task kind (:meth:`Task.example`; tests, docs and
    :func:`medadv.testing.check_task` / :func:`~medadv.testing.check_attack` run on it).

    Attributes:
        key: a short name of the setting (``"seg3d"``).
        task: the task instance.
        model: an ``nn.Module`` in eval mode whose output the task reads (BatchNorm and dropout included, so a
            check sees mode and running statistics change).
        x: ``(N, C, *spatial)`` inputs inside ``box``.
        y: labels for ``x``.
        box: the data range, ``(lo, hi)`` scalars or per-channel tensors (a :class:`~medadv.threats.Box`).
        target: labels for a targeted attack (a goal the task's targeted ``fooled`` test reads), or ``None``.
        eps: ``{"Linf": ..., "L2": ...}`` budgets in data units that fit the box.
    """

    key: str
    task: Task
    model: nn.Module
    x: Tensor
    y: Tensor
    box: Any = (0.0, 1.0)
    target: Tensor | None = None
    eps: dict[str, float] = field(default_factory=lambda: {"Linf": 0.1, "L2": 0.5})


class LogitsOfProbabilities(nn.Module):
    """A model that returns probabilities, seen as the logits its task reads (:meth:`Task.logits_model`).

    ``forward(x) = task.logits_from_outputs(model(x))``. It has no parameters or buffers of its own, and
    :meth:`named_modules` is the wrapped model's, so layer names, ``modules()`` and the mode and parameter
    bookkeeping of :func:`~medadv.runtime.attack_mode` see the user's model.
    """

    def __init__(self, model: nn.Module, task: Task) -> None:
        super().__init__()
        self.model = model
        self._task = task
        self.training = model.training  # the flag alone (train() would reset every submodule's own mode)

    def forward(self, x: Tensor) -> Any:
        out = self.model(x)
        # anything but one tensor is passed on: forward_tensor refuses it with its own message
        return self._task.logits_from_outputs(out) if isinstance(out, Tensor) else out

    def named_modules(self, memo: set[nn.Module] | None = None, prefix: str = "", remove_duplicate: bool = True
                      ) -> Any:
        return self.model.named_modules(memo, prefix, remove_duplicate)


def tiny_net(in_channels: int, outputs: int, ndim: int, dense: bool, seed: int = 0) -> nn.Module:
    """A tiny conv net for examples: BatchNorm (running statistics must not move under attack), dropout (eval
    mode must hold) and a smooth activation (saliency attacks differentiate an input gradient again).
    ``dense``: ``outputs`` channels at every position; else ``outputs`` values per sample."""
    torch.manual_seed(seed)
    conv = nn.Conv2d if ndim == 2 else nn.Conv3d
    bn = nn.BatchNorm2d if ndim == 2 else nn.BatchNorm3d
    layers: list[nn.Module] = [conv(in_channels, 6, 3, padding=1), bn(6), nn.Softplus(), nn.Dropout(0.2)]
    if dense:
        layers.append(conv(6, outputs, 1))
    else:
        layers += [nn.AdaptiveAvgPool2d(1) if ndim == 2 else nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(6, outputs)]
    return nn.Sequential(*layers).eval()


# --- the registry of task kinds ---------------------------------------------------------------------------------------
_REGISTRY: dict[str, type[Task]] = {}
#: every Task subclass defined, registered or not (weakly: a class defined in a test goes away with it)
_DEFINED: list[weakref.ref[type[Task]]] = []
T = TypeVar("T", bound=type[Task])


def register_task(name: str) -> Callable[[T], T]:
    """Class decorator: make a :class:`Task` subclass a task kind named ``name`` (lower case).

    The name is the class's :attr:`Task.name`, a config's ``task.type`` and what ``medadv tasks`` lists;
    ``get_task(name, **kwargs)`` builds it.
    """
    key = name.lower()

    def deco(cls: T) -> T:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"register_task({name!r}) decorates Task subclasses, got {cls!r}")
        if key in _REGISTRY and _REGISTRY[key] is not cls:
            raise ValueError(f"task kind {name!r} is already registered to {_REGISTRY[key].__name__}")
        cls.name = key
        _REGISTRY[key] = cls
        return cls

    return deco


def task_class(name: str) -> type[Task]:
    """The registered task class for ``name`` (case-insensitive; unknown names get the closest one)."""
    key = str(name).lower()
    if key not in _REGISTRY:
        c = closest(key, _REGISTRY)
        hint = f" — did you mean {c!r}?" if c else ""
        raise InvalidParameterError(f"unknown task kind {name!r}{hint} Available: {', '.join(_REGISTRY)}")
    return _REGISTRY[key]


def get_task(name: str, **params: Any) -> Task:
    """Build a registered task kind by name, e.g. ``get_task("segmentation", num_classes=4)``.

    Unknown parameters are refused with the closest valid name.
    """
    cls = task_class(name)
    accepted = [p for p in inspect.signature(cls.__init__).parameters.values()
                if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = [p.name for p in accepted]
    for k in params:
        if k not in names:
            c = closest(k, names)
            hint = f" — did you mean `{c}`?" if c else ""
            raise InvalidParameterError(f"unknown parameter `{k}` for task {cls.name!r}{hint} "
                                        f"(parameters: {', '.join(names) or 'none'})")
    return cls(**params)


def available_tasks() -> list[str]:
    """The registered task kinds, in registration order (the built-in ones first)."""
    return list(_REGISTRY)


def registered_task_classes() -> list[type[Task]]:
    """The registered task classes, in registration order."""
    return list(_REGISTRY.values())


def task_family(task: object) -> str | None:
    """The registered kind ``task`` is (its nearest registered class along the MRO: a subclass of
    ``Segmentation`` is ``"segmentation"``), or ``None`` for a task of no registered kind."""
    for cls in type(task).__mro__:
        name = getattr(cls, "name", None)
        if isinstance(name, str) and _REGISTRY.get(name) is cls:
            return name
    return None


def robust_metric_columns() -> dict[str, str]:
    """``{robust_metric_name: result column}`` of every registered kind (``accuracy`` → ``correct``): what the
    column of a robust metric named in a result row (``auto``'s ``attack_metric``) is."""
    return {cls.robust_metric_name: cls.robust_metric_column for cls in _REGISTRY.values()
            if cls.robust_metric_column is not None}


def _known_classes() -> list[type[Task]]:
    """The registered kinds, in registration order, then every other Task subclass defined so far (a kind used by
    dotted path in a config, a user's class passed to ``evaluate()``)."""
    defined = [c for c in (r() for r in _DEFINED) if c is not None]
    return list(dict.fromkeys([*_REGISTRY.values(), *defined]))


def headline_columns() -> tuple[str, ...]:
    """The headline per-sample column of every registered kind (without ``clean_``/``adv_``), in registration order,
    then those of the other Task classes defined: the column a report, a plot or the pytest plugin reads from result
    rows."""
    return tuple(dict.fromkeys(cls.headline for cls in _known_classes() if cls.headline is not None))


def lower_is_better(column: str) -> bool:
    """Whether ``column`` is the headline of a kind where lower is better (an error)."""
    return any(cls.headline == column and not cls.higher_is_better for cls in _known_classes())
