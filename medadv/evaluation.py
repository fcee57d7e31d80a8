"""Run models x attacks x budgets over data and collect a tidy :class:`~medadv.results.Results` table.

Data come as ``(x, y)`` tensor pairs or as MONAI dictionary batches (``{"image", "label", "case_id", ...}``);
rows carry each case's identifier, HD95 reads each case's voxel spacing from its image header, adversarial
examples can be written as NIfTI/PNG files and re-predicted, and the work can be sharded over the
processes of a ``torch.distributed`` run (:mod:`medadv.distributed`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from . import distributed as dist
from .attacks.base import Attack, AttackDetails, attack_mode, check_input, model_device
from .params import object_settings, stable_hash
from .results import DETAIL_PREFIX, Results
from .runtime import all_finite, forward_tensor, target_for
from .tasks import Outcome, Task

__all__ = ["evaluate", "sample_rows", "detail_rows"]

TargetFn = Callable[[Tensor, Tensor, Tensor], Tensor]
#: one target function for every targeted attack, or ``{attack name: fn}`` (a config's per-entry ``target``)
TargetFns = TargetFn | Mapping[str, TargetFn]


def _named_attacks(attacks: Attack | Sequence[Attack] | Mapping[str, Attack]) -> list[tuple[str, Attack]]:
    if isinstance(attacks, Attack):
        items = [(attacks.name, attacks)]
    elif isinstance(attacks, Mapping):
        items = [(str(k), v) for k, v in attacks.items()]
    elif isinstance(attacks, Sequence) and not isinstance(attacks, str):
        items = [(a.name, a) for a in attacks]
    else:
        raise TypeError(f"`attacks` must be an Attack, a sequence of Attacks or a name->Attack mapping, got {type(attacks).__name__}")
    seen = set()
    for name, atk in items:
        if not isinstance(atk, Attack):
            raise TypeError(f"`attacks` entry {name!r} is not a medadv Attack: {atk!r}")
        key = (name, atk.budget)
        if key in seen:
            raise ValueError(f"`attacks` has two entries named {name!r} with budget {atk.budget}; give them distinct names")
        seen.add(key)
    return items


def _sample_hashes(x: Tensor, y: Tensor, extras: Sequence[bytes] | None = None) -> list[str]:
    """A short content hash per sample of ``(x, y)`` (dtype, shape and content), plus ``extras[i]`` (a dictionary
    batch's case identifier and affine): a resumed run reuses a row only if its sample is the same data, not
    merely the same position in the iteration order.

    Host tensors (what a DataLoader yields) are hashed in place with SHA-256 (no copy). Tensors on an accelerator
    are reduced on their device to a per-sample checksum (:func:`_device_checksum`) and only those few integers
    are copied to the host: no copy of the voxels. The two schemes give different strings, so rows logged from
    host data are recomputed, never wrongly reused, when the same data arrive on a GPU.
    """
    n = x.shape[0]
    parts: list[list[bytes]] = [[] for _ in range(n)]
    for t in (x, y):
        t = t.detach()
        head = f"{t.dtype}{tuple(t.shape[1:])}".encode()
        if t.device.type == "cpu":
            t = t.contiguous()
            t = t.float() if t.dtype == torch.bfloat16 else t  # numpy has no bfloat16
            arr = t.numpy()
            for i in range(n):
                parts[i] += [head, arr[i].tobytes()]
        else:
            sums = _device_checksum(t).cpu().numpy()
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


#: two primes below 2**31: residues of a 32-bit word modulo both identify it (their product exceeds 2**32)
_PRIMES = (2147483647, 2147483629)


def _device_checksum(t: Tensor) -> Tensor:
    """``(N, 2)`` int64: per sample, ``sum_i (w_i * v_i mod p)`` for two primes ``p``, over the sample's 32-bit
    words ``v_i`` (its bytes, whatever the dtype) with pseudo-random position weights ``w_i``.

    Exact integer arithmetic on the tensor's device (the same values on every device): a product stays below
    2**63 and each sum of residues below 2**63, so nothing wraps. One changed word always changes both sums (a
    word changes by less than the primes' product); a change of several words goes unnoticed with probability
    about 2**-62, as the weights are independent of the data.
    """
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


def _weights_hash(model: nn.Module) -> str:
    """A short hash of the model's class and every weight and buffer (computed once per call)."""
    h = hashlib.sha256(type(model).__qualname__.encode())
    for k, v in model.state_dict().items():
        h.update(k.encode())
        t = v.detach().cpu().contiguous()
        h.update(str(t.dtype).encode())
        h.update((t.float() if t.dtype == torch.bfloat16 else t).numpy().tobytes())
    return h.hexdigest()[:16]


def _fingerprint(weights: str, task: Task, attack: Attack, hd95: bool, spacing: Any,
                 target_fn: TargetFn | None, *, seed: int | None = None, save: bool = False) -> str:
    """A short hash of what a row depends on: the model's weights, the task that reads its output, the
    attack's declared parameters with its task and threat or box (``attack.fingerprint()``), the HD95
    options, for targeted attacks the name of the target function, and (when given) the per-batch seed
    and whether adversarial examples are saved (the ``saved_*`` columns)."""
    target = None
    if target_fn is not None and _targeted(attack):
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


def _targeted(attack: Attack) -> bool:
    return bool(getattr(attack, "targeted", False) or type(attack).always_targeted)


def _plain(v: Any) -> Any:
    """A JSON-able value: tensors to Python numbers or lists, NaN to None."""
    if isinstance(v, Tensor):
        v = v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, list | tuple):
        return [_plain(e) for e in v]
    return v


def detail_rows(details: AttackDetails | None, n: int, prefix: str = DETAIL_PREFIX) -> list[dict[str, Any]]:
    """The declared per-sample columns of an attack's typed details, one dict per sample.

    Column ``c`` of ``details.columns`` becomes ``prefix + c`` (``attack_iterations``,
    ``attack_map_ssim``, ...), so attack outputs never clash with the metric columns. Each column is copied
    to the host once (not one synchronisation per sample); values are those of ``details.row(i)``, with NaN
    stored as ``None`` (JSON).
    """
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    if details is None:
        return rows
    for c in details.columns:
        v = getattr(details, c)
        if isinstance(v, Tensor):
            v = v.detach().cpu()
        for i in range(n):
            vi = v[i] if isinstance(v, Tensor) and v.ndim >= 1 else v
            rows[i][prefix + c] = _plain(vi)
    return rows


# --- data: batches, shards, dictionary batches ------------------------------------------------------------------
_PAIR_ERROR = ("`data` must be an (x, y) tensor pair, an iterable of (x, y) batches, or an iterable of dictionary "
               "batches (MONAI: {{'{image}': ..., '{label}': ...}})")


def _is_meta_tensor(t: Any) -> bool:
    mt = sys.modules.get("monai.data.meta_tensor")  # not imported: nothing can be a MetaTensor
    return mt is not None and isinstance(t, mt.MetaTensor)


def _plain_tensor(t: Any) -> Any:
    """A MetaTensor as a plain tensor (its metadata would be carried through every attack step)."""
    return t.as_tensor() if _is_meta_tensor(t) else t


def _is_single_batch(data: Any, image_key: str) -> bool:
    return (isinstance(data, tuple | list) and len(data) == 2 and isinstance(data[0], Tensor)) or \
        (isinstance(data, Mapping) and image_key in data)


def _batch_size(batch: Any, image_key: str, label_key: str) -> int:
    if isinstance(batch, Mapping):
        if image_key not in batch:
            raise TypeError(f"a dictionary batch has no {image_key!r} (keys: {', '.join(map(repr, batch))}); "
                            "give `image_key`/`label_key` to name the input and label keys")
        x = batch[image_key]
    elif isinstance(batch, tuple | list) and len(batch) >= 2:
        x = batch[0]
    else:
        raise TypeError(_PAIR_ERROR.format(image=image_key, label=label_key))
    if not isinstance(x, Tensor) or x.ndim == 0:
        raise TypeError(f"the input of a batch must be an (N, C, *spatial) tensor, got {type(x).__name__}")
    return int(x.shape[0])


class _Source:
    """The batches of ``data`` this process attacks: ``(batch index, number of its first sample, batch)``.

    Not sharded: every batch, in order. Sharded (``shard`` given), batch ``b`` belongs to rank
    ``b % world_size``; sample numbers stay those of the whole data. A DataLoader with a deterministic
    sampler (or an object iterating one, held as ``.loader``) is rebuilt over this rank's batches only (no
    other rank's data is loaded); a list of batches is indexed; any other iterable is read in full and the
    other ranks' batches skipped.
    """

    def __init__(self, data: Any, shard: dist.Shard | None, image_key: str, label_key: str) -> None:
        self.data, self.shard, self.keys = data, shard, (image_key, label_key)
        self.total: int | None = None  # batches this process will see, when known
        self._plan: list[tuple[int, int]] | None = None  # (index, offset) of the own batches
        self._loader: Any = None
        owns = shard.owns if shard is not None else (lambda b: True)
        if _is_single_batch(data, image_key):
            self.total = int(owns(0))
            return
        loader = self._sharded_loader(data, shard)
        if loader is not None:
            self._loader = loader
            self.total = len(self._plan or [])
            return
        if shard is not None and isinstance(data, list | tuple):
            sizes = [_batch_size(b, *self.keys) for b in data]
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            self._plan = [(i, offsets[i]) for i in range(len(data)) if owns(i)]
            self.total = len(self._plan)
            return
        try:
            n = len(data)
        except TypeError:
            return
        self.total = sum(1 for b in range(n) if owns(b))

    def _sharded_loader(self, data: Any, shard: dist.Shard | None) -> Any:
        from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

        if shard is not None and not isinstance(data, DataLoader) and isinstance(getattr(data, "loader", None),
                                                                                  DataLoader):
            data = data.loader  # a wrapper that iterates its DataLoader (medadv.data.sources)
        if shard is None or not isinstance(data, DataLoader) or data.batch_sampler is None \
                or isinstance(data.dataset, IterableDataset):
            return None
        if isinstance(data.sampler, RandomSampler | DistributedSampler):
            raise ValueError("a sharded evaluate() needs a DataLoader in a fixed order (shuffle=False, no "
                             f"{type(data.sampler).__name__}): it splits the batches over the processes itself, "
                             "and a resumed run finds samples by their position")
        batches = [list(b) for b in data.batch_sampler]
        offsets = [0]
        for b in batches:
            offsets.append(offsets[-1] + len(b))
        mine = [i for i in range(len(batches)) if shard.owns(i)]
        self._plan = [(i, offsets[i]) for i in mine]
        kw: dict[str, Any] = {"num_workers": data.num_workers, "collate_fn": data.collate_fn,
                              "pin_memory": data.pin_memory, "timeout": data.timeout,
                              "worker_init_fn": data.worker_init_fn, "generator": data.generator,
                              "multiprocessing_context": data.multiprocessing_context}
        if data.num_workers > 0:
            kw.update(prefetch_factor=data.prefetch_factor, persistent_workers=data.persistent_workers)
        return DataLoader(data.dataset, batch_sampler=[batches[i] for i in mine], **kw)

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        owns = self.shard.owns if self.shard is not None else (lambda b: True)
        if _is_single_batch(self.data, self.keys[0]):
            if owns(0):
                yield 0, 0, self.data
            return
        if self._loader is not None:
            assert self._plan is not None
            for (b, offset), batch in zip(self._plan, self._loader, strict=True):
                yield b, offset, batch
            return
        if self._plan is not None:
            for b, offset in self._plan:
                yield b, offset, self.data[b]
            return
        offset = 0
        for b, batch in enumerate(self.data):
            n = _batch_size(batch, *self.keys)
            if owns(b):
                yield b, offset, batch
            offset += n


@dataclass
class _Batch:
    """One batch as evaluate() uses it: plain tensors, plus what a dictionary batch tells about its cases."""

    x: Tensor
    y: Tensor
    case_ids: list[str] | None = None  # from the batch's "case_id"
    affine: Tensor | None = None  # (N, 4, 4) float64 on the CPU, from the image MetaTensor
    meta: Mapping[str, Any] | None = None  # the image's (collated) metadata
    width_first: bool = False  # MONAI's layout (C, W, H) of 2-D images read by LoadImage's defaults (sources.width_first)
    paths: dict[str, list[str]] | None = None  # row column -> the files of each case (sources.PATH_KEYS)

    def spacing(self) -> list[list[float]] | None:
        """Per-case voxel spacing (mm per spatial axis): the column norms of each affine's spatial block."""
        if self.affine is None:
            return None
        d = self.x.ndim - 2
        block = self.affine[:, :d, :d]
        return block.norm(dim=1).tolist()

    def extras(self) -> list[bytes] | None:
        """What the sample hash adds for a dictionary batch: the case identifier and the affine."""
        if self.case_ids is None and self.affine is None:
            return None
        out = []
        for i in range(self.x.shape[0]):
            cid = self.case_ids[i].encode() if self.case_ids is not None else b""
            aff = self.affine[i].numpy().tobytes() if self.affine is not None else b""
            out.append(cid + b"\0" + aff)
        return out


def _case_ids(value: Any, n: int) -> list[str]:
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, Tensor):
        value = value.reshape(-1).tolist()
    if not isinstance(value, list | tuple) or len(value) != n:
        raise ValueError(f"`case_id` of a batch must hold one identifier per sample ({n}), got {value!r}")
    return [str(v) for v in value]


