"""The attack interface shared by every medadv attack.

An attack is configured once (task, threat model or data box, declared hyper-parameters) and then
called as ``attack(model, x, y) -> AttackResult``. The call never modifies ``x``, ``y`` or the model:
the model is put in eval mode with its parameters frozen for the attack, and both are restored
afterwards. ``__call__`` is final: an attack implements :meth:`Attack.perturb` only (Foolbox 3's
``run``), and iterative attacks plug hooks into :class:`~medadv.attacks.engine.IterativeAttack`.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, final

import torch
from torch import Tensor, nn

from ..params import Bool, Configurable, InvalidParameterError, Optional, closest
from ..params import Int as _Int
from ..runtime import (
    all_finite,
    attack_mode,
    check_input,
    check_model,
    forward_tensor,
    make_generator,
    model_device,
)
from ..tasks import Task
from ..threats import Box, Threat, per_sample_norm

__all__ = [
    "Attack",
    "AttackResult",
    "AttackDetails",
    "PerturbOutput",
    "attack_mode",
    "check_input",
    "model_device",
    "make_generator",
    "register",
    "get_attack",
    "available_attacks",
    "attack_class",
    "hold_fixed_channels",
]


@dataclass
class AttackDetails:
    """Attack-specific outputs, typed. Subclasses are dataclasses whose ``columns`` name the per-sample
    ``(N,)`` fields that :func:`~medadv.evaluate` copies into each result row (as ``<column>``)."""

    columns: ClassVar[tuple[str, ...]] = ()
    #: per-sample fields (leading dimension N, or a dict of such tensors) that are not result-table columns (maps,
    #: logits, norms); with ``columns`` they tell :mod:`medadv.attack_cache` which fields it may split per sample
    sample_fields: ClassVar[tuple[str, ...]] = ()

    def row(self, i: int) -> dict[str, Any]:
        """The declared per-sample columns of sample ``i`` as plain Python values."""
        out: dict[str, Any] = {}
        for c in self.columns:
            v = getattr(self, c)
            v = v[i] if isinstance(v, Tensor) and v.ndim >= 1 else v
            if isinstance(v, Tensor):
                v = v.item() if v.numel() == 1 else v.detach().cpu().tolist()
            out[c] = v
        return out

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class AttackResult:
    """What an attack returns.

    Attributes:
        x_adv: adversarial input, same shape, dtype and device as ``x``.
        fooled: ``(N,)`` bool, the task's fooled test on ``x_adv`` (targeted: target reached).
        linf: ``(N,)`` L∞ norm of ``x_adv - x`` (data units).
        l2: ``(N,)`` L2 norm of ``x_adv - x`` (data units).
        logits: model output on ``x_adv`` (detached).
        y: the labels the attack used (the clean prediction when the caller passed ``y=None``).
        trace: optional per-step records (attack-specific, e.g. loss or fooled fraction per step).
        details: typed attack-specific outputs (:class:`AttackDetails` subclass) or ``None``.
        pred: the task's hard prediction on ``x_adv`` (:meth:`Task.predict` of ``logits``), or ``None``.
        clean_logits: the model output on ``x`` when the attack computed it (its own clean forward, or the first
            step of an attack that starts at ``x``), detached; ``None`` otherwise.
    """

    x_adv: Tensor
    fooled: Tensor
    linf: Tensor
    l2: Tensor
    logits: Tensor
    y: Tensor
    trace: dict[str, Any] | None = None
    details: AttackDetails | None = None
    pred: Tensor | None = None
    clean_logits: Tensor | None = None

    @property
    def extras(self) -> dict[str, Any]:
        """``details`` as a plain dict (empty when the attack has none)."""
        return {} if self.details is None else self.details.as_dict()

    @property
    def fooling_rate(self) -> float:
        return float(self.fooled.float().mean()) if self.fooled.numel() else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """Per-sample columns of the typed details (empty dicts when there are none)."""
        n = self.fooled.shape[0]
        return [{} if self.details is None else self.details.row(i) for i in range(n)]


@dataclass
class PerturbOutput:
    """What :meth:`Attack.perturb` may return instead of a bare tensor or an ``(x_adv, details, trace)`` tuple.

    ``clean_logits``: the model's output on the clean input, when the attack computed it on its way (an iterative
    attack whose first iterate is ``x`` itself): the result carries it, so a caller needs no clean forward pass.
    """

    x_adv: Tensor
    details: AttackDetails | None = None
    trace: dict[str, Any] | None = None
    clean_logits: Tensor | None = None

    def __iter__(self) -> Iterator[Any]:
        """Unpacks as ``x_adv, details, trace``, like the tuple that ``perturb`` returned before."""
        return iter((self.x_adv, self.details, self.trace))


class Attack(Configurable, ABC):
    """Base class: ``attack(model, x, y=None) -> AttackResult``.

    Subclasses declare their hyper-parameters in ``params`` (see :mod:`medadv.params`) and implement
    :meth:`perturb`, which receives validated inputs on the model's device with the model already in
    attack mode, and returns the adversarial batch (optionally with typed details and a trace).

    Args:
        task: what the model output means (:class:`~medadv.tasks.Task`).
        threat: the search set. ``threat_kind = "ball"`` attacks take a :class:`~medadv.threats.Threat`
            (norm ball + data box); ``"box"`` attacks (not Lp-bounded: VAFA, GAP's clipping) take a
            :class:`~medadv.threats.Box`; ``"ball_or_box"`` attacks (DAG) take either.
        targeted: if True, ``y`` is a target (class, label vector or label map) that the attack drives
            the prediction towards; otherwise it drives the prediction away from ``y``.
        seed: seed for the attack's own random numbers (same seed, same adversarial tensor); ``None``
            uses torch's global RNG (medadv never re-seeds it).
    """

    name: str = "attack"
    targeted: bool
    seed: int | None
    positional: ClassVar[tuple[str, ...]] = ("task", "threat")
    params: ClassVar[dict[str, Any]] = {"targeted": Bool(), "seed": Optional(_Int())}
    #: what ``threat`` must be: "ball" (Linf/L2), "box" (data bounds only) or "ball_or_box"
    threat_kind: ClassVar[str] = "ball"
    #: norms a "ball" attack supports (threat class names)
    norms: ClassVar[tuple[str, ...]] = ("Linf", "L2")
    #: tasks the attack supports (task class names; empty = every task)
    tasks: ClassVar[tuple[str, ...]] = ()
    #: what to use instead for a task kind outside ``tasks`` (appended to the refusal)
    other_tasks: ClassVar[str] = ""
    #: spatial ranks of the input the attack supports (2: images, 3: volumes; empty = any)
    spatial_dims: ClassVar[tuple[int, ...]] = ()
    #: the attack is targeted by nature (``y`` is always a target, e.g. DAG's adversarial label map)
    always_targeted: ClassVar[bool] = False
    #: the attack's objective is built on class distributions (``Task.distributions`` / ``target_cosine``):
    #: refused for kinds whose outputs are not class scores (``Task.class_scores``, e.g. regression)
    needs_class_scores: ClassVar[bool] = False
    #: the attack transforms every input channel (a frequency-domain quantisation, a generator): refused for tasks
    #: whose inputs carry channels that must not change (``Task.fixed_input_channels``, e.g. prompt codes)
    transforms_whole_input: ClassVar[bool] = False
    #: whether ``perturb`` needs the clean logits; attacks that do not (the gradient family) save one
    #: forward pass when ``y`` is given and validate ``y`` against their own first forward instead
    needs_clean_logits: bool = True

    def __init__(self, task: Task, threat: Threat | Box | None, *, targeted: bool = False,
                 seed: int | None = 0) -> None:
        owner = type(self).__name__
        if not isinstance(task, Task):
            raise TypeError(f"`task` must be a medadv Task (a kind of medadv.tasks.available_tasks()), got {task!r}")
        if self.tasks and type(task).__name__ not in self.tasks and not any(
                c.__name__ in self.tasks for c in type(task).__mro__):
            hint = f"; {self.other_tasks}" if self.other_tasks else ""
            raise TypeError(f"`task` of {owner} must be {' or '.join(self.tasks)}, got {task!r}{hint}")
        if self.needs_class_scores and not task.class_scores:
            raise TypeError(f"{owner} is built on class distributions and the outputs of {task!r} are not class "
                            "scores: use PGD, APGD (loss 'ce' or 'margin') or auto")
        if self.transforms_whole_input and task.fixed_input_channels():
            raise TypeError(f"{owner} transforms every input channel, and the last {task.fixed_input_channels()} "
                            f"input channels of {task!r} must not change (prompt codes): use a norm-ball attack "
                            "(PGD, APGD, auto), which moves the image channels only")
        self.task = task
        kind = self.threat_kind
        if isinstance(threat, Threat):
            if kind == "box":
                raise TypeError(f"{owner} is not an Lp-ball attack: pass the data box, e.g. "
                                f"{owner}(task, Box(lo, hi)) or {owner}(task, threat.box), not {threat!r}")
            if type(threat).__name__ not in self.norms:
                raise TypeError(f"`threat` of {owner} must be {' or '.join(self.norms)}, got {threat!r}")
            self.threat: Threat | None = threat
            self.box = threat.box
        elif isinstance(threat, Box):
            if kind == "ball":
                raise TypeError(f"`threat` of {owner} must be a norm ball ({' or '.join(self.norms)}) with the "
                                f"data box, e.g. Linf(eps, bounds=(lo, hi)); got the box {threat!r}")
            self.threat, self.box = None, threat
        else:
            want = {"ball": f"a {' or '.join(self.norms)} threat with bounds",
                    "box": "a Box (data bounds; Box.unbounded() for unbounded data)",
                    "ball_or_box": f"a {' or '.join(self.norms)} threat or a Box"}[kind]
            raise TypeError(f"`threat` of {owner} must be {want}, got {threat!r}")
        # stored even when a subclass does not expose them (e.g. always-targeted attacks)
        declared = self.declared_params()  # a subclass may narrow them (AutoAttack: targeted=False only)
        self.targeted = declared["targeted"].check(targeted, "targeted", owner)
        self.seed = declared["seed"].check(seed, "seed", owner)
        if self.always_targeted:
            self.targeted = True

    # --- properties used by evaluation, configs and reports ---------------------------------------------
    @property
    def budget(self) -> float | None:
        """The attack's budget in data units (the threat's ε), used as a column in results tables."""
        return None if self.threat is None else self.threat.eps

    @property
    def bounds(self):
        """The data box's ``(lo, hi)`` (``None`` when unbounded)."""
        return self.box.bounds

    @property
    def threat_or_box(self) -> Threat | Box:
        return self.threat if self.threat is not None else self.box

    def set_params(self, **params: Any) -> Attack:
        """A new attack with some parameters changed (this one is never mutated)."""
        new = {**self.get_params(), **self.check_kwargs(params)}
        return type(self)(self.task, self.threat_or_box, **new)

    def fingerprint(self) -> str:
        from ..params import object_settings, stable_hash

        # every task setting (dice_threshold, target_fraction, ... decide `fooled` and best-iterate choices)
        return stable_hash({"attack": super().fingerprint(), "task": object_settings(self.task),
                            "threat": self.threat_or_box.fingerprint()})

    # --- the call ------------------------------------------------------------------------------------------
    def _check_call(self, model: Any, x: Any, y: Any) -> None:
        """Validation shared by every attack, before any work."""
        check_model(model)
        check_input(x, self.box)
        if self.spatial_dims and x.ndim - 2 not in self.spatial_dims:
            ranks = " or ".join(f"{d}-D" for d in self.spatial_dims)
            raise ValueError(f"`x` of shape {tuple(x.shape)} holds {x.ndim - 2}-D samples, and "
                             f"{type(self).__name__} needs {ranks} inputs (N, C, *spatial)")
        if torch.is_inference_mode_enabled():
            raise RuntimeError("attacks need gradients: call them outside torch.inference_mode()")
        param = next((p for p in model.parameters() if p.is_floating_point()), None)
        if param is not None and param.dtype != x.dtype:
            raise TypeError(f"`x` has dtype {x.dtype} but the model's parameters are {param.dtype}; "
                            "convert one of them (medadv does not cast silently)")
        if self.targeted and y is None:
            raise ValueError("`y` (the target) is required for a targeted attack")
        if y is not None and not isinstance(y, Tensor):
            raise TypeError(f"`y` must be a torch.Tensor, got {type(y).__name__}")
        if y is not None and y.device.type == "meta":
            raise ValueError("`y` is on the meta device (no data); materialise it first")

    @property
    def optimises_task_metric(self) -> bool:
        """Whether the attack searches for the worst case of the task's own metric (its loss or a surrogate of
        it). False for baselines that do not optimise (random noise) and for objectives on something else (a
        volume): the robust metric of such an attack need not fall as ε grows, so
        :func:`medadv.masking.monotone_flags` leaves it out."""
        return True

    @final
    def __call__(self, model: nn.Module, x: Tensor, y: Tensor | None = None, *, clean_logits: Tensor | None = None,
                 **call_args: Any) -> AttackResult:
        """Attack the batch ``x`` (labels or targets ``y``; ``None``: the clean prediction).

        ``clean_logits``: the model's output on ``x`` in eval mode, when the caller has it already
        (:func:`~medadv.evaluate` computes it once per batch for every attack): it replaces the attack's own clean
        forward pass. It is read, never modified, and must come from this model and this ``x`` as the task reads it
        (``task.logits_model(model)(x)``: logits also for a task declared with ``outputs="probabilities"``).

        Model outputs that look like probabilities (:meth:`~medadv.tasks.Task.probability_evidence`) are refused
        on the first output, before any step, unless the task declares ``outputs="probabilities"``: then every
        output is converted to logits (:meth:`~medadv.tasks.Task.logits_model`) and the attack runs on them.
        """
        self._check_call(model, x, y)
        self._check_call_args(call_args)
        # a model declared to return probabilities (task `outputs`) is read as logits from here on, by every attack;
        # probabilities from a task that does not declare them are refused by task.validate on the first output
        model = self.task.logits_model(model)
        device = model_device(model, x.device)
        x0 = x.detach().to(device)
        if clean_logits is not None and (not isinstance(clean_logits, Tensor) or clean_logits.ndim == 0
                                         or clean_logits.shape[0] != x.shape[0]):
            got = tuple(clean_logits.shape) if isinstance(clean_logits, Tensor) else type(clean_logits).__name__
            raise ValueError(f"`clean_logits` must be the model's output on `x` (batch size {x.shape[0]}), got {got}")
        with attack_mode(model):
            logits0 = None
            if y is None or self.needs_clean_logits:
                if clean_logits is not None:
                    logits0 = clean_logits.detach().to(device)
                else:
                    with torch.no_grad():
                        logits0 = forward_tensor(model, x0)
            if y is None:
                assert logits0 is not None
                y0 = self.task.predict(logits0)
            else:
                # a copy: AttackResult.y must not alias the caller's tensor
                y0 = y.detach().to(device, copy=True)
            if logits0 is not None:
                self.task.validate(logits0, y0, "y")
            y0 = self.task.to_target(y0, x0 if logits0 is None else logits0)
            out = self.perturb(model, x0, y0, logits0, **call_args)
            if isinstance(out, PerturbOutput):
                x_adv, details, trace = out.x_adv, out.details, out.trace
                if logits0 is None and out.clean_logits is not None:
                    logits0 = out.clean_logits.detach()
            else:
                x_adv, details, trace = out if isinstance(out, tuple) else (out, None, None)
            x_adv = hold_fixed_channels(self.task, x_adv.detach(), x0)
            _check_finite_output(self, x_adv)
            with torch.no_grad():
                logits = forward_tensor(model, x_adv)
            pred, fooled = self.task.decide(logits, y0, self.targeted)
        delta = x_adv - x0
        return AttackResult(
            x_adv=x_adv.to(x.device),
            fooled=fooled,
            linf=per_sample_norm(delta, float("inf")),
            l2=per_sample_norm(delta, 2.0),
            logits=logits.detach(),
            y=y0,
            trace=trace,
            details=details,
            pred=pred,
            clean_logits=logits0,
        )

    #: extra keyword arguments ``__call__`` accepts (e.g. DAG's ``target_mask``)
    call_args: ClassVar[tuple[str, ...]] = ()
    #: the call arguments holding one entry per sample (first dimension: the batch): the attack-once cache
    #: (:mod:`medadv.attack_cache`) keys and slices them per sample; any other argument is one batch-wide value
    per_sample_call_args: ClassVar[tuple[str, ...]] = ()

    def _check_call_args(self, call_args: Mapping[str, Any]) -> None:
        for k in call_args:
            if k not in self.call_args:
                c = closest(k, self.call_args)
                hint = f"; did you mean `{c}`?" if c else ""
                raise TypeError(f"{type(self).__name__}() got an unexpected call argument `{k}`{hint}")

    @abstractmethod
    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any
                ) -> Tensor | tuple[Tensor, AttackDetails | None, dict[str, Any] | None] | PerturbOutput:
        """Return the adversarial batch, ``(x_adv, details, trace)`` or a :class:`PerturbOutput`.

        ``x`` and ``y`` are on the model's device; ``logits`` is the clean output, already checked
        against ``y``. It is ``None`` only for attacks with ``needs_clean_logits = False`` called with
        a ``y``: they must validate ``y`` (``task.validate``) against their first forward.
        Must not modify ``x`` in place.
        """


