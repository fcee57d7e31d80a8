"""Content fingerprints: what a result row, a sample or a crafted adversarial example depends on.

:func:`~medadv.evaluate` tags every row with a settings fingerprint (:func:`row_fingerprint`) and a sample hash
(:func:`sample_hashes`), so a resumed run reuses a logged row only for the same model, settings and data; the
attack-once cache (:mod:`medadv.attack_cache`) keys every crafted sample by the same kind of content hashes
(:func:`model_fingerprint`, :func:`attack_fingerprint`, :func:`per_sample_hashes`). The strings are stable across
releases: the rows of old logs keep their fingerprints.
"""

from __future__ import annotations

import functools
import hashlib
import json
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .params import object_settings, stable_hash

__all__ = [
    "weights_hash",
    "model_fingerprint",
    "attack_fingerprint",
    "row_fingerprint",
    "sample_hashes",
    "per_sample_hashes",
    "device_checksum",
    "is_targeted",
]

#: two primes below 2**31: residues of a 32-bit word modulo both identify it (their product exceeds 2**32)
_PRIMES = (2147483647, 2147483629)


def weights_hash(model: nn.Module) -> str:
    """A short hash of the model's class and every weight and buffer (``state_dict``), 16 hex digits.

    Each tensor is copied to the host once; :func:`model_fingerprint` remembers the result per model object.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    h = hashlib.sha256(type(model).__qualname__.encode())
    for k, v in model.state_dict().items():
        h.update(k.encode())
        t = v.detach().cpu().contiguous()
        h.update(str(t.dtype).encode())
        h.update((t.float() if t.dtype == torch.bfloat16 else t).numpy().tobytes())
    return h.hexdigest()[:16]


#: what every ``nn.Module`` keeps in its ``__dict__`` (weights, submodules, hook tables, the mode): not a setting
_MODULE_INTERNALS = frozenset(vars(nn.Module())) | {"training"}
_DEPTH = 8  # how deep a module attribute is described (a deeper one is not keyed: behaviour unknown)


class _Unkeyable(Exception):
    """A model whose behaviour cannot be described (an uninitialised lazy weight, a cycle too deep)."""


def _checksums(tensors: Sequence[Tensor]) -> tuple[tuple[int, int], ...]:
    """Each tensor's content checksum (:func:`device_checksum` of the whole tensor as one sample), reduced on
    its own device and copied to the host once per device (not once per tensor)."""
    by_device: dict[torch.device, list[tuple[int, Tensor]]] = {}
    for i, t in enumerate(tensors):
        try:
            flat = t.detach().reshape(1, -1)
        except (RuntimeError, ValueError, NotImplementedError) as e:  # lazy weights not materialised yet
            raise _Unkeyable(str(e)) from None
        by_device.setdefault(flat.device, []).append((i, device_checksum(flat)))
    out: list[tuple[int, int]] = [(0, 0)] * len(tensors)
    for parts in by_device.values():
        host = torch.cat([c for _, c in parts]).cpu().tolist()
        for (i, _), row in zip(parts, host, strict=True):
            out[i] = (int(row[0]), int(row[1]))
    return tuple(out)


def _callable_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _describe(v: Any, root: dict[int, str], tensors: list[Tensor], depth: int, seen: frozenset[int]) -> Any:
    """A JSON-able description of a module attribute or hook: what decides the module's behaviour besides its
    registered weights. Tensors are appended to ``tensors`` (their content goes into the checksum pass); an
    object that has nothing better than its ``repr`` keeps it (with ``" at 0x"``: the cache then does not key
    the call)."""
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, Tensor):
        tensors.append(v)
        return {"tensor": list(v.shape), "dtype": str(v.dtype), "index": len(tensors) - 1}
    if isinstance(v, torch.device | torch.dtype):
        return str(v)
    if depth > _DEPTH or id(v) in seen:
        raise _Unkeyable("an attribute nested too deep or referring to itself")
    seen = seen | {id(v)}
    d = depth + 1
    if isinstance(v, nn.Module):
        if id(v) in root:  # a submodule of the model (its own state is described on its own)
            return {"submodule": root[id(v)]}
        # a module held outside the model's registered tree (in a list, a closure): its weights count too
        return {"module": [[name, _callable_name(type(m)), _describe_module(m, root, tensors, d, seen | {id(m)}),
                            {k: _describe(t, root, tensors, d, seen) for k, t in m.state_dict(keep_vars=True).items()}]
                           for name, m in v.named_modules()]}
    if isinstance(v, np.ndarray):  # its repr is abridged: by content
        a = np.ascontiguousarray(v)
        return {"ndarray": list(a.shape), "dtype": str(a.dtype),
                "sha": hashlib.sha256(a.tobytes() if a.dtype != object else repr(a.tolist()).encode()).hexdigest()}
    if isinstance(v, Mapping):
        return {"map": [[_describe(k, root, tensors, d, seen), _describe(x, root, tensors, d, seen)]
                        for k, x in v.items()]}
    if isinstance(v, list | tuple | set | frozenset):
        items = sorted(v, key=repr) if isinstance(v, set | frozenset) else v
        return {type(v).__name__: [_describe(x, root, tensors, d, seen) for x in items]}
    if isinstance(v, functools.partial):
        return {"partial": _describe(v.func, root, tensors, d, seen), "args": _describe(v.args, root, tensors, d, seen),
                "keywords": _describe(v.keywords, root, tensors, d, seen)}
    if isinstance(v, types.MethodType):
        return {"method": _callable_name(v.__func__), "self": _describe(v.__self__, root, tensors, d, seen)}
    if isinstance(v, types.FunctionType):  # its code and what it closes over or defaults to
        cells = [c.cell_contents for c in (v.__closure__ or ()) if c.cell_contents is not v]
        return {"function": _callable_name(v), "code": hashlib.sha256(v.__code__.co_code).hexdigest()[:16],
                "closure": _describe(cells, root, tensors, d, seen),
                "defaults": _describe(v.__defaults__ or (), root, tensors, d, seen),
                "kwdefaults": _describe(v.__kwdefaults__ or {}, root, tensors, d, seen)}
    if isinstance(v, type | types.BuiltinFunctionType | types.ModuleType):
        return {"name": _callable_name(v) if not isinstance(v, types.ModuleType) else v.__name__}
    fp = getattr(v, "fingerprint", None)
    if callable(fp) and not isinstance(v, type):
        try:
            return {"class": _callable_name(type(v)), "fingerprint": fp()}
        except TypeError:
            pass
    state = getattr(v, "__dict__", None)
    if isinstance(state, dict):  # a plain object (a task, a window setting): its class and every attribute
        return {"class": _callable_name(type(v)), "state": _describe(state, root, tensors, d, seen)}
    return repr(v)


def _describe_module(m: nn.Module, root: dict[int, str], tensors: list[Tensor], depth: int,
                     seen: frozenset[int]) -> Any:
    """A module's plain attributes, non-persistent buffers and forward (pre-)hooks; ``training`` is left out
    (attacks run the model in eval mode)."""
    attrs = {k: _describe(v, root, tensors, depth, seen) for k, v in sorted(vars(m).items())
             if k not in _MODULE_INTERNALS}
    buffers = {k: _describe(b, root, tensors, depth, seen) for k, b in m._buffers.items()
               if b is not None and k in m._non_persistent_buffers_set}
    hooks = {name: [_describe(h, root, tensors, depth, seen) for h in getattr(m, name, {}).values()]
             for name in ("_forward_pre_hooks", "_forward_hooks")}
    return {"attributes": attrs, "non_persistent": buffers, "hooks": hooks}


def _behaviour(model: nn.Module) -> tuple[str, list[Tensor]]:
    """What decides the model's output besides ``state_dict``: every submodule's class, plain attributes,
    non-persistent buffers and forward hooks, plus torch's global forward hooks, as one canonical string; and
    the tensors it refers to (hashed by content on their device)."""
    from torch.nn.modules import module as torch_module

    root = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
    tensors: list[Tensor] = []
    desc = [[name, _callable_name(type(m)), _describe_module(m, root, tensors, 0, frozenset({id(m)}))]
            for name, m in model.named_modules()]
    glob = [_describe(h, root, tensors, 0, frozenset())
            for table in ("_global_forward_pre_hooks", "_global_forward_hooks")
            for h in getattr(torch_module, table, {}).values()]
    return json.dumps({"modules": desc, "global_hooks": glob}, sort_keys=True), tensors


def _signature(model: nn.Module) -> tuple[Any, ...] | None:
    """What the model's output depends on, cheaply: the structure (names, shapes, dtypes, devices of every
    weight), the behaviour description (:func:`_behaviour`) and an on-device content checksum of every weight,
    buffer and attribute tensor (one pass, one host copy per device: no per-step synchronisation). Unlike
    ``_version`` it sees writes through ``.data``, numpy or DLPack. ``None`` when the model cannot be
    described (then it is not keyed)."""
    try:
        state = model.state_dict(keep_vars=True)
        behaviour, extra = _behaviour(model)
        if " at 0x" in behaviour:
            return None  # something known only by its address: its behaviour is not described
        tensors = [*state.values(), *extra]
        layout = tuple((k, tuple(t.shape), str(t.dtype), str(t.device)) for k, t in state.items())
        sums = _checksums(tensors)
    except (_Unkeyable, RuntimeError, ValueError, NotImplementedError, TypeError):
        return None
    return layout, behaviour, tuple((tuple(t.shape), str(t.dtype)) for t in extra), sums


# model object -> (signature, fingerprint); weak: a model that is gone takes its entry with it
_MODEL_MEMO: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[Any, ...], str]] = weakref.WeakKeyDictionary()


def model_fingerprint(model: nn.Module) -> str | None:
    """A short hash of what decides the model's output: its weights (:func:`weights_hash`), the classes, plain
    attributes (a sliding window's ROI size, a wrapper's task), non-persistent buffers and forward hooks of all
    its submodules (so equal weights behaving differently differ); ``training`` is not part of it.

    Each call checks every tensor's content by an on-device checksum (one pass, no copy of the weights to the
    host); the full hash is computed again only when that changes. ``None`` when the model cannot be described
    (an uninitialised lazy weight, attributes nested too deep): such a model is not cached."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    sig = _signature(model)
    if sig is None:
        return None
    memo = _MODEL_MEMO.get(model)
    if memo is not None and memo[0] == sig:
        return memo[1]
    _, behaviour, _, sums = sig
    n_state = len(sig[0])
    extra = [f"{a}:{b}" for a, b in sums[n_state:]]
    value = stable_hash({"weights": weights_hash(model), "behaviour": behaviour, "extra": extra})
    _MODEL_MEMO[model] = (sig, value)
    return value


