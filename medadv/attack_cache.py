"""Attack once: a run crafts each adversarial example once, and every later consumer reads it back.

:func:`craft` is the one call site for crafting. Outside an :func:`attack_once` block it is exactly
``attack(model, x, y_or_target, **call_kwargs)``. Inside one, every sample's result is remembered under a key made
of content fingerprints (:mod:`medadv.fingerprints`):

* the model: its weights and the classes of its modules (:func:`~medadv.fingerprints.model_fingerprint`, hashed
  once per model object and again only when one of its parameters changes);
* the attack: its class and every declared parameter, its task and its threat (the budget) or data box
  (:func:`~medadv.fingerprints.attack_fingerprint`), and the call's other keyword arguments;
* the sample: its input bytes, its label or target bytes and its slice of any per-sample call argument (e.g.
  DAG's ``target_mask``), hashed per sample (:func:`~medadv.fingerprints.per_sample_hashes`: on an accelerator
  by an on-device checksum, one small host copy per call, never per attack step).

A later call with some samples already crafted under the same key crafts only the missing ones, as one
sub-batch, and puts the :class:`~medadv.attacks.base.AttackResult` back together in the caller's order
(``x_adv``, ``fooled``, norms, logits, prediction and the per-sample fields of the typed ``details``). A call
where nothing is cached crafts the batch exactly as without a cache (same tensors). A result that cannot be
split per sample (a ``trace`` was recorded, or ``details`` hold something that is neither per-sample nor a plain
constant) is returned as crafted and not remembered.

What is served is what was crafted first: an attack without its own ``seed`` that draws from torch's global RNG
is not crafted again under another global RNG state, and the missing samples of a partial hit are crafted as a
smaller batch (the attack's random start of a batch depends on its size). The values are adversarial examples of
the same sample under the same settings either way.

Values stay where the attack returned them (the model's device) up to ``max_bytes``; past it the least recently
used ones are written to ``spill_dir`` (one ``torch.save`` file per sample, read back with ``weights_only=True``),
or without a ``spill_dir`` dropped (they are then crafted again: correct, just not once). Nothing is written
outside ``spill_dir``, the caller's tensors are never modified and no returned tensor shares memory with the cache.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .attacks.base import Attack, AttackDetails, AttackResult
from .fingerprints import attack_fingerprint, model_fingerprint, per_sample_hashes
from .params import stable_hash

__all__ = ["AttackCache", "attack_once", "craft", "active_cache", "DEFAULT_MAX_BYTES"]

#: the default bound on the bytes a cache keeps on the device (1 GiB): a few hundred 3-D volumes with their logits
DEFAULT_MAX_BYTES = 1 << 30

_ACTIVE: contextvars.ContextVar[AttackCache | None] = contextvars.ContextVar("medadv_attack_cache", default=None)

#: the result fields split per sample (``pred`` and ``clean_logits`` may be None)
_REQUIRED = ("x_adv", "fooled", "linf", "l2", "logits", "y")
_OPTIONAL = ("pred", "clean_logits")
_PLAIN = (bool, int, float, str, type(None))


@dataclass(frozen=True, eq=False)
class _Layout:
    """How the results of one crafting call split per sample: the per-sample tensors' names, and for the typed
    details their class, the per-sample fields (``("sample",)``), mappings of per-sample tensors
    (``("map", keys)``) and batch constants (``("const", value)``)."""

    names: tuple[str, ...]
    details_cls: type | None
    details: tuple[tuple[str, tuple[Any, ...]], ...]


@dataclass
class _Entry:
    """One cached sample: its tensors (leading dimension 1) in memory, or the file they were spilled to."""

    layout: _Layout
    tensors: dict[str, Tensor] | None
    path: Path | None
    nbytes: int


def _plain_constant(v: Any) -> bool:
    if isinstance(v, _PLAIN):
        return True
    return isinstance(v, list | tuple) and all(_plain_constant(e) for e in v)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and a.device == b.device and bool(torch.equal(a, b)))
    return type(a) is type(b) and a == b


def _same_layout(a: _Layout, b: _Layout) -> bool:
    if a is b:
        return True
    if a.names != b.names or a.details_cls is not b.details_cls or len(a.details) != len(b.details):
        return False
    for (fa, ka), (fb, kb) in zip(a.details, b.details, strict=True):
        if fa != fb or ka[0] != kb[0]:
            return False
        if ka[0] == "map" and ka[1] != kb[1]:
            return False
        if ka[0] == "const" and not _same_value(ka[1], kb[1]):
            return False
    return True


def _per_sample(v: Any, n: int) -> bool:
    return isinstance(v, Tensor) and v.ndim >= 1 and v.shape[0] == n


def _split(res: Any, n: int) -> tuple[_Layout, list[dict[str, Tensor]]] | None:
    """The per-sample parts of a result (each tensor cloned, leading dimension 1), or ``None`` when the result
    cannot be split per sample."""
    if type(res) is not AttackResult or res.trace is not None:
        return None
    batch: dict[str, Tensor] = {}
    for name in _REQUIRED:
        v = getattr(res, name)
        if not _per_sample(v, n):
            return None
        batch[name] = v
    for name in _OPTIONAL:
        v = getattr(res, name)
        if v is None:
            continue
        if not _per_sample(v, n):
            return None
        batch[name] = v
    kinds: list[tuple[str, tuple[Any, ...]]] = []
    details_cls: type | None = None
    d = res.details
    if d is not None:
        if not (isinstance(d, AttackDetails) and dataclasses.is_dataclass(d)):
            return None
        fields = [f.name for f in dataclasses.fields(d)]
        if set(getattr(d, "__dict__", {})) - set(fields):  # attributes outside the declared fields would be lost
            return None
        details_cls = type(d)
        for f in fields:
            v = getattr(d, f)
            if _per_sample(v, n):
                batch[f"details:{f}"] = v
                kinds.append((f, ("sample",)))
            elif isinstance(v, Mapping) and v and all(isinstance(k, str) and _per_sample(t, n) for k, t in v.items()):
                for k, t in v.items():
                    batch[f"details:{f}:{k}"] = t
                kinds.append((f, ("map", tuple(v))))
            elif _plain_constant(v) or isinstance(v, Tensor):
                kinds.append((f, ("const", v.detach().clone() if isinstance(v, Tensor) else v)))
            else:
                return None
    layout = _Layout(tuple(batch), details_cls, tuple(kinds))
    parts = [{k: t.detach()[i:i + 1].clone() for k, t in batch.items()} for i in range(n)]
    return layout, parts


def _assemble(layout: _Layout, parts: list[dict[str, Tensor]], x: Tensor, clean_logits: Any) -> AttackResult:
    """One :class:`AttackResult` from per-sample parts in the caller's order (new tensors: nothing aliases the
    cache). ``clean_logits``: the caller's, when given (as the attack itself would return them)."""
    t = {name: torch.cat([p[name] for p in parts]) for name in layout.names}
    details: Any = None
    if layout.details_cls is not None:
        details = object.__new__(layout.details_cls)
        for f, kind in layout.details:
            value: Any
            if kind[0] == "sample":
                value = t[f"details:{f}"]
            elif kind[0] == "map":
                value = {k: t[f"details:{f}:{k}"] for k in kind[1]}
            else:
                value = kind[1].clone() if isinstance(kind[1], Tensor) else kind[1]
            object.__setattr__(details, f, value)  # frozen dataclasses too; no __post_init__ runs again
    logits = t["logits"]
    clean: Tensor | None
    if isinstance(clean_logits, Tensor):
        clean = clean_logits.detach().to(logits.device)
    else:
        clean = t.get("clean_logits")
    return AttackResult(x_adv=t["x_adv"].to(x.device), fooled=t["fooled"], linf=t["linf"], l2=t["l2"],
                        logits=logits, y=t["y"], trace=None, details=details, pred=t.get("pred"),
                        clean_logits=clean)


