"""The ``studies:`` config section: one pydantic schema per study, and :func:`run_study` to run one.

A ``studies:`` section is a list of entries, each a bare study name or a mapping with ``study:`` and that
study's options::

    studies:
      - classwise                                  # defaults
      - {study: corruptions, severities: [1, 3, 5], suite: [gaussian_noise, blur]}
      - {study: noise_baseline, match: ssim}
      - {study: transfer, surrogates: [unet_a], targets: [unet_b, unet_c]}

Unknown keys are refused with the closest valid one, as everywhere in the config (the sections reuse
:mod:`medadv.config_schema`'s rules). Options name models of a ``{name: model}`` mapping where a study takes
several (``transfer``, ``models``) or picks one (``model:`` in the others).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, PrivateAttr, Strict, field_validator, model_validator
from pydantic_core import PydanticCustomError
from torch import nn

from ..config_schema import ConfigError, DataSection, _Section, entry_label, validate_section
from ..params import closest
from ..tasks import Task
from ._common import AttackSpec, TargetFn, add_notes, named_attacks, renormalization_notes
from .base import StudyResult

__all__ = ["STUDY_SPECS", "StudySpec", "ClasswiseSpec", "TransferSpec", "CorruptionsSpec", "NoiseBaselineSpec",
           "FrequencySpec", "ModelsSpec", "CorrelationSpec", "CertifySpec", "SaliencySpec", "register_study", "validate_study", "validate_studies", "run_study"]

Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]


class StudySpec(_Section):
    """What every study entry has: its name, and ``model``: which model of a ``{name: model}`` mapping it uses
    (single-model studies; default: the first, which in a config is the evaluated ``model``)."""

    study: str
    model: str | None = Field(None, min_length=1)
    #: the report's heading for this study (a paper's "Table 2", "Fig. 7: ..."); default: the study's own
    title: str | None = Field(None, min_length=1)
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
        from ..config import build_loader

        return build_loader(section.model_dump(exclude_unset=True), self._base_dir, batch_size=batch_size, task=task,
                            seed=seed)


def _unknown_option(given: str, known: list[str]) -> PydanticCustomError:
    """The error of an option that is not one of ``known``, with the closest one."""
    c = closest(given, known)
    return PydanticCustomError("option", "must be one of {listed}; got {given}{hint}",
                               {"listed": ", ".join(repr(k) for k in known), "given": repr(given),
                                "hint": f"; did you mean {c!r}?" if c else "", "field": ""})


#: study name -> its schema (filled by :func:`register_study`)
STUDY_SPECS: dict[str, type[StudySpec]] = {}

S = TypeVar("S", bound=type[StudySpec])


def register_study(name: str) -> Callable[[S], S]:
    """Class decorator: register a :class:`StudySpec` subclass (its ``study`` field a ``Literal[name]`` and its
    :meth:`StudySpec.run`) as the ``studies:`` entry ``name``. A study module registers itself on import."""
    def deco(cls: S) -> S:
        if not (isinstance(cls, type) and issubclass(cls, StudySpec)):
            raise TypeError(f"register_study({name!r}) decorates a StudySpec subclass, got {cls!r}")
        if name in STUDY_SPECS and STUDY_SPECS[name] is not cls:
            raise ValueError(f"study {name!r} is already registered ({STUDY_SPECS[name].__name__})")
        STUDY_SPECS[name] = cls
        return cls
    return deco


def _box(spec: StudySpec, attacks: AttackSpec | None, what: str, required: bool = True) -> Any:
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


@register_study("classwise")
class ClasswiseSpec(StudySpec):
    """Per-class recall / label accuracy / Dice, CFPS, confusion matrices, attractors (Medi et al.).

    ``corruptions`` (names or a suite such as ``xu2021``) at ``severity`` are conditions next to the attacks
    (``bounds``: their data box, default the attacks'); ``target_classes`` (``all`` or a list) runs every
    targeted attack once per target class (multi-class); ``models`` (two or more) runs the study on each and
    adds their model-to-model cosine similarity (Medi et al., App. B)."""

    study: Literal["classwise"]
    class_names: list[str] | None = None
    corruptions: Annotated[list[str], Field(min_length=1)] | str | None = None
    severity: Int = Field(3, ge=1, le=5)
    seed: Int = 0
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None
    target_classes: Literal["all"] | Annotated[list[Annotated[int, Strict(), Field(ge=0)] | str],
                                               Field(min_length=1)] | None = None
    models: Annotated[list[str], Field(min_length=2)] | None = None

    @field_validator("corruptions")
    @classmethod
    def _known_corruptions(cls, names: list[str] | str | None) -> list[str] | str | None:
        return CorruptionsSpec._known(names)  # type: ignore[operator]

    @model_validator(mode="after")
    def _model_or_models(self) -> ClasswiseSpec:
        if self.model is not None and self.models is not None:
            raise PydanticCustomError("classwise_models", "give `model` (one) or `models` (several), not both")
        return self

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        from .classwise import classwise

        which: nn.Module | dict[str, nn.Module] = (_pick(models, self.models, "models") if self.models is not None
                                                   else _one(models, self))
        bounds = _box(self, attacks, "classwise", required=False) if self.corruptions else None
        return classwise(which, task, data, attacks, class_names=self.class_names, target_fn=target_fn,
                         corruptions=self.corruptions, severity=self.severity, bounds=bounds, seed=self.seed,
                         target_classes=self.target_classes)


@register_study("transfer")
class TransferSpec(StudySpec):
    """Surrogate × target table; ``surrogates``/``targets`` name models (default: all of them, both roles).
    ``hd95``: also each target's HD95 clean and transferred (segmentation; Malik et al.), ``spacing``: the voxel
    size for it in mm, one number or one per spatial axis (default: voxel units)."""

    study: Literal["transfer"]
    surrogates: Annotated[list[str], Field(min_length=1)] | None = None
    targets: Annotated[list[str], Field(min_length=1)] | None = None
    hd95: Annotated[bool, Strict()] = False
    spacing: (Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
              | Annotated[list[Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]],
                          Field(min_length=1, max_length=3)]
              | None) = None

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        from .transfer import transfer

        return transfer(_pick(models, self.surrogates, "surrogates"), _pick(models, self.targets, "targets"), task,
                        data, attacks if attacks is not None else {}, target_fn=target_fn, hd95=self.hd95,
                        spacing=self.spacing)


@register_study("corruptions")
class CorruptionsSpec(StudySpec):
    """Corruptions at severities 1..5 with the flip probability (Xu et al.). ``suite``: a suite name (``xu2021``
    / ``robust_benchmark``: the paper's 14 Robust-Benchmark sequences for 2-D images; ``default``: the MONAI
    MRI/CT corruptions; ``all``) or a list of corruption names. ``bounds``: the data box (default: the attacks'
    box; ``null``: unbounded). ``models``: also run every named model and give each its mean flip probability
    relative to ``model``'s (Xu et al.'s RFP, Table 4), in ``meta["rfp"]``; the rows stay ``model``'s."""

    study: Literal["corruptions"]
    models: Annotated[list[str], Field(min_length=1)] | None = None
    severities: Annotated[list[Annotated[int, Strict(), Field(ge=1, le=5)]], Field(min_length=1)] = [1, 2, 3, 4, 5]
    suite: Annotated[list[str], Field(min_length=1)] | str | None = None
    frames: Int = Field(5, ge=2)
    seed: Int = 0
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None

    @field_validator("suite")
    @classmethod
    def _known(cls, names: list[str] | str | None) -> list[str] | str | None:
        from .corruptions import ALIASES, CORRUPTIONS, SUITES

        if isinstance(names, str):
            if names not in SUITES:
                c = closest(names, list(SUITES))
                raise PydanticCustomError("option", "must be a suite ({listed}) or a list of corruptions; got "
                                          "{given}{hint}", {"listed": ", ".join(repr(k) for k in SUITES),
                                                            "given": repr(names),
                                                            "hint": f"; did you mean {c!r}?" if c else "",
                                                            "field": ""})
            return names
        known = [*CORRUPTIONS, *ALIASES]
        for n in names or []:
            if n not in known:
                raise _unknown_option(n, known)
        return names

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        from .corruptions import corruptions, relative_flip_probability

        box = _box(self, attacks, "corruptions")
        ref = _one(models, self)
        result = corruptions(ref, task, data, bounds=box, severities=self.severities, suite=self.suite,
                             frames=self.frames, seed=self.seed)
        if self.models is not None:
            ref_name = self.model or next(iter(models))
            others = {n: corruptions(m, task, data, bounds=box, severities=self.severities, suite=self.suite,
                                     frames=self.frames, seed=self.seed)
                      for n, m in _pick(models, self.models, "models").items() if n != ref_name}
            result.meta["rfp"] = relative_flip_probability({ref_name: result, **others})
        return result


