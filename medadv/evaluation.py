"""Run models x attacks x budgets over data and collect a tidy :class:`~medadv.results.Results` table.

Data come as ``(x, y)`` tensor pairs or as MONAI dictionary batches (``{"image", "label", "case_id", ...}``);
rows carry each case's identifier, HD95 reads each case's voxel spacing from its image header, adversarial
examples can be written as NIfTI/PNG files and re-predicted, and the work can be sharded over the
processes of a ``torch.distributed`` run (:mod:`medadv.distributed`).

This module holds the per-batch loop; its parts live beside it: fingerprints and sample hashes
(:mod:`medadv.fingerprints`), the batches (:mod:`medadv.evaluation_batches`), saved examples and background host
work (:mod:`medadv.evaluation_output`), and crafting through the attack-once cache (:mod:`medadv.attack_cache`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from . import distributed as dist
from .attack_cache import craft
from .attacks.base import Attack, AttackDetails, AttackResult, attack_mode, check_input, model_device
from .evaluation_batches import Batch, Source, prefetched
from .evaluation_output import Background, attack_folders, plain_value, saved_columns
from .fingerprints import device_checksum, is_targeted, row_fingerprint, sample_hashes, weights_hash
from .results import DETAIL_PREFIX, Results
from .runtime import all_finite, forward_tensor, target_for
from .tasks import Outcome, Task

__all__ = ["evaluate", "sample_rows", "detail_rows"]

TargetFn = Callable[[Tensor, Tensor, Tensor], Tensor]
#: one target function for every targeted attack, or ``{attack name: fn}`` (a config's per-entry ``target``)
TargetFns = TargetFn | Mapping[str, TargetFn]

# private names older code imported from here (medadv itself uses medadv.fingerprints / evaluation_batches)
_sample_hashes = sample_hashes
_device_checksum = device_checksum
_weights_hash = weights_hash
_fingerprint = row_fingerprint
_Source = Source



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
            rows[i][prefix + c] = plain_value(vi)
    return rows



# --- per-batch randomness -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _seeded(seed: int | None, key: str, device: torch.device) -> Iterator[None]:
    """With a ``seed``, run the block on torch's global RNG seeded from ``(seed, key)`` inside a fork (the
    caller's RNG state is restored after): each (batch, attack) then draws the same random numbers whichever
    batches ran before it, in this process or another."""
    if seed is None:
        yield
        return
    from .attack_cache import seed_tag

    value = int(hashlib.sha256(f"{int(seed)}:{key}".encode()).hexdigest()[:15], 16)
    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    # the seed tags the block's crafts: the attack-once cache keys attacks without their own seed by it
    with torch.random.fork_rng(devices=[index] if index is not None else []), seed_tag(int(seed)):
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


def _norm_name(attack: Attack) -> str | None:
    """The attack's threat class name (``"Linf"``, ``"L2"``), None for an attack on the data box only."""
    threat = getattr(attack, "threat", None)
    return None if threat is None else type(threat).__name__



# --- the parts of evaluate() ------------------------------------------------------------------------------------------
def _checked_attacks(model: Any, task: Any, attacks: Any, target_fn: TargetFns | None, hd95: bool,
                     spacing: Any) -> list[tuple[str, Attack]]:
    """The named attacks, once every argument that can be checked before any work is (one line naming it)."""
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
    if any(is_targeted(a) and target_for(target_fn, n) is None for n, a in named):
        which = ", ".join(repr(n) for n, a in named if is_targeted(a) and target_for(target_fn, n) is None)
        raise ValueError(f"`target_fn` is required because attack(s) {which} are targeted: give "
                         "target_fn(x, y, clean_logits) -> target")
    return named


class _Resume:
    """The logged rows this call may reuse: those of its settings (``configs``), from every rank's log, each
    reused once the hash of its sample's data matches (a row of other data at the same number is redone)."""

    def __init__(self, log: str | os.PathLike | None, shard: dist.Shard | None, configs: Mapping[str, str]) -> None:
        rows = [r for p in (dist.log_files(log) if log is not None else []) for r in Results.read_log(p).rows
                if r.get("config") == configs.get(r["attack"])]
        self.logged: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            self.logged.setdefault(r["sample"], []).append(r)
        self.done: set[tuple[Any, ...]] = set()  # (sample, attack, budget) with a row
        if shard is not None:
            dist.barrier()  # every rank has read the logs before any appends to its own

    def reuse(self, batch: Batch, ids: list[int], results: Results, background: Background) -> Future:
        """Add the batch's reusable rows to ``results``; the future of the batch's sample hashes (computed beside
        the attack when no logged row needs them now)."""
        mine = [r for sid in ids for r in self.logged.pop(sid, ())]
        if not mine:
            return background.submit(sample_hashes, batch.x, batch.y, batch.extras())
        hashes = sample_hashes(batch.x, batch.y, batch.extras())
        for r in mine:
            key = (r["sample"], r["attack"], r["budget"])
            if r.get("data") == hashes[r["sample"] - ids[0]] and key not in self.done:
                results.rows.append(r)
                self.done.add(key)
        return background.done(hashes)

    def todo(self, named: list[tuple[str, Attack]], ids: list[int]) -> list[tuple[str, Attack]]:
        """The attacks with a sample of the batch still to do."""
        return [(n, a) for n, a in named if any((i, n, a.budget) not in self.done for i in ids)]


