"""The conformance factory: a minimal instance of every registered attack on every task it supports.

Everything here is derived from the attack classes' metadata, never from a hand-kept list of attacks:

* ``Attack.tasks`` (task class names) and ``spatial_dims`` pick the cases among a 2-D classifier
  (multi-class and multi-label), a 2-D segmenter (two channels, per-channel box) and a 3-D segmenter;
* ``threat_kind`` and ``norms`` pick the threat (a ball, or the data box for box attacks);
* ``always_targeted`` attacks get a target (class 0, no label, or an all-background map);
* ``param_names()`` / ``declared_params()``: ``SMALL`` shrinks the declared *cost* knobs only (fewer
  steps, one restart, AutoAttack's cheapest member), and a GAP-style ``generator`` parameter gets a tiny
  generator module (an ``nn.Module`` generator is trusted as trained).

``pytest_generate_tests`` parametrizes the conformance tests from ``available_attacks()``: a new attack
gets every check without editing a list.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import medadv  # noqa: F401  (registers every attack)
from medadv.attacks.base import Attack, attack_class, available_attacks, get_attack
from medadv.params import (
    AnyOf,
    Bool,
    Component,
    Configurable,
    Constraint,
    Instance,
    Int,
    Optional,
    Options,
    Pair,
    Real,
    stable_hash,
)
from medadv.tasks import MultiClass, MultiLabel, Segmentation, Task
from medadv.threats import L2, Box, Linf, Threat

# --- cost knobs: only these are changed from the defaults, and only when the attack declares them -----------
#: parameter name -> a small value (applied if the attack has the parameter and its declaration accepts it)
SMALL: dict[str, Any] = {
    "steps": 2,
    "max_iter": 2,  # deprecated spelling of `steps` (DAG before the engine port)
    "restarts": 1,
    "n_restarts": 1,
    "epochs": 1,
    "queries": 20,  # score-based attacks (Square): a few queries, not the paper's thousands
    # AutoAttack: its cheapest member instead of the standard ensemble (FAB-T and Square take minutes)
    "version": "custom",
    "attacks": ["apgd-ce"],
}

N = 3  # batch size
EPS = {"Linf": 0.1, "L2": 0.5}  # data units (the boxes below span 1 or 2 units)


@dataclass(frozen=True)
class Setting:
    """One kind of model and data the attacks are tried on."""

    key: str
    task_class: type[Task]
    ndim: int  # spatial rank of the input
    channels: int
    segmenter: bool


SETTINGS = (
    Setting("multiclass", MultiClass, 2, 1, False),
    Setting("multilabel", MultiLabel, 2, 1, False),
    Setting("seg2d", Segmentation, 2, 2, True),
    Setting("seg3d", Segmentation, 3, 1, True),
)
OUTPUTS = 4  # classes / labels of the classifier
SEG_CLASSES = 3
SIZE = 8


def applicable(cls: type[Attack], s: Setting) -> bool:
    """Whether the class metadata admits this setting (task class by name, along the MRO; spatial rank)."""
    if cls.tasks and not any(c.__name__ in cls.tasks for c in s.task_class.__mro__):
        return False
    return not cls.spatial_dims or s.ndim in cls.spatial_dims


def settings_for(cls: type[Attack]) -> list[Setting]:
    return [s for s in SETTINGS if applicable(cls, s)]


# --- tiny models: BatchNorm (running stats must not move), dropout (eval mode must hold), smooth activations
# (saliency attacks differentiate the map w.r.t. the input: a ReLU net has a zero second derivative) -------
def _conv(ndim: int) -> type[nn.Module]:
    return nn.Conv2d if ndim == 2 else nn.Conv3d


def _bn(ndim: int) -> type[nn.Module]:
    return nn.BatchNorm2d if ndim == 2 else nn.BatchNorm3d


def make_model(s: Setting) -> nn.Module:
    torch.manual_seed(0)
    conv, bn = _conv(s.ndim), _bn(s.ndim)
    if s.segmenter:
        return nn.Sequential(conv(s.channels, 6, 3, padding=1), bn(6), nn.Softplus(), nn.Dropout(0.2),
                             conv(6, SEG_CLASSES, 1))
    pool = nn.AdaptiveAvgPool2d(1) if s.ndim == 2 else nn.AdaptiveAvgPool3d(1)
    return nn.Sequential(conv(s.channels, 6, 3, padding=1), bn(6), nn.Softplus(), nn.Dropout(0.2), pool,
                         nn.Flatten(), nn.Linear(6, OUTPUTS))


def make_generator(s: Setting) -> nn.Module:
    """A tiny image-to-perturbation generator (GAP): the data's channels in and out, tanh output."""
    torch.manual_seed(1)
    return nn.Sequential(_conv(s.ndim)(s.channels, s.channels, 3, padding=1), nn.Tanh())


