"""The schema of the ``medadv evaluate`` YAML config (pydantic v2): types, ranges, unknown keys.

One model per section. Every section refuses keys it does not declare, naming the closest valid one
(``unknown key `bacth_size` in the config; did you mean `batch_size`?``); booleans must be real booleans
(``hd95: 'false'`` is an error, not true); integers must be integers; budgets accept numbers and
fractions written as text (``8/255``). Attack entries carry the attack's own parameters: those are
checked by the attack's declarations when the attack is built (:func:`medadv.attacks.base.get_attack`),
not here.

:func:`validate_config` turns a mapping into a :class:`Config` or raises :class:`ConfigError` whose
message has one line per mistake, each naming where it is (``data.n``, ``attacks[1]``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Strict,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .schema_base import (
    FLOAT32_MAX,
    Bool,
    Budget,
    ClassNames,
    ConfigError,
    CsvData,
    DatalistData,
    FilesData,
    Int,
    Number,
    PairRule,
    Spacing,
    TransformEntry,
    _given,
    _option,
    _pick,
    _Section,
    parse_budget,
)
from .schema_base import (
    task_schema_from_signature as _schema_from_signature,
)
from .threats import MAX_BUDGET_FRACTION

__all__ = ["ConfigError", "MultiClassTask", "MultiLabelTask", "SegmentationTask", "task_schema_from_signature", "PairRule",
           "FLOAT32_MAX", "Budget", "Int", "Bool", "Number", "Spacing", "ClassNames", "Config", "AttackPlan", "AttackEntry", "ModelSection", "TrainSection", "ReportSection", "entry_label", "MODEL_KINDS", "TaskSection", "DataSection",
           "DATA_SOURCES", "FILE_SOURCES", "TransformEntry", "FilesData", "DatalistData", "CsvData", "InferenceSection",
           "ThreatSection", "MAX_BUDGET_FRACTION", "parse_budget", "validate_config", "validate_section", "format_errors"]


# --- value types (defined in medadv.schema_base, below the rooms that validate with them; re-exported) -----------
def _task_types() -> tuple[str, ...]:
    from .tasks import available_tasks

    return tuple(available_tasks())


#: the registered task kinds (:func:`medadv.tasks.available_tasks`) when the schema was built; a config's
#: ``task.type`` may also name a Task class by dotted path (``package.module:Class``, with ``allow_code``)
TASK_TYPES = _task_types()
MODEL_KINDS = ("builder", "monai", "torchvision", "torchscript", "zoo")
DATA_SOURCES = ("mni152", "synthetic", "npz", "files", "datalist", "csv")
FILE_SOURCES = ("files", "datalist", "csv")  # read through MONAI transforms, streamed batch by batch


# --- sections ------------------------------------------------------------------------------------------------------
class ModelSection(_Section):
    """The network: exactly one of ``builder``, ``monai``, ``torchvision``, ``torchscript``, ``zoo``; then weights.

    * ``builder``: a :mod:`medadv.models` builder (``small_unet``), ``path/to/file.py:Name`` (a class or a
      function returning an ``nn.Module``, in a file relative to the config's folder) or
      ``package.module:function`` (importable from here);
    * ``monai``: a network of ``monai.networks.nets`` by name (``UNet``);
    * ``torchvision``: a torchvision model builder by name (``resnet18``), with no download;
    * ``torchscript``: a file written by ``torch.jit.save`` (architecture and weights in one);
    * ``zoo``: a published pretrained model of :mod:`medadv.models.zoo` by name (``deepbet``), weights from an
      installed package (not code: no ``allow_code``).

    ``kwargs`` are the builder's keyword arguments; ``checkpoint`` a state-dict file (or a mapping holding
    one under ``state_dict``/``model_state_dict``/``model``) loaded strictly after ``strip_prefix`` is
    removed from its keys; ``seed`` draws the initial weights (default: the config's ``seed``).
    """

    builder: str | None = Field(None, min_length=1)
    monai: str | None = Field(None, min_length=1)
    torchvision: str | None = Field(None, min_length=1)
    torchscript: str | None = Field(None, min_length=1)
    zoo: str | None = Field(None, min_length=1)  # medadv.models.zoo by name
    kwargs: dict[str, Any] = {}
    checkpoint: str | None = Field(None, min_length=1)
    strip_prefix: str | None = Field(None, min_length=1)
    seed: Int | None = None
    name: str | None = Field(None, min_length=1)  # the model's name in reports and studies
    train: TrainSection | None = None  # train (or fine-tune) the network on data before it is evaluated

    @model_validator(mode="after")
    def _one_network(self) -> ModelSection:
        given = [k for k in MODEL_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            listed = ", ".join(f"`{k}`" for k in MODEL_KINDS)
            got = f"; got {' and '.join(f'`{k}`' for k in given)}" if given else ""
            raise PydanticCustomError("one_of", "needs exactly one of {listed} naming the network{got}",
                                      {"listed": listed, "got": got, "options": ",".join(MODEL_KINDS)})
        if self.torchscript is not None and self.kwargs:
            raise PydanticCustomError("one_of", "`kwargs` does not go with `torchscript`: a TorchScript file "
                                      "holds its architecture and arguments", {"options": ""})
        if self.strip_prefix is not None and self.checkpoint is None:
            raise PydanticCustomError("one_of", "`strip_prefix` applies to the keys of a `checkpoint`, and none "
                                      "is given", {"options": ""})
        return self

    def network(self) -> tuple[str, str]:
        """``(kind, name)``: which of ``builder``/``monai``/``torchvision``/``torchscript`` and its value."""
        for kind in MODEL_KINDS:
            value = getattr(self, kind)
            if value is not None:
                return kind, value
        raise AssertionError("validated: one network is given")


# the built-in kinds' `task:` sections live with the kinds (Task.config_schema); re-exported here
from .tasks.classification import MultiClassTask, MultiLabelTask  # noqa: E402
from .tasks.segmentation import SegmentationTask  # noqa: E402


class Mni152Data(_Section):
    source: Literal["mni152"]
    n: Int = Field(8, ge=1)
    kwargs: dict[str, Any] = {}


class SyntheticData(_Section):
    source: Literal["synthetic"]
    n: Int = Field(8, ge=1)
    kwargs: dict[str, Any] = {}


class NpzData(_Section):
    source: Literal["npz"]
    path: str = Field(min_length=1)
    n: Int | None = Field(None, ge=1)  # the first n cases; all when absent


def _roi_size(value: Any) -> Any:
    items = value if isinstance(value, list) else [value]
    if not 1 <= len(items) <= 3 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in items):
        raise PydanticCustomError("roi", "must be an integer >= 1 or a list of them, one per spatial axis (voxels); "
                                  "got {given}", {"given": _given(value)})
    return value


class InferenceSection(_Section):
    """Whole volumes through MONAI sliding-window inference (:class:`medadv.models.sliding.SlidingWindow`):
    the model sees ``roi_size`` windows, attacks and metrics see the whole volume."""

    roi_size: Annotated[int | list[int], BeforeValidator(_roi_size)]
    overlap: Number = Field(0.5, ge=0.0, lt=1.0)
    sw_batch_size: Int = Field(4, ge=1)
    mode: Annotated[str, _option(("gaussian", "constant"))] = "gaussian"
    checkpoint: Bool = True  # recompute each window's activations in the backward pass (memory of one window)


class ThreatSection(_Section):
    norm: Annotated[str, _option(("linf", "l2"))] = "linf"
    # required, but may be null (unbounded data)
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None
    eps: Budget | None = None

    @field_validator("bounds")
    @classmethod
    def _ordered(cls, b: list[float] | None) -> list[float] | None:
        if b is not None and not (math.isfinite(b[0]) and math.isfinite(b[1]) and b[0] < b[1]):
            raise PydanticCustomError("bounds", "must be [lo, hi] with finite lo < hi, or null; got {given}",
                                      {"given": b})
        if b is not None and max(abs(b[0]), abs(b[1])) > FLOAT32_MAX:  # the box of float32 inputs
            raise PydanticCustomError("bounds", "must lie within ±3.4e38 (the float32 range of the inputs); got "
                                      "{given}", {"given": b})
        return b


#: an L∞ budget above this fraction of the data range (``hi - lo``) is refused unless ``allow_large_budgets``
def _check_budget_scale(threat: ThreatSection, budgets: Sequence[float] | None, allow: bool,
                        norm: str | None = None) -> None:
    """Refuse an L∞ budget larger than :data:`MAX_BUDGET_FRACTION` of the data range (the rule of
    :func:`medadv.threats.check_budget_scale`, said here as a config error naming the key): a budget in the wrong units
    (``8`` meant as 8/255 on data in [0, 1]) makes the ball the whole box, and its results mean nothing.

    ``norm`` is the ball's norm when it is not ``threat.norm`` (an ``attacks`` entry's own ``norm:``). Not for L2 (its
    norm sums over every element, so no single element's range bounds it) nor unbounded data.
    """
    if allow or threat.bounds is None or (norm or threat.norm) != "linf":
        return
    lo, hi = threat.bounds
    given = [(f"budgets[{i}]", b) for i, b in enumerate(budgets or ())]
    if threat.eps is not None:
        given.append(("threat.eps", threat.eps))
    for where, eps in given:
        if eps > MAX_BUDGET_FRACTION * (hi - lo):
            raise PydanticCustomError(
                "large_budget", "`{where}` is {eps}, more than half the data range [{lo}, {hi}] (`threat.bounds`): "
                "budgets are in data units, e.g. use 8/255 for 8 on a 0-255 scale; set `allow_large_budgets: true` "
                "if you mean it", {"where": where, "eps": f"{eps:g}", "lo": f"{lo:g}", "hi": f"{hi:g}"})


def _attack_param_names(name: str) -> tuple[str, ...]:
    """The parameters the registered attack ``name`` declares; ``()`` for an unknown name (refused, with the closest
    valid one, when the attacks are built)."""
    from .attacks.base import attack_class
    from .params import InvalidParameterError

    try:
        return tuple(attack_class(name).param_names())
    except InvalidParameterError:
        return ()


def _check_attack_budgets(threat: ThreatSection, budgets: Sequence[float] | None, entries: Sequence[AttackEntry],
                          allow: bool) -> None:
    """:func:`_check_budget_scale` on the config's budgets and on every ``attacks`` entry, each entry under the norm
    of its own ball (its ``norm:``, else the threat's): an entry of another norm and no budgets of its own runs the
    config's budgets in its own norm."""
    _check_budget_scale(threat, budgets, allow)
    for entry in entries:
        norm = entry.threat_norm(_attack_param_names(entry.name)) if entry.norm is not None else None
        if entry.budgets is not None:
            _check_budget_scale(threat, entry.budgets, allow, norm)
        elif norm is not None and norm != threat.norm:
            _check_budget_scale(threat, budgets, allow, norm)


def _dump_without_unset(handler: SerializerFunctionWrapHandler, value: BaseModel, keys: tuple[str, ...]) -> Any:
    """``value`` dumped by ``handler`` without the keys of ``keys`` that are ``None``: optional keys added after configs
    were first dumped leave the dump, and so the config's fingerprint and the trained-weights cache keys, as they
    were when they are not given."""
    out = handler(value)
    if isinstance(out, dict):
        for key in keys:
            if out.get(key, 0) is None:
                del out[key]
    return out


class AttackEntry(BaseModel):
    """``{name: pgd, id: pgd-50, steps: 50}`` or a bare ``pgd``; the other keys are the attack's
    parameters, checked by its declarations when it is built. ``id`` names the entry (``label`` too, for
    attacks that have no ``label`` parameter of their own: for the saliency attacks ``label`` is the class
    whose map is attacked). ``norm`` (``linf`` or ``l2``) is the norm of this entry's ε-ball instead of
    ``threat.norm`` (DeepFool in L2 beside FGSM in L∞), or the attack's own ``norm`` parameter for an attack that
    declares one (DAG's step normalisation)."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    id: str | None = Field(default=None, min_length=1)
    label: Any = None
    # this entry's budgets instead of the config's (a paper's "PGD ε=2/255 with 1 step, ε=4/255 with 4")
    budgets: Annotated[list[Budget], Field(min_length=1)] | None = None
    # this entry's target instead of the config's (DAG type A, B and C side by side)
    target: str | None = Field(None, min_length=1)
    # this entry's ε-ball norm instead of `threat.norm` (kept out of `params()`, unless the attack has its own `norm`)
    norm: Annotated[str, _option(("linf", "l2"))] | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        if isinstance(data, str):  # `- fgsm` is `- {name: fgsm}`
            return {"name": data}
        if isinstance(data, Mapping) and not data.get("name"):
            raise PydanticCustomError("attack_name", "each entry of `attacks` needs a `name`, got {given}",
                                      {"given": dict(data)})
        return data

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _dump_without_unset(handler, self, ("norm",))

    def params(self) -> dict[str, Any]:
        """The attack's own parameters (every key but ``name``, ``id``, ``budgets``, ``target``, ``norm`` and an
        entry-naming ``label``)."""
        return dict(self.model_extra or {})

    def threat_norm(self, attack_params: Sequence[str]) -> str | None:
        """The norm of this entry's ε-ball (``None``: the threat's), given the parameters the attack declares: an
        attack with a ``norm`` parameter of its own (DAG) takes ``norm`` as that parameter, not as its ball's."""
        return None if "norm" in attack_params else self.norm

    def entry_name(self, attack_params: Sequence[str], default: str) -> tuple[str, dict[str, Any]]:
        """``(name of the entry, the attack's parameters)``: ``label`` goes to the attack when it declares one."""
        params = self.params()
        if "norm" in attack_params and self.norm is not None:  # the attack's own parameter, not its ball's norm
            params["norm"] = self.norm
        if "label" in attack_params:
            if self.label is not None:
                params["label"] = self.label
            return self.id or default, params
        if self.label is not None and not isinstance(self.label, str):
            raise ValueError(f"`label` of the `attacks` entry {self.name!r} names the entry and must be a string, "
                             f"got {self.label!r}")
        return self.id or self.label or default, params


