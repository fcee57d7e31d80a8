"""evaluate() on torch.distributed: 2 CPU processes on gloo (torchrun) equal the 1-process run exactly, and a
killed distributed run resumes from the per-rank logs, with the same or another number of processes.

The worker the processes run is this file itself: ``python -m torch.distributed.run ... test_distributed.py run``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from medadv import distributed
from medadv.attacks import FGSM, PGD
from medadv.evaluation import evaluate
from medadv.models import small_cnn
from medadv.results import Results
from medadv.tasks import MultiClass
from medadv.threats import Linf

N, BATCH, SEED = 10, 3, 7  # 4 batches of 3, 3, 3, 1: the ranks get different amounts of work


class _Cases(Dataset):
    """Dictionary samples, as a MONAI Dataset yields them (collated by the DataLoader)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.x[i], "label": self.y[i], "case_id": f"case{i:02d}.png"}


def _setup(kind: str) -> tuple[torch.nn.Module, MultiClass, Any, dict[str, Any]]:
    torch.manual_seed(0)
    model = small_cnn(1, 3, width=4).eval()
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(N, 1, 12, 12, generator=g), torch.randint(0, 3, (N,), generator=g)
    task = MultiClass()
    # PGD draws its random start from torch's global RNG (no seed of its own): evaluate(seed=...) makes that
    # the same for a batch whichever process attacks it
    attacks = {"fgsm": FGSM(task, Linf(0.05, bounds=(0.0, 1.0))),
               "pgd": PGD(task, Linf(0.05, bounds=(0.0, 1.0)), steps=3, seed=None)}
    data: Any = DataLoader(_Cases(x, y), batch_size=BATCH) if kind == "loader" else \
        [(x[i: i + BATCH], y[i: i + BATCH]) for i in range(0, N, BATCH)]
    return model, task, data, attacks


def _count_calls(attacks: dict[str, Any], kill_at: int | None = None) -> list[list[Any]]:
    """Record (attack, batch size) of every attack call; with ``kill_at``, every rank dies together at that
    call (after the calls before it were logged), as a killed job would."""
    calls: list[list[Any]] = []
    for name, atk in attacks.items():
        orig = atk.perturb

        def wrapped(*a: Any, _orig: Any = orig, _name: str = name, **k: Any) -> Any:
            if kill_at is not None and len(calls) + 1 == kill_at:
                distributed.barrier()
                os._exit(3)
            calls.append([_name, a[1].shape[0]])
            return _orig(*a, **k)

        atk.perturb = wrapped
    return calls