def make_box(s: Setting) -> Box:
    if s.channels == 1:
        return Box(0.0, 1.0)
    # per-channel data ranges (multi-modal MRI): channel 0 in [0, 1], channel 1 in [0, 2]
    shape = (s.channels,) + (1,) * s.ndim
    return Box(torch.zeros(shape), torch.arange(1, s.channels + 1, dtype=torch.float32).reshape(shape))


def make_data(s: Setting, targeted: bool) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(2)
    spatial = (SIZE,) * s.ndim
    hi = make_box(s).hi
    x = torch.rand(N, s.channels, *spatial, generator=g) * (hi if isinstance(hi, Tensor) else float(hi or 1.0))
    if s.segmenter:
        # targeted: an all-background map; else a random label map
        y = torch.zeros(N, *spatial, dtype=torch.long) if targeted else \
            torch.randint(0, SEG_CLASSES, (N, *spatial), generator=g)
    elif s.task_class is MultiLabel:
        y = torch.zeros(N, OUTPUTS) if targeted else torch.randint(0, 2, (N, OUTPUTS), generator=g).float()
    else:
        y = torch.zeros(N, dtype=torch.long) if targeted else torch.arange(N) % OUTPUTS
    return x, y


def make_threat(cls: type[Attack], s: Setting, norm: str | None = None) -> Threat | Box:
    """The data box for box attacks, else a ball (``norm``, default the first of ``cls.norms``)."""
    box = make_box(s)
    if cls.threat_kind == "box" or norm == "box":
        return box
    norm = norm or ("Linf" if "Linf" in cls.norms else cls.norms[0])
    return {"Linf": Linf, "L2": L2}[norm](EPS[norm], bounds=box)


def small_params(cls: type[Attack], s: Setting) -> dict[str, Any]:
    """The declared cost knobs of ``cls`` shrunk (see ``SMALL``), plus a tiny generator if it takes one."""
    names = cls.param_names()
    declared = cls.declared_params()
    out = {}
    for k, v in SMALL.items():
        if k in names and (k not in declared or declared[k].accepts(v)):
            out[k] = v
    if "generator" in names:
        out["generator"] = make_generator(s)
    if s.channels > 1 and "step_size" in names and declared["step_size"].accepts(0.01) and "step_size" not in out:
        # per-channel ranges of different widths have no single data range: defaults relative to it are
        # refused, so the step is given in data units (the refusal itself is tested in tests/test_params.py)
        out["step_size"] = 0.01
    return out


@dataclass
class Case:
    """One attack on one setting: everything a conformance check needs, built fresh."""

    name: str
    setting: Setting
    norm: str | None = None  # None: the default threat of make_threat
    cls: type[Attack] = field(init=False)

    def __post_init__(self) -> None:
        self.cls = attack_class(self.name)

    @property
    def id(self) -> str:
        return f"{self.name}-{self.setting.key}" + (f"-{self.norm}" if self.norm else "")

    @property
    def task(self) -> Task:
        return Segmentation(SEG_CLASSES) if self.setting.segmenter else self.setting.task_class()

    @property
    def targeted(self) -> bool:
        return bool(self.cls.always_targeted)

    def threat(self, norm: str | None = None) -> Threat | Box:
        return make_threat(self.cls, self.setting, norm or self.norm)

    def small(self) -> dict[str, Any]:
        return small_params(self.cls, self.setting)

    def build(self, task: Task | None = None, threat: Threat | Box | None = None, **overrides: Any) -> Attack:
        """``get_attack(name, task, threat_or_box, **small, **overrides)``."""
        return get_attack(self.name, task or self.task, threat or self.threat(), **{**self.small(), **overrides})

    def model(self) -> nn.Module:
        return make_model(self.setting)

    def data(self) -> tuple[Tensor, Tensor]:
        return make_data(self.setting, self.targeted)