@register_study("noise_baseline")
class NoiseBaselineSpec(StudySpec):
    """Noise matched per example in SSIM (or L2) to each attack's examples (Paschali et al.)."""

    study: Literal["noise_baseline"]
    match: Literal["ssim", "l2"] = "ssim"
    noise: Literal["gaussian", "rician"] = "gaussian"
    seed: Int = 0

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        from .corruptions import noise_baseline

        return noise_baseline(_one(models, self), task, data, attacks if attacks is not None else {}, match=self.match,
                              noise=self.noise, seed=self.seed, target_fn=target_fn)


@register_study("frequency")
class FrequencySpec(StudySpec):
    """The attacks restricted to low / high DCT bands (Malik et al.)."""

    study: Literal["frequency"]
    cutoff: Number = Field(0.25, gt=0.0, lt=1.0)
    tile: Annotated[int, Strict(), Field(ge=1)] | Annotated[list[Annotated[int, Strict(), Field(ge=1)]],
                                                             Field(min_length=2, max_length=3)] | None = None

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        from .frequency import frequency

        return frequency(_one(models, self), task, data, attacks if attacks is not None else {}, cutoff=self.cutoff,
                         tile=self.tile, target_fn=target_fn)


@register_study("models")
class ModelsSpec(StudySpec):
    """Clean vs robust over several models (Paschali et al.); ``models`` names them (default: all)."""

    study: Literal["models"]
    models: Annotated[list[str], Field(min_length=1)] | None = None

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        from .models import models as models_study

        return models_study(_pick(models, self.models, "models"), task, data, attacks if attacks is not None else {},
                            target_fn=target_fn)


