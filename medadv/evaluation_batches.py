"""The batches :func:`~medadv.evaluate` attacks: where they come from, how they are read, and loading ahead.

:class:`Source` yields this process's batches of the data (all of them, or one rank's shard), :func:`parse_batch`
reads a ``(x, y)`` pair or a MONAI dictionary batch into a :class:`Batch` (plain tensors, labels as the task reads
them, case identifiers, affines, file paths), and :func:`prefetched` loads the next batch beside the device work.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import distributed as dist
from .tasks import Task

__all__ = ["Source", "Batch", "parse_batch", "prefetched", "batch_size", "is_single_batch"]

_PAIR_ERROR = ("`data` must be an (x, y) tensor pair, an iterable of (x, y) batches, or an iterable of dictionary "
               "batches (MONAI: {{'{image}': ..., '{label}': ...}})")


def _is_meta_tensor(t: Any) -> bool:
    mt = sys.modules.get("monai.data.meta_tensor")  # not imported: nothing can be a MetaTensor
    return mt is not None and isinstance(t, mt.MetaTensor)


def _plain_tensor(t: Any) -> Any:
    """A MetaTensor as a plain tensor (its metadata would be carried through every attack step)."""
    return t.as_tensor() if _is_meta_tensor(t) else t


def is_single_batch(data: Any, image_key: str) -> bool:
    """Whether ``data`` is one batch (an ``(x, y)`` tensor pair or a dictionary batch), not an iterable of them."""
    return (isinstance(data, tuple | list) and len(data) == 2 and isinstance(data[0], Tensor)) or \
        (isinstance(data, Mapping) and image_key in data)


def batch_size(batch: Any, image_key: str, label_key: str) -> int:
    """The number of samples of one batch (its input's first dimension); TypeError naming what is wrong."""
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


class Source:
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
        if is_single_batch(data, image_key):
            self.total = int(owns(0))
            return
        loader = self._sharded_loader(data, shard)
        if loader is not None:
            self._loader = loader
            self.total = len(self._plan or [])
            return
        if shard is not None and isinstance(data, list | tuple):
            sizes = [batch_size(b, *self.keys) for b in data]
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
        if is_single_batch(self.data, self.keys[0]):
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
            n = batch_size(batch, *self.keys)
            if owns(b):
                yield b, offset, batch
            offset += n


@dataclass
class Batch:
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


def parse_batch(batch: Any, task: Task, image_key: str, label_key: str) -> Batch:
    """One raw batch (``(x, y)`` or a dictionary batch) as a :class:`Batch`: plain tensors (a MetaTensor's
    metadata kept aside), labels as ``task`` reads them, case identifiers, affines and file paths."""
    from .data.sources import PATH_KEYS, width_first

    if isinstance(batch, Mapping):
        batch_size(batch, image_key, label_key)  # the input key exists
        if label_key not in batch:
            raise TypeError(f"a dictionary batch has no label {label_key!r} (keys: {', '.join(map(repr, batch))}); "
                            "give `label_key` to name it")
        raw_x = batch[image_key]
        n = int(raw_x.shape[0])
        x = _plain_tensor(raw_x)
        ids = _case_ids(batch["case_id"], n) if batch.get("case_id") is not None else None
        meta = raw_x.meta if _is_meta_tensor(raw_x) else None
        paths = {col: _case_ids(batch[k], n) for k, col in PATH_KEYS.items() if batch.get(k) is not None}
        return Batch(x, _labels(task, x, batch[label_key]), ids, _affines(raw_x, n), meta, width_first(meta),
                      paths or None)
    if not (isinstance(batch, tuple | list) and len(batch) >= 2):
        raise TypeError(_PAIR_ERROR.format(image=image_key, label=label_key))
    raw_x = batch[0]
    x = _plain_tensor(raw_x)
    if not isinstance(x, Tensor):
        raise TypeError(_PAIR_ERROR.format(image=image_key, label=label_key))
    meta = raw_x.meta if _is_meta_tensor(raw_x) else None
    return Batch(x, _labels(task, x, batch[1]), None, _affines(raw_x, x.shape[0]), meta, width_first(meta))


def prefetched(source: Source, task: Task, image_key: str, label_key: str, device: torch.device,
               enabled: bool) -> Iterator[tuple[int, int, Batch]]:
    """The parsed batches of ``source``; with ``enabled`` (an accelerator) the next batch is loaded, parsed and put
    in pinned memory by a thread while the current one is attacked, so its copy to the device does not block."""
    if not enabled:
        for b, offset, raw in source:
            yield b, offset, parse_batch(raw, task, image_key, label_key)
        return
    import queue
    import threading

    slots: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def load() -> None:
        try:
            for b, offset, raw in source:
                batch = parse_batch(raw, task, image_key, label_key)
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