class AttackCache:
    """The adversarial examples of a run, one entry per crafted sample (see the module documentation).

    Args:
        max_bytes: the most bytes of cached tensors kept where the attack returned them (the model's device);
            default :data:`DEFAULT_MAX_BYTES` (1 GiB). 0 keeps nothing in memory.
        spill_dir: a folder for what does not fit (created when first needed; one file per sample, removed by
            :meth:`clear`); ``None``: what does not fit is dropped, least recently used first.

    ``stats`` counts samples: ``crafted`` (given to the attack while the cache was active), ``reused`` (served
    from the cache), ``uncached`` (crafted, but their result could not be split per sample), ``spilled`` (written
    to ``spill_dir``) and ``evicted`` (dropped past ``max_bytes``).
    """

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES, spill_dir: str | os.PathLike | None = None) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"`max_bytes` must be an integer >= 0 (bytes kept in memory), got {max_bytes!r}")
        if spill_dir is not None and not isinstance(spill_dir, str | os.PathLike):
            raise TypeError(f"`spill_dir` must be a folder path or None, got {type(spill_dir).__name__}")
        self.max_bytes = max_bytes
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        if self.spill_dir is not None and self.spill_dir.exists() and not self.spill_dir.is_dir():
            raise ValueError(f"`spill_dir` must be a folder, and {self.spill_dir} is a file")
        self.stats: dict[str, int] = {"crafted": 0, "reused": 0, "uncached": 0, "spilled": 0, "evicted": 0}
        self._entries: dict[str, _Entry] = {}
        self._memory: OrderedDict[str, None] = OrderedDict()  # keys held in memory, least recently used first
        self._bytes = 0
        self._lock = threading.RLock()
        self._token = secrets.token_hex(4)  # this cache's files: two caches may share a spill_dir

    def __len__(self) -> int:
        """The number of cached samples (in memory and spilled)."""
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """The bytes of the cached tensors held in memory (at most ``max_bytes``)."""
        return self._bytes

    def clear(self) -> None:
        """Forget every entry and delete this cache's files in ``spill_dir`` (the statistics are kept)."""
        with self._lock:
            for entry in self._entries.values():
                if entry.path is not None:
                    entry.path.unlink(missing_ok=True)
            self._entries.clear()
            self._memory.clear()
            self._bytes = 0

    # --- entries ------------------------------------------------------------------------------------------------
    def _get(self, key: str) -> tuple[_Layout, dict[str, Tensor]] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.tensors is not None:
                self._memory.move_to_end(key)
                return entry.layout, entry.tensors
            assert entry.path is not None
            try:
                loaded = torch.load(entry.path, weights_only=True)
            except FileNotFoundError:  # deleted behind our back: crafted again
                del self._entries[key]
                return None
            return entry.layout, loaded

    def _put(self, key: str, layout: _Layout, tensors: dict[str, Tensor]) -> None:
        with self._lock:
            self._drop(key)
            nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
            self._entries[key] = _Entry(layout, tensors, None, nbytes)
            self._memory[key] = None
            self._bytes += nbytes
            while self._bytes > self.max_bytes and self._memory:
                self._release(next(iter(self._memory)))

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        if entry.tensors is not None:
            self._memory.pop(key, None)
            self._bytes -= entry.nbytes
        if entry.path is not None:
            entry.path.unlink(missing_ok=True)

    def _release(self, key: str) -> None:
        """Move the entry out of memory: to ``spill_dir``, else away."""
        from .safe_io import open_output

        entry = self._entries[key]
        assert entry.tensors is not None
        if self.spill_dir is None:
            del self._entries[key]
            self.stats["evicted"] += 1
        else:
            path = self.spill_dir / f"{self._token}-{hashlib.sha256(key.encode()).hexdigest()[:32]}.pt"
            # never through a link planted below spill_dir; written in full or not at all (a failed write, e.g. a
            # full disk, raises with the entry still in memory: the cache stays consistent)
            with open_output(path, "wb", root=self.spill_dir) as fh:
                torch.save(entry.tensors, fh)
            entry.tensors, entry.path = None, path
            self.stats["spilled"] += 1
        self._memory.pop(key)
        self._bytes -= entry.nbytes

    # --- crafting -----------------------------------------------------------------------------------------------
    def _keys(self, attack: Attack, model: nn.Module, x: Tensor, target: Any,
              call_kwargs: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
        """Each sample's key, and the names of the per-sample call arguments; ``None`` when the call cannot be
        keyed (the attack then sees it unchanged and reports what is wrong with it)."""
        if not isinstance(attack, Attack) or not isinstance(model, nn.Module) or not isinstance(x, Tensor) \
                or x.ndim == 0 or x.shape[0] == 0:
            return None
        n = x.shape[0]
        if target is not None and not _per_sample(target, n):
            return None
        per_sample = sorted(k for k, v in call_kwargs.items() if k != "clean_logits" and _per_sample(v, n))
        others = {k: v for k, v in call_kwargs.items() if k != "clean_logits" and k not in per_sample}
        tensors = [x] + ([target] if target is not None else []) + [call_kwargs[k] for k in per_sample]
        try:
            head = stable_hash({"model": model_fingerprint(model), "attack": attack_fingerprint(attack),
                                "target": target is not None, "per_sample": per_sample, "call": others})
            samples = per_sample_hashes(*tensors)
        except (TypeError, ValueError, KeyError, RuntimeError, NotImplementedError):
            return None  # a dtype or device the hashes cannot read: not cached
        return [f"{head}:{s}" for s in samples], per_sample

    def craft(self, attack: Attack, model: nn.Module, x: Tensor, y_or_target: Tensor | None = None,
              **call_kwargs: Any) -> AttackResult:
        """``attack(model, x, y_or_target, **call_kwargs)``, crafting only the samples not cached yet."""
        keyed = self._keys(attack, model, x, y_or_target, call_kwargs)
        if keyed is None:
            return self._uncached(attack, model, x, y_or_target, call_kwargs)
        keys, per_sample = keyed
        n = len(keys)
        found = [self._get(k) for k in keys]
        miss = [i for i, f in enumerate(found) if f is None]
        if len(miss) == n:  # nothing cached: the batch exactly as without a cache
            res = attack(model, x, y_or_target, **call_kwargs)
            self.stats["crafted"] += n
            if not self._remember(keys, res):
                self.stats["uncached"] += n
            return res
        if miss:
            idx = torch.tensor(miss, device=x.device)
            kw = {k: (v.index_select(0, idx.to(v.device))
                      if k in per_sample or (k == "clean_logits" and _per_sample(v, n)) else v)
                  for k, v in call_kwargs.items()}
            target = y_or_target.index_select(0, idx.to(y_or_target.device)) if y_or_target is not None else None
            fresh = attack(model, x.index_select(0, idx), target, **kw)
            self.stats["crafted"] += len(miss)
            split = _split(fresh, len(miss))
            if split is None:  # cannot be put together with the cached samples: the whole batch as today
                return self._uncached(attack, model, x, y_or_target, call_kwargs)
            layout, parts = split
            for j, i in enumerate(miss):
                found[i] = (layout, parts[j])
                self._put(keys[i], layout, parts[j])
        got = [f for f in found if f is not None]
        assert len(got) == n
        layout = got[0][0]
        try:
            if not all(_same_layout(layout, g[0]) for g in got):
                raise ValueError("cached results of another layout")
            res = _assemble(layout, [g[1] for g in got], x, call_kwargs.get("clean_logits"))
        except (ValueError, RuntimeError):  # shapes or constants that do not fit together: crafted afresh
            return self._uncached(attack, model, x, y_or_target, call_kwargs, keys)
        self.stats["reused"] += n - len(miss)
        return res

    def _uncached(self, attack: Attack, model: nn.Module, x: Tensor, target: Any, call_kwargs: Mapping[str, Any],
                  keys: list[str] | None = None) -> AttackResult:
        """The whole batch crafted as without a cache (remembered under ``keys`` when given and splittable)."""
        res = attack(model, x, target, **call_kwargs)
        n = x.shape[0] if isinstance(x, Tensor) and x.ndim else 0
        self.stats["crafted"] += n
        if keys is None or not self._remember(keys, res):
            self.stats["uncached"] += n
        return res

    def _remember(self, keys: list[str], res: AttackResult) -> bool:
        """Store every sample of a fresh result; False when it cannot be split per sample."""
        split = _split(res, len(keys))
        if split is None:
            return False
        layout, parts = split
        for k, p in zip(keys, parts, strict=True):
            self._put(k, layout, p)
        return True


def active_cache() -> AttackCache | None:
    """The cache of the innermost :func:`attack_once` block around this call, or ``None``."""
    return _ACTIVE.get()


@contextmanager
def attack_once(cache: AttackCache | None = None) -> Iterator[AttackCache]:
    """Activate ``cache`` (a new :class:`AttackCache` when ``None``) for :func:`craft` calls in the block (this
    thread or task only: a context variable). A cache made here is cleared when the block ends; a given one is
    kept (call its :meth:`~AttackCache.clear` to delete its spilled files)."""
    if cache is not None and not isinstance(cache, AttackCache):
        raise TypeError(f"`cache` must be an AttackCache or None, got {type(cache).__name__}")
    own = cache is None
    active = AttackCache() if cache is None else cache
    token = _ACTIVE.set(active)
    try:
        yield active
    finally:
        _ACTIVE.reset(token)
        if own:
            active.clear()


def craft(attack: Attack, model: nn.Module, x: Tensor, y_or_target: Tensor | None = None,
          **call_kwargs: Any) -> AttackResult:
    """Craft adversarial examples: the one call site for attacking a batch.

    With no active cache (:func:`attack_once`) this is exactly ``attack(model, x, y_or_target, **call_kwargs)``.
    With one, samples already crafted under the same model weights, attack settings, input and target are served
    from it and only the others are crafted (one sub-batch); the result is in the caller's order.
    """
    cache = _ACTIVE.get()
    if cache is None:
        return attack(model, x, y_or_target, **call_kwargs)
    return cache.craft(attack, model, x, y_or_target, **call_kwargs)