def attack_fingerprint(attack: Any) -> str:
    """What decides an attack's output besides its inputs: its class and every declared parameter, with its
    task and its threat or data box (``attack.fingerprint()``: the budget is the threat's ε; a generator or
    other module parameter is hashed by content)."""
    fp = getattr(attack, "fingerprint", None)
    if not callable(fp):
        raise TypeError(f"`attack` must be a medadv Attack (with a fingerprint()), got {type(attack).__name__}")
    return stable_hash({"class": f"{type(attack).__module__}.{type(attack).__qualname__}", "settings": fp()})


def is_targeted(attack: Any) -> bool:
    """Whether the attack drives the prediction towards a target (``targeted=True`` or targeted by nature)."""
    return bool(getattr(attack, "targeted", False) or getattr(type(attack), "always_targeted", False))


def row_fingerprint(weights: str, task: Any, attack: Any, hd95: bool, spacing: Any,
                    target_fn: Callable[..., Any] | None, *, seed: int | None = None, save: bool = False) -> str:
    """A short hash of what a result row depends on: the model's weights (``weights``: :func:`weights_hash`), the
    task that reads its output, the attack's declared parameters with its task and threat or box
    (``attack.fingerprint()``), the HD95 options, for targeted attacks the name of the target function, and (when
    given) the per-batch seed and whether adversarial examples are saved (the ``saved_*`` columns)."""
    target = None
    if target_fn is not None and is_targeted(attack):
        target = f"{getattr(target_fn, '__module__', '')}.{getattr(target_fn, '__qualname__', repr(target_fn))}"
    spacing = list(spacing) if isinstance(spacing, Sequence) and not isinstance(spacing, str) else spacing
    settings: dict[str, Any] = {"model": weights, "task": object_settings(task), "attack": attack.fingerprint(),
                                "hd95": bool(hd95), "spacing": spacing, "target_fn": target}
    # only when set: the rows of earlier releases (no seed, nothing saved) keep their fingerprint
    if seed is not None:
        settings["seed"] = int(seed)
    if save:
        settings["save_adversarial"] = True
    return stable_hash(settings)


