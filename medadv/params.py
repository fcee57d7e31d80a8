"""Declared parameters: one declaration per attack (or defense strategy) drives validation, ``repr``,
``get_params()``, the resume fingerprint of :func:`~medadv.evaluate` and the YAML config.

A class lists its constructor arguments once, in ``params``, as constraint objects::

    class PGD(GradientAttack):
        params = {"steps": Int(low=1), "step_size": Optional(Real(low=0)), "random_start": Bool()}

and its ``__init__`` ends the argument handling with ``self._init_params(locals())``: every declared
argument is checked (wrong type, out of range, misspelt option) and stored under its own name, converted
(``steps=10.0`` becomes ``10``; ``steps=2.5`` is an error, never a silent ``2``). Every error has one
format: the argument, what was expected, what was given and, for strings, the closest valid option.

This is our own small take on scikit-learn's ``_param_validation`` (constraint objects, one error type that
is both a ``ValueError`` and a ``TypeError``) and MONAI's ``look_up_option`` (did-you-mean).
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

__all__ = [
    "InvalidParameterError",
    "Constraint",
    "Int",
    "Real",
    "Bool",
    "Constant",
    "Options",
    "Names",
    "Optional",
    "Pair",
    "Instance",
    "AnyOf",
    "Component",
    "Configurable",
    "closest",
    "look_up_option",
    "stable_hash",
    "object_settings",
]


class InvalidParameterError(ValueError, TypeError):
    """A constructor argument of the wrong type, out of range, or unknown.

    Subclasses both ``ValueError`` and ``TypeError`` so ``except ValueError`` and ``except TypeError``
    callers both see it (the kind of mistake is in the message).
    """


def closest(name: str, options: Iterable[str]) -> str | None:
    """The option most similar to ``name`` (``None`` if nothing is close)."""
    opts = [str(o) for o in options]
    lowered = {o.lower(): o for o in opts}
    if str(name).lower() in lowered:
        return lowered[str(name).lower()]
    hit = difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[hit[0]] if hit else None


def _did_you_mean(name: str, options: Iterable[str]) -> str:
    c = closest(name, options)
    return f"; did you mean {c!r}?" if c is not None and c != name else ""


def look_up_option(value: Any, options: Iterable[str], *, argument: str, owner: str = "") -> str:
    """Return ``value`` if it is one of ``options`` (case-insensitive), else raise with a did-you-mean."""
    opts = list(options)
    if isinstance(value, str):
        for o in opts:
            if value.lower() == str(o).lower():
                return str(o)
    where = f" of {owner}" if owner else ""
    listed = ", ".join(repr(o) for o in opts)
    hint = _did_you_mean(value, opts) if isinstance(value, str) else ""
    raise InvalidParameterError(f"`{argument}`{where} must be one of {listed}; got {value!r}{hint}")


def _given(value: Any) -> str:
    if isinstance(value, float | int | str | bool) or value is None:
        return f"{value!r} ({type(value).__name__})"
    return type(value).__name__


class Constraint:
    """One parameter's declaration: what it accepts (``describe``) and how it converts (``convert``)."""

    def describe(self) -> str:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def accepts(self, value: Any) -> bool:
        try:
            self.convert(value)
            return True
        except (ValueError, TypeError):
            return False

    def convert(self, value: Any) -> Any:
        """The validated, normalised value; raises ``ValueError``/``TypeError`` (no message needed)."""
        raise NotImplementedError

    def check(self, value: Any, argument: str, owner: str = "") -> Any:
        try:
            return self.convert(value)
        except InvalidParameterError:
            raise
        except (ValueError, TypeError):
            where = f" of {owner}" if owner else ""
            raise InvalidParameterError(
                f"`{argument}`{where} must be {self.describe()}; got {_given(value)}{self._hint(value)}"
            ) from None

    def _hint(self, value: Any) -> str:
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


