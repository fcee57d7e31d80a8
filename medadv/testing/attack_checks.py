"""Conformance checks of an attack: :func:`check_attack` and the per-property checks it runs.

Everything is derived from the attack class's declarations and the task registry, never from a hand-kept list:

* the *settings* are every registered task kind's :meth:`~medadv.tasks.Task.examples` (a 2-D multi-class and
  multi-label classifier, a 2-D segmenter on two channels with a per-channel box, a 3-D segmenter, and whatever
  kinds are registered after them);
* ``Attack.tasks`` (task class names, along the MRO) and ``spatial_dims`` say which settings the attack admits; on
  the others it must refuse before any work (a ``ValueError``/``TypeError`` at construction or at the call, after at
  most the one clean forward that validates ``y``);
* ``threat_kind`` and ``norms`` pick the threat (a ball of the example's ε, or the example's data box);
  ``always_targeted`` attacks get the example's target;
* ``param_names()`` / ``declared_params()``: :data:`SMALL` shrinks the declared *cost* knobs only (fewer steps, one
  restart, AutoAttack's cheapest member), and a GAP-style ``generator`` parameter gets a tiny generator module.

Properties (the names in a :class:`~medadv.testing.ConformanceError`), per setting: ``result shapes``,
``box and ball``, ``declared norms``, ``HU-range data``, ``model state``, ``caller tensors``, ``global RNG``,
``determinism``, ``bad input``; per attack: ``declarations``, ``config round trip``, ``fingerprints``,
``unknown parameter``, ``deprecated aliases``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attacks.base import Attack, AttackResult, attack_class, get_attack
from ..params import InvalidParameterError, stable_hash
from ..tasks import Task, TaskExample, available_tasks, task_class
from ..threats import L2, Box, Linf, Threat
from ._common import (
    ConformanceError,
    count_forwards,
    example_prototypes,
    model_state,
    prepare_model,
    state_problems,
)
from ._values import candidates

__all__ = ["SMALL", "Setting", "AttackCase", "AttackReport", "check_attack", "settings", "admits", "check_case",
           "check_norm", "check_bad_input", "check_attack_property", "SETTING_PROPERTIES", "ATTACK_PROPERTIES",
           "BAD_INPUTS", "make_threat", "small_params", "to_config"]

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

HU_LO, HU_WIDTH = -1024.0, 4095.0  # CT in Hounsfield units: a [0, 1] box mapped onto [-1024, 3071]


class _Fail(ConformanceError):
    """A property failed (the driver prefixes the subject, setting and property)."""


# --- settings: the registered kinds' examples --------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One example of one task kind (``task_cls.examples()[index]``) that attacks are tried on."""

    task_cls: type[Task]
    index: int
    key: str
    ndim: int  # spatial rank of the input
    channels: int

    @property
    def kind(self) -> str:
        return self.task_cls.name

    def example(self, seed: int = 0) -> TaskExample:
        """The example with its own tensors and task; the model is the shared prototype's (copy it before use:
        :meth:`AttackCase.model`)."""
        proto = example_prototypes(self.task_cls, seed)[self.index]
        return dataclasses.replace(proto, task=copy.deepcopy(proto.task), x=proto.x.clone(), y=proto.y.clone(),
                                   target=None if proto.target is None else proto.target.clone(),
                                   box=copy.deepcopy(proto.box), eps=dict(proto.eps))

    def __repr__(self) -> str:
        return self.key


def _kind_classes(task_kinds: Iterable[str | type[Task]] | None) -> list[type[Task]]:
    kinds = available_tasks() if task_kinds is None else list(task_kinds)
    return [task_class(k) if isinstance(k, str) else k for k in kinds]


def settings(task_kinds: Iterable[str | type[Task]] | None = None) -> list[Setting]:
    """The settings of ``task_kinds`` (names or Task classes; default every registered kind), in registration
    order; a kind without :meth:`~medadv.tasks.Task.examples` has none."""
    out = []
    for cls in _kind_classes(task_kinds):
        try:
            exs = example_prototypes(cls)
        except NotImplementedError:
            continue
        out += [Setting(cls, i, ex.key, ex.x.ndim - 2, int(ex.x.shape[1])) for i, ex in enumerate(exs)]
    return out


def admits(cls: type[Attack], s: Setting) -> bool:
    """Whether the attack's declarations admit the setting (task class by name, along the MRO; spatial rank)."""
    if cls.tasks and not any(c.__name__ in cls.tasks for c in s.task_cls.__mro__):
        return False
    return not cls.spatial_dims or s.ndim in cls.spatial_dims


# --- one attack on one setting -----------------------------------------------------------------------------------
def _box_of(ex: TaskExample) -> Box:
    box = ex.box
    return box if isinstance(box, Box) else Box(*box)


def make_threat(cls: type[Attack], ex: TaskExample, norm: str | None = None) -> Threat | Box:
    """The example's data box for box attacks (or ``norm="box"``), else a ball of the example's ε (``norm``,
    default ``Linf`` when declared, else the first of ``cls.norms``)."""
    box = _box_of(ex)
    if cls.threat_kind == "box" or norm == "box":
        return box
    norm = norm or ("Linf" if "Linf" in cls.norms else cls.norms[0])
    return {"Linf": Linf, "L2": L2}[norm](ex.eps[norm], bounds=box)


def _per_channel(box: Box) -> bool:
    return box.bounds is not None and any(isinstance(b, Tensor) and b.numel() > 1 for b in box.bounds)