def device_checksum(t: Tensor) -> Tensor:
    """``(N, 2)`` int64: per sample, ``sum_i (w_i * v_i mod p)`` for two primes ``p``, over the sample's 32-bit
    words ``v_i`` (its bytes, whatever the dtype) with pseudo-random position weights ``w_i``.

    Exact integer arithmetic on the tensor's device (the same values on every device): a product stays below
    2**63 and each sum of residues below 2**63, so nothing wraps. One changed word always changes both sums (a
    word changes by less than the primes' product); a change of several words goes unnoticed with probability
    about 2**-62, as the weights are independent of the data.
    """
    if not isinstance(t, Tensor) or t.ndim == 0:
        raise TypeError(f"`t` must be a tensor with a batch dimension, got {type(t).__name__}")
    n = t.shape[0]
    flat = t.detach().contiguous().reshape(n, -1)
    size = flat.element_size()
    if flat.dtype == torch.bool:
        words = flat.to(torch.int64)
    elif size == 8:
        w64 = flat.view(torch.int64)
        words = torch.stack((w64 & 0xFFFFFFFF, (w64 >> 32) & 0xFFFFFFFF), dim=2).reshape(n, -1)
    else:
        view = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[size]
        words = flat.view(view).to(torch.int64) & 0xFFFFFFFF
    idx = torch.arange(1, words.shape[1] + 1, device=words.device, dtype=torch.int64)
    sums = []
    for k, p in enumerate(_PRIMES):
        w = (idx * (48271 + 2 * k) + 12345) % p
        w = (w * w) % p + 1  # non-linear in the position, never 0
        sums.append(((words * w) % p).sum(dim=1))
    return torch.stack(sums, dim=1)