def _affines(x: Any, n: int) -> Tensor | None:
    meta = getattr(x, "meta", None) if _is_meta_tensor(x) else None
    aff = meta.get("affine") if isinstance(meta, Mapping) else None
    if not isinstance(aff, Tensor) or aff.shape[-2:] != (4, 4):
        return None
    aff = aff.detach().to("cpu", torch.float64)
    if aff.ndim == 2:
        aff = aff.expand(n, 4, 4)
    return aff.contiguous() if aff.shape[0] == n else None


def _labels(task: Task, x: Tensor, y: Any) -> Any:
    """Labels as the task reads them (:meth:`Task.parse_labels`: a MONAI label map ``(N, 1, *spatial)`` becomes
    ``(N, *spatial)`` class indices, class-index columns ``(N, 1)`` become ``(N,)``); lists of numbers a tensor."""
    if isinstance(y, list | tuple) and y and all(isinstance(v, int | float | bool) for v in y):
        y = torch.as_tensor(y)
    y = _plain_tensor(y)
    if not isinstance(y, Tensor):
        return y
    return task.parse_labels(y, x)


def _parse(batch: Any, task: Task, image_key: str, label_key: str) -> _Batch:
    from .data.sources import PATH_KEYS, width_first

    if isinstance(batch, Mapping):
        _batch_size(batch, image_key, label_key)  # the input key exists
        if label_key not in batch:
            raise TypeError(f"a dictionary batch has no label {label_key!r} (keys: {', '.join(map(repr, batch))}); "
                            "give `label_key` to name it")
        raw_x = batch[image_key]
        n = int(raw_x.shape[0])
        x = _plain_tensor(raw_x)
        ids = _case_ids(batch["case_id"], n) if batch.get("case_id") is not None else None
        meta = raw_x.meta if _is_meta_tensor(raw_x) else None
        paths = {col: _case_ids(batch[k], n) for k, col in PATH_KEYS.items() if batch.get(k) is not None}
        return _Batch(x, _labels(task, x, batch[label_key]), ids, _affines(raw_x, n), meta, width_first(meta),
                      paths or None)
    if not (isinstance(batch, tuple | list) and len(batch) >= 2):
        raise TypeError(_PAIR_ERROR.format(image=image_key, label=label_key))
    raw_x = batch[0]
    x = _plain_tensor(raw_x)
    if not isinstance(x, Tensor):
        raise TypeError(_PAIR_ERROR.format(image=image_key, label=label_key))
    meta = raw_x.meta if _is_meta_tensor(raw_x) else None
    return _Batch(x, _labels(task, x, batch[1]), None, _affines(raw_x, x.shape[0]), meta, width_first(meta))