def small_params(cls: type[Attack], ex: TaskExample) -> dict[str, Any]:
    """The declared cost knobs of ``cls`` shrunk (see :data:`SMALL`), plus a tiny generator if it takes one."""
    names = cls.param_names()
    declared = cls.declared_params()
    out = {}
    for k, v in SMALL.items():
        if k in names and (k not in declared or declared[k].accepts(v)):
            out[k] = v
    if "generator" in names:
        out["generator"] = _generator(ex.x)
    if _per_channel(_box_of(ex)) and "step_size" in names and declared["step_size"].accepts(0.01):
        # per-channel ranges of different widths have no single data range: defaults relative to it are
        # refused, so the step is given in data units
        out["step_size"] = 0.01
    return out


def _generator(x: Tensor) -> nn.Module:
    """A tiny image-to-perturbation generator (GAP): the data's channels in and out, tanh output."""
    conv = nn.Conv2d if x.ndim == 4 else nn.Conv3d
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return nn.Sequential(conv(x.shape[1], x.shape[1], 3, padding=1), nn.Tanh())


def _attack_name(cls: type[Attack]) -> str:
    """The registered name of ``cls``, or its class name when it is not registered."""
    try:
        if attack_class(cls.name) is cls:
            return cls.name
    except InvalidParameterError:
        pass
    return cls.__name__


def _build(cls: type[Attack], task: Task, threat: Threat | Box, **params: Any) -> Attack:
    """``get_attack(name, ...)`` for a registered attack, else the class with its keywords checked the same way."""
    name = _attack_name(cls)
    if name == cls.name:
        return get_attack(name, task, threat, **params)
    return cls(task, threat, **cls.check_kwargs(params, what=f"attack {cls.__name__!r}"))


@dataclass
class AttackCase:
    """One attack on one setting (optionally under one norm): everything a check needs, built fresh.

    ``attack``: a registered name or an Attack class; ``params``: parameters every build uses (an instance's own).
    """

    attack: str | type[Attack]
    setting: Setting
    norm: str | None = None  # None: the default threat of make_threat
    params: Mapping[str, Any] = field(default_factory=dict)
    cls: type[Attack] = field(init=False)
    _example: TaskExample | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.cls = attack_class(self.attack) if isinstance(self.attack, str) else self.attack

    @property
    def name(self) -> str:
        return _attack_name(self.cls)

    @property
    def id(self) -> str:
        return f"{self.name}-{self.setting.key}" + (f"-{self.norm}" if self.norm else "")

    @property
    def key(self) -> str:
        """The id, plus the fixed parameters' hash when there are any (the cache key of this case)."""
        return self.id + (f"@{stable_hash(dict(self.params))}" if self.params else "")

    @property
    def example(self) -> TaskExample:
        if self._example is None:
            self._example = self.setting.example()
        return self._example

    @property
    def task(self) -> Task:
        return self.example.task

    @property
    def targeted(self) -> bool:
        return bool(self.cls.always_targeted)

    def threat(self, norm: str | None = None) -> Threat | Box:
        return make_threat(self.cls, self.example, norm or self.norm)

    def small(self) -> dict[str, Any]:
        return {**small_params(self.cls, self.example), **self.params}

    def build(self, task: Task | None = None, threat: Threat | Box | None = None, **overrides: Any) -> Attack:
        """The attack with the small parameters and ``overrides`` (by name through the registry when registered)."""
        return _build(self.cls, task or self.task, threat or self.threat(), **{**self.small(), **overrides})

    def model(self) -> nn.Module:
        """A fresh copy of the example's model (in eval mode)."""
        return copy.deepcopy(self.example.model).eval()

    def data(self) -> tuple[Tensor, Tensor]:
        """Fresh copies of ``(x, y)``; ``y`` is the example's target for an always-targeted attack."""
        ex = self.example
        y = ex.target if self.targeted else ex.y
        if y is None:
            raise _Fail(f"the {self.setting.key} example has no `target` for the always-targeted {self.name}")
        return ex.x.clone(), y.clone()

    def box(self) -> Box:
        return _box_of(self.example)


@dataclass
class Run:
    """One call of the attack with everything the read-only properties look at."""

    x: Tensor
    y: Tensor
    x_before: Tensor
    y_before: Tensor
    state_before: dict[str, Any]
    state_after: dict[str, Any]
    rng_before: Tensor
    rng_after: Tensor
    grad_mode: tuple[bool, bool]
    seeded: bool
    forwards: int
    result: AttackResult | None
    error: BaseException | None

    def get(self) -> AttackResult:
        if self.error is not None:
            raise _Fail(f"the attack call failed: {type(self.error).__name__}: {self.error} (to refuse a setting, raise a "
                        "ValueError/TypeError saying what to use instead at construction or before any forward pass "
                        "but the clean one)") from self.error
        assert self.result is not None
        return self.result


def _device(device: torch.device | str | None) -> torch.device:
    return torch.device("cpu" if device is None else device)