def per_sample_hashes(*tensors: Tensor, extras: Sequence[bytes] | None = None) -> list[str]:
    """A short content hash per sample over several batch tensors (each one's dtype, sample shape and content, in
    the given order), plus ``extras[i]``; 16 hex digits each.

    Host tensors are hashed in place with SHA-256 (no copy). Tensors on an accelerator are reduced on their device
    to a per-sample checksum (:func:`device_checksum`) and only those few integers are copied to the host (one
    copy per tensor, not per sample): no copy of the voxels. The two schemes give different strings.
    """
    if not tensors:
        raise ValueError("`tensors` must hold at least one batch tensor")
    n = None
    for t in tensors:
        if not isinstance(t, Tensor) or t.ndim == 0:
            raise TypeError(f"`tensors` must be tensors with a batch dimension, got {type(t).__name__}")
        if n is not None and t.shape[0] != n:
            raise ValueError(f"`tensors` must share their batch size, got {n} and {t.shape[0]}")
        n = t.shape[0]
    assert n is not None
    if extras is not None and len(extras) != n:
        raise ValueError(f"`extras` must hold one entry per sample ({n}), got {len(extras)}")
    parts: list[list[bytes]] = [[] for _ in range(n)]
    for t in tensors:
        t = t.detach()
        head = f"{t.dtype}{tuple(t.shape[1:])}".encode()
        if t.device.type == "cpu":
            t = t.contiguous()
            t = t.float() if t.dtype == torch.bfloat16 else t  # numpy has no bfloat16
            arr = t.numpy()
            for i in range(n):
                parts[i] += [head, arr[i].tobytes()]
        else:
            sums = device_checksum(t).cpu().numpy()
            for i in range(n):
                parts[i] += [b"device:" + head, sums[i].tobytes()]
    out = []
    for i in range(n):
        h = hashlib.sha256()
        for part in parts[i]:
            h.update(part)
        if extras is not None:
            h.update(extras[i])
        out.append(h.hexdigest()[:16])
    return out


def sample_hashes(x: Tensor, y: Tensor, extras: Sequence[bytes] | None = None) -> list[str]:
    """A short content hash per sample of ``(x, y)`` (dtype, shape and content), plus ``extras[i]`` (a dictionary
    batch's case identifier and affine): a resumed run reuses a row only if its sample is the same data, not
    merely the same position in the iteration order (the ``data`` column of :func:`~medadv.evaluate`'s rows).

    Host tensors are hashed in place with SHA-256; accelerator tensors by their on-device checksum
    (:func:`per_sample_hashes`), so rows logged from host data are recomputed, never wrongly reused, when the same
    data arrive on a GPU.
    """
    return per_sample_hashes(x, y, extras=extras)
