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

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, Strict, field_validator, model_validator
from pydantic_core import PydanticCustomError
from torch import nn

from ..config_schema import ConfigError, _Section, validate_section
from ..params import closest
from ..tasks import Task
from ._common import AttackSpec, TargetFn, named_attacks
from .base import StudyResult

__all__ = ["STUDY_SPECS", "StudySpec", "ClasswiseSpec", "TransferSpec", "CorruptionsSpec", "NoiseBaselineSpec",
           "FrequencySpec", "ModelsSpec", "CorrelationSpec", "CertifySpec", "validate_study", "validate_studies", "run_study"]

Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]


class StudySpec(_Section):
    """What every study entry has: its name, and ``model``: which model of a ``{name: model}`` mapping it uses
    (single-model studies; default: the only model)."""

    study: str
    model: str | None = Field(None, min_length=1)


class ClasswiseSpec(StudySpec):
    """Per-class recall / label accuracy / Dice, CFPS, confusion matrices, attractors (Medi et al.)."""

    study: Literal["classwise"]
    class_names: list[str] | None = None


class TransferSpec(StudySpec):
    """Surrogate × target table; ``surrogates``/``targets`` name models (default: all of them, both roles)."""

    study: Literal["transfer"]
    surrogates: Annotated[list[str], Field(min_length=1)] | None = None
    targets: Annotated[list[str], Field(min_length=1)] | None = None


class CorruptionsSpec(StudySpec):
    """MONAI corruptions at severities 1..5 with the flip probability (Xu et al.). ``bounds``: the data box
    (default: the attacks' box; ``null``: unbounded)."""

    study: Literal["corruptions"]
    severities: Annotated[list[Annotated[int, Strict(), Field(ge=1, le=5)]], Field(min_length=1)] = [1, 2, 3, 4, 5]
    suite: Annotated[list[str], Field(min_length=1)] | None = None
    frames: Int = Field(5, ge=2)
    seed: Int = 0
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None

    @field_validator("suite")
    @classmethod
    def _known(cls, names: list[str] | None) -> list[str] | None:
        from .corruptions import SUITE

        known = [c.name for c in SUITE]
        for n in names or []:
            if n not in known:
                c = closest(n, known)
                raise PydanticCustomError("option", "must be one of {listed}; got {given}{hint}",
                                          {"listed": ", ".join(repr(k) for k in known), "given": repr(n),
                                           "hint": f"; did you mean {c!r}?" if c else "", "field": ""})
        return names


class NoiseBaselineSpec(StudySpec):
    """Noise matched per example in SSIM (or L2) to each attack's examples (Paschali et al.)."""

    study: Literal["noise_baseline"]
    match: Literal["ssim", "l2"] = "ssim"
    noise: Literal["gaussian", "rician"] = "gaussian"
    seed: Int = 0


class FrequencySpec(StudySpec):
    """The attacks restricted to low / high DCT bands (Malik et al.)."""

    study: Literal["frequency"]
    cutoff: Number = Field(0.25, gt=0.0, lt=1.0)
    tile: Annotated[int, Strict(), Field(ge=1)] | Annotated[list[Annotated[int, Strict(), Field(ge=1)]],
                                                             Field(min_length=2, max_length=3)] | None = None


class ModelsSpec(StudySpec):
    """Clean vs robust over several models (Paschali et al.); ``models`` names them (default: all)."""

    study: Literal["models"]
    models: Annotated[list[str], Field(min_length=1)] | None = None


class CorrelationSpec(StudySpec):
    """Feature embedding from ``layer`` (``null``: the logits) and label co-occurrence under attack (Xu et al.)."""

    study: Literal["correlation"]
    layer: str | None = Field(None, min_length=1)
    label_names: list[str] | None = None
    max_points: Int = Field(2000, ge=2)


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


#: study name -> its schema
STUDY_SPECS: dict[str, type[StudySpec]] = {
    "classwise": ClasswiseSpec, "transfer": TransferSpec, "corruptions": CorruptionsSpec,
    "noise_baseline": NoiseBaselineSpec, "frequency": FrequencySpec, "models": ModelsSpec,
    "correlation": CorrelationSpec, "certify": CertifySpec,
}


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
    if len(models) != 1:
        raise ValueError(f"study {spec.study!r} runs on one model: give `model:` (one of {', '.join(models)})")
    return next(iter(models.values()))


def run_study(name: str, spec: Mapping[str, Any] | StudySpec | None, model: nn.Module | Mapping[str, nn.Module],
              task: Task, data: Any, attacks: AttackSpec | None, *, target_fn: TargetFn | None = None) -> StudyResult:
    """Run study ``name`` with the options ``spec`` (a mapping, checked by the study's schema, or a spec).

    Args:
        name: one of :data:`STUDY_SPECS`.
        spec: the study's options (without ``study:``; ``None``: defaults).
        model: one model, or ``{name: model}`` (required for ``transfer`` and ``models``; other studies use the
            entry's ``model:`` or the only one).
        task, data, attacks, target_fn: as for ``evaluate``.
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
    models = _models(model)
    from .classwise import classwise
    from .correlation import correlation
    from .corruptions import corruptions, noise_baseline
    from .frequency import frequency
    from .models import models as models_study
    from .transfer import transfer

    if isinstance(s, ClasswiseSpec):
        return classwise(_one(models, s), task, data, attacks, class_names=s.class_names, target_fn=target_fn)
    if isinstance(s, TransferSpec):
        return transfer(_pick(models, s.surrogates, "surrogates"), _pick(models, s.targets, "targets"), task, data,
                        attacks if attacks is not None else {}, target_fn=target_fn)
    if isinstance(s, CertifySpec):
        from .certify import certify

        if "bounds" in s.model_fields_set:
            box: Any = None if s.bounds is None else (s.bounds[0], s.bounds[1])
        else:
            named = named_attacks(attacks)
            box = named[0][1].box if named else None
        return certify(_one(models, s), task, data, sigma=s.sigma, radii=s.radii, n0=s.n0, n=s.n, alpha=s.alpha,
                       batch_size=s.batch_size, correction=s.correction, tau=s.tau, seed=s.seed,
                       empirical=s.empirical, empirical_steps=s.empirical_steps, draws=s.draws, bounds=box)
    if isinstance(s, CorruptionsSpec):
        if "bounds" in s.model_fields_set:
            bounds: Any = None if s.bounds is None else (s.bounds[0], s.bounds[1])
        else:
            named = named_attacks(attacks)
            if not named:
                raise ValueError("the corruptions study needs the data box: give `bounds: [lo, hi]` (or null for "
                                 "unbounded data), or attacks whose box it takes")
            bounds = named[0][1].box
        return corruptions(_one(models, s), task, data, bounds=bounds, severities=s.severities, suite=s.suite,
                           frames=s.frames, seed=s.seed)
    if isinstance(s, NoiseBaselineSpec):
        return noise_baseline(_one(models, s), task, data, attacks if attacks is not None else {}, match=s.match,
                              noise=s.noise, seed=s.seed, target_fn=target_fn)
    if isinstance(s, FrequencySpec):
        return frequency(_one(models, s), task, data, attacks if attacks is not None else {}, cutoff=s.cutoff,
                         tile=s.tile, target_fn=target_fn)
    if isinstance(s, ModelsSpec):
        return models_study(_pick(models, s.models, "models"), task, data, attacks if attacks is not None else {},
                            target_fn=target_fn)
    assert isinstance(s, CorrelationSpec)
    return correlation(_one(models, s), task, data, attacks if attacks is not None else {}, layer=s.layer,
                       label_names=s.label_names, max_points=s.max_points, target_fn=target_fn)