@register_study("correlation")
class CorrelationSpec(StudySpec):
    """Feature embedding from ``layer`` (``null``: the logits) and label co-occurrence under attack (Xu et al.).

    ``embedding``: ``pca`` and/or ``tsne`` (each fitted jointly on all groups). ``train``: the model's training data
    as a ``data:`` section (``{source: mni152, n: 200, kwargs: {...}}``, any source; paths relative to the config's
    folder): Xu et al.'s control group in the embedding and the kNN probe's reference
    (without it: no train group). ``noise``: the noisy control matches each adversarial perturbation's ``l2`` or
    ``linf`` norm. ``seed``: the noise and t-SNE. ``knn``: neighbours of the separability score and the probe."""

    study: Literal["correlation"]
    layer: str | None = Field(None, min_length=1)
    label_names: list[str] | None = None
    max_points: Int = Field(2000, ge=2)
    embedding: Annotated[list[Literal["pca", "tsne"]], Field(min_length=1)] = ["pca", "tsne"]
    train: DataSection | None = None
    noise: Literal["l2", "linf"] = "l2"
    seed: Int = 0
    perplexity: Number = Field(30.0, gt=0.0)
    knn: Int = Field(5, ge=1)

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        from .correlation import correlation

        train = None if self.train is None else self.load(self.train, task)
        return correlation(_one(models, self), task, data, attacks if attacks is not None else {}, layer=self.layer,
                           label_names=self.label_names, max_points=self.max_points, target_fn=target_fn,
                           embedding=self.embedding, train_data=train, noise=self.noise, seed=self.seed,
                           perplexity=self.perplexity, knn=self.knn)


@register_study("certify")
class CertifySpec(StudySpec):
    """Randomized-smoothing certificates vs. an attack on the same smoothed model (Cohen et al. 2019, Salman et
    al. 2019): :func:`medadv.studies.certify.certify`. ``sigma`` and ``radii`` in data units (L2); ``bounds``: the
    attack's data box (default: the attacks' box; ``null``: unbounded)."""

    study: Literal["certify"]
    sigma: Number = Field(gt=0.0)
    radii: Annotated[list[Annotated[float, Strict(), Field(gt=0.0)]], Field(min_length=1)]
    n0: Int = Field(100, ge=1)
    n: Int = Field(1000, ge=1)
    alpha: Number = Field(0.001, gt=0.0, lt=1.0)
    batch_size: Int = Field(256, ge=1)
    correction: Literal["bonferroni", "holm"] = "bonferroni"
    tau: Annotated[float, Strict(), Field(gt=0.5, lt=1.0)] | None = None
    seed: Int | None = 0
    empirical: Literal["auto", "pgd", "none"] = "auto"
    empirical_steps: Annotated[int, Strict(), Field(ge=1)] | None = None
    draws: Int = Field(8, ge=1)
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None

    @model_validator(mode="after")
    def _holm_needs_tau(self) -> CertifySpec:
        if self.correction == "holm" and self.tau is None:
            raise PydanticCustomError("certify_tau", "needs `tau` with `correction: holm` (Holm tests p <= tau per "
                                      "element, e.g. tau: 0.75); use `correction: bonferroni` without it")
        return self

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        from .certify import certify

        return certify(_one(models, self), task, data, sigma=self.sigma, radii=self.radii, n0=self.n0, n=self.n,
                       alpha=self.alpha, batch_size=self.batch_size, correction=self.correction, tau=self.tau,
                       seed=self.seed, empirical=self.empirical, empirical_steps=self.empirical_steps,
                       draws=self.draws, bounds=_box(self, attacks, "certify", required=False))




