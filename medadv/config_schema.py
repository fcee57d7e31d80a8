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
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    Strict,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from .params import InvalidParameterError, closest
from .threats import MAX_BUDGET_FRACTION

__all__ = ["ConfigError", "Config", "AttackPlan", "AttackEntry", "ModelSection", "TrainSection", "ReportSection", "entry_label", "MODEL_KINDS", "TaskSection", "DataSection",
           "DATA_SOURCES", "FILE_SOURCES", "TransformEntry", "FilesData", "DatalistData", "CsvData", "InferenceSection",
           "ThreatSection", "MAX_BUDGET_FRACTION", "parse_budget", "validate_config", "validate_section", "format_errors"]


class ConfigError(InvalidParameterError):
    """A config that does not fit the schema; ``messages`` holds one line per mistake."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages = list(messages)
        super().__init__("\n".join(self.messages))


# --- value types --------------------------------------------------------------------------------------------------
def parse_budget(value: Any) -> float:
    """A budget in data units: a number, or text such as ``8/255``, ``'4/255'`` or ``0.03``; finite, >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise PydanticCustomError("budget", "must be a number or a fraction such as 8/255; got {given}",
                                  {"given": _given(value)})
    if isinstance(value, str):
        try:
            # Fraction parses "8/255" exactly; float() of it is the correctly rounded 8/255
            out = float(Fraction(value.replace(" ", "")))
        except (ValueError, ZeroDivisionError, OverflowError):  # OverflowError: text such as 1e400
            raise PydanticCustomError("budget", "must be a number or a fraction such as 8/255; got {given}",
                                      {"given": _given(value)}) from None
    else:
        out = float(value)
    if not math.isfinite(out) or out < 0:
        raise PydanticCustomError("budget", "must be a finite number >= 0; got {given}", {"given": _given(value)})
    if out > FLOAT32_MAX:  # a perturbation of 1e308 overflows the float32 inputs it is added to
        raise PydanticCustomError("budget", "must be at most 3.4e38 (the largest float32: inputs are attacked in "
                                  "float32); got {given}", {"given": _given(value)})
    return out


#: the largest float32: budgets and bounds beyond it overflow the inputs they apply to
FLOAT32_MAX = 3.4028234663852886e38


def _pick(value: Any, options: tuple[str, ...], aliases: Mapping[str, str], field: str = "") -> str:
    """Case-insensitive choice among ``options`` (plus ``aliases``) with a did-you-mean when wrong."""
    table = {**{o: o for o in options}, **aliases}
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    hint = ""
    if isinstance(value, str) and (c := closest(value, table)) is not None:
        hint = f"; did you mean {table[c]!r}?"
    raise PydanticCustomError("option", "must be one of {listed}; got {given}{hint}",
                              {"listed": ", ".join(repr(o) for o in options), "given": _given(value),
                               "hint": hint, "field": field})


def _option(options: tuple[str, ...]) -> BeforeValidator:
    return BeforeValidator(lambda v: _pick(v, options, {}))


Budget = Annotated[float, BeforeValidator(parse_budget)]
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Number = Annotated[float, Strict()]  # ints are numbers too; strings are not
Spacing = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]  # a voxel's size: finite, > 0


def _distinct_names(value: list[str]) -> list[str]:
    seen: set[str] = set()
    twice = [v for v in value if v in seen or seen.add(v)]  # type: ignore[func-returns-value]
    if twice:
        raise PydanticCustomError("class_names", "names a class twice: '{name}'", {"name": twice[0]})
    return value


