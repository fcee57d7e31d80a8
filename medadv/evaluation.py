"""Run models x attacks x budgets over data and collect a tidy :class:`~medadv.results.Results` table."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .attacks.base import Attack, AttackDetails, attack_mode, check_input, model_device
from .params import object_settings, stable_hash
from .results import DETAIL_PREFIX, Results
from .runtime import forward_tensor
from .tasks import MultiClass, MultiLabel, Segmentation, Task

__all__ = ["evaluate", "sample_rows", "detail_rows"]

TargetFn = Callable[[Tensor, Tensor, Tensor], Tensor]


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


def _sample_hashes(x: Tensor, y: Tensor) -> list[str]:
    """A short content hash per sample of ``(x, y)`` (dtype, shape and bytes): a resumed run reuses a row only
    if its sample is the same data, not merely the same position in the iteration order."""
    xs, ys = x.detach().cpu().contiguous(), y.detach().cpu().contiguous()
    out = []
    for i in range(xs.shape[0]):
        h = hashlib.sha256()
        for t in (xs[i], ys[i]):
            t = t.float() if t.dtype == torch.bfloat16 else t
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.numpy().tobytes())
        out.append(h.hexdigest()[:16])
    return out


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
                 target_fn: TargetFn | None) -> str:
    """A short hash of what a row depends on: the model's weights, the task that reads its output, the
    attack's declared parameters with its task and threat or box (``attack.fingerprint()``), the HD95
    options and, for targeted attacks, the name of the target function."""
    target = None
    if target_fn is not None and _targeted(attack):
        target = f"{getattr(target_fn, '__module__', '')}.{getattr(target_fn, '__qualname__', repr(target_fn))}"
    spacing = list(spacing) if isinstance(spacing, Sequence) and not isinstance(spacing, str) else spacing
    return stable_hash({"model": weights, "task": object_settings(task), "attack": attack.fingerprint(),
                        "hd95": bool(hd95), "spacing": spacing, "target_fn": target})


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


def _batches(data: Any) -> Iterable[tuple[Tensor, Tensor]]:
    if isinstance(data, tuple | list) and len(data) == 2 and isinstance(data[0], Tensor):
        yield data[0], data[1]
        return
    for item in data:
        if not (isinstance(item, tuple | list) and len(item) >= 2):
            raise TypeError("`data` must be an (x, y) tensor pair or an iterable of (x, y) batches")
        yield item[0], item[1]


def _f(t: Tensor) -> list:
    return [None if v != v else v for v in t.detach().double().cpu().tolist()]  # NaN -> None (JSON)


def sample_rows(
    task: Task,
    y: Tensor,
    clean_logits: Tensor,
    adv_logits: Tensor,
    *,
    spacing: float | Sequence[float] | None = None,
    hd95: bool = False,
) -> list[dict[str, Any]]:
    """Per-sample metric columns (clean and adversarial) for one batch."""
    # one device-to-host copy per tensor, then plain indexing (not one sync per sample and column)
    y, clean_logits, adv_logits = y.detach().cpu(), clean_logits.detach().cpu(), adv_logits.detach().cpu()
    n = y.shape[0]
    cp, ap = task.predict(clean_logits), task.predict(adv_logits)
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    if isinstance(task, MultiClass):
        for i in range(n):
            rows[i].update(label=int(y[i]), clean_pred=int(cp[i]), adv_pred=int(ap[i]),
                           clean_correct=bool(cp[i] == y[i]), adv_correct=bool(ap[i] == y[i]),
                           changed=bool(cp[i] != ap[i]))
    elif isinstance(task, MultiLabel):
        cs, as_ = clean_logits.sigmoid(), adv_logits.sigmoid()
        flips = (cp != ap).float().mean(dim=1)
        cacc = (cp == y).float().mean(dim=1)
        aacc = (ap == y).float().mean(dim=1)
        for i in range(n):
            rows[i].update(label=_f(y[i]), clean_pred=_f(cp[i]), adv_pred=_f(ap[i]),
                           clean_scores=_f(cs[i]), adv_scores=_f(as_[i]),
                           clean_label_accuracy=float(cacc[i]), adv_label_accuracy=float(aacc[i]),
                           clean_exact_match=bool(cacc[i] == 1), adv_exact_match=bool(aacc[i] == 1),
                           flip_rate=float(flips[i]), changed=bool(flips[i] > 0))
    elif isinstance(task, Segmentation):
        cm, am = task.metrics(clean_logits, y), task.metrics(adv_logits, y)
        changed = task.reduce((cp != ap).float(), y)
        if hd95:
            from .metrics.segmentation import hd95_per_class

            mask = task.valid_mask(y)
            chd = hd95_per_class(cp, y, task.num_classes, spacing, mask=mask)
            ahd = hd95_per_class(ap, y, task.num_classes, spacing, mask=mask)
        for i in range(n):
            rows[i].update(clean_dice=_f(cm["dice"][i]), adv_dice=_f(am["dice"][i]),
                           clean_mean_dice=float(cm["mean_dice"][i]), adv_mean_dice=float(am["mean_dice"][i]),
                           clean_pixel_accuracy=float(cm["pixel_accuracy"][i]),
                           adv_pixel_accuracy=float(am["pixel_accuracy"][i]),
                           changed_fraction=float(changed[i]))
            if hd95:
                rows[i].update(clean_hd95=_f(chd[i]), adv_hd95=_f(ahd[i]))
    else:  # a user-defined task: report its own metrics
        cm, am = task.metrics(clean_logits, y), task.metrics(adv_logits, y)
        for i in range(n):
            for k in cm:
                rows[i][f"clean_{k}"] = _f(cm[k][i].reshape(-1)) if cm[k][i].numel() > 1 else float(cm[k][i])
                rows[i][f"adv_{k}"] = _f(am[k][i].reshape(-1)) if am[k][i].numel() > 1 else float(am[k][i])
    return rows


def evaluate(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: Attack | Sequence[Attack] | Mapping[str, Attack],
    *,
    log: str | os.PathLike | None = None,
    target_fn: TargetFn | None = None,
    hd95: bool = False,
    spacing: float | Sequence[float] | None = None,
    progress: bool = False,
    meta: dict[str, Any] | None = None,
) -> Results:
    """Attack every batch of ``data`` with every attack and tabulate clean vs adversarial metrics.

    Args:
        model: the model under test (its mode and parameters are left as they were).
        task: how to read its output.
        data: an ``(x, y)`` tensor pair or an iterable of ``(x, y)`` batches (e.g. a DataLoader).
            Samples are numbered in iteration order, so a resumed run must see the same order.
        attacks: one attack, a list (named by ``attack.name``) or a ``{name: attack}`` mapping; the
            budget column is each attack's ``budget`` (its ε in data units, None for attacks without an
            ε-ball, which run once).
        log: JSON Lines file to which rows are appended batch by batch. Rows already in it are kept
            and their (sample, attack, budget) is not recomputed: a crashed run resumes where it stopped.
            A row counts only if its ``data`` hash (the sample's input and label bytes) and its ``config``
            fingerprint match this call: the model's weights, the
            task, ``attack.fingerprint()`` (every declared parameter of the attack, its task and its
            threat or data box), ``hd95``, ``spacing`` and, for targeted attacks, the target function's
            name. Rows of other settings or of attacks not requested are ignored.
        target_fn: for targeted attacks (``targeted=True`` or targeted by nature, like DAG),
            ``target_fn(x, y, clean_logits) -> target``; required when any attack is targeted.
        hd95: also compute per-class HD95 for segmentation (slower, SciPy distance transforms).
        spacing: voxel spacing for HD95 (mm), scalar or per axis.
        progress: show a progress bar.
        meta: free-form metadata stored with the results (model name, dataset, ...).

    Returns:
        :class:`Results` with one row per (sample, attack, budget). Besides the metric columns, each row
        holds the attack's declared per-sample outputs (``AttackResult.details.columns``) as
        ``attack_<column>`` (e.g. DAG's ``attack_iterations``, the saliency attacks' ``attack_map_ssim``);
        :meth:`Results.summary` averages them per attack and budget.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(task, Task):
        raise TypeError(f"`task` must be a medadv Task, got {task!r}")
    named = _named_attacks(attacks)
    if target_fn is None and any(_targeted(a) for _, a in named):
        which = ", ".join(repr(n) for n, a in named if _targeted(a))
        raise ValueError(f"`target_fn` is required because attack(s) {which} are targeted: give "
                         "target_fn(x, y, clean_logits) -> target")
    weights = _weights_hash(model)
    configs = {name: _fingerprint(weights, task, atk, hd95, spacing, target_fn) for name, atk in named}
    # rows of a resumed log count only if they came from the same model, task and attack settings
    done = [r for r in (Results.read_log(log).rows if log is not None else [])
            if r.get("config") == configs.get(r["attack"])]
    # rows of the log by sample; a row is reused only once its sample's data is known to be the same
    logged: dict[int, list[dict[str, Any]]] = {}
    for r in done:
        logged.setdefault(r["sample"], []).append(r)
    done_keys: set[tuple[Any, ...]] = set()
    results = Results([], meta={"task": repr(task), **(meta or {})})
    device = model_device(model)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc="evaluate", unit="attack-batch")
    offset = 0
    modes = [(m, m.training) for m in model.modules()]
    try:
        for x, y in _batches(data):
            check_input(x)
            ids = list(range(offset, offset + x.shape[0]))
            offset += x.shape[0]
            if not isinstance(y, Tensor) or y.ndim == 0 or y.shape[0] != x.shape[0]:
                raise ValueError(f"`y` of a batch must be a tensor with one label per sample ({x.shape[0]}), got "
                                 + (f"shape {tuple(y.shape)}" if isinstance(y, Tensor) else type(y).__name__))
            hashes = _sample_hashes(x, y)
            for i, sid in enumerate(ids):  # logged rows of the same data count as done; others are redone
                for r in logged.pop(sid, ()):
                    key = (sid, r["attack"], r["budget"])
                    if r.get("data") == hashes[i] and key not in done_keys:
                        results.rows.append(r)
                        done_keys.add(key)
            todo = [(n, a) for n, a in named if any((i, n, a.budget) not in done_keys for i in ids)]
            if not todo:
                continue
            x_d, y_d = x.to(device), y.to(device)
            with attack_mode(model), torch.no_grad():
                clean_logits = forward_tensor(model, x_d)  # clear errors: list outputs, no batch dim
            task.validate(clean_logits, y_d, "y")
            for name, atk in todo:
                target = target_fn(x_d, y_d, clean_logits) if target_fn is not None and _targeted(atk) else y_d
                res = atk(model, x_d, target)
                rows = sample_rows(task, y_d, clean_logits, res.logits, spacing=spacing, hd95=hd95)
                extra = detail_rows(res.details, len(rows))
                fooled, linf, l2 = res.fooled.cpu().tolist(), res.linf.cpu().tolist(), res.l2.cpu().tolist()
                new = []
                for i, row in enumerate(rows):
                    key = (ids[i], name, atk.budget)
                    if key in done_keys:
                        continue
                    new.append({"sample": ids[i], "attack": name, "budget": atk.budget, "config": configs[name],
                                "data": hashes[i],
                                "fooled": bool(fooled[i]), "linf": float(linf[i]), "l2": float(l2[i]),
                                **row, **extra[i]})
                    done_keys.add(key)
                results.extend(new)
                if log is not None:
                    Results.append_log(log, new)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(attack=name, fooled=f"{res.fooling_rate:.2f}")
    finally:
        for m, training in modes:
            m.training = training
        if bar is not None:
            bar.close()
    order = {name: i for i, (name, _) in enumerate(named)}
    results.rows.sort(key=lambda r: (order.get(r["attack"], len(order)), str(r["attack"]), r["sample"]))
    return results
