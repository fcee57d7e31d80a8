"""torch.distributed helpers: run ``evaluate`` on several processes (``torchrun``), one shard of batches each.

:func:`medadv.evaluation.evaluate` shards by *batch*: with ``W`` processes, rank ``r`` attacks the batches
``r, r + W, r + 2W, ...`` of the data (no sample twice, no padding), appends its rows to its own log
``log.rank{r}.jsonl`` beside the ``log`` given, and the ranks then gather every row, so each returns the
whole table, equal row for row and value for value to a 1-process run (with ``evaluate(..., seed=...)``
the random numbers of each batch and attack do not depend on which process ran it). A resumed run reads
the rows of every rank's log, so it may use another number of processes.

Launch::

    torchrun --nproc_per_node 4 -m medadv evaluate config.yaml          # one machine, 4 processes
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:29400 -m medadv evaluate config.yaml   # two machines (run on each)

In Python::

    from medadv import distributed
    distributed.init_from_env()      # reads torchrun's RANK / WORLD_SIZE / MASTER_ADDR ...; no-op alone
    model.to(distributed.device())   # cuda:LOCAL_RANK with NCCL, else the CPU (gloo)
    res = evaluate(model, task, loader, attacks, log="out/log.jsonl", seed=0)  # sharded automatically
    if distributed.is_main():
        res.to_json("out/results.json")
    distributed.destroy()
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import torch

__all__ = ["Shard", "init_from_env", "is_initialized", "rank", "world_size", "local_rank", "is_main", "device",
           "barrier", "destroy", "all_gather_objects", "current_shard", "rank_log", "log_files"]

_OWNED = False  # the process group was created by init_from_env (destroy() only tears down what it made)


class Shard(NamedTuple):
    """This process's place in a sharded evaluation: batch ``b`` is its own when ``b % world_size == rank``."""

    rank: int
    world_size: int

    def owns(self, batch_index: int) -> bool:
        return batch_index % self.world_size == self.rank


def is_initialized() -> bool:
    """A default process group exists (``torch.distributed.init_process_group`` was called)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    return torch.distributed.get_rank() if is_initialized() else 0


def world_size() -> int:
    """The number of processes (1 when not distributed)."""
    return torch.distributed.get_world_size() if is_initialized() else 1


def local_rank() -> int:
    """The rank on this machine (torchrun's ``LOCAL_RANK``; 0 when not set)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """True on the process that writes outputs (rank 0, or the only process)."""
    return rank() == 0


def device() -> torch.device:
    """Where this process's model should live: ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def init_from_env(backend: str | None = None, timeout_s: float | None = None) -> bool:
    """Join the process group described by torchrun's environment; True when running on several processes.

    Reads ``WORLD_SIZE``/``RANK`` (and ``MASTER_ADDR``/``MASTER_PORT``, ``LOCAL_RANK``) as ``torchrun`` sets
    them. Does nothing (returns False) when they are absent or ``WORLD_SIZE`` is 1, and returns True
    without re-initialising when a process group already exists. ``backend`` defaults to NCCL when CUDA
    is available (each process then uses ``cuda:LOCAL_RANK``) and gloo on CPUs.
    """
    global _OWNED
    if is_initialized():
        return world_size() > 1
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 or "RANK" not in os.environ:
        return False
    if not torch.distributed.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device())
    kwargs: dict[str, Any] = {}
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    torch.distributed.init_process_group(backend=backend, **kwargs)
    _OWNED = True
    return True


def barrier() -> None:
    """Wait for every process (no-op when not distributed)."""
    if is_initialized() and world_size() > 1:
        torch.distributed.barrier()


def destroy() -> None:
    """Leave the process group made by :func:`init_from_env` (one made by the caller is left alone)."""
    global _OWNED
    if _OWNED and is_initialized():
        torch.distributed.destroy_process_group()
    _OWNED = False


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank (``[obj]`` when not distributed)."""
    if not is_initialized() or world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def current_shard(distributed: bool | None = None) -> Shard | None:
    """The shard of this process for ``evaluate(distributed=...)``: ``None`` runs everything here.

    ``None`` (auto): shard when a process group with more than one process is initialised; ``True``:
    require one (an error otherwise); ``False``: never shard.
    """
    if distributed is False:
        return None
    if not is_initialized():
        if distributed:
            raise RuntimeError("distributed=True but no torch.distributed process group is initialised: launch "
                               "with torchrun and call medadv.distributed.init_from_env() first")
        return None
    size = world_size()
    return Shard(rank(), size) if size > 1 else None


_RANK_LOG = re.compile(r"\.rank(\d+)$")


def rank_log(log: str | os.PathLike, rank: int) -> Path:
    """The log file of ``rank`` beside ``log``: ``out/log.jsonl`` -> ``out/log.rank1.jsonl``."""
    p = Path(log)
    suffix = "".join(p.suffixes[-1:])
    return p.with_name(f"{p.name[: len(p.name) - len(suffix)]}.rank{rank}{suffix}")


def log_files(log: str | os.PathLike) -> list[Path]:
    """``log`` and the per-rank logs beside it (any number of ranks), existing ones only, in a stable order:
    what a resumed run reads, whatever the number of processes that wrote them."""
    p = Path(log)
    suffix = "".join(p.suffixes[-1:])
    stem = p.name[: len(p.name) - len(suffix)]
    found = [p] if p.is_file() else []
    if p.parent.is_dir():
        ranked = []
        for q in p.parent.iterdir():
            if q.is_file() and q.name.startswith(stem + ".rank") and q.name.endswith(suffix):
                m = _RANK_LOG.search(q.name[: len(q.name) - len(suffix)])
                if m and q.name[: len(q.name) - len(suffix) - len(m.group(0))] == stem:
                    ranked.append((int(m.group(1)), q))
        found += [q for _, q in sorted(ranked)]
    return found