def _progress_bar(progress: bool, shard: dist.Shard | None, batches: int | None, attacks: int) -> Any:
    """A tqdm bar over attack-batches (on rank 0 only), or ``None``."""
    if not progress or (shard is not None and shard.rank != 0):
        return None
    from tqdm.auto import tqdm

    where = f" (rank 0 of {shard.world_size})" if shard is not None else ""
    return tqdm(desc="evaluate" + where, total=batches * attacks if batches is not None else None, unit="attack-batch")


def _advance(bar: Any, name: str | None, new: list[dict[str, Any]], skipped: int = 0) -> None:
    """One attack-batch done (``name``), or ``skipped`` ones resumed from the log (the ETA counts what is left)."""
    if bar is None:
        return
    if skipped and bar.total is not None:
        bar.total -= skipped
        bar.refresh()
    if name is not None:
        n = max(len(new), 1)
        bar.update(1)
        bar.set_postfix(attack=name, fooled=f"{sum(r['fooled'] for r in new) / n:.2f}",
                        changed=f"{sum(r['changed'] for r in new) / n:.2f}")


def _check_labels(batch: Batch) -> None:
    """One label per sample, a tensor: before the batch is hashed or attacked."""
    x, y = batch.x, batch.y
    if not isinstance(y, Tensor) or y.ndim == 0 or y.shape[0] != x.shape[0]:
        raise ValueError(f"`y` of a batch must be a tensor with one label per sample ({x.shape[0]}), got "
                         + (f"shape {tuple(y.shape)}" if isinstance(y, Tensor) else type(y).__name__))


@dataclass
class _Clean:
    """A batch on the model's device with its spacing, and its clean output once known (shared by every attack)."""

    x: Tensor
    y: Tensor
    spacing: Any
    logits: Tensor | None = None
    outcome: Outcome | None = None
    hd95: Tensor | None = None