# --- per-batch randomness -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _seeded(seed: int | None, key: str, device: torch.device) -> Iterator[None]:
    """With a ``seed``, run the block on torch's global RNG seeded from ``(seed, key)`` inside a fork (the
    caller's RNG state is restored after): each (batch, attack) then draws the same random numbers whichever
    batches ran before it, in this process or another."""
    if seed is None:
        yield
        return
    value = int(hashlib.sha256(f"{int(seed)}:{key}".encode()).hexdigest()[:15], 16)
    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    with torch.random.fork_rng(devices=[index] if index is not None else []):
        torch.default_generator.manual_seed(value)
        if index is not None:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(value)
        yield


# --- per-sample metric columns --------------------------------------------------------------------------------------
def _to_host(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Every tensor on the host with one wait: accelerator tensors are copied without blocking, then the device's
    stream is synchronised once (not one synchronisation per tensor, sample or column)."""
    cuda = [t.device for t in tensors.values() if t.device.type == "cuda"]
    out = {k: t.detach().to("cpu", non_blocking=bool(cuda)) for k, t in tensors.items()}
    for d in set(cuda):
        torch.cuda.current_stream(d).synchronize()
    return out


def _plain_list(t: Tensor) -> list:
    """A host tensor with leading dim N as N plain values: bools, ints, or floats with NaN as ``None`` (JSON)."""
    n = t.shape[0]
    if t.ndim > 2:
        t = t.reshape(n, -1)
    if t.dtype == torch.bool or not t.is_floating_point():
        return t.tolist()
    values = t.double().tolist()
    if t.ndim == 1:
        return [None if v != v else v for v in values]
    return [[None if v != v else v for v in row] for row in values]


def _rows_from_columns(columns: Mapping[str, Tensor], n: int) -> list[dict[str, Any]]:
    """Result rows from per-sample column tensors (any device): one host copy for the whole batch."""
    host = _to_host(columns)
    values = {k: _plain_list(t.expand(n) if t.ndim == 0 else t) for k, t in host.items()}
    return [{k: v[i] for k, v in values.items()} for i in range(n)]


def _check_spacing(spacing: Any) -> None:
    """``evaluate``'s ``spacing``: a number or one number per spatial axis (mm), finite and > 0; ValueError naming it."""
    import numpy as np

    try:
        arr = np.asarray(spacing.detach().cpu() if isinstance(spacing, Tensor) else spacing, dtype=np.float64)
    except (TypeError, ValueError):
        arr = np.asarray([np.nan])
    if arr.ndim > 1 or arr.size == 0 or not (np.isfinite(arr).all() and (arr > 0).all()):
        raise ValueError(f"`spacing` must be a number or one number per spatial axis (voxel size in mm), finite and "
                         f"> 0, got {spacing!r}")


def _surface_columns(task: Task, y: Tensor, pred: Tensor, spacing: Any) -> Tensor:
    """Per-class HD95 ``(N, C)`` of one prediction (segmentation): on the prediction's device, NaN where a class is
    absent from the label or the prediction."""
    from .metrics.segmentation import hd95_per_class

    num_classes = getattr(task, "num_classes", None)
    if num_classes is None:
        raise ValueError(f"`hd95` needs a segmentation task (label maps and a number of classes), got {task!r}")
    return hd95_per_class(pred, y, num_classes, spacing, mask=task.valid_mask(y))


def _clean_outcome(model: nn.Module, task: Task, x: Tensor, y: Tensor, logits: Tensor | None, hd95: bool,
                   spacing: Any) -> tuple[Tensor, Outcome, Tensor | None]:
    """The clean output of a batch (``logits`` when an attack computed it already: the attack checked ``y``
    against it; else one forward pass, checked against ``y`` here), its :class:`Outcome` and, with ``hd95``, its
    per-class HD95."""
    if logits is None:
        with attack_mode(model), torch.no_grad():
            logits = forward_tensor(model, x)  # clear errors: list outputs, no batch dim
        task.validate(logits, y, "y")
    clean = task.outcome(logits, y)
    return logits, clean, (_surface_columns(task, y, clean.pred, spacing) if hd95 else None)


def _batch_columns(task: Task, y: Tensor, clean: Outcome, adv: Outcome, *, hd95: bool, spacing: Any,
                   clean_hd95: Tensor | None = None) -> dict[str, Tensor]:
    cols = task.sample_columns(y, clean, adv)
    volumes = getattr(task, "volume_columns", None)  # declared by segmentation: per-class volumes (ml) with a spacing
    if spacing is not None and callable(volumes):
        cols.update(volumes(y, clean, adv, spacing))
    if hd95:
        cols["clean_hd95"] = clean_hd95 if clean_hd95 is not None else _surface_columns(task, y, clean.pred, spacing)
        cols["adv_hd95"] = _surface_columns(task, y, adv.pred, spacing)
    return cols


def sample_rows(
    task: Task,
    y: Tensor,
    clean_logits: Tensor,
    adv_logits: Tensor,
    *,
    spacing: float | Sequence[float] | Sequence[Sequence[float]] | None = None,
    hd95: bool = False,
) -> list[dict[str, Any]]:
    """Per-sample metric columns (clean and adversarial) for one batch.

    Every task gets ``changed`` (the adversarial prediction differs from the clean one) and ``flipped``
    (the task's untargeted "wrong" test against ``y`` is false on the clean output and true on the
    adversarial one: right before the attack, wrong after), then its own ``clean_*``/``adv_*`` metrics
    (:meth:`Task.outcome`, :meth:`Task.sample_columns`). Everything is computed for the whole batch on the
    device of the logits, then copied to the host once.
    ``spacing``: one spacing for the batch, or one per sample (HD95 in the units of the spacing; with a 3-D
    segmentation, also the per-class volume columns in ml, the spacing in mm: :meth:`Segmentation.volume_columns`).
    """
    clean, adv = task.outcome(clean_logits.detach(), y), task.outcome(adv_logits.detach(), y)
    return _rows_from_columns(_batch_columns(task, y, clean, adv, hd95=hd95, spacing=spacing), y.shape[0])


# --- saved adversarial examples ---------------------------------------------------------------------------------------
def _attack_folders(named: list[tuple[str, Attack]]) -> dict[tuple[str, Any], str]:
    """The sub-folder of each (name, budget): the attack's name, with the budget when a name repeats."""
    from .data.save import safe_name

    counts: dict[str, int] = {}
    for name, _ in named:
        counts[name] = counts.get(name, 0) + 1
    out = {}
    for name, atk in named:
        label = name if counts[name] == 1 else f"{name}@{atk.budget:.6g}" if atk.budget is not None else name
        out[(name, atk.budget)] = safe_name(label)
    return out


def _saved_columns(model: nn.Module, task: Task, atk: Attack, folder: Path, sub: str, ids: list[int],
                   batch: _Batch, x_d: Tensor, clean_logits: Tensor, y_d: Tensor, res: Any) -> list[dict[str, Any]]:
    """Write each adversarial example, read it back, re-predict it: the ``saved_*`` columns of the batch."""
    from .data.save import case_stem, dicom_source, load_example, original_dtype, save_example

    n = x_d.shape[0]
    x_adv = res.x_adv.detach()
    paths, loaded = [], []
    for i in range(n):
        name = f"{ids[i]:04d}" + (f"_{case_stem(batch.case_ids[i])}" if batch.case_ids is not None else "")
        aff = batch.affine[i] if batch.affine is not None else None
        path = save_example(x_adv[i], folder / sub / name, box=atk.box, affine=aff,
                            dtype=original_dtype(batch.meta, i), width_first=batch.width_first,
                            source=dicom_source(batch.meta, i), root=folder)
        paths.append(path.relative_to(folder).as_posix())
        loaded.append(load_example(path, box=atk.box, like=x_adv[i], width_first=batch.width_first, affine=aff))
    x_q = torch.stack(loaded)
    with attack_mode(model), torch.no_grad():
        logits_q = forward_tensor(model, x_q)
    fooled = atk.task.fooled(logits_q, res.y, atk.targeted)
    still = fooled & res.fooled.to(fooled.device)
    changed = task.changed(task.predict(clean_logits), task.predict(logits_q), y_d)
    linf = (x_q - x_d).reshape(n, -1).abs().amax(dim=1)
    metric_col, metric = None, None
    try:
        metric = task.robust_metric(logits_q, y_d)
        metric_col = "saved_adv_" + (task.robust_metric_column or task.robust_metric_name)
    except NotImplementedError:
        pass
    as_bool = task.robust_metric_binary
    f_, s_, c_, l_ = (t.cpu().tolist() for t in (fooled, still, changed, linf))
    m_ = metric.cpu().tolist() if metric is not None else None
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"saved_file": paths[i], "saved_fooled": bool(f_[i]), "saved_still_fooled": bool(s_[i]),
                               "saved_changed": bool(c_[i]), "saved_linf": float(l_[i])}
        if metric_col is not None and m_ is not None:
            row[metric_col] = bool(m_[i] == 1) if as_bool else _plain(float(m_[i]))
        rows.append(row)
    return rows


