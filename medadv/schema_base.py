"""The building blocks of medadv's config schema that rooms below :mod:`medadv.config_schema` validate with.

:class:`ConfigError`, the strict value types (``Budget``, ``Int``, ``Bool``, ``Number``, ``Spacing``,
``ClassNames``), the section base :class:`_Section` (undeclared keys refused with the closest declared one), the
file data sources' sections (:class:`FilesData`, :class:`DatalistData`, :class:`CsvData`, :class:`TransformEntry`)
and :func:`task_schema_from_signature`. They live here, below :mod:`medadv.tasks`, :mod:`medadv.models` and
:mod:`medadv.data`, so that a task kind can declare its own ``task:`` schema and the data and model loaders can
raise :class:`ConfigError` without importing :mod:`medadv.config_schema` (which imports the task registry to build
the ``task:`` union): no import cycle between them (``tests/test_layout.py``). :mod:`medadv.config_schema`
re-exports every name.
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
    Field,
    ModelWrapValidatorHandler,
    Strict,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from .params import InvalidParameterError, closest

__all__ = ["ConfigError", "parse_budget", "FLOAT32_MAX", "Budget", "Int", "Bool", "Number", "Spacing", "ClassNames",
           "TransformEntry", "PairRule", "FilesData", "DatalistData", "CsvData", "task_schema_from_signature",
           "monai_transforms", "transform_name_error", "OUTPUTS_OPTION"]


class ConfigError(InvalidParameterError):
    """A config that does not fit the schema; ``messages`` holds one line per mistake."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages = list(messages)
        super().__init__("\n".join(self.messages))


# --- value types ------------------------------------------------------------------------------------------------
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


#: a task kind's ``outputs`` key (:attr:`medadv.tasks.Task.outputs`): what the model returns
OUTPUTS_OPTION = Annotated[str, BeforeValidator(lambda v: _pick(v, ("logits", "probabilities"), {}))]


# --- sections ---------------------------------------------------------------------------------------------------
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


# --- MONAI transforms by name (the file sources' `transforms`; re-exported by medadv.data.sources) -----------------
@functools.cache
def monai_transforms() -> dict[str, type]:
    """Every transform class of :mod:`monai.transforms` by name (imports MONAI on first use only)."""
    import monai.transforms as T

    return {n: o for n in dir(T) if not n.startswith("_") and isinstance(o := getattr(T, n), type)
            and issubclass(o, T.Transform)}


def transform_name_error(name: str) -> str | None:
    """Why ``name`` is not a MONAI dictionary transform (``None`` when it is one)."""
    from monai.transforms import MapTransform

    table = monai_transforms()
    if name not in table:
        c = closest(name, list(table))
        hint = f"; did you mean {c!r}?" if c and c != name else ""
        return (f"unknown MONAI transform {name!r}{hint} (monai.transforms lists them; "
                "dictionary transforms end in 'd')")
    if not issubclass(table[name], MapTransform):
        alt = next((n for n in (name + "d", name + "D") if n in table), None)
        use = f"name its dictionary version {alt!r}" if alt else "name a dictionary transform (a MapTransform)"
        return f"{name!r} is an array transform: {use}; the cases are dictionaries with keys image, label"
    return None


# --- a task kind's section from its signature -------------------------------------------------------------
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


def task_schema_from_signature(cls: type, registered: bool = False) -> type[BaseModel]:
    """The config schema of a task class from its ``__init__`` signature: one key per parameter (type hints become
    strict YAML types, defaults stay defaults, parameters without one are required), plus ``type`` and the
    report-only ``class_names``; unknown keys are refused with the closest valid one.

    ``registered``: whether ``cls.name`` is a registered kind (then ``type`` must be that name; else any dotted
    path). The caller says (:meth:`medadv.tasks.Task.config_schema` asks its registry): this module imports
    nothing above it. :func:`medadv.config_schema.task_schema_from_signature` asks the registry itself."""
    import inspect
    import typing

    from pydantic import create_model

    try:
        hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    except Exception:  # noqa: BLE001 -- unresolvable hints: the parameters are still declared, untyped
        hints = {}
    fields: dict[str, Any] = {"type": (Literal[cls.name] if registered else str, ...),  # type: ignore[attr-defined]
                              "class_names": (ClassNames | None, None)}
    for p in inspect.signature(cls.__init__).parameters.values():  # type: ignore[misc]
        if p.name == "self" or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        hint = _field_type(hints.get(p.name, Any))
        fields[p.name] = (hint, ... if p.default is inspect.Parameter.empty else p.default)
    return create_model(f"{cls.__name__}Section", __base__=_Section, **fields)


# --- error text ----------------------------------------------------------------------------------------------
def _clip(text: str, limit: int = 80) -> str:
    """``text``, or its first ``limit`` characters and its length: an error never echoes a huge value whole."""
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"


def _given(value: Any) -> str:
    if isinstance(value, float | int | str | bool) or value is None:
        return f"{_clip(repr(value))} ({type(value).__name__})"
    if isinstance(value, list | tuple | dict) and len(repr(value)) <= 60:
        return repr(value)
    return type(value).__name__