def all_cases() -> list[Case]:
    return [Case(n, s) for n in available_attacks() for s in settings_for(attack_class(n))]


def first_case(name: str) -> Case:
    cls = attack_class(name)
    ss = settings_for(cls)
    if not ss:
        raise AssertionError(f"attack {name!r} admits none of the conformance settings "
                             f"(tasks={cls.tasks}, spatial_dims={cls.spatial_dims})")
    return Case(name, ss[0])


def norm_cases() -> list[Case]:
    """Every norm an attack declares (and the plain box for "ball_or_box" attacks), on its first setting."""
    out = []
    for n in available_attacks():
        cls = attack_class(n)
        ss = settings_for(cls)
        if not ss:
            continue
        kinds = ["box"] if cls.threat_kind == "box" else list(cls.norms)
        if cls.threat_kind == "ball_or_box":
            kinds.append("box")
        out += [Case(n, ss[-1], k) for k in kinds]  # the last setting: segmentation where supported
    return out


def param_cases() -> list[tuple[str, str]]:
    return [(n, p) for n in available_attacks() for p in attack_class(n).param_names()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = metafunc.fixturenames
    if "case" in names:
        cases = all_cases()
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])
    if "norm_case" in names:
        cases = norm_cases()
        metafunc.parametrize("norm_case", cases, ids=[c.id for c in cases])
    if "attack_name" in names:
        metafunc.parametrize("attack_name", available_attacks())
    if "attack_alias" in names:
        al = [(n, old, new) for n in available_attacks() for old, new in attack_class(n).aliases.items()]
        metafunc.parametrize("attack_alias", al, ids=[f"{n}-{o}" for n, o, _ in al])
    if "attack_param" in names:
        pcs = param_cases()
        metafunc.parametrize("attack_param", pcs, ids=[f"{n}-{p}" for n, p in pcs])


# --- a different valid value for each kind of declared constraint ---------------------------------------------
ANY = object()  # "no current value": any valid value will do

_POOL: tuple[Any, ...] = (1, 2, 3, 0, 5, 0.5, 0.25, 0.75, 1.5, 2.5, 10, 0.01, True, False, "a",
                          (1, 2), (2, 2), (1, 1), (1, SIZE, SIZE), (2, SIZE, SIZE), (1, SIZE, SIZE, SIZE), [1, 2],
                          torch.ones(SIZE, SIZE), torch.rand(SIZE, SIZE, generator=torch.Generator().manual_seed(3)),
                          torch.ones(SIZE, SIZE, SIZE))


def _key(c: Constraint, v: Any) -> str | None:
    try:
        return stable_hash(c.convert(v))
    except (ValueError, TypeError):
        return None


def _numbers(c: Int | Real, current: Any) -> Iterator[Any]:
    lo, hi = c.low, c.high
    if current is not ANY and isinstance(current, int | float):
        yield from (current + 1, current * 2, current / 2, current - 1, current * 0.9, current * 1.1)
    if lo is not None and hi is not None:
        yield (lo + hi) / 2
        yield lo + (hi - lo) / 4
    for b in (lo, hi):
        if b is not None:
            yield b
            yield b + 1
            yield b - 1
            yield b * 0.5
    yield from (1, 2, 3, 0, 0.5, 0.25, 0.1, 10)