@register_study("saliency")
class SaliencySpec(StudySpec):
    """Explanation maps before and after each attack, model × method (Zhang et al. 2024, Tables 1–2):
    :func:`medadv.studies.saliency.saliency`. ``explanations``: method names (default: all registered);
    ``models``: which models (default: all)."""

    study: Literal["saliency"]
    explanations: Annotated[list[str | dict[str, Any]], Field(min_length=1)] | None = None
    models: Annotated[list[str], Field(min_length=1)] | None = None
    max_samples: Annotated[int, Strict(), Field(ge=1)] | None = None
    matched: Annotated[bool, Strict()] = False

    @field_validator("explanations")
    @classmethod
    def _known(cls, specs: list[str | dict[str, Any]] | None) -> list[str | dict[str, Any]] | None:
        from ..explain import available_explanations, get_explanation

        known = available_explanations()
        for spec in specs or []:
            n = spec if isinstance(spec, str) else str(spec.get("name"))
            if n in known and isinstance(spec, dict):
                try:
                    get_explanation(spec)  # its parameters, checked now
                except (TypeError, ValueError) as e:
                    raise PydanticCustomError("explanation", "{error}", {"error": str(e)}) from None
            if n not in known:
                raise _unknown_option(n, known)
        return specs

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        from .saliency import saliency

        return saliency(_pick(models, self.models, "models"), task, data, attacks if attacks is not None else {},
                        explanations=self.explanations, max_samples=self.max_samples, matched=self.matched,
                        target_fn=target_fn)


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
    if not isinstance(name, str) or name not in STUDY_SPECS:
        c = closest(str(name), list(STUDY_SPECS)) if name is not None else None
        hint = f"; did you mean {c!r}?" if c else ""
        raise ConfigError([f"`{loc}.study` must be one of {', '.join(map(repr, STUDY_SPECS))}; got {name!r}{hint}"])
    return validate_section(STUDY_SPECS[name], dict(entry), where)


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


def _models(model: nn.Module | Mapping[str, nn.Module]) -> dict[str, nn.Module]:
    if isinstance(model, nn.Module):
        return {"model": model}
    if isinstance(model, Mapping) and model and all(isinstance(m, nn.Module) for m in model.values()):
        return {str(k): m for k, m in model.items()}
    raise TypeError(f"`model` must be an nn.Module or a non-empty {{name: nn.Module}} mapping, got {model!r}")


def _pick(models: dict[str, nn.Module], names: list[str] | None, what: str) -> dict[str, nn.Module]:
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


def _one(models: dict[str, nn.Module], spec: StudySpec) -> nn.Module:
    if spec.model is not None:
        return _pick(models, [spec.model], "model")[spec.model]
    return next(iter(models.values()))  # the first: a config's evaluated `model`


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


def run_study(name: str, spec: Mapping[str, Any] | StudySpec | None, model: nn.Module | Mapping[str, nn.Module],
              task: Task, data: Any, attacks: AttackSpec | None, *, target_fn: TargetFn | None = None,
              base_dir: str | None = None) -> StudyResult:
    """Run study ``name`` with the options ``spec`` (a mapping, checked by the study's schema, or a spec).

    Args:
        name: one of :data:`STUDY_SPECS`.
        spec: the study's options (without ``study:``; ``None``: defaults).
        model: one model, or ``{name: model}`` (required for ``transfer`` and ``models``; other studies use the
            entry's ``model:`` or the only one).
        task, data, attacks, target_fn: as for ``evaluate``.
        base_dir: where relative paths of the study's own data sections (``train:``) start (a config's folder;
            default: the working directory).
    """
    if name not in STUDY_SPECS:
        c = closest(name, list(STUDY_SPECS))
        raise ValueError(f"unknown study {name!r}{f'; did you mean {c!r}?' if c else ''} "
                         f"(studies: {', '.join(STUDY_SPECS)})")
    if isinstance(spec, StudySpec):
        if spec.study != name:
            raise ValueError(f"the spec is for study {spec.study!r}, not {name!r}")
        s = spec
    else:
        s = validate_study({"study": name, **dict(spec or {})}, ("studies", name))
    s._base_dir = base_dir
    if s.attacks is not None:
        attacks = _chosen_attacks(attacks, s.attacks)
    result = s.run(_models(model), task, data, attacks, target_fn)
    # a VAFA attack's frequency reading depends on its renormalisation: every study that ran one says which
    add_notes(result.meta, renormalization_notes(named_attacks(attacks)))
    if s.title is not None:
        result.meta["title"] = s.title
    return result