def hold_fixed_channels(task: Task, new: Tensor, clean: Tensor | None) -> Tensor:
    """``new`` with the input channels that are not part of any threat model (the last
    :meth:`Task.fixed_input_channels`, e.g. prompt codes) taken from ``clean``, or zeroed when ``clean`` is ``None``
    (a gradient). ``new`` itself when the task has none. The one place that holds them: the engine applies it to
    every start, gradient and projected iterate, :meth:`Attack.__call__` to every attack's ``x_adv``, so no norm or
    budget can move them (a box snap alone flips a code voxel moved by more than half the data range)."""
    k = task.fixed_input_channels()
    if not k or new.ndim < 2 or new.shape[1] <= k:  # a batch of another layout is refused by the box check
        return new
    keep = torch.zeros_like(new[:, -k:]) if clean is None else clean[:, -k:].to(new.dtype)
    return torch.cat([new[:, :-k], keep], dim=1)


def _check_finite_output(attack: Attack, x_adv: Tensor) -> None:
    """Refuse an adversarial batch holding NaN/Inf: its output (arg-max of NaN logits) would count as fooled
    and the evaluation would report a broken attack as a success. One host read per call, after the attack
    (never inside its step loop); the inputs were checked finite before it ran, so this is a defect of the
    attack (an unstable loss or normalisation), never of the caller's data."""
    if all_finite(x_adv):  # one reduction in the common case
        return
    bad = ~torch.isfinite(x_adv.reshape(x_adv.shape[0], -1)).all(dim=1)
    if bool(bad.any()):
        rows = bad.nonzero().flatten().tolist()
        raise FloatingPointError(
            f"{type(attack).__name__} returned NaN/Inf adversarial inputs for sample(s) {rows[:10]} of the batch "
            "(the inputs were finite): a NaN/Inf gradient or step; please report it with the attack's settings. "
            "Another loss or attack avoids it meanwhile")