def _raw_candidates(c: Constraint, current: Any) -> Iterator[Any]:
    if isinstance(c, Bool):
        yield from ((not current,) if isinstance(current, bool) else (True, False))
    elif isinstance(c, Int):
        for v in _numbers(c, current):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, int) and not isinstance(v, bool):
                yield v
    elif isinstance(c, Real):
        yield from (float(v) for v in _numbers(c, current) if not isinstance(v, bool))
    elif isinstance(c, Options):
        yield from c.options
    elif isinstance(c, Optional):
        if current is not None:
            yield None
        yield from _raw_candidates(c.inner, ANY if current is None else current)
    elif isinstance(c, Pair):
        cur = current if isinstance(current, tuple | list) and len(current) == 2 else None
        if cur is not None:
            for v in _raw_candidates(c.inner, cur[0]):
                yield (v, cur[1])
                yield (cur[0], v)
            if c.scalar_ok:
                yield from _raw_candidates(c.inner, cur[0])
        vals = list(_raw_candidates(c.inner, ANY))[:8]
        for a in vals:
            yield (a, a)
            for b in vals:
                yield (a, b)
    elif isinstance(c, AnyOf):
        for sub in c.constraints:
            yield from _raw_candidates(sub, current if sub.accepts(current) else ANY)
    elif isinstance(c, Component | Instance):
        yield from _object_candidates(current)
        if isinstance(c, Component):
            yield from _component_names(c)
    else:  # a constraint type of its own (a sample shape, a list of names): its options, then plain values
        opts = list(getattr(c, "options", ()) or ())
        yield from opts
        yield from ([o] for o in opts)
        if isinstance(current, list | tuple):
            yield from (list(current)[:-1] + [o] for o in opts)
            yield from (list(current) + [o] for o in opts)
        yield from _POOL


def _object_candidates(current: Any) -> Iterator[Any]:
    """Variants of an object value: a Configurable with one parameter changed, a module with other weights."""
    if isinstance(current, nn.Module):
        other = copy.deepcopy(current)
        with torch.no_grad():
            for p in other.parameters():
                p.add_(0.5)
                break
        yield other
    elif isinstance(current, Tensor):
        yield current + 1
    elif isinstance(current, Configurable):
        declared = current.declared_params()
        for p in current.param_names():
            if p in declared:
                for v in candidates(declared[p], getattr(current, p)):
                    try:
                        yield current.set_params(**{p: v})
                    except (ValueError, TypeError):
                        continue
                    break


def _component_names(c: Component) -> list[str]:
    """Registered names a component may be given by (explanations), if the component has a registry."""
    try:
        from medadv.explain import available_explanations
        from medadv.explain.base import Explanation
    except ImportError:  # pragma: no cover
        return []
    return list(available_explanations()) if issubclass(c.base, Explanation) else []


def candidates(c: Constraint, current: Any = ANY, limit: int = 12) -> list[Any]:
    """Up to ``limit`` values ``c`` accepts whose converted value differs from ``current``.

    Covers every constraint type of :mod:`medadv.params` (Int, Real, Bool, Options, Optional, Pair, AnyOf,
    Component, Instance); a constraint type of its own gets values from a pool of plain values.
    """
    cur = ANY if current is ANY else stable_hash(current)
    out: list[Any] = []
    seen: set[str] = set() if cur is ANY else {cur}  # type: ignore[arg-type]
    for v in _raw_candidates(c, current):
        if isinstance(v, float) and not math.isfinite(v):
            continue
        k = _key(c, v)
        if k is None or k in seen:
            continue
        seen.add(k)
        out.append(v)
        if len(out) >= limit:
            break
    return out


# --- model state ---------------------------------------------------------------------------------------------
def model_state(model: nn.Module) -> dict[str, Any]:
    """Everything an attack must leave as it found it: modes, requires_grad, .grad, weights, buffers."""
    return {
        "modes": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def prepare_model(model: nn.Module) -> nn.Module:
    """A model as a caller may hand it over mid-training: train mode (BatchNorm would update its running
    statistics, dropout would fire) with its last layer in eval mode and one frozen parameter; every flag
    must come back exactly so."""
    model.train()
    model[-1].eval()
    next(model[0].parameters()).requires_grad_(False)
    return model


@pytest.fixture
def factory(device: torch.device) -> Any:
    """The helpers above, for the test module (conftest helpers are not importable under importlib mode), and the
    ``--device`` the conformance runs use."""

    class F:
        pass

    f = F()
    f.device = device
    for k, v in {
        "Case": Case, "first_case": first_case, "candidates": candidates, "model_state": model_state,
        "prepare_model": prepare_model, "make_threat": make_threat, "make_box": make_box, "EPS": EPS,
        "SMALL": SMALL, "ANY": ANY, "settings_for": settings_for,
    }.items():
        setattr(f, k, v)
    return f
