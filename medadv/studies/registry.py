"""The study registry: one :func:`register_study` per study, and :func:`run_study` to run one by name.

A study is one module of :mod:`medadv.studies` holding three things, registered together by one decorator on
its config schema (a :class:`StudySpec` subclass)::

    @register_study("my_study", draw=draw_my_study, needs=classes_only, check_options={"steps": 1})
    class MyStudySpec(StudySpec):
        study: Literal["my_study"]
        steps: Int = Field(10, ge=1)

        def run(self, models, task, data, attacks, target_fn) -> StudyResult:
            return my_study(one_model(models, self), task, data, attacks, steps=self.steps)

- the **spec**: the ``studies:`` config entry (its options, checked by pydantic with did-you-mean errors) and
  :meth:`StudySpec.run`, which calls the study's function;
- the **computation**: a function returning a :class:`~medadv.studies.base.StudyResult`;
- the **report section**: ``draw(study, class_names) -> Section`` built from the public blocks of
  :mod:`medadv.report.blocks` (a study without one is shown as its raw rows).

``needs(task) -> str | None`` declares which task kinds the study supports: it returns why a task is refused
(``None``: supported) and :func:`run_study` refuses before any work with that reason. ``spatial_dims`` declares the
input ranks a study supports (:func:`run_study` refuses an ``(x, y)`` pair of another rank; on a loader the study
refuses its first batch before using it), ``single_range`` that it needs one data range (the study refuses a box
whose per-channel ranges have different widths before any work). ``check_options`` are the
options of a tiny run (:func:`medadv.testing.check_study` runs every study with them on every task kind).

The package :mod:`medadv.studies` imports every module in it, so a new module is registered without editing any
list; :func:`available_studies` names them and :func:`get_study` looks one up with a did-you-mean error.

The row contract
----------------
A study's ``rows`` are a tidy table, one flat dict per key combination, strict JSON: values are ``None``, bools,
ints, finite floats, strings or lists of them (a per-class vector); a non-finite number is written ``None``
(:func:`~medadv.studies.base.jsonable`), never ``NaN``. Column names, when a study has the quantity:

- ``attack`` (the entry name, e.g. ``pgd`` or ``pgd@0.0314``) and ``budget`` (ε in data units, ``None`` for an
  attack without one) on every row that belongs to one attack;
- ``model`` (a model's name in the ``{name: model}`` mapping) on the rows of multi-model studies (``models``,
  ``saliency``; ``transfer`` has ``surrogate`` and ``target``);
- the metric: ``clean`` and ``adv`` (the task's robust metric, named in ``meta["metric"]``), or ``metric`` /
  ``metric_clean`` and the study's own columns (``flip_probability``, ``fooling_rate``, ``drop_points``,
  ``cfps_clean`` / ``cfps_adv``, ``ssim``, ``certified`` / ``empirical``, ...);
- a condition column per extra key (``class``, ``severity``, ``corruption``, ``band``, ``split``, ``strategy``,
  ``radius``, ``kind``, ...).

Anything that is not tabular (matrices, embeddings, notes, images) goes to ``meta``, also strict JSON;
``meta["metric"]`` names the metric, ``meta["notes"]`` holds lines the report shows above the section and
``meta["title"]`` (a config's ``title:``) its heading.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import Field, PrivateAttr, Strict
from pydantic_core import PydanticCustomError
from torch import nn

from ..config_schema import ConfigError, _Section, entry_label, validate_section
from ..params import closest
from ..report.sections import register_section
from ..tasks import Task
from ._common import AttackSpec, TargetFn, add_notes, named_attacks, renormalization_notes
from .base import StudyResult

if TYPE_CHECKING:
    from ..report.blocks import StudyDrawer

__all__ = ["StudySpec", "StudyInfo", "register_study", "STUDY_SPECS", "available_studies", "get_study",
           "study_drawer", "validate_study", "validate_studies", "run_study", "unknown_option", "data_box",
           "one_model", "pick_models", "load_section", "Int", "Number"]


#: strict option types of the specs (``1.0`` is no int, ``"1"`` no number)
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]


class StudySpec(_Section):
    """What every study entry has: its name, and ``model``: which model of a ``{name: model}`` mapping it uses
    (single-model studies; default: the first, which in a config is the evaluated ``model``)."""

    study: str
    model: str | None = Field(None, min_length=1)
    #: the report's heading for this study (a paper's "Table 2", "Fig. 7: ..."); default: the study's own
    title: str | None = Field(None, min_length=1)
    #: a note the report shows under the heading, as written (a recipe's reading of its numbers against the
    #: paper's: what reproduces, what does not and why)
    note: str | None = Field(None, min_length=1)
    #: which of the config's attacks the study runs, by entry name (``pgd``, or one budget: ``pgd@0.0313725``);
    #: default: all
    attacks: Annotated[list[str], Field(min_length=1)] | None = None

    #: the folder relative paths of the study's own data sections start from (a config's folder)
    _base_dir: str | None = PrivateAttr(default=None)

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        """Run the study on ``models`` (``{name: model}``) with these options."""
        raise NotImplementedError(f"{type(self).__name__} does not define run()")

    def load(self, section: Any, task: Task, batch_size: int = 16, seed: int = 0) -> Any:
        """The batches of one of the study's data sections (``train:``), any source of the config's ``data:``,
        paths relative to the config's folder."""
        return load_section(section, self._base_dir, task, batch_size=batch_size, seed=seed)


