"""What :func:`~medadv.evaluate` writes beside its rows: adversarial examples saved and re-read, and the host work
(hashing, appending to the log) run on a worker thread beside the device work."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .attacks.base import Attack, AttackResult, attack_mode
from .evaluation_batches import Batch
from .runtime import forward_tensor
from .tasks import Task

__all__ = ["Background", "attack_folders", "saved_columns", "plain_value"]


def plain_value(v: Any) -> Any:
    """A JSON-able value: tensors to Python numbers or lists, NaN to None."""
    if isinstance(v, Tensor):
        v = v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, list | tuple):
        return [plain_value(e) for e in v]
    return v


def attack_folders(named: list[tuple[str, Attack]]) -> dict[tuple[str, Any], str]:
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


def saved_columns(model: nn.Module, task: Task, atk: Attack, folder: Path, sub: str, ids: list[int],
                  batch: Batch, x_d: Tensor, clean_logits: Tensor, y_d: Tensor, res: AttackResult
                  ) -> list[dict[str, Any]]:
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
            row[metric_col] = bool(m_[i] == 1) if as_bool else plain_value(float(m_[i]))
        rows.append(row)
    return rows


# --- host work beside the device work ---------------------------------------------------------------------------------
class Background:
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
        """Run ``fn(*args)`` on the worker (at once when disabled); its future."""
        if self._pool is None:
            return self.done(fn(*args))
        job = self._pool.submit(fn, *args)
        self._jobs = [j for j in self._jobs if not j.done() or j.exception() is not None] + [job]
        return job

    @staticmethod
    def done(value: Any) -> Future:
        """A future already holding ``value`` (work that needed no worker)."""
        f: Future = Future()
        f.set_result(value)
        return f

    def drain(self) -> None:
        """Wait for every submitted job; the first failure is raised here."""
        for job in self._jobs:
            job.result()
        self._jobs = []

    def close(self) -> None:
        """Stop the worker after its queued jobs."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