# --- deprecated keywords shared by the box attacks ------------------------------------------------------------
def bounds_keyword(argument: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorator for ``__init__``: the deprecated ``bounds=(lo, hi)`` keyword becomes the data box.

    Older releases took the data range as ``bounds=``; the box is now the positional ``argument``
    (``DAG(task, Box(0, 1))``). ``bounds=None`` meant unbounded data: it becomes ``Box.unbounded()``.
    """

    def deco(init: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(init)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
            if "bounds" in kwargs:
                bounds = kwargs.pop("bounds")
                owner = type(self).__name__
                if len(args) > 1 and args[1] is None:
                    args = args[:1]  # an explicit positional None, e.g. from calibrate_step_size
                if len(args) > 1 or kwargs.get(argument) is not None:
                    raise InvalidParameterError(f"give the data box of {owner} once, as `{argument}` "
                                                "(`bounds` is its deprecated name)")
                # stacklevel 3: the caller, past this wrapper and the `renamed` one around it
                warnings.warn(f"`bounds` of {owner} is deprecated; pass the data box: {owner}(task, Box(lo, hi))",
                              FutureWarning, stacklevel=3)
                kwargs[argument] = bounds if isinstance(bounds, Threat) else Box.coerce(bounds)
            init(self, *args, **kwargs)

        return wrapper

    return deco


# --- registry: names used by configs and the CLI -------------------------------------------------------------
_REGISTRY: dict[str, type[Attack]] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator that makes an attack constructible by name (``get_attack(name, ...)``)."""

    def deco(cls: type) -> type:
        key = name.lower()
        if key in _REGISTRY and _REGISTRY[key] is not cls:
            raise ValueError(f"attack name {name!r} is already registered to {_REGISTRY[key].__name__}")
        _REGISTRY[key] = cls  # type: ignore[assignment]
        cls.name = key  # type: ignore[attr-defined]
        return cls

    return deco


def attack_class(name: str) -> type[Attack]:
    """The registered class for ``name`` (case-insensitive; unknown names get the closest one)."""
    key = str(name).lower()
    if key not in _REGISTRY:
        c = closest(key, _REGISTRY)
        hint = f"; did you mean {c!r}?" if c else ""
        raise InvalidParameterError(f"unknown attack {name!r}{hint} Available: {', '.join(sorted(_REGISTRY))}"
                                    if hint else f"unknown attack {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[key]


def get_attack(name: str, task: Task, threat: Threat | Box | None = None, **params: Any) -> Attack:
    """Build a registered attack by name, e.g. ``get_attack("pgd", task, threat, steps=10)``.

    Unknown parameters are refused with the closest valid name; ``threat`` is passed through (a
    :class:`~medadv.threats.Threat` for ball attacks; box attacks given a Threat refuse it, pass its
    ``.box``).
    """
    cls = attack_class(name)
    kwargs = cls.check_kwargs(params, what=f"attack {cls.name!r}")
    return cls(task, threat, **kwargs)


def available_attacks() -> list[str]:
    """The registered attack names (``get_attack``, configs' ``attacks:``, ``medadv attacks``), sorted."""
    return sorted(_REGISTRY)