def entry_label(key: str) -> str:
    """The ``attacks`` entry an attack built from a config belongs to: its key without the ``@budget`` that ball
    attacks get (``pgd-4@0.0156863`` → ``pgd-4``; box attacks' keys are the label itself)."""
    return key.rsplit("@", 1)[0]


def _normalise(field: str, options: tuple[str, ...], aliases: Mapping[str, str]) -> Any:
    def before(value: Any) -> Any:
        if isinstance(value, Mapping) and field in value:
            value = dict(value)
            value[field] = _pick(value[field], options, aliases, field)
        return value

    return BeforeValidator(before)


def _tag(field: str, default: str) -> Discriminator:
    # not a mapping: any branch, whose error then says "must be a mapping"
    return Discriminator(lambda v: v.get(field) if isinstance(v, Mapping) else getattr(v, field, default),
                         custom_error_type="missing_" + field,
                         custom_error_message=f"needs `{field}`")


def is_code_path(value: Any) -> bool:
    """``task.type`` names a class by dotted path (``package.module:Class`` or ``package.module.Class``), not a kind."""
    return isinstance(value, str) and ("." in value or ":" in value)


class CustomTask(BaseModel):
    """A task class named by dotted path (or a kind registered after the schema was built): its parameters are
    checked against the class's own schema (:meth:`medadv.tasks.Task.config_schema`) once the class is known
    (a dotted path is imported only with ``allow_code``)."""

    model_config = ConfigDict(extra="allow")
    type: Annotated[str, Strict(), Field(min_length=3)]
    class_names: ClassNames | None = None