def _run(case: AttackCase, device: torch.device, cache: dict[str, Any], threat: Threat | Box | None = None) -> Run:
    threat = threat or case.threat()
    key = f"run|{case.setting.kind}|{case.key}|{threat!r}"
    if key in cache:
        return cache[key]
    x, y = (t.to(device) for t in case.data())
    model = prepare_model(case.model()).to(device)
    x_before, y_before = x.clone(), y.clone()
    state_before = model_state(model)
    rng_before, grad_before = torch.get_rng_state(), torch.is_grad_enabled()
    result, error, seeded = None, None, False
    with count_forwards(model) as calls:
        try:
            attack = case.build(threat=threat)
            seeded = getattr(attack, "seed", None) is not None
            result = attack(model, x, y)
        except Exception as e:  # recorded: every property of this case reports it (or it is a refusal)
            error = e
    run = Run(x, y, x_before, y_before, state_before, model_state(model), rng_before, torch.get_rng_state(),
              (grad_before, torch.is_grad_enabled()), seeded, len(calls), result, error)
    cache[key] = run
    return run


def _refusal(run: Run) -> str | None:
    """The refusal a failed run is (a ValueError/TypeError before any work), or ``None``."""
    e = run.error
    if isinstance(e, ValueError | TypeError) and run.forwards <= 1 and str(e).strip():
        return f"{type(e).__name__}: {e}"
    return None


# --- per-setting properties --------------------------------------------------------------------------------------
def _box_violation(box: Box, x_adv: Tensor) -> float:
    if box.bounds is None:
        return 0.0
    lo, hi = box.lohi(x_adv)
    return float(torch.maximum(lo - x_adv, x_adv - hi).clamp_min(0).max())


def _inside(threat: Threat | Box, x: Tensor, res: AttackResult) -> None:
    box = threat if isinstance(threat, Box) else threat.box
    # exactly inside: a model or a second attack that checks its input must accept x_adv
    gap = _box_violation(box, res.x_adv)
    if gap != 0.0:
        raise _Fail(f"x_adv leaves the box {box!r} by {gap}")
    try:
        box.check_inside(res.x_adv, "x_adv")
    except ValueError as e:
        raise _Fail(str(e)) from None
    if isinstance(threat, Threat):
        norms = threat.norm(res.x_adv - x)
        tol = threat.eps * 1e-5 + 1e-6
        if not bool((norms <= threat.eps + tol).all()):
            raise _Fail(f"x_adv leaves the {type(threat).__name__} ball of radius {threat.eps}: norms {norms.tolist()}")


def _shapes(case: AttackCase, device: torch.device, cache: dict[str, Any]) -> None:
    run = _run(case, device, cache)
    res = run.get()
    n = run.x.shape[0]
    if not (res.x_adv.shape == run.x.shape and res.x_adv.dtype == run.x.dtype and res.x_adv.device == run.x.device):
        raise _Fail(f"x_adv is {tuple(res.x_adv.shape)} {res.x_adv.dtype} on {res.x_adv.device}, "
                    f"x is {tuple(run.x.shape)} {run.x.dtype} on {run.x.device}")
    if res.fooled.shape != (n,) or res.fooled.dtype != torch.bool:
        raise _Fail(f"`fooled` must be ({n},) bool, got {tuple(res.fooled.shape)} {res.fooled.dtype}")
    if res.linf.shape != (n,) or res.l2.shape != (n,):
        raise _Fail(f"`linf`/`l2` must be ({n},), got {tuple(res.linf.shape)} and {tuple(res.l2.shape)}")
    if not (torch.isfinite(res.x_adv).all() and torch.isfinite(res.logits).all()):
        raise _Fail("x_adv or the adversarial logits hold NaN/Inf")
    if res.x_adv.requires_grad:
        raise _Fail("x_adv requires grad (return a detached tensor)")
    # the typed details' declared columns are per-sample values (they become result-table columns)
    want = set(() if res.details is None else res.details.columns)
    for i, row in enumerate(res.rows()):
        if set(row) != want:
            raise _Fail(f"row {i} of the details has columns {sorted(row)}, the details declare {sorted(want)}")


def _box_and_ball(case: AttackCase, device: torch.device, cache: dict[str, Any]) -> None:
    run = _run(case, device, cache)
    _inside(case.threat(), run.x, run.get())


def _state(case: AttackCase, device: torch.device, cache: dict[str, Any]) -> None:
    run = _run(case, device, cache)
    run.get()
    problems = state_problems(run.state_before, run.state_after)
    if problems:
        raise _Fail("; ".join(problems))
    if run.grad_mode[0] != run.grad_mode[1]:
        raise _Fail("torch's grad mode changed")


def _tensors(case: AttackCase, device: torch.device, cache: dict[str, Any]) -> None:
    run = _run(case, device, cache)
    res = run.get()
    if not torch.equal(run.x, run.x_before):
        raise _Fail("x was modified in place")
    if not torch.equal(run.y, run.y_before):
        raise _Fail("y was modified in place")
    # x_adv and the returned labels are the caller's to modify: they must not share memory with x and y
    if res.x_adv.untyped_storage().data_ptr() == run.x.untyped_storage().data_ptr():
        raise _Fail("x_adv aliases x")
    if res.y.untyped_storage().data_ptr() == run.y.untyped_storage().data_ptr():
        raise _Fail("result.y aliases y")


def _rng(case: AttackCase, device: torch.device, cache: dict[str, Any]) -> None:
    run = _run(case, device, cache)
    run.get()
    if not run.seeded:
        raise _Fail("the attack's default seed is None (an attack is seeded by default)")
    if not torch.equal(run.rng_before, run.rng_after):
        raise _Fail("a seeded attack used or re-seeded torch's global RNG")


