"""Content fingerprints: what a result row, a sample or a crafted adversarial example depends on.

:func:`~medadv.evaluate` tags every row with a settings fingerprint (:func:`row_fingerprint`) and a sample hash
(:func:`sample_hashes`), so a resumed run reuses a logged row only for the same model, settings and data; the
attack-once cache (:mod:`medadv.attack_cache`) keys every crafted sample by the same kind of content hashes
(:func:`model_fingerprint`, :func:`attack_fingerprint`, :func:`per_sample_hashes`). The strings are stable across
releases: the rows of old logs keep their fingerprints.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

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


def _tensor_state(t: Tensor) -> tuple[Any, ...] | None:
    """What identifies a tensor's current content without reading it: object, storage, in-place version.
    ``None`` for tensors without a version counter (inference tensors, uninitialised lazy parameters)."""
    try:
        return (id(t), t.data_ptr(), t._version, tuple(t.shape), str(t.dtype), str(t.device))
    except (RuntimeError, ValueError, NotImplementedError):
        return None


def _signature(model: nn.Module) -> tuple[Any, ...] | None:
    """The state of every parameter and buffer (names, objects, storages, versions) and of every submodule's
    class: it changes whenever a weight is updated in place (an optimiser step, ``load_state_dict``), replaced or
    added. ``None`` when some tensor cannot be tracked (then nothing is remembered)."""
    parts: list[Any] = [f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()]
    for name, t in model.state_dict(keep_vars=True).items():
        state = _tensor_state(t)
        if state is None:
            return None
        parts.append((name, state))
    return tuple(parts)


# model object -> (signature, fingerprint); weak: a model that is gone takes its entry with it
_MODEL_MEMO: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[Any, ...], str]] = weakref.WeakKeyDictionary()


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of the model's weights (:func:`weights_hash`) and the classes of all its submodules (so two
    architectures that happen to hold equal tensors differ), computed once per model object and recomputed when
    one of its parameters or buffers changes (in place or replaced)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    sig = _signature(model)
    memo = _MODEL_MEMO.get(model)
    if sig is not None and memo is not None and memo[0] == sig:
        return memo[1]
    classes = [f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()]
    value = stable_hash({"weights": weights_hash(model), "modules": classes})
    if sig is not None:
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