def task_schema_from_signature(cls: type, registered: bool | None = None) -> type[BaseModel]:
    """The config schema of a task class from its ``__init__`` signature (:func:`medadv.schema_base.task_schema_from_signature`);
    ``registered`` ``None``: whether ``cls.name`` is a registered kind is asked of the task registry."""
    if registered is None:
        registered = getattr(cls, "name", None) in _task_types()
    return _schema_from_signature(cls, registered=registered)


def _task_tag(v: Any) -> Any:
    t = v.get("type") if isinstance(v, Mapping) else getattr(v, "type", None)
    if is_code_path(t):
        return "custom"
    # a kind registered after this schema was built is checked by its own schema when the task is built
    return "custom" if isinstance(t, str) and t not in TASK_TYPES and t in _task_types() else t


def _normalise_task_type(value: Any) -> Any:
    if isinstance(value, Mapping) and "type" in value and not is_code_path(value["type"]):
        value = dict(value)
        value["type"] = _pick(value["type"], _task_types(), {"multi_class": "multiclass",
                                                             "multi_label": "multilabel"}, "type")
    return value


def _task_union() -> Any:
    """The union of every registered kind's schema, tagged by ``type``, and :class:`CustomTask`."""
    import functools as ft
    import operator

    from .tasks import registered_task_classes

    branches = [Annotated[cls.config_schema(), Tag(cls.name)] for cls in registered_task_classes()]
    branches.append(Annotated[CustomTask, Tag("custom")])
    return ft.reduce(operator.or_, branches)