def _range_text(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return " and ".join(parts)


class _Number(Constraint):
    def __init__(self, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False) -> None:
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def _in_range(self, v: float) -> bool:
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        if self.high is not None and (v > self.high or (self.high_open and v == self.high)):
            return False
        return True

    def _suffix(self) -> str:
        r = _range_text(self.low, self.high, self.low_open, self.high_open)
        return f" {r}" if r else ""


class Int(_Number):
    """An integer (``10.0`` is accepted as ``10``; ``2.5``, ``True`` and strings are not)."""

    def describe(self) -> str:
        return "an integer" + self._suffix()

    def convert(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError
        if isinstance(value, numbers.Integral):
            v = int(value)
        else:
            f = float(value)
            if not f.is_integer():  # 2.5 steps is a mistake, never a silent 2
                raise ValueError
            v = int(f)
        if not self._in_range(v):
            raise ValueError
        return v


class Real(_Number):
    """A finite real number, optionally in a range (``finite=False`` also admits ±inf)."""

    def __init__(self, low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False, finite: bool = True) -> None:
        super().__init__(low, high, low_open=low_open, high_open=high_open)
        self.finite = finite

    def describe(self) -> str:
        return ("a finite number" if self.finite else "a number") + self._suffix()

    def convert(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError
        v = float(value)
        if math.isnan(v) or (self.finite and not math.isfinite(v)) or not self._in_range(v):
            raise ValueError
        return v


class Bool(Constraint):
    """``True`` or ``False`` (strings such as ``'false'`` are refused, not read as true)."""

    def describe(self) -> str:
        return "True or False"

    def convert(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if type(value).__name__ == "bool_":  # numpy.bool_
            return bool(value)
        raise TypeError


class Options(Constraint):
    """One of a fixed set of strings (case-insensitive; the canonical spelling is stored)."""

    def __init__(self, *options: str) -> None:
        self.options = tuple(options)

    def describe(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)

    def convert(self, value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError
        for o in self.options:
            if value.lower() == o.lower():
                return o
        raise ValueError

    def _hint(self, value: Any) -> str:
        return _did_you_mean(value, self.options) if isinstance(value, str) else ""


class Constant(Constraint):
    """Exactly one allowed value (a parameter kept for the common signature, e.g. AutoAttack's
    ``targeted=False``); ``why`` says why in the error."""

    def __init__(self, value: Any, why: str = "") -> None:
        self.value, self.why = value, why
        self.options = (value,)

    def describe(self) -> str:
        return f"{self.value!r}" + (f" ({self.why})" if self.why else "")

    def convert(self, value: Any) -> Any:
        if type(value) is not type(self.value) or value != self.value:
            raise ValueError
        return value


class Names(Constraint):
    """A non-empty list of distinct names from ``options`` (case-insensitive; stored canonical, in order),
    e.g. the members of an attack ensemble; a misspelt name gets the closest option."""

    def __init__(self, *options: str) -> None:
        self.options = options

    def describe(self) -> str:
        return "a non-empty list of distinct names from " + ", ".join(repr(o) for o in self.options)

    def convert(self, value: Any) -> list[str]:
        if isinstance(value, str) or not isinstance(value, Sequence) or not value:
            raise TypeError
        out = [Options(*self.options).convert(v) for v in value]
        if len(set(out)) != len(out):
            raise ValueError
        return out

    def _hint(self, value: Any) -> str:
        if isinstance(value, Sequence) and not isinstance(value, str):
            bad = [v for v in value if isinstance(v, str) and v.lower() not in self.options]
            if bad:
                return _did_you_mean(bad[0], self.options)
        return ""


class Optional(Constraint):
    """``None`` or what ``inner`` accepts."""

    def __init__(self, inner: Constraint) -> None:
        self.inner = inner

    def describe(self) -> str:
        return f"None or {self.inner.describe()}"

    def convert(self, value: Any) -> Any:
        return None if value is None else self.inner.convert(value)

    def _hint(self, value: Any) -> str:
        return self.inner._hint(value)


class Pair(Constraint):
    """A pair ``(a, b)`` of values each accepted by ``inner``; ``ordered`` requires ``a <= b``.

    ``scalar_ok`` also accepts a single value ``v`` as ``(v, v)``.
    """

    def __init__(self, inner: Constraint, *, ordered: bool = False, scalar_ok: bool = False) -> None:
        self.inner, self.ordered, self.scalar_ok = inner, ordered, scalar_ok

    def describe(self) -> str:
        s = f"a pair of {self.inner.describe().removeprefix('a ').removeprefix('an ')}s"
        if self.ordered:
            s += " (first <= second)"
        if self.scalar_ok:
            s = f"{self.inner.describe()} or {s}"
        return s

    def convert(self, value: Any) -> tuple[Any, Any]:
        if self.scalar_ok and not isinstance(value, Sequence | str):
            v = self.inner.convert(value)
            return (v, v)
        if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
            raise TypeError
        a, b = self.inner.convert(value[0]), self.inner.convert(value[1])
        if self.ordered and a > b:
            raise ValueError
        return (a, b)


class Instance(Constraint):
    """An instance of one of ``types`` (described as ``text``)."""

    def __init__(self, *types: type, text: str | None = None) -> None:
        self.types, self.text = types, text

    def describe(self) -> str:
        return self.text or ("an instance of " + " or ".join(t.__name__ for t in self.types))

    def convert(self, value: Any) -> Any:
        if not isinstance(value, self.types):
            raise TypeError
        return value


class AnyOf(Constraint):
    """The first of ``constraints`` that accepts the value."""

    def __init__(self, *constraints: Constraint) -> None:
        self.constraints = constraints

    def describe(self) -> str:
        return " or ".join(c.describe() for c in self.constraints)

    def convert(self, value: Any) -> Any:
        for c in self.constraints:
            try:
                return c.convert(value)
            except (ValueError, TypeError):
                continue
        raise ValueError


class Component(Constraint):
    """A component object (an explanation, a generator) given as an instance or built by name.

    ``build`` turns a name (``"gradcam"``) or a mapping (``{"name": "gradcam", "layer": "features"}``) into
    the component; ``base`` is the component's type. The stored value is always the built object, so
    ``get_params()`` returns it and the fingerprint hashes its settings.
    """

    def __init__(self, base: type, build: Callable[[Any], Any], text: str) -> None:
        self.base, self.build, self.text = base, build, text

    def describe(self) -> str:
        return self.text

    def convert(self, value: Any) -> Any:
        if isinstance(value, self.base):
            return value
        if isinstance(value, str | Mapping):
            return self.build(value)
        raise TypeError


# --- the mixin --------------------------------------------------------------------------------------------------
def _signature_names(cls: type) -> list[str]:
    sig = inspect.signature(cls.__init__)  # type: ignore[misc]
    return [n for n, p in sig.parameters.items()
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


class Configurable:
    """Declared constructor parameters: validation, ``get_params``, ``repr``, fingerprint, config.

    Subclasses declare ``params: ClassVar[dict[str, Constraint]]`` (merged along the MRO, so a subclass
    declares only what it adds or changes) and call ``self._init_params(locals())`` in ``__init__``.
    ``positional`` names the constructor arguments that are not hyper-parameters (the task, the threat);
    they are shown by ``repr`` but not returned by ``get_params``. ``aliases`` maps deprecated argument
    names to their new names (a ``FutureWarning`` is issued when one is used, see :func:`renamed`).
    """

    params: ClassVar[dict[str, Constraint]] = {}
    positional: ClassVar[tuple[str, ...]] = ()
    aliases: ClassVar[dict[str, str]] = {}

    @classmethod
    def declared_params(cls) -> dict[str, Constraint]:
        out: dict[str, Constraint] = {}
        for klass in reversed(cls.__mro__):
            out.update(klass.__dict__.get("params", {}))
        return out

    @classmethod
    def param_names(cls) -> list[str]:
        """The constructor's hyper-parameter names (every one of them is declared)."""
        return [n for n in _signature_names(cls) if n not in cls.positional]

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        sig = inspect.signature(cls.__init__)  # type: ignore[misc]
        return {n: p.default for n, p in sig.parameters.items()
                if n in cls.param_names() and p.default is not inspect.Parameter.empty}

    @classmethod
    def check_declarations(cls) -> None:
        """Raise if a constructor argument has no declaration (a conformance check)."""
        missing = [n for n in cls.param_names() if n not in cls.declared_params()]
        if missing:
            raise TypeError(f"{cls.__name__} does not declare the constructor argument(s) {missing} in `params`")

    def _init_params(self, values: Mapping[str, Any]) -> None:
        """Validate, convert and store every declared constructor argument found in ``values``."""
        declared = self.declared_params()
        owner = type(self).__name__
        for name in self.param_names():
            if name not in values:
                continue
            if name not in declared:
                raise TypeError(f"{owner} does not declare its constructor argument `{name}` in `params`")
            setattr(self, name, declared[name].check(values[name], name, owner))

    @classmethod
    def check_kwargs(cls, kwargs: Mapping[str, Any], what: str | None = None) -> dict[str, Any]:
        """Refuse unknown keyword arguments (with the closest valid name) and map deprecated aliases."""
        names = cls.param_names()
        out: dict[str, Any] = {}
        for k, v in kwargs.items():
            if k in cls.aliases and k not in names:
                new = cls.aliases[k]
                warnings.warn(f"`{k}` of {cls.__name__} is deprecated; use `{new}`", FutureWarning, stacklevel=3)
                k = new
            if k not in names:
                label = what or cls.__name__
                raise InvalidParameterError(
                    f"unknown parameter `{k}` for {label}{_did_you_mean(k, names) or ';'} "
                    f"valid parameters: {', '.join(names)}"
                )
            out[k] = v
        return out

    def get_params(self) -> dict[str, Any]:
        """Every hyper-parameter under its constructor name (scikit-learn style)."""
        return {n: getattr(self, n) for n in self.param_names()}

    def set_params(self, **params: Any) -> Configurable:
        """A new instance with some parameters changed (the instance itself is never mutated)."""
        args = {n: getattr(self, n) for n in self.positional}
        new = {**self.get_params(), **self.check_kwargs(params)}
        return type(self)(**args, **new)

    def fingerprint(self) -> str:
        """A short, stable hash of the class and every parameter (and the positional arguments)."""
        payload = {"class": f"{type(self).__module__}.{type(self).__qualname__}",
                   **{n: _canonical(getattr(self, n)) for n in self.positional},
                   **{k: _canonical(v) for k, v in self.get_params().items()}}
        return stable_hash(payload)

    def __repr__(self) -> str:
        defaults = self.param_defaults()
        shown = [f"{n}={getattr(self, n)!r}" for n in self.positional]
        for k, v in self.get_params().items():
            d = defaults.get(k, inspect.Parameter.empty)
            try:
                same = d is not inspect.Parameter.empty and bool(d == v)
            except Exception:  # tensors and other objects without a plain ==
                same = False
            if not same:
                shown.append(f"{k}={v!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


def renamed(**aliases: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorator for ``__init__``: accept deprecated keyword names with a ``FutureWarning``."""
    import functools

    def deco(init: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(init)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
            for old, new in aliases.items():
                if old in kwargs:
                    if new in kwargs:
                        raise InvalidParameterError(f"give `{new}` only (`{old}` is its deprecated name)")
                    warnings.warn(f"`{old}` of {type(self).__name__} is deprecated; use `{new}`",
                                  FutureWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)

        return wrapper

    return deco


# --- fingerprints -----------------------------------------------------------------------------------------------
def _canonical(v: Any) -> Any:
    """A JSON-able, order-stable description of a parameter value (tensors and modules by content)."""
    import torch

    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, torch.Tensor):
        t = v.detach().cpu().contiguous()
        return {"tensor": list(t.shape), "dtype": str(t.dtype),
                "sha": hashlib.sha256(t.numpy().tobytes() if t.dtype != torch.bfloat16
                                      else t.float().numpy().tobytes()).hexdigest()[:16]}
    if isinstance(v, torch.nn.Module):
        h = hashlib.sha256(type(v).__qualname__.encode())
        for k, t in v.state_dict().items():
            h.update(k.encode())
            h.update(t.detach().cpu().contiguous().float().numpy().tobytes())
        return {"module": type(v).__qualname__, "sha": h.hexdigest()[:16]}
    if isinstance(v, Configurable):
        return {"class": type(v).__qualname__, **{k: _canonical(x) for k, x in v.get_params().items()}}
    if isinstance(v, Mapping):
        return {str(k): _canonical(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, list | tuple):
        return [_canonical(x) for x in v]
    fp = getattr(v, "fingerprint", None)
    if callable(fp):
        return {"class": type(v).__qualname__, "fingerprint": fp()}
    return repr(v)


def object_settings(obj: Any) -> dict[str, Any]:
    """The public attributes of a plain settings object (a Task): its class and every setting, so a hash
    of it changes with any of them (``repr`` may show only some)."""
    return {"class": f"{type(obj).__module__}.{type(obj).__qualname__}",
            **{k: v for k, v in sorted(vars(obj).items()) if not k.startswith("_")}}


def stable_hash(payload: Any) -> str:
    """16 hex digits of SHA-256 over a canonical JSON dump."""
    return hashlib.sha256(json.dumps(_canonical(payload), sort_keys=True).encode()).hexdigest()[:16]
