"""The attack interface shared by every medadv attack.

An attack is configured once (task, threat model, hyper-parameters) and then called as
``attack(model, x, y) -> AttackResult``. The call never modifies ``x``, ``y`` or the model: the model is
put in eval mode with its parameters frozen for the attack, and both are restored afterwards.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..tasks import Task
from ..threats import Threat, per_sample_norm

__all__ = [
    "Attack",
    "AttackResult",
    "attack_mode",
    "check_input",
    "model_device",
    "make_generator",
    "register",
    "get_attack",
    "available_attacks",
]


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
        extras: attack-specific outputs (e.g. VAFA quantisation tables).
    """

    x_adv: Tensor
    fooled: Tensor
    linf: Tensor
    l2: Tensor
    logits: Tensor
    y: Tensor
    trace: dict[str, Any] | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def fooling_rate(self) -> float:
        return float(self.fooled.float().mean()) if self.fooled.numel() else 0.0


def model_device(model: nn.Module, default: torch.device | None = None) -> torch.device:
    """The device of the model's first parameter or buffer (``default`` or CPU if it has none)."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return default or torch.device("cpu")


@contextlib.contextmanager
def attack_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and frozen parameters for the duration of an attack; both restored afterwards.

    Freezing parameters means the backward pass computes gradients to the input only (no wasted
    weight gradients), and the caller's ``.grad`` buffers are left untouched.
    """
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training
        for p, rg in flags:
            p.requires_grad_(rg)


def check_input(x: Any, threat: Threat | None = None, name: str = "x") -> Tensor:
    """Validate an input batch: a non-empty floating tensor with finite values inside the bounds."""
    if not isinstance(x, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"`{name}` must be a floating-point tensor, got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"`{name}` must be batch-first (N, C, ...), got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"`{name}` is an empty batch (N = 0)")
    if not torch.isfinite(x).all():
        raise ValueError(f"`{name}` contains NaN or Inf values")
    if threat is not None:
        threat.check_inside(x, name)
    return x


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A seeded generator on ``device`` (``None`` when no seed: use the global RNG)."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


class Attack(ABC):
    """Base class: ``attack(model, x, y=None) -> AttackResult``.

    Subclasses implement :meth:`perturb`, which receives validated inputs on the model's device with
    the model already in attack mode, and returns the adversarial batch.

    Args:
        task: what the model output means (:class:`~medadv.tasks.Task`).
        threat: the search set (:class:`~medadv.threats.Threat`), or ``None`` for attacks whose
            constraint is not an Lp ball (they then take ``bounds`` themselves).
        targeted: if True, ``y`` is a target (class, label vector or label map) that the attack drives
            the prediction towards; otherwise it drives the prediction away from ``y``.
        seed: seed for the attack's own random numbers (same seed, same adversarial tensor).
    """

    name: str = "attack"
    #: whether ``perturb`` needs the clean logits; attacks that do not (the gradient family) save one
    #: forward pass when ``y`` is given and validate ``y`` against their own first forward instead
    needs_clean_logits: bool = True

    def __init__(self, task: Task, threat: Threat | None, *, targeted: bool = False, seed: int | None = 0) -> None:
        if not isinstance(task, Task):
            raise TypeError(f"`task` must be a medadv Task (MultiClass, MultiLabel, Segmentation), got {task!r}")
        if threat is not None and not isinstance(threat, Threat):
            raise TypeError(f"`threat` must be a medadv Threat (Linf, L2) or None, got {threat!r}")
        self.task = task
        self.threat = threat
        self.targeted = bool(targeted)
        self.seed = seed

    @property
    def budget(self) -> float | None:
        """The attack's budget in data units (the threat's ε), used as a column in results tables."""
        return None if self.threat is None else self.threat.eps

    @property
    def bounds(self):
        return None if self.threat is None else self.threat.bounds

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor | None = None) -> AttackResult:
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
        check_input(x, self.threat)
        if torch.is_inference_mode_enabled():
            raise RuntimeError("attacks need gradients: call them outside torch.inference_mode()")
        param = next((p for p in model.parameters() if p.is_floating_point()), None)
        if param is not None and param.dtype != x.dtype:
            raise TypeError(f"`x` has dtype {x.dtype} but the model's parameters are {param.dtype}; "
                            "convert one of them (medadv does not cast silently)")
        if self.targeted and y is None:
            raise ValueError("`y` (the target) is required for a targeted attack")
        device = model_device(model, x.device)
        x0 = x.detach().to(device)
        if y is not None and not isinstance(y, Tensor):
            raise TypeError(f"`y` must be a torch.Tensor, got {type(y).__name__}")
        with attack_mode(model):
            logits0 = None
            if y is None or self.needs_clean_logits:
                with torch.no_grad():
                    logits0 = model(x0)
            if y is None:
                y0 = self.task.predict(logits0)
            else:
                # a copy: AttackResult.y must not alias the caller's tensor
                y0 = y.detach().to(device, copy=True)
            if logits0 is not None:
                self.task.validate(logits0, y0, "y")
            y0 = self.task.to_target(y0, x0 if logits0 is None else logits0)
            x_adv, extras, trace = self._run(model, x0, y0, logits0)
            x_adv = x_adv.detach()
            with torch.no_grad():
                logits = model(x_adv)
            fooled = self.task.fooled(logits, y0, self.targeted)
        delta = x_adv - x0
        return AttackResult(
            x_adv=x_adv.to(x.device),
            fooled=fooled,
            linf=per_sample_norm(delta, float("inf")),
            l2=per_sample_norm(delta, 2.0),
            logits=logits.detach(),
            y=y0,
            trace=trace,
            extras=extras,
        )

    def _run(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None) -> tuple[Tensor, dict, dict | None]:
        out = self.perturb(model, x, y, logits)
        if isinstance(out, tuple):
            x_adv, extras = out[0], out[1]
            trace = out[2] if len(out) > 2 else None
            return x_adv, extras, trace
        return out, {}, None

    @abstractmethod
    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor):
        """Return the adversarial batch (or ``(x_adv, extras)`` / ``(x_adv, extras, trace)``).

        ``x`` and ``y`` are on the model's device; ``logits`` is the clean output, already checked
        against ``y``. It is ``None`` only for attacks with ``needs_clean_logits = False`` called with
        a ``y``: they must validate ``y`` (``task.validate``) against their first forward.
        Must not modify ``x`` in place.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(task={self.task!r}, threat={self.threat!r}, targeted={self.targeted})"


# --- registry: names used by configs and the CLI -------------------------------------------------------------
_REGISTRY: dict[str, Callable[..., Attack]] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator that makes an attack constructible by name (``get_attack(name, ...)``)."""

    def deco(cls: type) -> type:
        key = name.lower()
        if key in _REGISTRY and _REGISTRY[key] is not cls:
            raise ValueError(f"attack name {name!r} is already registered to {_REGISTRY[key].__name__}")
        _REGISTRY[key] = cls
        cls.name = key
        return cls

    return deco


def get_attack(name: str, *args: Any, **kwargs: Any) -> Attack:
    """Build a registered attack by name, e.g. ``get_attack("pgd", task=..., threat=..., steps=10)``."""
    key = str(name).lower()
    if key not in _REGISTRY:
        raise ValueError(f"unknown attack {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[key](*args, **kwargs)


def available_attacks() -> list[str]:
    return sorted(_REGISTRY)