def _worker(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--data", default="loader")
    p.add_argument("--kill-at", type=int)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    assert distributed.init_from_env(), "run me with torchrun"
    out = Path(args.out)
    model, task, data, attacks = _setup(args.data)
    calls = _count_calls(attacks, args.kill_at)
    res = evaluate(model, task, data, attacks, log=out / "log.jsonl", seed=SEED)
    (out / f"calls.rank{distributed.rank()}.json").write_text(json.dumps(calls))
    if distributed.is_main():
        res.to_json(out / "results.json")
    distributed.destroy()


def _torchrun(out: Path, nproc: int, *extra: str) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           __file__, "run", "--out", str(out), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The 1-process reference runs on one thread, like each torchrun worker (bitwise the same kernels)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _reference(kind: str, **kw: Any) -> tuple[Results, list[list[Any]]]:
    model, task, data, attacks = _setup(kind)
    calls = _count_calls(attacks)
    return evaluate(model, task, data, attacks, seed=SEED, **kw), calls


def _rows(path: Path) -> list[dict[str, Any]]:
    return Results.from_json(path).rows


def test_two_gloo_processes_equal_one_process(tmp_path, one_thread):
    run = _torchrun(tmp_path / "dist", 2)
    assert run.returncode == 0, run.stderr[-3000:]
    reference, calls = _reference("loader")
    merged = _rows(tmp_path / "dist" / "results.json")
    assert merged == reference.rows  # row for row, value for value (floats included)
    assert len(merged) == 2 * N and [r["case_id"] for r in merged[:N]] == [f"case{i:02d}.png" for i in range(N)]
    # each rank attacked its own batches (0, 2 and 1, 3), logged them in its own file, nothing twice
    ranks = [json.loads((tmp_path / "dist" / f"calls.rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [[["fgsm", 3], ["pgd", 3]] * 2, [["fgsm", 3], ["pgd", 3], ["fgsm", 1], ["pgd", 1]]]
    logged = [{r["sample"] for r in Results.read_log(tmp_path / "dist" / f"log.rank{k}.jsonl")} for k in (0, 1)]
    assert logged == [{0, 1, 2, 6, 7, 8}, {3, 4, 5, 9}]
    assert not (tmp_path / "dist" / "log.jsonl").exists()
    assert sum(n for _, n in calls) == 2 * N


def test_killed_distributed_run_resumes_with_the_same_or_another_world_size(tmp_path, one_thread):
    killed = tmp_path / "killed"
    run = _torchrun(killed, 2, "--data", "list", "--kill-at", "2")  # both ranks die in their second attack call
    assert run.returncode != 0
    assert not (killed / "results.json").exists()
    # each rank logged its first (batch, attack) before dying: fgsm on batch 0 (rank 0) and batch 1 (rank 1)
    logged = [sorted((r["attack"], r["sample"]) for r in Results.read_log(killed / f"log.rank{k}.jsonl"))
              for k in (0, 1)]
    assert logged == [[("fgsm", i) for i in (0, 1, 2)], [("fgsm", i) for i in (3, 4, 5)]]
    reference, _ = _reference("list")

    # resumed on one process from the two ranks' logs: only what was missing is attacked
    single = tmp_path / "single"
    shutil.copytree(killed, single)
    resumed, calls = _reference("list", log=single / "log.jsonl")
    assert resumed.rows == reference.rows
    assert calls == [["pgd", 3], ["pgd", 3], ["fgsm", 3], ["pgd", 3], ["fgsm", 1], ["pgd", 1]]

    # resumed on two processes again
    run = _torchrun(killed, 2, "--data", "list")
    assert run.returncode == 0, run.stderr[-3000:]
    assert _rows(killed / "results.json") == reference.rows
    ranks = [json.loads((killed / f"calls.rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [[["pgd", 3], ["fgsm", 3], ["pgd", 3]], [["pgd", 3], ["fgsm", 1], ["pgd", 1]]]


def test_distributed_true_needs_a_process_group(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert not distributed.is_initialized() and distributed.world_size() == 1 and distributed.is_main()
    assert not distributed.init_from_env()  # no torchrun environment: a no-op
    model, task, data, attacks = _setup("list")
    with pytest.raises(RuntimeError, match="init_from_env"):
        evaluate(model, task, data, attacks, distributed=True)
    # distributed=False: every batch here even if a group existed; the same rows as the default
    assert evaluate(model, task, data, attacks, seed=SEED, distributed=False).rows == \
        evaluate(model, task, data, attacks, seed=SEED).rows
    assert distributed.all_gather_objects({"a": 1}) == [{"a": 1}]


class _Seen(_Cases):
    """Records which cases were read."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__(x, y)
        self.read: list[int] = []

    def __getitem__(self, i: int) -> dict[str, Any]:
        self.read.append(i)
        return super().__getitem__(i)


class _Wrapped:
    """An iterable holding its DataLoader as ``.loader`` (as medadv.data.sources' loader does)."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


def test_a_rank_reads_only_its_own_batches():
    from medadv.evaluation import _Source

    _, _, data, _ = _setup("list")
    x, y = torch.cat([b[0] for b in data]), torch.cat([b[1] for b in data])
    for kind in ("loader", "wrapped", "list", "iterable"):
        seen = _Seen(x, y)
        src: Any = DataLoader(seen, batch_size=BATCH)
        src = _Wrapped(src) if kind == "wrapped" else data if kind == "list" else iter(data) if kind == "iterable" \
            else src
        source = _Source(src, distributed.Shard(1, 2), "image", "label")
        got = [(b, offset, len(batch["image"] if isinstance(batch, dict) else batch[0])) for b, offset, batch in source]
        assert got == [(1, 3, 3), (3, 9, 1)], kind  # batch index, first sample, size: no padding
        assert source.total == (None if kind == "iterable" else 2)
        if kind in ("loader", "wrapped"):
            assert seen.read == [3, 4, 5, 9]  # the other rank's cases are never loaded
    with pytest.raises(ValueError, match="shuffle=False"):
        _Source(DataLoader(_Cases(x, y), batch_size=BATCH, shuffle=True), distributed.Shard(0, 2), "image", "label")


def test_rank_logs_sit_beside_the_log(tmp_path):
    log = tmp_path / "log.jsonl"
    assert distributed.rank_log(log, 3) == tmp_path / "log.rank3.jsonl"
    for name in ("log.rank10.jsonl", "log.rank2.jsonl", "log.jsonl", "other.rank1.jsonl", "log.rankx.jsonl",
                 "log.rank1.json"):
        (tmp_path / name).write_text("")
    assert [p.name for p in distributed.log_files(log)] == ["log.jsonl", "log.rank2.jsonl", "log.rank10.jsonl"]
    assert distributed.Shard(1, 3).owns(4) and not distributed.Shard(1, 3).owns(3)


if __name__ == "__main__" and sys.argv[1:2] == ["run"]:
    _worker(sys.argv[2:])