TaskSection: Any = Annotated[  # built from the registry: a runtime type (mypy sees Any)
    _task_union(),
    Discriminator(_task_tag, custom_error_type="missing_type", custom_error_message="needs `type`"),
    BeforeValidator(_normalise_task_type),
]
DataSection = Annotated[
    Annotated[Mni152Data, Tag("mni152")] | Annotated[SyntheticData, Tag("synthetic")]
    | Annotated[NpzData, Tag("npz")] | Annotated[FilesData, Tag("files")]
    | Annotated[DatalistData, Tag("datalist")] | Annotated[CsvData, Tag("csv")],
    _tag("source", "npz"),
    _normalise("source", DATA_SOURCES, {}),
]


def _defense_entry(value: Any) -> Any:
    """``model.train.defense``: a training strategy by name or ``{name, eps, ...its parameters}``, checked by
    :func:`medadv.defenses.strategies.normalize_entry` (did-you-mean on an unknown name or parameter) and normalised
    to a mapping; ``none`` (clean training) is no defense. A strategy that trains in an ε-ball needs its ``eps``:
    the config's attacks do not lend theirs to training."""
    from .defenses.strategies import NONE, STUDY_KEYS, needs_threat, normalize_entry, strategy_classes

    if value is None:
        return None
    known = strategy_classes()
    try:
        entry = normalize_entry(value, known)
    except ValueError as e:
        raise PydanticCustomError("defense", "{why}", {"why": str(e)}) from None
    misplaced = sorted(k for k in STUDY_KEYS if k in entry and k not in ("name", "eps"))
    if misplaced:  # the defenses study's per-entry keys: here `model.train` holds them once
        keys = ", ".join(f"`{k}`" for k in misplaced)
        raise PydanticCustomError("defense", "{why}", {"why": f"{keys} of the training belong to `model.train` "
                                                               "itself, not to its `defense`"})
    name = entry["name"]
    if name == NONE:
        return None
    if needs_threat(known[name]) and "eps" not in entry:
        why = f"strategy {name!r} trains in an L∞ ε-ball: give `eps:` in data units, e.g. {{name: {name}, eps: 8/255}}"
        raise PydanticCustomError("defense", "{why}", {"why": why})
    return entry