def load_section(section: Any, base_dir: str | None, task: Task, batch_size: int = 16, seed: int = 0) -> Any:
    """The batches of a ``data:``-style section (a :class:`~medadv.config_schema.DataSection`)."""
    # the config's data builders: medadv.config sits below the studies and never imports them (issue 30)
    from ..config.data import build_loader

    return build_loader(section.model_dump(exclude_unset=True), base_dir, batch_size=batch_size, task=task,
                        seed=seed)


def unknown_option(given: str, known: list[str]) -> PydanticCustomError:
    """The error of an option that is not one of ``known``, with the closest one."""
    c = closest(given, known)
    return PydanticCustomError("option", "must be one of {listed}; got {given}{hint}",
                               {"listed": ", ".join(repr(k) for k in known), "given": repr(given),
                                "hint": f"; did you mean {c!r}?" if c else "", "field": ""})


@dataclass(frozen=True)
class StudyInfo:
    """One registered study: its name, spec class and the declarations of :func:`register_study`."""

    name: str
    spec: type[StudySpec]
    draw: StudyDrawer | None = None
    needs: Callable[[Task], str | None] | None = None
    spatial_dims: tuple[int, ...] = ()
    single_range: bool = False
    check_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """The first line of the spec's docstring (what the study does, and whose paper)."""
        doc = (self.spec.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else self.name

    def refusal(self, task: Task) -> str | None:
        """Why ``task`` is refused (``needs``), or ``None`` when the study supports it."""
        return None if self.needs is None else self.needs(task)


_REGISTRY: dict[str, StudyInfo] = {}


class _Specs(Mapping[str, type[StudySpec]]):
    """``{name: spec class}``: a read-only view of the registry (what configs validate against)."""

    def __getitem__(self, name: str) -> type[StudySpec]:
        return _REGISTRY[name].spec

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return f"STUDY_SPECS({', '.join(_REGISTRY)})"


#: study name -> its schema (a view of the registry :func:`register_study` fills)
STUDY_SPECS: Mapping[str, type[StudySpec]] = _Specs()

S = TypeVar("S", bound=type[StudySpec])


def register_study(name: str, *, draw: StudyDrawer | None = None, needs: Callable[[Task], str | None] | None = None,
                   spatial_dims: Sequence[int] = (), single_range: bool = False,
                   check_options: Mapping[str, Any] | None = None) -> Callable[[S], S]:
    """Class decorator: register a :class:`StudySpec` subclass (its ``study`` field a ``Literal[name]`` and its
    :meth:`StudySpec.run`) as the study ``name``, with its report section ``draw`` and what it supports.

    Args:
        name: the study's name (``studies:`` entries, :func:`run_study`, ``StudyResult.study``).
        draw: ``draw(study, class_names) -> Section`` (:mod:`medadv.report.blocks`); ``None``: the raw rows.
            Recorded in the report's registry too (:func:`medadv.report.sections.register_section`), where
            :func:`~medadv.report.html.write_html_report` finds it.
        needs: ``needs(task) -> str | None``: why a task is refused (``None``: supported); :func:`run_study`
            raises it before any work.
        spatial_dims: the input ranks the study supports (2: images, 3: volumes; empty: any).
        single_range: the study needs one data range (per-channel boxes of different widths are refused).
        check_options: the options of a tiny run for :func:`medadv.testing.check_study`.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"`name` of register_study must be an identifier such as 'my_study', got {name!r}")
    if draw is not None and not callable(draw):
        raise TypeError(f"`draw` of register_study({name!r}) must be a function (study, class_names) -> Section, "
                        f"got {draw!r}")
    if needs is not None and not callable(needs):
        raise TypeError(f"`needs` of register_study({name!r}) must be a function task -> str | None, got {needs!r}")
    dims = tuple(int(d) for d in spatial_dims)
    if any(d not in (1, 2, 3) for d in dims):
        raise ValueError(f"`spatial_dims` of register_study({name!r}) must hold 1, 2 or 3, got {list(spatial_dims)}")

    def deco(cls: S) -> S:
        if not (isinstance(cls, type) and issubclass(cls, StudySpec)):
            raise TypeError(f"register_study({name!r}) decorates a StudySpec subclass, got {cls!r}")
        old = _REGISTRY.get(name)
        # the same class again (a study module reloaded) replaces its entry; another class under the name is refused
        if old is not None and old.spec is not cls and \
                (old.spec.__module__, old.spec.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"study {name!r} is already registered ({_REGISTRY[name].spec.__name__})")
        _REGISTRY[name] = StudyInfo(name, cls, draw, needs, dims, bool(single_range), dict(check_options or {}))
        # the report reads drawers from its own registry (it lies below the studies and imports none of them)
        register_section(name, draw)
        return cls
    return deco


def available_studies() -> list[str]:
    """The registered study names, sorted (``studies:`` entries, :func:`run_study`)."""
    return sorted(_REGISTRY)


def get_study(name: str) -> StudyInfo:
    """The registered study ``name``; an unknown name is refused with the closest one."""
    if not isinstance(name, str) or name not in _REGISTRY:
        c = closest(str(name), list(_REGISTRY))
        raise ValueError(f"unknown study {name!r}{f'; did you mean {c!r}?' if c else ''} "
                         f"(studies: {', '.join(available_studies())})")
    return _REGISTRY[name]


def study_drawer(name: str) -> StudyDrawer | None:
    """The report drawer of study ``name`` (``None`` for an unknown study or one without a drawer)."""
    info = _REGISTRY.get(name)
    return None if info is None else info.draw


def validate_study(entry: Any, where: Sequence[str | int] = ("studies",)) -> StudySpec:
    """One entry (a study name or a mapping with ``study:``) checked against its study's schema.

    Raises :class:`~medadv.config_schema.ConfigError` with one located line per mistake."""
    loc = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in where).replace(".[", "[")
    if isinstance(entry, StudySpec):
        return entry
    if isinstance(entry, str):
        entry = {"study": entry}
    if not isinstance(entry, Mapping):
        raise ConfigError([f"`{loc}` must be a study name or a mapping with `study:`; got {entry!r}"])
    name = entry.get("study")
    if not isinstance(name, str) or name not in _REGISTRY:
        c = closest(str(name), list(_REGISTRY)) if name is not None else None
        hint = f"; did you mean {c!r}?" if c else ""
        raise ConfigError([f"`{loc}.study` must be one of {', '.join(map(repr, _REGISTRY))}; got {name!r}{hint}"])
    return validate_section(_REGISTRY[name].spec, dict(entry), where)


def validate_studies(value: Any) -> list[StudySpec]:
    """A whole ``studies:`` list; every mistake of every entry is reported at once."""
    if not isinstance(value, list | tuple):
        raise ConfigError([f"`studies` must be a list of studies such as [classwise, {{study: corruptions}}]; "
                           f"got {value!r}"])
    out, errors = [], []
    for i, entry in enumerate(value):
        try:
            out.append(validate_study(entry, ("studies", i)))
        except ConfigError as e:
            errors += e.messages
    if errors:
        raise ConfigError(errors)
    return out


# --- helpers of the specs' run() --------------------------------------------------------------------------------
def _models(model: nn.Module | Mapping[str, nn.Module]) -> dict[str, nn.Module]:
    if isinstance(model, nn.Module):
        return {"model": model}
    if isinstance(model, Mapping) and model and all(isinstance(m, nn.Module) for m in model.values()):
        return {str(k): m for k, m in model.items()}
    raise TypeError(f"`model` must be an nn.Module or a non-empty {{name: nn.Module}} mapping, got {model!r}")


def pick_models(models: dict[str, nn.Module], names: list[str] | None, what: str) -> dict[str, nn.Module]:
    """The models named ``names`` (all for ``None``); an unknown name is refused with the closest one."""
    if names is None:
        return models
    out = {}
    for n in names:
        if n not in models:
            c = closest(n, list(models))
            raise ValueError(f"`{what}` names an unknown model {n!r}{f'; did you mean {c!r}?' if c else ''} "
                             f"(models: {', '.join(models)})")
        out[n] = models[n]
    return out


def one_model(models: dict[str, nn.Module], spec: StudySpec) -> nn.Module:
    """The model of a single-model study: the spec's ``model:``, else the first (a config's evaluated ``model``)."""
    if spec.model is not None:
        return pick_models(models, [spec.model], "model")[spec.model]
    return next(iter(models.values()))


def data_box(spec: StudySpec, attacks: AttackSpec | None, what: str, required: bool = True) -> Any:
    """``spec.bounds`` when given (``null``: unbounded), else the first attack's data box (without attacks: an
    error when ``required``, else unbounded)."""
    if "bounds" in spec.model_fields_set:
        b = spec.bounds  # type: ignore[attr-defined]
        return None if b is None else (b[0], b[1])
    named = named_attacks(attacks)
    if not named and not required:
        return None
    if not named:
        raise ValueError(f"the {what} study needs the data box: give `bounds: [lo, hi]` (or null for unbounded "
                         "data), or attacks whose box it takes")
    return named[0][1].box


def _chosen_attacks(attacks: AttackSpec | None, names: list[str]) -> dict[str, Any]:
    """The attacks named in a study's ``attacks:`` (an entry's name matches each of its budgets)."""
    named = dict(named_attacks(attacks))
    out: dict[str, Any] = {}
    for n in names:
        hits = {k: a for k, a in named.items() if n in (k, entry_label(k))}
        if not hits:
            c = closest(n, sorted({entry_label(k) for k in named} | set(named)))
            raise ValueError(f"`attacks` of the study names an unknown attack {n!r}"
                             f"{f'; did you mean {c!r}?' if c else ''} (attacks: {', '.join(named)})")
        out.update(hits)
    return out


def _first_input(data: Any) -> Any:
    """The input tensor of ``data`` when it is one ``(x, y)`` pair or one dictionary batch (seen without iterating
    anything); ``None`` for a loader, whose batches the study checks itself."""
    from torch import Tensor

    if isinstance(data, tuple | list) and len(data) == 2 and isinstance(data[0], Tensor):
        return data[0]
    if isinstance(data, Mapping) and isinstance(data.get("image"), Tensor):
        return data["image"]
    return None


def run_study(name: str, spec: Mapping[str, Any] | StudySpec | None, model: nn.Module | Mapping[str, nn.Module],
              task: Task, data: Any, attacks: AttackSpec | None, *, target_fn: TargetFn | None = None,
              base_dir: str | None = None) -> StudyResult:
    """Run study ``name`` with the options ``spec`` (a mapping, checked by the study's schema, or a spec).

    Args:
        name: one of :func:`available_studies`.
        spec: the study's options (without ``study:``; ``None``: defaults).
        model: one model, or ``{name: model}`` (required for ``transfer`` and ``models``; other studies use the
            entry's ``model:`` or the only one).
        task, data, attacks, target_fn: as for ``evaluate``.
        base_dir: where relative paths of the study's own data sections (``train:``) start (a config's folder;
            default: the working directory).

    A task kind the study does not support (its ``needs``), or inputs of a rank it does not support (its
    ``spatial_dims``, seen here for an ``(x, y)`` pair, else by the study on its first batch), are refused before
    any work, in one line.
    """
    info = get_study(name)
    if isinstance(spec, StudySpec):
        if spec.study != name:
            raise ValueError(f"the spec is for study {spec.study!r}, not {name!r}")
        s = spec
    else:
        s = validate_study({"study": name, **dict(spec or {})}, ("studies", name))
    if not isinstance(task, Task):
        raise TypeError(f"`task` must be a medadv Task (MultiClass, MultiLabel, Segmentation), got {task!r}")
    why = info.refusal(task)
    if why is not None:
        raise ValueError(f"the {name} study does not support {task!r}: {why}")
    x = _first_input(data)
    if info.spatial_dims and x is not None and x.ndim - 2 not in info.spatial_dims:
        ranks = " or ".join(f"{d}-D" for d in info.spatial_dims)
        raise ValueError(f"the {name} study needs {ranks} inputs (N, C, *spatial); `data` holds {x.ndim - 2}-D "
                         f"samples of shape {tuple(x.shape)}")
    models = _models(model)
    s = s.model_copy()  # the caller's spec is not modified (its base folder is this call's)
    s._base_dir = base_dir
    if s.attacks is not None:
        attacks = _chosen_attacks(attacks, s.attacks)
    result = s.run(models, task, data, attacks, target_fn)
    # a VAFA attack's frequency reading depends on its renormalisation: every study that ran one says which
    add_notes(result.meta, renormalization_notes(named_attacks(attacks)))
    if s.title is not None:
        result.meta["title"] = s.title
    if s.note is not None:
        result.meta["note"] = s.note
    return result