def _determinism(case: AttackCase, device: torch.device, cache: dict[str, Any]) -> None:
    first = _run(case, device, cache).get()
    x, y = (t.to(device) for t in case.data())
    again = case.build()(prepare_model(case.model()).to(device), x, y)
    if not torch.equal(first.x_adv, again.x_adv):
        raise _Fail("same seed, same settings, same data: a different x_adv")


def _cacheable(case: AttackCase, device: torch.device, cache: dict[str, Any]) -> None:
    """A run crafts each sample once (:mod:`medadv.attack_cache`): the result splits per sample, and served back
    from the cache it equals what the attack returned."""
    from ..attack_cache import AttackCache, _split, attack_once, craft

    first = _run(case, device, cache).get()
    n = first.x_adv.shape[0]
    if first.trace is None and _split(first, n) is None:
        raise _Fail("its result cannot be split per sample, so a run crafts it again wherever it is read: declare "
                    "every per-sample field of its details in `columns` or `sample_fields` (leading dimension N)")
    x, y = (t.to(device) for t in case.data())
    model = prepare_model(case.model()).to(device)
    attack = case.build()
    with attack_once(AttackCache()) as store:
        crafted = craft(attack, model, x, y)
        served = craft(attack, model, x, y)
    if first.trace is None and store.stats["reused"] != n:
        raise _Fail(f"a second identical call crafted again ({store.stats})")
    for name in ("x_adv", "logits"):
        if not torch.equal(getattr(crafted, name), getattr(served, name)):
            raise _Fail(f"the cache served a different {name} than the attack returned")
    if crafted.rows() != served.rows():
        raise _Fail("the cache served other per-sample details than the attack returned")


def _in_hu(threat: Threat | Box) -> Threat | Box:
    box = threat if isinstance(threat, Box) else threat.box
    assert box.bounds is not None
    lo, hi = box.bounds
    hu = Box(HU_LO + HU_WIDTH * lo, HU_LO + HU_WIDTH * hi)
    return hu if isinstance(threat, Box) else type(threat)(threat.eps * HU_WIDTH, bounds=hu)


def check_norm(case: AttackCase, device: torch.device | str | None = None, cache: dict[str, Any] | None = None,
               *, hu: bool = False) -> None:
    """``declared norms`` (``hu=False``): under ``case.norm``, x_adv lies in the box and the ball; ``HU-range data``
    (``hu=True``): the same on data in Hounsfield units, where the tiny models' logits run into the thousands and
    saturate the softmax (a careless log or normalisation gives NaN). Raises :class:`ConformanceError`."""
    dev, memo = _device(device), {} if cache is None else cache
    prop = "HU-range data" if hu else "declared norms"

    def body() -> None:
        threat = case.threat()
        if not hu:
            run = _run(case, dev, memo, threat)
            if _refusal(run) is None:  # a setting refused before any work passes
                _inside(threat, run.x, run.get())
            return
        threat = _in_hu(threat)
        try:
            attack = case.build(threat=threat)
        except (ValueError, TypeError):
            return  # refused before any work: a pass
        model = prepare_model(case.model()).to(dev)
        x, y = case.data()
        x, y = (HU_LO + HU_WIDTH * x).to(dev), y.to(dev)
        with count_forwards(model) as calls:
            try:
                res = attack(model, x, y)
            except (ValueError, TypeError) as e:
                if len(calls) <= 1 and str(e).strip():  # refused before any work (autoattack: several labels)
                    return
                raise
        if not torch.isfinite(res.x_adv).all():
            raise _Fail("x_adv holds NaN/Inf on HU-range data")
        _inside(threat, x, res)

    _guard(f"check_attack({case.name}): {case.setting.key} under {case.norm or 'the default threat'}", prop, body,
           memo, f"{prop}|{case.setting.kind}|{case.key}")


#: the bad inputs of the ``bad input`` property
BAD_INPUTS = ("nan_x", "x_outside_box", "y_wrong_shape", "model_not_a_module")


def check_bad_input(case: AttackCase, bad: str, cache: dict[str, Any] | None = None) -> None:
    """``bad input``: ``bad`` (one of :data:`BAD_INPUTS`) gets a clear error before any work (at most the one clean
    forward that validates ``y``); an attack that refuses the setting at construction passes. Raises
    :class:`ConformanceError`."""

    def body() -> None:
        try:
            attack = case.build()
        except (ValueError, TypeError):
            return  # the attack refuses this setting at construction (a pass): there is no call to feed bad input
        model: Any = case.model()
        x, y = case.data()
        allowed = 0  # forwards allowed before the error
        err: tuple[type[Exception], ...]
        if bad == "nan_x":
            x[0].view(-1)[0] = float("nan")
            err, match = (ValueError,), "`x` contains NaN"
        elif bad == "x_outside_box":
            hi = case.box().hi
            x = x + 2 * (hi if isinstance(hi, Tensor) else float(1.0 if hi is None else hi))
            err, match = (ValueError,), "outside the declared bounds"
        elif bad == "y_wrong_shape":
            # labels on the input's grid lose a row of it; other labels lose a sample
            y = y[:, :-1] if case.task.spatial_labels and y.ndim >= 2 else y[:-1]
            err, match = (ValueError, TypeError), "`y`"
            allowed = 1  # the clean forward that y is checked against
        elif bad == "model_not_a_module":
            model = lambda t: t  # noqa: E731
            err, match = (TypeError,), "`model` must be a torch.nn.Module"
        else:
            raise ValueError(f"`bad` must be one of {', '.join(BAD_INPUTS)}, got {bad!r}")
        counter = count_forwards(model) if isinstance(model, nn.Module) else None
        calls: list[int] = []
        try:
            if counter is not None:
                with counter as calls:
                    attack(model, x, y)
            else:
                attack(model, x, y)
        except err as e:
            if match not in str(e):
                raise _Fail(f"{bad}: the error does not say {match!r}: {type(e).__name__}: {e}") from None
        except Exception as e:
            raise _Fail(f"{bad}: {type(e).__name__} instead of {' or '.join(t.__name__ for t in err)}: {e}") from None
        else:
            raise _Fail(f"{bad}: no error")
        if len(calls) > allowed:
            raise _Fail(f"{bad}: {len(calls)} forward passes before the error")

    _guard(f"check_attack({case.name}): {case.setting.key}", "bad input", body, cache,
           f"bad input {bad}|{case.setting.kind}|{case.key}")