class TrainSection(_Section):
    """``model.train``: fit the network to built-in data (``mni152``, ``synthetic``, ``npz``) with the config's task
    loss and Adam before anything is evaluated (after ``checkpoint``, so a checkpoint is fine-tuned). The weights are
    cached in medadv's cache folder under a hash of the network, the task, this section and the seed: a second run
    loads them.

    ``defense`` trains with a training strategy of :mod:`medadv.defenses` instead of plain supervised training
    (:class:`~medadv.defenses.trainer.AdversarialTrainer`): ``pgd_at``, ``trades``, ``maadvt`` need ``eps`` (the
    L∞ training ball, data units), ``mpadvt``/``vaft`` take the config's data box, ``gaussian`` its ``sigma``;
    e.g. ``defense: {name: pgd_at, eps: 8/255, steps: 4}``."""

    data: DataSection
    epochs: Int = Field(10, ge=1)
    lr: Number = Field(1e-2, gt=0.0)
    batch_size: Int = Field(16, ge=1)
    seed: Int = 0
    cache: Bool = True
    defense: Annotated[dict[str, Any] | None, BeforeValidator(_defense_entry)] = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _dump_without_unset(handler, self, ("defense",))

    @field_validator("data")
    @classmethod
    def _tensor_source(cls, data: Any) -> Any:
        if data.source in FILE_SOURCES:
            raise PydanticCustomError("train_data", "must be a built-in source (mni152, synthetic "
                                      "or npz): the training set is held in memory; got source {source!r}",
                                      {"source": data.source})
        return data


ModelSection.model_rebuild()

_TAGS = set(TASK_TYPES) | set(DATA_SOURCES) | {"custom"}
_BRANCHES = {"float", "int", "str", "bool", "nullable", "constrained-float", "constrained-int"}  # union branch names pydantic puts in error locations


