"""Attack once: a run crafts each adversarial example once, and every later consumer reads it back.

:func:`craft` is the one call site for crafting. Outside an :func:`attack_once` block it is exactly
``attack(model, x, y_or_target, **call_kwargs)``. Inside one, every sample's result is remembered under a key made
of content fingerprints (:mod:`medadv.fingerprints`):

* the model: its weights and the classes, plain attributes, non-persistent buffers and forward hooks of its
  modules (:func:`~medadv.fingerprints.model_fingerprint`: every call checks the weights' content by an
  on-device checksum, one pass and one small host copy; the full hash only when that changes);
* the attack: its class and every declared parameter, its task and its threat (the budget) or data box
  (:func:`~medadv.fingerprints.attack_fingerprint`), and the call's other keyword arguments; for an attack
  without its own ``seed`` also the seed the global RNG was seeded from (:func:`seed_tag`, set per batch by
  ``evaluate(seed=...)``);
* the sample: its input bytes, its label or target bytes and its slice of each call argument the attack declares
  per sample (``per_sample_call_args``, e.g. DAG's ``target_mask``), hashed per sample
  (:func:`~medadv.fingerprints.per_sample_hashes`: on an accelerator by an on-device checksum, one small host copy
  per call, never per attack step).

A call whose settings are known only by a ``repr`` with a memory address, or whose model cannot be described, is
crafted without the cache.

A later call with some samples already crafted under the same key crafts only the missing ones, as one
sub-batch, and puts the :class:`~medadv.attacks.base.AttackResult` back together in the caller's order
(``x_adv``, ``fooled``, norms, logits, prediction and the per-sample fields of the typed ``details``). A call
where nothing is cached crafts the batch exactly as without a cache (same tensors). A result that cannot be
split per sample (a ``trace`` was recorded, or ``details`` hold something that is neither a declared per-sample
field nor a batch constant) is returned as crafted and not remembered; once a sub-batch's result could not be
split, later calls with the same settings are crafted whole at once.

What is served is what was crafted first: an attack without its own ``seed`` that draws from torch's global RNG
is not crafted again under another global RNG state, and the missing samples of a partial hit are crafted as a
smaller batch (the attack's random start of a batch depends on its size). The values are adversarial examples of
the same sample under the same settings either way.

Values stay where the attack returned them (the model's device) up to ``max_bytes``; past it the least recently
used ones are written to ``spill_dir`` (one ``torch.save`` file per sample, read back with ``weights_only=True``;
written and read without following a link below ``root``), or without a ``spill_dir`` dropped (they are then
crafted again: correct, just not once); a spill that fails (a full disk, a refused link) drops its entry. Nothing
is written outside ``spill_dir``, the caller's tensors are never modified and no returned tensor shares memory
with the cache.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import json
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
from .params import _canonical

__all__ = ["AttackCache", "attack_once", "craft", "active_cache", "suspended", "seed_tag", "DEFAULT_MAX_BYTES"]

#: the default bound on the bytes a cache keeps on the device (1 GiB): a few hundred 3-D volumes with their logits
DEFAULT_MAX_BYTES = 1 << 30

_ACTIVE: contextvars.ContextVar[AttackCache | None] = contextvars.ContextVar("medadv_attack_cache", default=None)
#: the seed the global RNG was seeded from around this call (:func:`seed_tag`; ``evaluate(seed=...)`` sets it per
#: batch): part of the key of attacks without their own ``seed``, whose output depends on it
_SEED_TAG: contextvars.ContextVar[int | None] = contextvars.ContextVar("medadv_attack_seed_tag", default=None)

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


def _ambiguous(v: Any, n: int) -> bool:
    """An undeclared details value that may hold one entry per sample (a tensor, or a mapping of tensors, whose
    first dimension is the batch size): neither slicing it nor keeping it whole is known to be right."""
    if isinstance(v, Mapping):
        return any(_per_sample(t, n) for t in v.values())
    return _per_sample(v, n)


def _declared_fields(cls: type) -> frozenset[str]:
    """The details fields declared per sample: the ``columns`` (indexed per row by
    :meth:`~medadv.attacks.base.AttackDetails.row`) and, where a details class lists them, its ``sample_fields``
    (per-sample tensors that are no table column)."""
    return frozenset(getattr(cls, "columns", ())) | frozenset(getattr(cls, "sample_fields", ()))


def _split(res: Any, n: int) -> tuple[_Layout, list[dict[str, Tensor]]] | None:
    """The per-sample parts of a result (each tensor cloned, leading dimension 1), or ``None`` when the result
    cannot be split per sample.

    A details field is split only when its class declares it per sample (:func:`_declared_fields`), never
    because its first dimension happens to equal the batch size; an undeclared tensor whose first dimension is
    the batch size may be either, so such a result is not split (it is crafted as without a cache)."""
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
        declared = _declared_fields(details_cls)
        for f in fields:
            v = getattr(d, f)
            if f in declared:
                if _per_sample(v, n):
                    batch[f"details:{f}"] = v
                    kinds.append((f, ("sample",)))
                elif isinstance(v, Mapping) and v and all(isinstance(k, str) and _per_sample(t, n)
                                                          for k, t in v.items()):
                    for k, t in v.items():
                        batch[f"details:{f}:{k}"] = t
                    kinds.append((f, ("map", tuple(v))))
                elif _plain_constant(v):  # a declared column may be one value for the whole batch (a name)
                    kinds.append((f, ("const", v)))
                else:
                    return None
            elif _ambiguous(v, n):
                return None
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
        root: the folder ``spill_dir`` lies in (a run's output folder); every folder below it up to the files is
            opened without following a link, so a link planted there (``<out>/.attack_cache``) is refused, never
            written through. Default: ``spill_dir`` itself. A spill file that cannot be written (a full disk, a
            refused link) drops its entry (counted as ``evicted``): the run goes on.

    ``stats`` counts samples: ``crafted`` (given to the attack while the cache was active), ``reused`` (served
    from the cache), ``uncached`` (crafted, but their result could not be split per sample), ``spilled`` (written
    to ``spill_dir``) and ``evicted`` (dropped past ``max_bytes``).
    """

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES, spill_dir: str | os.PathLike | None = None,
                 root: str | os.PathLike | None = None) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"`max_bytes` must be an integer >= 0 (bytes kept in memory), got {max_bytes!r}")
        if spill_dir is not None and not isinstance(spill_dir, str | os.PathLike):
            raise TypeError(f"`spill_dir` must be a folder path or None, got {type(spill_dir).__name__}")
        if root is not None and not isinstance(root, str | os.PathLike):
            raise TypeError(f"`root` must be a folder path or None, got {type(root).__name__}")
        if root is not None and spill_dir is None:
            raise ValueError("`root` needs a `spill_dir` inside it (the folder spilled files go to)")
        if root is not None and spill_dir is not None:
            r, d = os.path.abspath(root), os.path.abspath(spill_dir)
            if d != r and not d.startswith(r.rstrip(os.sep) + os.sep):
                raise ValueError(f"`spill_dir` {spill_dir} must be inside `root` {root}")
        self.max_bytes = max_bytes
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        self.root = Path(root) if root is not None else self.spill_dir
        if self.spill_dir is not None and self.spill_dir.exists() and not self.spill_dir.is_dir():
            raise ValueError(f"`spill_dir` must be a folder, and {self.spill_dir} is a file")
        self.stats: dict[str, int] = {"crafted": 0, "reused": 0, "uncached": 0, "spilled": 0, "evicted": 0}
        self._entries: dict[str, _Entry] = {}
        self._memory: OrderedDict[str, None] = OrderedDict()  # keys held in memory, least recently used first
        self._bytes = 0
        self._lock = threading.RLock()
        self._token = secrets.token_hex(4)  # this cache's files: two caches may share a spill_dir
        self._unsplittable: set[str] = set()  # keys' heads whose results could not be split: crafted whole

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
                loaded = self._read(entry.path)
            except (OSError, RuntimeError, ValueError, EOFError):  # deleted or replaced behind our back: crafted again
                del self._entries[key]
                return None
            return entry.layout, loaded

    def _read(self, path: Path) -> dict[str, Tensor]:
        """A spilled file read back with ``weights_only=True``, opened like it was written: no folder below
        ``root`` and not the file itself may be a link (one planted after the write is refused, never read)."""
        from . import safe_io

        assert self.root is not None
        fd_dir = safe_io._open_dir(path.parent, self.root)
        try:
            fd = os.open(path.name if safe_io._DIR_FD else path, os.O_RDONLY | safe_io._NOFOLLOW | safe_io._CLOEXEC,
                         dir_fd=fd_dir if safe_io._DIR_FD else None)
        finally:
            os.close(fd_dir)
        with os.fdopen(fd, "rb") as fh:
            loaded = torch.load(fh, weights_only=True)
        if not isinstance(loaded, dict) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                   for k, v in loaded.items()):
            raise ValueError(f"{path} does not hold the cache's tensors")
        return loaded

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
            # never through a link planted below root; written in full or not at all
            try:
                with open_output(path, "wb", root=self.root) as fh:
                    torch.save(entry.tensors, fh)
            except OSError:  # a full disk, a refused link: the attack succeeded, only this entry is lost
                del self._entries[key]
                self.stats["evicted"] += 1
            else:
                entry.tensors, entry.path = None, path
                self.stats["spilled"] += 1
        self._memory.pop(key)
        self._bytes -= entry.nbytes

    # --- crafting -----------------------------------------------------------------------------------------------
    def _keys(self, attack: Attack, model: nn.Module, x: Tensor, target: Any,
              call_kwargs: Mapping[str, Any]) -> tuple[str, list[str], list[str]] | None:
        """The key's head (model, attack, settings), each sample's key, and the names of the per-sample call
        arguments (those the attack declares in ``per_sample_call_args``); ``None`` when the call cannot be keyed
        (the attack then sees it unchanged and reports what is wrong with it), also when a setting is known only
        by a ``repr`` with a memory address (two different objects could share it over time)."""
        if not isinstance(attack, Attack) or not isinstance(model, nn.Module) or not isinstance(x, Tensor) \
                or x.ndim == 0 or x.shape[0] == 0:
            return None
        n = x.shape[0]
        if target is not None and not _per_sample(target, n):
            return None
        declared = set(getattr(type(attack), "per_sample_call_args", ()))
        per_sample = sorted(k for k in call_kwargs if k in declared)
        if not all(_per_sample(call_kwargs[k], n) for k in per_sample):
            return None  # a declared per-sample argument of another batch size: the attack says what is wrong
        others = {k: v for k, v in call_kwargs.items() if k != "clean_logits" and k not in per_sample}
        tensors = [x] + ([target] if target is not None else []) + [call_kwargs[k] for k in per_sample]
        try:
            model_fp = model_fingerprint(model)
            if model_fp is None:
                return None  # a model whose behaviour cannot be described is not keyed
            attack_fingerprint(attack)  # refuses what is no medadv attack (TypeError: not keyed)
            settings = {"model": model_fp, "target": target is not None, "per_sample": per_sample, "call": others,
                        "attack": {"class": f"{type(attack).__module__}.{type(attack).__qualname__}",
                                   "settings": attack.fingerprint()}}
            if getattr(attack, "seed", 0) is None:  # drawn from the global RNG: its seeding is a setting
                settings["seed_tag"] = _SEED_TAG.get()
            text = json.dumps(_canonical(settings), sort_keys=True)  # stable_hash's payload, read once
            if " at 0x" in text:
                return None  # a setting known only by its address: two objects could share it over time
            head = hashlib.sha256(text.encode()).hexdigest()[:16]
            samples = per_sample_hashes(*tensors)
        except (TypeError, ValueError, KeyError, RuntimeError, NotImplementedError):
            return None  # a dtype or device the hashes cannot read: not cached
        return head, [f"{head}:{s}" for s in samples], per_sample

    def craft(self, attack: Attack, model: nn.Module, x: Tensor, y_or_target: Tensor | None = None,
              **call_kwargs: Any) -> AttackResult:
        """``attack(model, x, y_or_target, **call_kwargs)``, crafting only the samples not cached yet."""
        keyed = self._keys(attack, model, x, y_or_target, call_kwargs)
        if keyed is None:
            return self._uncached(attack, model, x, y_or_target, call_kwargs)
        head, keys, per_sample = keyed
        n = len(keys)
        found = [self._get(k) for k in keys]
        miss = [i for i, f in enumerate(found) if f is None]
        if len(miss) == n or (miss and head in self._unsplittable):
            # nothing cached, or these settings gave a result that could not be split before (then a sub-batch
            # could not be put together with the cached samples): the batch exactly as without a cache
            res = attack(model, x, y_or_target, **call_kwargs)
            self.stats["crafted"] += n
            if not self._remember(keys, res):
                self._unsplittable.add(head)
                self.stats["uncached"] += n
            return res
        if miss:
            idx = torch.tensor(miss, device=x.device)
            kw = {k: (v.index_select(0, idx.to(v.device))
                      if k in per_sample or (k == "clean_logits" and _per_sample(v, n)) else v)
                  for k, v in call_kwargs.items()}
            target = y_or_target.index_select(0, idx.to(y_or_target.device)) if y_or_target is not None else None
            fresh = attack(model, x.index_select(0, idx), target, **kw)
            split = _split(fresh, len(miss))
            if split is None:
                # cannot be put together with the cached samples: the whole batch as today, each sample counted
                # once; these settings then skip the sub-batch (decided before crafting) from now on
                self._unsplittable.add(head)
                return self._uncached(attack, model, x, y_or_target, call_kwargs)
            self.stats["crafted"] += len(miss)
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


@contextmanager
def suspended() -> Iterator[None]:
    """No active cache in the block (:func:`craft` calls the attack itself): for checks that must see the attack
    run, such as a determinism re-run, inside a run's :func:`attack_once` block."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@contextmanager
def seed_tag(seed: int | None) -> Iterator[None]:
    """Tag the :func:`craft` calls of the block with the seed torch's global RNG was seeded from
    (``evaluate(seed=...)`` does, per batch, through ``evaluation._seeded``). It is part of the key of attacks
    without their own ``seed``: ``evaluate(seed=0)`` and ``evaluate(seed=1)`` do not share examples, and a study
    run under the run's seed tag reuses what ``evaluate`` crafted with it."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"`seed` must be an integer or None, got {type(seed).__name__}")
    token = _SEED_TAG.set(seed)
    try:
        yield
    finally:
        _SEED_TAG.reset(token)


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
