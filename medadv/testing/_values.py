"""Different valid values for a declared parameter (:mod:`medadv.params` constraints).

:func:`candidates` gives values a constraint accepts whose converted value differs from the current one: the
fingerprint check changes every declared parameter of an attack with them, and the deprecated-alias check passes
them through the old name.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..params import (
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

__all__ = ["ANY", "candidates"]

#: "no current value": any valid value will do
ANY: Any = object()


def _pool(sample: Sequence[int]) -> tuple[Any, ...]:
    """Plain values for a constraint type of its own (a sample shape, a mask): numbers, flags, names, pairs and
    shapes / tensors that fit one sample of ``sample`` = ``(C, *spatial)``."""
    spatial = tuple(sample[1:])
    g = torch.Generator().manual_seed(3)
    plane = spatial[-2:] if len(spatial) >= 2 else spatial
    return (1, 2, 3, 0, 5, 0.5, 0.25, 0.75, 1.5, 2.5, 10, 0.01, True, False, "a",
            (1, 2), (2, 2), (1, 1), (1, *plane), (2, *plane), (1, *plane[-1:], *plane), [1, 2],
            torch.ones(*plane), torch.rand(*plane, generator=g), torch.ones(*plane[-1:], *plane))


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


def _raw_candidates(c: Constraint, current: Any, sample: Sequence[int]) -> Iterator[Any]:
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
        yield from _raw_candidates(c.inner, ANY if current is None else current, sample)
    elif isinstance(c, Pair):
        cur = current if isinstance(current, tuple | list) and len(current) == 2 else None
        if cur is not None:
            for v in _raw_candidates(c.inner, cur[0], sample):
                yield (v, cur[1])
                yield (cur[0], v)
            if c.scalar_ok:
                yield from _raw_candidates(c.inner, cur[0], sample)
        vals = list(_raw_candidates(c.inner, ANY, sample))[:8]
        for a in vals:
            yield (a, a)
            for b in vals:
                yield (a, b)
    elif isinstance(c, AnyOf):
        for sub in c.constraints:
            yield from _raw_candidates(sub, current if sub.accepts(current) else ANY, sample)
    elif isinstance(c, Component | Instance):
        yield from _object_candidates(current, sample)
        if isinstance(c, Component):
            yield from _component_names(c)
    else:  # a constraint type of its own (a sample shape, a list of names): its options, then plain values
        opts = list(getattr(c, "options", ()) or ())
        yield from opts
        yield from ([o] for o in opts)
        if isinstance(current, list | tuple):
            yield from (list(current)[:-1] + [o] for o in opts)
            yield from (list(current) + [o] for o in opts)
        yield from _pool(sample)


def _object_candidates(current: Any, sample: Sequence[int]) -> Iterator[Any]:
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
        for name in current.param_names():
            if name in declared:
                for v in candidates(declared[name], getattr(current, name), sample=sample):
                    try:
                        yield current.set_params(**{name: v})
                    except (ValueError, TypeError):
                        continue
                    break


def _component_names(c: Component) -> list[str]:
    """Registered names a component may be given by (explanations), if the component has a registry."""
    from ..explain import available_explanations
    from ..explain.base import Explanation

    return list(available_explanations()) if issubclass(c.base, Explanation) else []


def _key(c: Constraint, v: Any) -> str | None:
    try:
        return stable_hash(c.convert(v))
    except (ValueError, TypeError):
        return None


def candidates(c: Constraint, current: Any = ANY, limit: int = 12, *,
               sample: Sequence[int] = (1, 8, 8)) -> list[Any]:
    """Up to ``limit`` values ``c`` accepts whose converted value differs from ``current``.

    Covers every constraint type of :mod:`medadv.params` (Int, Real, Bool, Options, Optional, Pair, AnyOf,
    Component, Instance); a constraint type of its own gets values from a pool of plain values, with shapes and
    tensors fitting one sample of shape ``sample`` (``(C, *spatial)``).
    """
    cur = ANY if current is ANY else stable_hash(current)
    out: list[Any] = []
    seen: set[str] = set() if cur is ANY else {cur}
    for v in _raw_candidates(c, current, sample):
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