#: the per-setting properties over one run of the default threat (and its determinism rerun)
SETTING_PROPERTIES: dict[str, Callable[[AttackCase, torch.device, dict[str, Any]], None]] = {
    "result shapes": _shapes,
    "box and ball": _box_and_ball,
    "model state": _state,
    "caller tensors": _tensors,
    "global RNG": _rng,
    "determinism": _determinism,
    "attack once": _cacheable,
}


def _guard(subject: str, prop: str, body: Callable[[], None], cache: dict[str, Any] | None = None,
           key: str | None = None) -> None:
    """Run ``body``; a failure becomes ``ConformanceError("<subject>: <prop>: <what>")`` (memoised under ``key``)."""
    if cache is not None and key is not None and key in cache:
        if cache[key] is not None:
            raise cache[key]
        return
    error: ConformanceError | None = None
    try:
        body()
    except _Fail as e:
        error = ConformanceError(f"{subject}: {prop}: {e}")
    except ConformanceError:
        raise
    except Exception as e:  # noqa: BLE001 -- a crash is a failure of the property, named as such
        error = ConformanceError(f"{subject}: {prop}: {type(e).__name__}: {e}")
    if cache is not None and key is not None:
        cache[key] = error
    if error is not None:
        raise error


def check_case(case: AttackCase, prop: str, device: torch.device | str | None = None,
               cache: dict[str, Any] | None = None) -> str | None:
    """Check one per-setting property (a key of :data:`SETTING_PROPERTIES`) of one case.

    Returns ``None`` when it holds, or the refusal when the attack refused the setting before any work (a pass);
    raises :class:`ConformanceError` naming the setting and the property otherwise. ``cache`` shares the attack
    run between the properties (and between calls given the same dict).
    """
    dev, memo = _device(device), {} if cache is None else cache
    subject = f"check_attack({case.name}): {case.setting.key}"
    try:
        run = _run(case, dev, memo)
    except _Fail as e:
        raise ConformanceError(f"{subject}: {prop}: {e}") from None
    refused = _refusal(run)
    if refused is not None:
        return refused
    fn = SETTING_PROPERTIES[prop]
    _guard(subject, prop, lambda: fn(case, dev, memo), memo, f"{prop}|{case.setting.kind}|{case.key}")
    return None


# --- per-attack properties ---------------------------------------------------------------------------------------
def _memo(cache: dict[str, Any] | None, key: str, subject: str, fn: Callable[[], None]) -> None:
    """Run the check ``fn`` once per ``key`` of ``cache``: a later call re-raises its failure (or returns). A failure
    is a :class:`ConformanceError` reading ``<subject>: <what>``."""
    memo = {} if cache is None else cache
    if key not in memo:
        try:
            fn()
            memo[key] = None
        except _Fail as e:
            memo[key] = ConformanceError(f"{subject}: {e}")
    if memo[key] is not None:
        raise memo[key]


class _NotYAML(Exception):
    pass


def to_config(v: Any) -> Any:
    """A value's YAML form: plain values as they are, objects by their ``config()`` form; raises ``TypeError`` for
    values without one (modules, tensors: a config names them by path instead)."""
    if v is None or isinstance(v, bool | int | str | float):
        return v
    if isinstance(v, tuple | list):
        return [to_config(e) for e in v]
    if isinstance(v, Mapping):
        return {str(k): to_config(e) for k, e in v.items()}
    config = getattr(v, "config", None)
    if callable(config):
        return to_config(config())
    raise _NotYAML(type(v).__name__)


def _declarations(case: AttackCase, all_settings: Sequence[Setting], cache: dict[str, Any]) -> None:
    cls = case.cls
    try:
        cls.check_declarations()
    except Exception as e:  # noqa: BLE001
        raise _Fail(f"{type(e).__name__}: {e}") from None
    if cls.threat_kind not in ("ball", "box", "ball_or_box"):
        raise _Fail(f"threat_kind must be 'ball', 'box' or 'ball_or_box', got {cls.threat_kind!r}")
    if not (cls.__doc__ and cls.__doc__.strip()):
        raise _Fail("a public attack needs a docstring")