# --- host work beside the device work ---------------------------------------------------------------------------------
class _Background:
    """One worker thread for host-side work that the device need not wait for (hashing, appending to the log).

    Jobs run in submission order, so log lines keep their order. Disabled (CPU models) every job runs at once in
    the calling thread. A failed job raises where its result is read, at the latest in :meth:`drain`.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._pool: Any = None
        self._jobs: list[Future] = []
        if enabled:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="medadv-evaluate")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._pool is None:
            return self.done(fn(*args))
        job = self._pool.submit(fn, *args)
        self._jobs = [j for j in self._jobs if not j.done() or j.exception() is not None] + [job]
        return job

    @staticmethod
    def done(value: Any) -> Future:
        f: Future = Future()
        f.set_result(value)
        return f

    def drain(self) -> None:
        for job in self._jobs:
            job.result()
        self._jobs = []

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _prefetched(source: _Source, task: Task, image_key: str, label_key: str, device: torch.device,
                enabled: bool) -> Iterator[tuple[int, int, _Batch]]:
    """The parsed batches of ``source``; with ``enabled`` (an accelerator) the next batch is loaded, parsed and put
    in pinned memory by a thread while the current one is attacked, so its copy to the device does not block."""
    if not enabled:
        for b, offset, raw in source:
            yield b, offset, _parse(raw, task, image_key, label_key)
        return
    import queue
    import threading

    slots: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def load() -> None:
        try:
            for b, offset, raw in source:
                batch = _parse(raw, task, image_key, label_key)
                if batch.x.device.type == "cpu":
                    batch.x = batch.x.pin_memory()
                if isinstance(batch.y, Tensor) and batch.y.device.type == "cpu":
                    batch.y = batch.y.pin_memory()
                while not stop.is_set():
                    try:
                        slots.put((b, offset, batch), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put(end)
        except BaseException as err:  # raised again in the consuming thread
            slots.put(err)

    worker = threading.Thread(target=load, name="medadv-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = slots.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join(timeout=5)


def _norm_name(attack: Attack) -> str | None:
    """The attack's threat class name (``"Linf"``, ``"L2"``), None for an attack on the data box only."""
    threat = getattr(attack, "threat", None)
    return None if threat is None else type(threat).__name__