@dataclass
class _Run:
    """What every batch of one evaluate() call uses: the model as the task reads it and the call's settings."""

    model: nn.Module
    task: Task
    configs: dict[str, str]
    target_fn: TargetFns | None
    hd95: bool
    spacing: Any
    seed: int | None
    device: torch.device
    save_dir: Path | None
    folders: dict[tuple[str, Any], str] = field(default_factory=dict)

    def prepare(self, batch: Batch, ids: list[int]) -> _Clean:
        """The batch checked (finite inputs, the spacing's rank) and on the model's device."""
        x, y = batch.x, batch.y
        try:
            check_input(x)
        except ValueError:
            if isinstance(x, Tensor) and x.ndim >= 1 and x.is_floating_point() and not all_finite(x):
                bad = [batch.case_ids[i] if batch.case_ids is not None else f"sample {ids[i]}"
                       for i in range(x.shape[0]) if not all_finite(x[i])]
                raise ValueError(f"`x` contains NaN or Inf values in case {', '.join(bad[:5])}"
                                 + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
                                 + " (check the file and the `transforms`)") from None
            raise
        if self.spacing is not None and (self.hd95 or callable(getattr(self.task, "volume_columns", None))):
            from .metrics.surface import _spacing_table

            _spacing_table(self.spacing, x.shape[0], x.ndim - 2)  # one value per spatial axis: checked before the attacks
        # the voxel spacing (mm) of HD95 and of the volume columns: the argument, else each case's header
        return _Clean(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True),
                      self.spacing if self.spacing is not None else batch.spacing())

    def clean(self, c: _Clean, logits: Tensor | None = None) -> None:
        """Fill in the clean output: ``logits`` when an attack computed them on its way, else one forward pass."""
        c.logits, c.outcome, c.hd95 = _clean_outcome(self.model, self.task, c.x, c.y, logits, self.hd95, c.spacing)

    def attack(self, b: int, name: str, atk: Attack, c: _Clean) -> AttackResult:
        """The attack's result on the batch, seeded per (batch, attack, budget), crafted through the attack-once
        cache (:func:`~medadv.attack_cache.craft`: served from it when an active cache has it)."""
        with _seeded(self.seed, f"{b}:{name}:{atk.budget}", self.device):
            target = c.y
            fn = target_for(self.target_fn, name)
            if fn is not None and is_targeted(atk):
                assert c.logits is not None
                target = fn(c.x, c.y, c.logits)
            return craft(atk, self.model, c.x, target, clean_logits=c.logits)

    def rows(self, name: str, atk: Attack, ids: list[int], batch: Batch, c: _Clean, res: AttackResult,
             hashes: list[str], done: set[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """The batch's new rows for one attack (samples without a row yet), marked as done."""
        assert c.logits is not None and c.outcome is not None
        adv = self.task.outcome(res.logits, c.y, pred=res.pred)
        columns = {"fooled": res.fooled, "linf": res.linf, "l2": res.l2,
                   **_batch_columns(self.task, c.y, c.outcome, adv, hd95=self.hd95, spacing=c.spacing,
                                    clean_hd95=c.hd95)}
        rows = _rows_from_columns(columns, len(ids))
        extra = detail_rows(res.details, len(rows))
        saved = (saved_columns(self.model, self.task, atk, self.save_dir, self.folders[(name, atk.budget)], ids,
                               batch, c.x, c.logits, c.y, res)
                 if self.save_dir is not None else [{} for _ in rows])
        cases = batch.case_ids if batch.case_ids is not None else [str(i) for i in ids]
        new = []
        for i, row in enumerate(rows):
            key = (ids[i], name, atk.budget)
            if key in done:
                continue
            files = {k: v[i] for k, v in batch.paths.items()} if batch.paths else {}  # which image, label
            new.append({"sample": ids[i], "case_id": cases[i], **files, "attack": name, "budget": atk.budget,
                        "config": self.configs[name], "data": hashes[i], "fooled": row.pop("fooled"),
                        "changed": row.pop("changed"), "flipped": row.pop("flipped"),
                        "linf": row.pop("linf"), "l2": row.pop("l2"), **row, **saved[i], **extra[i]})
            done.add(key)
        return new


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
            ε-ball, which run once). Every batch is crafted through :func:`medadv.attack_cache.craft`: inside an
            :func:`~medadv.attack_cache.attack_once` block, samples already crafted under the same model weights,
            attack settings, input and target are served from the cache (a second call crafts nothing and returns
            the same rows), and studies and report cases reading the same cache craft only what is new.
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
    named = _checked_attacks(model, task, attacks, target_fn, hd95, spacing)
    shard = dist.current_shard(distributed)
    if shard is not None and seed is None and any(getattr(a, "seed", None) is None for _, a in named):
        warnings.warn("a sharded evaluate() without `seed`: attacks without their own seed draw from each "
                      "process's global RNG, so rows may differ from a 1-process run; pass seed=...",
                      RuntimeWarning, stacklevel=2)
    save_dir = Path(save_adversarial) if save_adversarial is not None else None
    weights = weights_hash(model)  # of the user's model (the task's `outputs` is in the fingerprint)
    # a model declared to return probabilities is read as logits by everything below (clean outputs, attacks, saved
    # files); probabilities from a task that does not declare them are refused on the first forward (task.validate)
    model = task.logits_model(model)
    configs = {name: row_fingerprint(weights, task, atk, hd95, spacing, target_for(target_fn, name), seed=seed,
                                     save=save_dir is not None)
               for name, atk in named}
    # rows of a resumed log (and of every rank's log) count only if they came from the same settings
    resume = _Resume(log, shard, configs)
    own_log = dist.rank_log(log, shard.rank) if log is not None and shard is not None else log
    # each attack's norm ("Linf", "L2"; None: a data box, not an Lp ball): the report checks rows against it
    # attacks that do not search for the worst case of the task's metric (noise, a volume objective): the
    # monotonicity check of the masking flags leaves them out
    off_metric = [n for n, a in named if not getattr(a, "optimises_task_metric", True)]
    results = Results([], meta={"task": repr(task), "norms": {n: _norm_name(a) for n, a in named},
                                **({"off_metric": off_metric} if off_metric else {}), **(meta or {})})
    device = model_device(model)
    run = _Run(model, task, configs, target_fn, hd95, spacing, seed, device, save_dir,
               attack_folders(named) if save_dir is not None else {})
    names = (meta or {}).get("classes")
    source = Source(data, shard, image_key, label_key)
    bar = _progress_bar(progress, shard, source.total, len(named))
    modes = [(m, m.training) for m in model.modules()]
    # on an accelerator the host work (loading the next batch, hashing, writing the log) runs beside the device
    # work; on the CPU it would only compete with the attack for the same cores
    background = Background(device.type == "cuda")
    try:
        for b, offset, batch in prefetched(source, task, image_key, label_key, device, background.enabled):
            _check_labels(batch)
            ids = list(range(offset, offset + batch.x.shape[0]))
            hashed = resume.reuse(batch, ids, results, background)  # logged rows of the same data count as done
            todo = resume.todo(named, ids)
            _advance(bar, None, [], skipped=len(named) - len(todo))
            if not todo:
                continue
            c = run.prepare(batch, ids)
            # The clean output is computed once per batch and shared by every attack. Untargeted, the first
            # attack may compute it on its way (its first step at x) and hand it back: no separate forward pass,
            # and y is checked against it by the attack before any step. Targets need it before the attack.
            if any(is_targeted(a) for _, a in todo) or names is not None:
                run.clean(c)
                if names is not None:  # the report's class names must name every output: refused before any attack
                    assert c.logits is not None
                    task.check_names(names, c.logits, "class_names")
                    names = None
            for name, atk in todo:
                res = run.attack(b, name, atk, c)
                if c.outcome is None:
                    run.clean(c, res.clean_logits)
                new = run.rows(name, atk, ids, batch, c, res, hashed.result(), resume.done)
                results.extend(new)
                if own_log is not None:
                    background.submit(Results.append_log, own_log, new)
                _advance(bar, name, new)
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