def _round_trip(case: AttackCase, all_settings: Sequence[Setting], cache: dict[str, Any]) -> None:
    """``get_params()`` -> ``yaml.safe_dump`` -> load -> build gives the same fingerprint (objects without a YAML
    form, ``nn.Module`` instances and tensors, are handed over as objects; a config names them by path)."""
    import yaml

    attack = case.build()
    params = attack.get_params()
    if list(params) != attack.param_names():
        raise _Fail(f"get_params() gives {list(params)}, param_names() {attack.param_names()}")
    cfg, objects = {}, {}
    for k, v in params.items():
        try:
            cfg[k] = to_config(v)
        except _NotYAML:
            if not isinstance(v, nn.Module | Tensor):
                raise _Fail(f"`{k}` = {type(v).__name__} has no YAML (config()) form") from None
            objects[k] = v
    loaded = yaml.safe_load(yaml.safe_dump(cfg))
    again = _build(case.cls, case.task, case.threat(), **loaded, **objects)
    if again.fingerprint() != attack.fingerprint():
        raise _Fail("the attack rebuilt from its YAML config has another fingerprint")
    if again.get_params().keys() != params.keys():
        raise _Fail("the attack rebuilt from its YAML config has other parameters")


def _try_build(case: AttackCase, **params: Any) -> Attack | Exception:
    try:
        return case.build(**params)
    except (ValueError, TypeError) as e:  # e.g. a value another parameter rules out
        return e


def check_parameter_fingerprint(case: AttackCase, p: str, all_settings: Sequence[Setting] | None = None,
                                cache: dict[str, Any] | None = None) -> None:
    """``fingerprints``: the fingerprint changes when the declared parameter ``p`` changes (on some admitted
    setting of ``all_settings``, default every registered kind's; or together with another parameter a value
    needs). Raises :class:`ConformanceError`."""
    every = settings() if all_settings is None else all_settings
    _memo(cache, f"fingerprint {p}|{case.key}", f"check_attack({case.name}): fingerprints",
          lambda: _param_fingerprint(case, p, every))


def _param_fingerprint(case: AttackCase, p: str, all_settings: Sequence[Setting]) -> None:
    base = case.build()
    declared = base.declared_params()
    if p not in declared:
        raise _Fail(f"`{p}` is not declared")
    current = base.get_params()[p]
    sample = tuple(case.example.x.shape[1:])
    values = candidates(declared[p], current, sample=sample)
    if not values:
        return  # the declaration admits this one value only: there is no other setting to tell apart
    refused = []
    # a value may apply to some tasks only (auto's progressive_radius is refused for multi-class): every setting
    for setting in [s for s in all_settings if admits(case.cls, s)]:
        here = AttackCase(case.cls, setting, params=case.params)
        try:
            here_base = here.build()
        except (ValueError, TypeError):
            continue
        for v in values:
            other = _try_build(here, **{p: v})
            if isinstance(other, Exception):
                refused.append(f"{v!r} ({setting.key}): {other}")
                continue
            if stable_hash(other.get_params()[p]) == stable_hash(current):
                raise _Fail(f"`{p}`={v!r} was not stored")
            if other.fingerprint() == here_base.fingerprint():
                raise _Fail(f"`{p}`={v!r} gives the same fingerprint")
            return
    # values that need another parameter changed with them (GAP's universal=True needs input_shape,
    # AutoAttack's version='standard' needs attacks=None): two valid builds that differ in `p` only
    for q, cq in declared.items():
        if q == p or q not in base.param_names():
            continue
        # on this case's setting, then on the others (APGD's volume_target needs loss='volume' and a segmentation)
        heres = [case, *(AttackCase(case.cls, s, params=case.params) for s in all_settings
                         if admits(case.cls, s) and s.key != case.setting.key)]
        for w, here in ((w, h) for w in [base.get_params()[q], *candidates(cq, base.get_params()[q], limit=4,
                                                                          sample=sample)] for h in heres):
            built = []
            for v in [current, *values]:
                other = _try_build(here, **{p: v, q: w})
                if not isinstance(other, Exception):
                    built.append((v, other))
                if len(built) == 2:
                    (v1, a), (v2, b) = built
                    if a.fingerprint() == b.fingerprint():
                        raise _Fail(f"`{p}`={v1!r} and {v2!r} (with `{q}`={w!r}) give the same fingerprint")
                    return
    raise _Fail(f"no different valid value of `{p}` ({declared[p]!r}, now {current!r}) could be built: {refused}")


def check_budget_fingerprint(case: AttackCase, cache: dict[str, Any] | None = None) -> None:
    """``fingerprints``: the fingerprint changes with the ε and with the data box. Raises
    :class:`ConformanceError`."""
    _memo(cache, f"fingerprint budget|{case.key}", f"check_attack({case.name}): fingerprints",
          lambda: _budget_fingerprint(case))


def _budget_fingerprint(case: AttackCase) -> None:
    threat = case.threat()
    base = case.build().fingerprint()
    box = threat if isinstance(threat, Box) else threat.box
    if box.bounds is None:
        return  # unbounded data: there is no box to widen
    lo, hi = box.bounds
    wider = Box(lo, hi * 2)
    if isinstance(threat, Threat):
        if case.build(threat=threat.with_eps(threat.eps * 2)).fingerprint() == base:
            raise _Fail("the fingerprint does not change with ε")
        if case.build(threat=type(threat)(threat.eps, bounds=wider)).fingerprint() == base:
            raise _Fail("the fingerprint does not change with the data box")
    elif case.build(threat=wider).fingerprint() == base:
        raise _Fail("the fingerprint does not change with the data box")