def evaluate(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: Attack | Sequence[Attack] | Mapping[str, Attack],
    *,
    log: str | os.PathLike | None = None,
    target_fn: TargetFns | None = None,
    hd95: bool = False,
    spacing: float | Sequence[float] | None = None,
    progress: bool = False,
    meta: dict[str, Any] | None = None,
    image_key: str = "image",
    label_key: str = "label",
    save_adversarial: str | os.PathLike | None = None,
    seed: int | None = None,
    distributed: bool | None = None,
) -> Results:
    """Attack every batch of ``data`` with every attack and tabulate clean vs adversarial metrics.

    Args:
        model: the model under test (its mode and parameters are left as they were).
        task: how to read its output. A task declared with ``outputs="probabilities"`` reads a model ending in a
            softmax or sigmoid through :meth:`~medadv.tasks.Task.logits_model`; a task that does not declare its
            ``outputs`` refuses such a model on the first batch (:meth:`~medadv.tasks.Task.check_outputs`).
        data: an ``(x, y)`` tensor pair, an iterable of ``(x, y)`` batches (e.g. a DataLoader), or an
            iterable of dictionary batches as MONAI's DataLoader collates them: ``batch[image_key]`` the
            input ``(N, C, *spatial)`` (a MetaTensor: its affine gives each case's voxel spacing and the
            geometry of saved files), ``batch[label_key]`` the labels (class indices ``(N,)``, float
            multi-hot ``(N, L)``, or a label map ``(N, *spatial)``; ``(N, 1, *spatial)`` float maps as
            ``LoadImaged`` reads them are accepted), ``batch["case_id"]`` (optional) one identifier per
            sample. Samples are numbered in iteration order, so a resumed run must see the same order.
        attacks: one attack, a list (named by ``attack.name``) or a ``{name: attack}`` mapping; the
            budget column is each attack's ``budget`` (its ε in data units, None for attacks without an
            ε-ball, which run once).
        log: JSON Lines file to which rows are appended batch by batch. Rows already in it are kept
            and their (sample, attack, budget) is not recomputed: a crashed run resumes where it stopped.
            A row counts only if its ``data`` hash (the sample's input and label bytes, with a dictionary
            batch's case identifier and affine) and its ``config`` fingerprint match this call: the
            model's weights, the task, ``attack.fingerprint()`` (every declared parameter of the attack, its
            task and its threat or data box), ``hd95``, ``spacing``, for targeted attacks the target
            function's name, and ``seed`` and ``save_adversarial`` when given. Rows of other settings or of
            attacks not requested are ignored. The per-rank logs of a distributed run
            (``log.rank{r}.jsonl`` beside it) are read too, whatever the number of processes that wrote them.
        target_fn: for targeted attacks (``targeted=True`` or targeted by nature, like DAG),
            ``target_fn(x, y, clean_logits) -> target``, or ``{attack name: target_fn}`` (attacks with targets of
            their own); required for every targeted attack.
        hd95: also compute per-class HD95 for segmentation (MONAI's definition, batched on the model's device by
            :func:`medadv.metrics.surface.surface_distance_per_class`; the clean HD95 once per batch). A task
            without label maps and classes is refused before any work.
        spacing: voxel spacing for HD95 and volumes (mm), scalar or per axis. ``None``: each case's spacing from
            its image's affine (MONAI MetaTensor inputs; the column norms of its spatial block), else voxels for
            HD95 and no volume columns. With a spacing, a 3-D segmentation's rows carry per-class volumes in ml
            (``ref_volume_ml``, ``clean_volume_ml``, ``adv_volume_ml``, ``volume_change_ml``,
            ``volume_change_pct``: :meth:`~medadv.tasks.Segmentation.volume_columns`).
        progress: show a progress bar (attack-batches, with a total and an ETA when ``len(data)`` is known;
            on rank 0 only in a distributed run).
        meta: free-form metadata stored with the results (model name, dataset, ...). ``meta["classes"]`` (the
            report's class names, as the CLI passes a config's ``task.class_names``) must name every output, one
            per class or label in output order (:meth:`~medadv.tasks.Task.check_names`): a list of another length
            is refused on the first batch, before any attack.
        image_key, label_key: the input and label keys of dictionary batches.
        save_adversarial: a folder to write every adversarial example to (``None``: nothing written), one
            sub-folder per attack, files named ``{sample:04d}_{case}``: NIfTI with the input's affine for
            3-D data, PNG (8- or 16-bit over the data box) for 2-D data of 1 or 3 channels, ``.npy``
            otherwise; integer NIfTI keeps the dtype of the file the input came from
            (:mod:`medadv.data.save`). Each file is read back and re-predicted: see the ``saved_*`` columns.
        seed: run each (batch, attack) on torch's global RNG seeded from ``(seed, batch index, attack,
            budget)`` inside a fork (the caller's RNG state is left as it was), so the random numbers of
            attacks without their own ``seed`` do not depend on which batches ran before: results are then
            the same in a resumed run and in any number of processes. ``None``: the global RNG as it is.
        distributed: shard the batches over the processes of ``torch.distributed``: ``None`` (default)
            when a process group of more than one process is initialised, ``True`` to require one, ``False``
            to run every batch here. Rank ``r`` of ``W`` attacks batches ``r, r + W, ...`` (no sample twice,
            no padding), logs them to ``log.rank{r}.jsonl``, and every rank returns the merged table, equal
            row for row to a 1-process run when ``seed`` is given (:mod:`medadv.distributed`).

    Returns:
        :class:`Results` with one row per (sample, attack, budget), sorted by attack then sample. Columns:

        * ``sample`` (number in iteration order), ``case_id`` (the batch's ``case_id``, else ``str(sample)``),
          ``image_path`` and ``label_path`` (the files a case came from, when the batch names them as the file
          sources do: ``path_image``, ``path_label``, :data:`medadv.data.sources.PATH_KEYS`),
          ``attack``, ``budget``, ``config`` (settings fingerprint), ``data`` (sample hash);
        * ``fooled``: the attack's own success test on its output (untargeted: the task's "wrong" test
          against the label, so a sample already wrong before the attack counts; targeted: target reached);
          ``changed``: the prediction differs from the clean prediction; ``flipped``: right before the
          attack and wrong after (untargeted test against the true label) — the damage the attack did;
        * ``linf``/``l2``: the perturbation's size in data units;
        * the task's ``clean_*``/``adv_*`` metrics (``clean_correct``/``adv_correct``,
          ``*_exact_match``, ``*_mean_dice``, ``*_hd95`` ...);
        * with ``save_adversarial``: ``saved_file`` (relative to the folder), ``saved_fooled`` (the
          attack's test on the re-loaded file), ``saved_still_fooled`` (fooled before and after saving: the
          attack survives the file's quantisation), ``saved_changed``, ``saved_linf`` (the perturbation as
          stored) and ``saved_adv_<metric>`` (the robust metric of the re-loaded file);
        * the attack's declared per-sample outputs (``AttackResult.details.columns``) as
          ``attack_<column>`` (e.g. DAG's ``attack_iterations``, the saliency attacks' ``attack_map_ssim``);
          :meth:`Results.summary` averages them per attack and budget.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(task, Task):
        raise TypeError(f"`task` must be a medadv Task, got {task!r}")
    named = _named_attacks(attacks)
    if spacing is not None:  # HD95 and the volumes read it after the attack: a bad one is refused before any work
        _check_spacing(spacing)
    if hd95 and not isinstance(getattr(task, "num_classes", None), int):
        raise ValueError(f"`hd95=True` needs a segmentation task (label maps with `num_classes`), got {task!r}; "
                         "HD95 is a distance between label maps and does not apply to classifiers")
    if any(_targeted(a) and target_for(target_fn, n) is None for n, a in named):
        which = ", ".join(repr(n) for n, a in named if _targeted(a) and target_for(target_fn, n) is None)
        raise ValueError(f"`target_fn` is required because attack(s) {which} are targeted: give "
                         "target_fn(x, y, clean_logits) -> target")
    shard = dist.current_shard(distributed)
    if shard is not None and seed is None and any(getattr(a, "seed", None) is None for _, a in named):
        warnings.warn("a sharded evaluate() without `seed`: attacks without their own seed draw from each "
                      "process's global RNG, so rows may differ from a 1-process run; pass seed=...",
                      RuntimeWarning, stacklevel=2)
    save_dir = Path(save_adversarial) if save_adversarial is not None else None
    weights = _weights_hash(model)  # of the user's model (the task's `outputs` is in the fingerprint)
    # a model declared to return probabilities is read as logits by everything below (clean outputs, attacks, saved
    # files); probabilities from a task that does not declare them are refused on the first forward (task.validate)
    model = task.logits_model(model)
    names = (meta or {}).get("classes")
    configs = {name: _fingerprint(weights, task, atk, hd95, spacing, target_for(target_fn, name), seed=seed,
                                  save=save_dir is not None)
               for name, atk in named}
    # rows of a resumed log (and of every rank's log) count only if they came from the same settings
    done = [r for p in (dist.log_files(log) if log is not None else []) for r in Results.read_log(p).rows
            if r.get("config") == configs.get(r["attack"])]
    own_log = dist.rank_log(log, shard.rank) if log is not None and shard is not None else log
    if shard is not None:
        dist.barrier()  # every rank has read the logs before any appends to its own
    # rows of the log by sample; a row is reused only once its sample's data is known to be the same
    logged: dict[int, list[dict[str, Any]]] = {}
    for r in done:
        logged.setdefault(r["sample"], []).append(r)
    done_keys: set[tuple[Any, ...]] = set()
    # each attack's norm ("Linf", "L2"; None: a data box, not an Lp ball): the report checks rows against it
    # attacks that do not search for the worst case of the task's metric (noise, a volume objective): the
    # monotonicity check of the masking flags leaves them out
    off_metric = [n for n, a in named if not getattr(a, "optimises_task_metric", True)]
    results = Results([], meta={"task": repr(task), "norms": {n: _norm_name(a) for n, a in named},
                                **({"off_metric": off_metric} if off_metric else {}), **(meta or {})})
    device = model_device(model)
    folders = _attack_folders(named) if save_dir is not None else {}
    source = _Source(data, shard, image_key, label_key)

    bar = None
    if progress and (shard is None or shard.rank == 0):
        from tqdm.auto import tqdm

        total = source.total * len(named) if source.total is not None else None
        where = f" (rank 0 of {shard.world_size})" if shard is not None else ""
        bar = tqdm(desc="evaluate" + where, total=total, unit="attack-batch")
    modes = [(m, m.training) for m in model.modules()]
    # on an accelerator the host work (loading the next batch, hashing, writing the log) runs beside the device
    # work; on the CPU it would only compete with the attack for the same cores
    background = _Background(device.type == "cuda")
    try:
        for b, offset, batch in _prefetched(source, task, image_key, label_key, device, background.enabled):
            x, y = batch.x, batch.y
            ids = list(range(offset, offset + x.shape[0]))
            if not isinstance(y, Tensor) or y.ndim == 0 or y.shape[0] != x.shape[0]:
                raise ValueError(f"`y` of a batch must be a tensor with one label per sample ({x.shape[0]}), got "
                                 + (f"shape {tuple(y.shape)}" if isinstance(y, Tensor) else type(y).__name__))
            cases = batch.case_ids if batch.case_ids is not None else [str(i) for i in ids]
            mine = [r for sid in ids for r in logged.pop(sid, ())]
            if mine:  # logged rows of the same data count as done; others are redone
                hashes = _sample_hashes(x, y, batch.extras())
                for r in mine:
                    i = r["sample"] - offset
                    key = (r["sample"], r["attack"], r["budget"])
                    if r.get("data") == hashes[i] and key not in done_keys:
                        results.rows.append(r)
                        done_keys.add(key)
                hashed = background.done(hashes)
            else:  # needed only when the rows are written: computed beside the attack
                hashed = background.submit(_sample_hashes, x, y, batch.extras())
            todo = [(n, a) for n, a in named if any((i, n, a.budget) not in done_keys for i in ids)]
            if bar is not None and bar.total is not None and len(todo) < len(named):
                bar.total -= len(named) - len(todo)  # resumed work: the ETA counts only what is left
                bar.refresh()
            if not todo:
                continue
            try:
                check_input(x)
            except ValueError:
                if isinstance(x, Tensor) and x.ndim >= 1 and x.is_floating_point() and not all_finite(x):
                    bad = [cases[i] if batch.case_ids is not None else f"sample {ids[i]}"
                           for i in range(x.shape[0]) if not all_finite(x[i])]
                    raise ValueError(f"`x` contains NaN or Inf values in case {', '.join(bad[:5])}"
                                     + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
                                     + " (check the file and the `transforms`)") from None
                raise
            x_d = x.to(device, non_blocking=True)
            y_d = y.to(device, non_blocking=True)
            # the voxel spacing (mm) of HD95 and of the volume columns: the argument, else each case's header
            batch_spacing = spacing if spacing is not None else batch.spacing()
            if spacing is not None and (hd95 or callable(getattr(task, "volume_columns", None))):
                from .metrics.surface import _spacing_table

                _spacing_table(spacing, x.shape[0], x.ndim - 2)  # one value per spatial axis: checked before the attacks
            # The clean output is computed once per batch and shared by every attack. Untargeted, the first
            # attack may compute it on its way (its first step at x) and hand it back: no separate forward pass,
            # and y is checked against it by the attack before any step. Targets need it before the attack.
            clean_logits: Tensor | None = None
            clean: Outcome | None = None
            if any(_targeted(a) for _, a in todo) or names is not None:
                clean_logits, clean, clean_hd95 = _clean_outcome(model, task, x_d, y_d, None, hd95, batch_spacing)
                if names is not None:  # the report's class names must name every output: refused before any attack
                    task.check_names(names, clean_logits, "class_names")
                    names = None
            for name, atk in todo:
                with _seeded(seed, f"{b}:{name}:{atk.budget}", device):
                    target = y_d
                    fn = target_for(target_fn, name)
                    if fn is not None and _targeted(atk):
                        assert clean_logits is not None
                        target = fn(x_d, y_d, clean_logits)
                    res = atk(model, x_d, target, clean_logits=clean_logits)
                if clean is None:
                    clean_logits, clean, clean_hd95 = _clean_outcome(model, task, x_d, y_d, res.clean_logits, hd95,
                                                                     batch_spacing)
                assert clean_logits is not None
                adv = task.outcome(res.logits, y_d, pred=res.pred)
                columns = {"fooled": res.fooled, "linf": res.linf, "l2": res.l2,
                           **_batch_columns(task, y_d, clean, adv, hd95=hd95, spacing=batch_spacing,
                                            clean_hd95=clean_hd95)}
                rows = _rows_from_columns(columns, len(ids))
                extra = detail_rows(res.details, len(rows))
                saved = (_saved_columns(model, task, atk, save_dir, folders[(name, atk.budget)], ids, batch, x_d,
                                        clean_logits, y_d, res)
                         if save_dir is not None else [{} for _ in rows])
                hashes = hashed.result()
                new = []
                for i, row in enumerate(rows):
                    key = (ids[i], name, atk.budget)
                    if key in done_keys:
                        continue
                    files = {k: v[i] for k, v in batch.paths.items()} if batch.paths else {}  # which image, label
                    new.append({"sample": ids[i], "case_id": cases[i], **files, "attack": name, "budget": atk.budget,
                                "config": configs[name], "data": hashes[i], "fooled": row.pop("fooled"),
                                "changed": row.pop("changed"), "flipped": row.pop("flipped"),
                                "linf": row.pop("linf"), "l2": row.pop("l2"), **row, **saved[i], **extra[i]})
                    done_keys.add(key)
                results.extend(new)
                if own_log is not None:
                    background.submit(Results.append_log, own_log, new)
                if bar is not None:
                    bar.update(1)
                    changed = sum(r["changed"] for r in new) / max(len(new), 1)
                    bar.set_postfix(attack=name, fooled=f"{sum(r['fooled'] for r in new) / max(len(new), 1):.2f}",
                                    changed=f"{changed:.2f}")
        background.drain()  # every row is in the log before the results are returned
    finally:
        background.close()
        for m, training in modes:
            m.training = training
        if bar is not None:
            bar.close()
    if shard is not None:  # every rank gets every row (rank 0 writes the outputs)
        results.rows = [r for part in dist.all_gather_objects(results.rows) for r in part]
    order = {name: i for i, (name, _) in enumerate(named)}
    results.rows.sort(key=lambda r: (order.get(r["attack"], len(order)), str(r["attack"]), r["sample"]))
    return results