class AttackPlan(BaseModel):
    """What :func:`medadv.config.build_attacks` reads: ``threat``, ``budgets``, ``attacks`` (other keys ignored)."""

    model_config = ConfigDict(extra="ignore")
    threat: ThreatSection
    budgets: Annotated[list[Budget], Field(min_length=1)] | None = None
    attacks: Annotated[list[AttackEntry], Field(min_length=1)]
    allow_large_budgets: Bool = False

    @model_validator(mode="after")
    def _budget_scale(self) -> AttackPlan:
        _check_attack_budgets(self.threat, self.budgets, self.attacks, self.allow_large_budgets)
        return self

    def budget_list(self) -> list[float] | None:
        """``budgets``, else ``[threat.eps]``, else ``None`` (only box attacks can run)."""
        if self.budgets is not None:
            return list(self.budgets)
        return None if self.threat.eps is None else [self.threat.eps]


def _report_window(value: Any) -> Any:
    """``report.window``: a preset name (did-you-mean when misspelt) or ``[width, level]``, as the case
    figures accept it (:func:`medadv.report.windows.check_window`); numbers are kept as written."""
    from .report.windows import MODES, WINDOWS, check_window

    if isinstance(value, str):
        return _pick(value, (*MODES, *WINDOWS), {})
    try:
        check_window(value)
    except (TypeError, ValueError) as e:
        raise PydanticCustomError("window", "{reason}", {"reason": str(e).removeprefix("`window` ")}) from None
    return value


class ReportSection(_Section):
    """``report``: the HTML report's ``title`` and the heading of the evaluation's tables (``results``, e.g. a
    paper's "Table 1: white-box attacks"); each study's heading is its own ``title:``."""

    title: str | None = Field(None, min_length=1)
    results: str | None = Field(None, min_length=1)
    # the case figures' grey window (medadv.report.windows): a CT preset, auto, percentile or [width, level]
    window: Annotated[Any, AfterValidator(_report_window)] = None


class Config(_Section):
    """The whole ``medadv evaluate`` config."""

    model: ModelSection
    task: TaskSection
    data: DataSection
    threat: ThreatSection
    budgets: Annotated[list[Budget], Field(min_length=1)] | None = None  # data units; default [threat.eps]
    attacks: Annotated[list[AttackEntry], Field(min_length=1)]
    target: str | None = Field(None, min_length=1)  # background | least_likely | package.module:function
    batch_size: Int = Field(8, ge=1)
    output: str = Field("medadv-results", min_length=1)
    seed: Int = 0
    hd95: Bool = False
    spacing: Spacing | Annotated[list[Spacing], Field(min_length=1)] | None = None  # voxel spacing for HD95 (mm)
    inference: InferenceSection | None = None  # sliding-window inference over whole volumes
    save_adversarial: Bool = False  # write the adversarial examples with the input's geometry
    cases: Int = Field(2, ge=0)  # report.html draws the k most-damaged samples of each attack (0: none)
    allow_code: Bool = False  # let builders outside medadv/MONAI/torchvision and files elsewhere run
    allow_large_budgets: Bool = False  # L∞ budgets above half the data range (see MAX_BUDGET_FRACTION)
    # the papers' studies (medadv.studies), each entry checked by its study's own schema in load_config
    studies: Annotated[list[Any], Field(min_length=1)] | None = None
    # more networks, by name, for the studies that compare models (transfer, models, ...): the studies see
    # {model's name: model, **models}
    models: dict[str, ModelSection] | None = None
    report: ReportSection | None = None

    budget_list = AttackPlan.budget_list

    @model_validator(mode="after")
    def _budget_scale(self) -> Config:
        _check_attack_budgets(self.threat, self.budgets, self.attacks, self.allow_large_budgets)
        return self