def _fingerprints(case: AttackCase, all_settings: Sequence[Setting], cache: dict[str, Any]) -> None:
    for p in case.cls.param_names():
        check_parameter_fingerprint(case, p, all_settings, cache)
    check_budget_fingerprint(case, cache)


def check_unknown_parameter(case: AttackCase, p: str, cache: dict[str, Any] | None = None) -> None:
    """``unknown parameter``: a typo of ``p`` is refused with ``InvalidParameterError`` naming the closest valid
    name. Raises :class:`ConformanceError`."""
    _memo(cache, f"unknown {p}|{case.key}", f"check_attack({case.name}): unknown parameter",
          lambda: _unknown_parameter(case, p))


def _unknown_parameter(case: AttackCase, p: str) -> None:
    typo = p + p[-1]
    try:
        _build(case.cls, case.task, case.threat(), **{typo: 1})
    except InvalidParameterError as e:
        if f"unknown parameter `{typo}`" not in str(e) or f"did you mean '{p}'" not in str(e):
            raise _Fail(f"`{typo}` is refused without naming `{p}`: {e}") from None
    else:
        raise _Fail(f"the unknown parameter `{typo}` was accepted")


def _unknown(case: AttackCase, all_settings: Sequence[Setting], cache: dict[str, Any]) -> None:
    for p in case.cls.param_names():
        check_unknown_parameter(case, p, cache)


def check_alias(case: AttackCase, old: str, new: str, cache: dict[str, Any] | None = None) -> None:
    """``deprecated aliases``: the deprecated name ``old`` warns (``FutureWarning`` naming ``new``) and builds what
    ``new`` builds. Raises :class:`ConformanceError`."""
    _memo(cache, f"alias {old}|{case.key}", f"check_attack({case.name}): deprecated aliases",
          lambda: _alias(case, old, new))


def _alias(case: AttackCase, old: str, new: str) -> None:
    import re
    import warnings

    declared = case.cls.declared_params()
    if new not in case.cls.param_names() or new not in declared:
        raise _Fail(f"alias `{old}` points to `{new}`, not a declared parameter")
    if old in case.cls.param_names():
        raise _Fail(f"alias `{old}` is still a parameter")
    base = case.build()
    for v in candidates(declared[new], base.get_params()[new], sample=tuple(case.example.x.shape[1:])):
        ref = _try_build(case, **{new: v})
        if isinstance(ref, Exception):
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            via_alias = _build(case.cls, case.task, case.threat(),
                               **{k: w for k, w in case.small().items() if k != new}, **{old: v})
        if not any(issubclass(w.category, FutureWarning)
                   and re.search(rf"`{old}` .*deprecated.*`{new}`", str(w.message)) for w in caught):
            raise _Fail(f"`{old}` does not warn (FutureWarning: `{old}` is deprecated, use `{new}`)")
        if not via_alias.fingerprint() == ref.fingerprint() != base.fingerprint():
            raise _Fail(f"`{old}`={v!r} does not build what `{new}`={v!r} builds")
        return
    raise _Fail(f"no value of `{new}` to try the alias `{old}` with")


def _aliases(case: AttackCase, all_settings: Sequence[Setting], cache: dict[str, Any]) -> None:
    for old, new in case.cls.aliases.items():
        check_alias(case, old, new, cache)


#: the per-attack properties (checked on the first admitted setting)
ATTACK_PROPERTIES: dict[str, Callable[[AttackCase, Sequence[Setting], dict[str, Any]], None]] = {
    "declarations": _declarations,
    "config round trip": _round_trip,
    "fingerprints": _fingerprints,
    "unknown parameter": _unknown,
    "deprecated aliases": _aliases,
}


def check_attack_property(case: AttackCase, prop: str, all_settings: Sequence[Setting] | None = None,
                          cache: dict[str, Any] | None = None) -> None:
    """Check one per-attack property (a key of :data:`ATTACK_PROPERTIES`) on ``case``'s setting. Raises
    :class:`ConformanceError`."""
    fn = ATTACK_PROPERTIES[prop]
    every = settings() if all_settings is None else all_settings
    memo = {} if cache is None else cache
    key = f"{prop}|{case.name}" + (f"@{stable_hash(dict(case.params))}" if case.params else "")
    _guard(f"check_attack({case.name})", prop, lambda: fn(case, every, memo), memo, key)


# --- the driver --------------------------------------------------------------------------------------------------
@dataclass
class AttackReport:
    """What :func:`check_attack` checked: ``passed`` (``"<setting>: <property>"``), ``refused`` (setting key -> the
    refusal, a pass) and ``skipped`` (setting or kind -> why nothing could be checked)."""

    attack: str
    passed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"check_attack({self.attack}): {len(self.passed)} checks passed"]
        lines += [f"  refused {k} (a pass): {v}" for k, v in self.refused.items()]
        lines += [f"  skipped {k}: {v}" for k, v in self.skipped.items()]
        return "\n".join(lines)


def _norm_kinds(cls: type[Attack]) -> list[str]:
    kinds = ["box"] if cls.threat_kind == "box" else list(cls.norms)
    if cls.threat_kind == "ball_or_box":
        kinds.append("box")
    return kinds