#: names of the classes / labels, shown in the report instead of indices (``[background, liver, tumour]``)
ClassNames = Annotated[list[Annotated[str, Strict(), Field(min_length=1)]], Field(min_length=1),
                       AfterValidator(_distinct_names)]

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
class _Section(BaseModel):
    """A mapping that refuses undeclared keys, naming the closest declared one."""

    model_config = ConfigDict(extra="forbid", validate_default=False)

    @model_validator(mode="wrap")
    @classmethod
    def _known_keys(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        if not isinstance(data, Mapping) or all(k in cls.model_fields for k in data):
            return handler(data)
        valid = list(cls.model_fields)
        errors: list[InitErrorDetails] = []
        meant: set[str] = set()
        for key in data:
            if key not in cls.model_fields:
                c = closest(str(key), valid)
                if c:
                    meant.add(c)
                errors.append(InitErrorDetails(type=PydanticCustomError(
                    "unknown_key", "unknown key `{key}`{hint} (valid keys: {valid})",
                    {"key": _clip(str(key)), "hint": f"; did you mean `{c}`?" if c else "", "valid": ", ".join(valid)}),
                    loc=(), input=data))
        # the known keys are checked too, so that every mistake is reported at once
        try:
            handler({k: v for k, v in data.items() if k in cls.model_fields})
        except ValidationError as e:
            errors += [InitErrorDetails(type=PydanticCustomError(err["type"], err["msg"], err.get("ctx")),
                                        loc=err["loc"], input=err["input"])
                       for err in e.errors(include_url=False)
                       # `bulder: x` is one mistake: not also "`builder` is required"
                       if not (err["type"] == "missing" and tuple(err["loc"]) in {(m,) for m in meant})
                       and not (err["type"] == "one_of"
                                and meant & set((err.get("ctx") or {}).get("options", "").split(",")))]
        raise ValidationError.from_exception_data(cls.__name__, errors)


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


class MultiClassTask(_Section):
    type: Literal["multiclass"]
    outputs: Annotated[str, _option(("logits", "probabilities"))] | None = None  # Task.outputs
    class_names: ClassNames | None = None  # one per model output, in output order (report only)


class MultiLabelTask(_Section):
    type: Literal["multilabel"]
    threshold: Number = Field(0.5, gt=0.0, lt=1.0)
    outputs: Annotated[str, _option(("logits", "probabilities"))] | None = None  # Task.outputs
    class_names: ClassNames | None = None  # one per label, in output order (default: a CSV's label columns)


class SegmentationTask(_Section):
    type: Literal["segmentation"]
    num_classes: Int = Field(ge=2)
    include_background: Bool = False
    ignore_index: Int | None = None
    loss: Annotated[str, _option(("ce", "dice", "dicece"))] = "ce"
    dice_threshold: Number = Field(0.5, ge=0.0, le=1.0)
    target_fraction: Number = Field(0.99, ge=0.0, le=1.0)
    squared_pred: Bool = False
    outputs: Annotated[str, _option(("logits", "probabilities"))] | None = None  # Task.outputs
    class_names: ClassNames | None = None  # num_classes names, background (class 0) first (report only)

    @model_validator(mode="after")
    def _one_name_per_class(self) -> SegmentationTask:
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise PydanticCustomError("class_names", "lists {n} `class_names` for num_classes = {k} (one name "
                                      "per class, background first)", {"n": len(self.class_names), "k": self.num_classes})
        return self


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


class TransformEntry(BaseModel):
    """One MONAI dictionary transform by class name with its arguments: ``{name: Spacingd, pixdim: [2, 2, 2]}``
    or a bare ``EnsureChannelFirstd``. The name is checked here (with the closest MONAI transform when it is
    not one); the arguments are checked against the class's signature by :func:`medadv.config.check_data`."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        if isinstance(data, str):  # `- EnsureChannelFirstd` is `- {name: EnsureChannelFirstd}`
            return {"name": data}
        if isinstance(data, Mapping) and not data.get("name"):
            raise PydanticCustomError("transform", "each entry of `transforms` needs the `name` of a MONAI "
                                      "transform, e.g. {example}; got {given}",
                                      {"given": _given(dict(data)), "example": "{name: Spacingd, pixdim: [1, 1, 1]}"})
        return data

    @model_validator(mode="after")
    def _monai_name(self) -> TransformEntry:
        from .data.sources import transform_name_error  # imports monai.transforms: only when one is named

        problem = transform_name_error(self.name)
        if problem:
            raise PydanticCustomError("transform", "{problem}", {"problem": problem})
        return self

    def args(self) -> dict[str, Any]:
        """The transform's keyword arguments (every key but ``name``)."""
        return dict(self.model_extra or {})


class _FileData(_Section):
    """What the file sources share: MONAI ``transforms``, the first ``n`` cases, DataLoader workers."""

    transforms: list[TransformEntry] | None = None
    n: Int | None = Field(None, ge=1)  # the first n cases; all when absent
    num_workers: Int = Field(0, ge=0)


def _path_list(value: Any) -> Any:
    items = value if isinstance(value, list) else [value]
    if value is not None and (not items or any(not isinstance(v, str) or not v for v in items)):
        raise PydanticCustomError("paths", "must be a path or a glob, or a non-empty list of them; got {given}",
                                  {"given": _given(value)})
    return value


def _id_template(value: Any) -> Any:
    if isinstance(value, str) and value.count("{id}") != 1:
        raise PydanticCustomError("pair", "must contain {id} once (the part of the name an image and its label "
                                  "share), e.g. '{id}_seg'; got {given}", {"given": _given(value)})
    return value


class PairRule(_Section):
    """``data.pair``: how image and label files pair (:mod:`medadv.data.sources`): the end of each path,
    suffixes (``.nii.gz``, ``.png`` ...) removed, matches the template, and ``{id}`` is the same for both:
    ``{image: "{id}_0000", label: "{id}"}`` (nnU-Net), ``{image: "{id}_t1", label: "{id}_seg"}`` (BraTS)."""

    image: Annotated[str, BeforeValidator(_id_template)] = "{id}"
    label: Annotated[str, BeforeValidator(_id_template)] = "{id}"


class FilesData(_FileData):
    """Image files (and label maps): each a path or a glob, relative to the config's folder. NIfTI, DICOM
    series folders, PNG/JPEG, NumPy; paired with ``labels`` by the ``pair`` rule (default: the same file name,
    suffixes aside)."""

    source: Literal["files"]
    images: Annotated[str | list[str], BeforeValidator(_path_list)]
    labels: Annotated[str | list[str] | None, BeforeValidator(_path_list)] = None
    pair: PairRule = PairRule()


class DatalistData(_FileData):
    """A MONAI (Medical Segmentation Decathlon) datalist JSON: ``{"validation": [{"image": ..., "label": ...}]}``."""

    source: Literal["datalist"]
    path: str = Field(min_length=1)
    key: str = Field("validation", min_length=1)
    base_dir: str | None = Field(None, min_length=1)  # image paths are relative to it; default: the JSON's folder


class CsvData(_FileData):
    """A CSV of image paths (relative to the CSV's folder) and labels: ``label_columns`` hold 0/1 per label
    (multi-label; default: every column but the image and id columns), or ``label_column`` one class index; for a
    task kind that reads numbers (``label_source = "values"``: regression) the label column(s) hold real values,
    one target per column."""

    source: Literal["csv"]
    path: str = Field(min_length=1)
    image_column: str = Field("image", min_length=1)
    label_columns: Annotated[list[str], Field(min_length=1)] | None = None
    label_column: str | None = Field(None, min_length=1)
    id_column: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_label_kind(self) -> CsvData:
        if self.label_columns is not None and self.label_column is not None:
            raise PydanticCustomError("one_of", "give `label_columns` (multi-label, 0/1 each) or `label_column` "
                                      "(one class index), not both", {"options": ""})
        return self


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
def _check_budget_scale(threat: ThreatSection, budgets: Sequence[float] | None, allow: bool) -> None:
    """Refuse an L∞ budget larger than :data:`MAX_BUDGET_FRACTION` of the data range (the rule of
    :func:`medadv.threats.check_budget_scale`, said here as a config error naming the key): a budget in the wrong units
    (``8`` meant as 8/255 on data in [0, 1]) makes the ball the whole box, and its results mean nothing.

    Not for L2 (its norm sums over every element, so no single element's range bounds it) nor unbounded data.
    """
    if allow or threat.bounds is None or threat.norm != "linf":
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


class AttackEntry(BaseModel):
    """``{name: pgd, id: pgd-50, steps: 50}`` or a bare ``pgd``; the other keys are the attack's
    parameters, checked by its declarations when it is built. ``id`` names the entry (``label`` too, for
    attacks that have no ``label`` parameter of their own: for the saliency attacks ``label`` is the class
    whose map is attacked)."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    id: str | None = Field(default=None, min_length=1)
    label: Any = None
    # this entry's budgets instead of the config's (a paper's "PGD ε=2/255 with 1 step, ε=4/255 with 4")
    budgets: Annotated[list[Budget], Field(min_length=1)] | None = None
    # this entry's target instead of the config's (DAG type A, B and C side by side)
    target: str | None = Field(None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        if isinstance(data, str):  # `- fgsm` is `- {name: fgsm}`
            return {"name": data}
        if isinstance(data, Mapping) and not data.get("name"):
            raise PydanticCustomError("attack_name", "each entry of `attacks` needs a `name`, got {given}",
                                      {"given": dict(data)})
        return data

    def params(self) -> dict[str, Any]:
        """The attack's own parameters (every key but ``name``, ``id`` and an entry-naming ``label``)."""
        return dict(self.model_extra or {})

    def entry_name(self, attack_params: Sequence[str], default: str) -> tuple[str, dict[str, Any]]:
        """``(name of the entry, the attack's parameters)``: ``label`` goes to the attack when it declares one."""
        params = self.params()
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


_SCALARS: dict[Any, Any] = {bool: Bool, int: Int, float: Number, str: Annotated[str, Strict()]}


def _field_type(hint: Any) -> Any:
    import types
    import typing

    if hint in _SCALARS:
        return _SCALARS[hint]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        import functools as ft
        import operator

        return ft.reduce(operator.or_, [_field_type(a) for a in args])
    return hint


def task_schema_from_signature(cls: type) -> type[BaseModel]:
    """The config schema of a task class from its ``__init__`` signature: one key per parameter (type hints become
    strict YAML types, defaults stay defaults, parameters without one are required), plus ``type`` and the
    report-only ``class_names``; unknown keys are refused with the closest valid one."""
    import inspect
    import typing

    from pydantic import create_model

    try:
        hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    except Exception:  # noqa: BLE001 -- unresolvable hints: the parameters are still declared, untyped
        hints = {}
    from .tasks import available_tasks

    registered = getattr(cls, "name", None) in available_tasks()
    fields: dict[str, Any] = {"type": (Literal[cls.name] if registered else str, ...),  # type: ignore[attr-defined]
                              "class_names": (ClassNames | None, None)}
    for p in inspect.signature(cls.__init__).parameters.values():  # type: ignore[misc]
        if p.name == "self" or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        hint = _field_type(hints.get(p.name, Any))
        fields[p.name] = (hint, ... if p.default is inspect.Parameter.empty else p.default)
    return create_model(f"{cls.__name__}Section", __base__=_Section, **fields)


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


class TrainSection(_Section):
    """``model.train``: fit the network to built-in data (``mni152``, ``synthetic``, ``npz``) with the config's task
    loss and Adam before anything is evaluated (after ``checkpoint``, so a checkpoint is fine-tuned). The weights are
    cached in medadv's cache folder under a hash of the network, the task, this section and the seed: a second run
    loads them."""

    data: DataSection
    epochs: Int = Field(10, ge=1)
    lr: Number = Field(1e-2, gt=0.0)
    batch_size: Int = Field(16, ge=1)
    seed: Int = 0
    cache: Bool = True

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
        _check_budget_scale(self.threat, self.budgets, self.allow_large_budgets)
        for entry in self.attacks:
            _check_budget_scale(self.threat, entry.budgets, self.allow_large_budgets)
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
        _check_budget_scale(self.threat, self.budgets, self.allow_large_budgets)
        for entry in self.attacks:
            _check_budget_scale(self.threat, entry.budgets, self.allow_large_budgets)
        return self


# --- errors --------------------------------------------------------------------------------------------------------
def _clip(text: str, limit: int = 80) -> str:
    """``text``, or its first ``limit`` characters and its length: an error never echoes a huge value whole."""
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"


def _given(value: Any) -> str:
    if isinstance(value, float | int | str | bool) or value is None:
        return f"{_clip(repr(value))} ({type(value).__name__})"
    if isinstance(value, list | tuple | dict) and len(repr(value)) <= 60:
        return repr(value)
    return type(value).__name__


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