# --- errors --------------------------------------------------------------------------------------------------------
def _where(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TAGS or part in _BRANCHES or "[" in part or part.startswith("function-"):
            continue  # union branches and tags pydantic adds to the location: not keys of the config
        else:
            out += f".{part}" if out else part
    return out


_TYPE_TEXT = {
    "int_type": "an integer", "int_from_float": "an integer", "int_parsing": "an integer",
    "bool_type": "true or false (a YAML boolean, not text)", "bool_parsing": "true or false",
    "float_type": "a number", "float_parsing": "a number", "string_type": "text",
    "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
}
_BOUND_TEXT = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _message(err: Mapping[str, Any], where: str) -> str | None:
    kind, ctx, given = err["type"], err.get("ctx") or {}, err.get("input")
    subject = f"`{where}`" if where else "the config"
    if kind == "unknown_key":
        return f"unknown key `{ctx['key']}` in {subject}{ctx['hint']} (valid keys: {ctx['valid']})"
    if kind == "option":
        field = f"{where}.{ctx['field']}" if where and ctx.get("field") else where or ctx.get("field", "")
        return f"`{field}` must be one of {ctx['listed']}; got {ctx['given']}{ctx['hint']}"
    if kind == "defense":
        return f"{subject}: {err['msg']}"
    if kind in ("transform", "large_budget"):
        return f"{subject}: {err['msg']}" if kind == "transform" else err["msg"]
    if kind == "attack_name":
        return err["msg"] + (f" (in `{where}`)" if where else "")
    if kind == "missing":
        return f"{subject} is required" if where else "a required key is missing"
    if kind in ("missing_type", "missing_source"):
        field = kind.removeprefix("missing_")
        return f"{subject} needs `{field}`"
    if kind in _TYPE_TEXT:
        return f"{subject} must be {_TYPE_TEXT[kind]}; got {_given(given)}"
    if kind in _BOUND_TEXT:
        bound = next(iter(ctx.values()))
        return f"{subject} must be {_BOUND_TEXT[kind]} {bound}; got {_given(given)}"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return f"{subject} must be a non-empty list; got {_given(given)}"
    if kind in ("too_short", "too_long") and isinstance(given, list):
        return f"{subject} must have {'at least' if kind == 'too_short' else 'at most'} " \
               f"{ctx.get('min_length', ctx.get('max_length'))} entries; got {_given(given)}"
    if kind == "literal_error":
        return f"{subject} must be {ctx.get('expected')}; got {_given(given)}"
    return f"{subject} {err['msg'][0].lower()}{err['msg'][1:]}" if err["msg"] else f"{subject} is invalid"


def format_errors(exc: ValidationError, prefix: Sequence[str | int] = ()) -> list[str]:
    """One line per mistake, each naming its place in the config (``data.n``, ``attacks[0]``)."""
    lines: list[str] = []
    errors = exc.errors(include_url=False)
    # a value refused by every branch of a union gives one error per branch: keep the first of each place
    seen: set[str] = set()
    for err in errors:
        where = _where([*prefix, *err["loc"]])
        if where in seen and err["type"] not in ("unknown_key", "missing", "large_budget"):
            continue
        seen.add(where)
        msg = _message(err, where)
        if where == "attacks" and err["type"] == "too_short":
            msg = f"`attacks` must be a non-empty list such as [{{name: pgd, steps: 10}}]; got {_given(err['input'])}"
        if msg and msg not in lines:
            lines.append(msg)
    return lines


@functools.cache
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def validate_section(tp: Any, data: Any, where: Sequence[str | int] = ()) -> Any:
    """``data`` checked against ``tp`` (a section model such as :class:`ThreatSection`, or
    :data:`TaskSection`), errors as :class:`ConfigError` located under ``where``."""
    try:
        return _adapter(tp).validate_python(data)
    except ValidationError as e:
        raise ConfigError(format_errors(e, where)) from None


def validate_config(data: Any) -> Config:
    """The whole config, checked; :class:`ConfigError` lists every mistake (one line each)."""
    if not isinstance(data, Mapping):
        raise ConfigError([f"the config must be a YAML mapping of sections (model, task, data, ...); "
                           f"got {_given(data)}"])
    nul = _nul_string(data)
    if nul is not None:
        raise ConfigError([f"`{_where(nul)}` holds a NUL character (\\x00): not a valid name or path" if nul else
                           "a key of the config holds a NUL character (\\x00)"])
    return validate_section(Config, data)


def _nul_string(data: Any) -> tuple[str | int, ...] | None:
    """Where the first text holding a NUL character is (``()`` for a key), else ``None``; iterative, so
    that deeply nested junk cannot exhaust the stack."""
    todo: list[tuple[tuple[str | int, ...], Any]] = [((), data)]
    while todo:
        loc, value = todo.pop()
        if isinstance(value, str) and "\x00" in value:
            return loc
        if isinstance(value, Mapping):
            for k, v in value.items():
                if isinstance(k, str) and "\x00" in k:
                    return ()
                todo.append(((*loc, str(k)), v))
        elif isinstance(value, list | tuple):
            todo.extend(((*loc, i), v) for i, v in enumerate(value))
    return None