def _check_refused(case: AttackCase, device: torch.device, cache: dict[str, Any]) -> str:
    """``refusal``: a setting the declarations exclude is refused before any work; returns the refusal."""
    subject = f"check_attack({case.name}): {case.setting.key}"
    try:
        run = _run(case, device, cache)
    except _Fail as e:
        raise ConformanceError(f"{subject}: refusal: {e}") from None
    refused = _refusal(run)
    if refused is None:
        what = "ran" if run.error is None else \
            f"failed after {run.forwards} forward passes ({type(run.error).__name__}: {run.error})"
        raise ConformanceError(
            f"{subject}: refusal: the declarations (tasks={case.cls.tasks}, spatial_dims={case.cls.spatial_dims}) "
            f"exclude this setting, but the attack {what}: refuse it before any work with a ValueError/TypeError "
            "saying what to use instead")
    return refused


def check_attack(attack: str | type[Attack] | Attack, task_kinds: Iterable[str | type[Task]] | None = None, *,
                 properties: Iterable[str] | None = None, device: torch.device | str | None = None,
                 cache: dict[str, Any] | None = None) -> AttackReport:
    """Run the attack contract on every setting of ``task_kinds`` (default: every registered kind's examples).

    Args:
        attack: a registered name, an :class:`~medadv.attacks.base.Attack` subclass (registered or not) or an
            instance (its parameters are used on the examples of every requested kind).
        task_kinds: registered kind names or Task classes whose :meth:`~medadv.tasks.Task.examples` are the settings.
        properties: a subset of :data:`SETTING_PROPERTIES`, ``"declared norms"``, ``"HU-range data"``,
            ``"bad input"`` and :data:`ATTACK_PROPERTIES` (default: all).
        device: where models and data go (default CPU).
        cache: a dict that shares attack runs and outcomes between calls (the project's tests pass one).

    Per setting the attack's declarations admit: the result's shapes; x_adv in the box (exactly) and the ε-ball; every
    declared norm (and the plain box for ``ball_or_box`` attacks) on the last admitted setting, also on data in
    Hounsfield units; the model's modes, flags, gradients, weights and buffers, the caller's tensors, torch's global
    RNG and grad mode untouched; the same seed gives the same tensor; bad inputs (NaN, outside the box, a misshaped
    ``y``, a model that is not a module) get a clear error before any work. An attack that refuses a setting before
    any work (a ``ValueError``/``TypeError`` at construction or at the call, after at most the clean forward) passes
    it, and the refusal is reported; a setting the declarations exclude must be refused so. Per attack: complete
    declarations, ``get_params()`` round trip through YAML to the same fingerprint, a fingerprint that changes with
    every declared parameter, ε and the box, unknown parameters refused with the closest name, deprecated aliases.

    Returns an :class:`AttackReport`; raises :class:`~medadv.testing.ConformanceError` naming the attack, the setting
    and the failed property.
    """
    params: dict[str, Any] = {}
    if isinstance(attack, Attack):
        params = dict(attack.get_params())
        cls: type[Attack] = type(attack)
    else:
        cls = attack_class(attack) if isinstance(attack, str) else attack
    if not (isinstance(cls, type) and issubclass(cls, Attack)):
        raise TypeError(f"check_attack() takes an attack name, Attack class or instance, got {attack!r}")
    wanted = None if properties is None else set(properties)
    known = {*SETTING_PROPERTIES, *ATTACK_PROPERTIES, "declared norms", "HU-range data", "bad input"}
    if wanted is not None and wanted - known:
        raise ValueError(f"unknown properties {sorted(wanted - known)}; known: {', '.join(sorted(known))}")
    dev, memo = _device(device), {} if cache is None else cache
    requested = _kind_classes(task_kinds)
    report = AttackReport(_attack_name(cls))
    for kcls in requested:
        try:
            example_prototypes(kcls)
        except NotImplementedError:
            report.skipped[kcls.name] = f"{kcls.__name__} defines no examples()"
    with torch.random.fork_rng(devices=[]):
        every = settings()
        mine = settings(requested)
        admitted: list[AttackCase] = []
        for s in mine:
            case = AttackCase(cls, s, params=params)
            if not admits(cls, s):
                report.refused[s.key] = _check_refused(case, dev, memo)
                continue
            try:
                run = _run(case, dev, memo)
            except _Fail as e:
                report.skipped[s.key] = str(e)
                continue
            refused = _refusal(run)
            if refused is not None:
                report.refused[s.key] = refused
                continue
            admitted.append(case)
        for case in admitted:
            for prop in SETTING_PROPERTIES:
                if wanted is None or prop in wanted:
                    check_case(case, prop, dev, memo)
                    report.passed.append(f"{case.setting.key}: {prop}")
            if wanted is None or "bad input" in wanted:
                for bad in BAD_INPUTS:
                    check_bad_input(case, bad, memo)
                report.passed.append(f"{case.setting.key}: bad input")
        if admitted:
            last = admitted[-1]  # dense segmentation where supported
            for norm in _norm_kinds(cls):
                norm_case = AttackCase(cls, last.setting, norm, params=params)
                for hu, prop in ((False, "declared norms"), (True, "HU-range data")):
                    if wanted is None or prop in wanted:
                        check_norm(norm_case, dev, memo, hu=hu)
                        report.passed.append(f"{last.setting.key}: {prop} ({norm})")
            for prop in ATTACK_PROPERTIES:
                if wanted is None or prop in wanted:
                    check_attack_property(admitted[0], prop, every, memo)
                    report.passed.append(prop)
        elif not report.skipped and not report.refused:
            report.skipped["*"] = "no setting of the requested kinds"
    return report

