"""Plumbing shared by the studies: data batches, named attacks, clean and attacked forwards."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..attack_cache import craft
from ..attacks.base import Attack, AttackResult
from ..fingerprints import is_targeted
from ..runtime import attack_mode, check_input, forward_tensor, model_device, target_for
from ..tasks import Task

TargetFn = Callable[[Tensor, Tensor, Tensor], Tensor] | Mapping[str, Callable[[Tensor, Tensor, Tensor], Tensor]]
AttackSpec = Attack | Sequence[Attack] | Mapping[str, Attack]


def named_attacks(attacks: AttackSpec | None) -> list[tuple[str, Attack]]:
    """``[(name, attack)]`` from one attack, a list (named by ``attack.name``) or a mapping, as in ``evaluate``;
    ``None`` or empty: no attack."""
    if attacks is None:
        return []
    if isinstance(attacks, Attack):
        items = [(attacks.name, attacks)]
    elif isinstance(attacks, Mapping):
        items = [(str(k), v) for k, v in attacks.items()]
    elif isinstance(attacks, Sequence) and not isinstance(attacks, str):
        items = [(getattr(a, "name", repr(a)), a) for a in attacks]
    else:
        raise TypeError("`attacks` must be an Attack, a sequence of Attacks or a name->Attack mapping, "
                        f"got {type(attacks).__name__}")
    seen = set()
    for name, atk in items:
        if not isinstance(atk, Attack):
            raise TypeError(f"`attacks` entry {name!r} is not a medadv Attack: {atk!r}")
        if (name, atk.budget) in seen:
            raise ValueError(f"`attacks` has two entries named {name!r} with budget {atk.budget}; give them "
                             "distinct names (a {name: attack} mapping)")
        seen.add((name, atk.budget))
    return items


def _plain(t: Any) -> Any:
    """A MONAI MetaTensor as a plain tensor (its metadata is not needed here)."""
    return t.as_tensor() if isinstance(t, Tensor) and hasattr(t, "as_tensor") else t


def batches(data: Any, image_key: str = "image", label_key: str = "label") -> Iterator[tuple[Tensor, Tensor]]:
    """``(x, y)`` batches of an ``(x, y)`` pair, an iterable of ``(x, y)`` batches (a DataLoader) or of MONAI
    dictionary batches (``{"image": x, "label": y}``)."""
    if isinstance(data, tuple | list) and len(data) == 2 and isinstance(data[0], Tensor):
        items: Iterable[Any] = [data]
    elif isinstance(data, Mapping) and image_key in data:
        items = [data]
    else:
        items = data
    for item in items:
        if isinstance(item, Mapping):
            if image_key not in item or label_key not in item:
                raise TypeError(f"a dictionary batch needs {image_key!r} and {label_key!r} keys, got {list(item)}")
            x, y = item[image_key], item[label_key]
        elif isinstance(item, tuple | list) and len(item) >= 2:
            x, y = item[0], item[1]
        else:
            raise TypeError("`data` must be an (x, y) tensor pair or an iterable of (x, y) or dictionary batches")
        x, y = _plain(x), _plain(y)
        check_input(x)
        if not isinstance(y, Tensor) or y.ndim == 0 or y.shape[0] != x.shape[0]:
            raise ValueError(f"`y` of a batch must be a tensor with one label per sample ({x.shape[0]})")
        yield x, y


def check_model(model: Any, what: str = "model") -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"`{what}` must be a torch.nn.Module, got {type(model).__name__}")
    return model


def check_task(task: Any) -> Task:
    if not isinstance(task, Task):
        raise TypeError(f"`task` must be a medadv Task (MultiClass, MultiLabel, Segmentation), got {task!r}")
    return task


def check_models(models: Any, what: str) -> dict[str, nn.Module]:
    if not isinstance(models, Mapping) or not models:
        raise TypeError(f"`{what}` must be a non-empty mapping name -> nn.Module, got {type(models).__name__}")
    return {str(k): check_model(m, f"{what}[{k!r}]") for k, m in models.items()}


def check_targets(named: list[tuple[str, Attack]], target_fn: TargetFn | None) -> None:
    missing = [n for n, a in named if is_targeted(a) and target_for(target_fn, n) is None]
    if missing:
        which = ", ".join(repr(n) for n in missing)
        raise ValueError(f"`target_fn` is required because attack(s) {which} are targeted: give "
                         "target_fn(x, y, clean_logits) -> target")


def key(name: str, budget: float | None) -> str:
    """The label of an (attack, budget) pair in ``meta`` dicts: ``"pgd@0.0314"`` (``"dag"`` without a budget).

    Names that already carry their budget (a config's ``pgd@0.1``) are kept as they are, not ``pgd@0.1@0.1``.
    """
    if budget is None or "@" in name:
        return name
    return f"{name}@{budget:.4g}"


def forward(model: nn.Module, x: Tensor) -> Tensor:
    """Logits of ``model`` on ``x`` (eval mode, no gradients, on the model's device; mode restored).

    ``model`` is read as it is: every study entry point wraps its models once with
    :meth:`~medadv.tasks.Task.logits_model` (a task declared ``outputs="probabilities"``: logits from here on)."""
    with attack_mode(model), torch.no_grad():
        return forward_tensor(model, x.to(model_device(model, x.device)))


def robust_metric(task: Task, logits: Tensor, y: Tensor) -> Tensor:
    """``(N,)`` per-sample value of the task's robust metric (accuracy / exact match / mean Dice), on the CPU."""
    return task.robust_metric(logits, y.to(logits.device)).detach().double().cpu()


@dataclass
class Attacked:
    """One attack on one batch: the attack's name, the attack, the target it was given and its result."""

    name: str
    attack: Attack
    target: Tensor
    result: AttackResult


@dataclass
class Batch:
    x: Tensor  # on the model's device
    y: Tensor  # on the model's device
    clean_logits: Tensor
    attacked: list[Attacked]


def attacked_batches(model: nn.Module, task: Task, data: Any, named: list[tuple[str, Attack]],
                     target_fn: TargetFn | None = None, check: Callable[[Tensor], None] | None = None
                     ) -> Iterator[Batch]:
    """Every batch of ``data`` with its clean logits and each attack's result (crafted on ``model``).

    Untargeted attacks get the true labels; targeted ones ``target_fn(x, y, clean_logits)`` (as in ``evaluate``).
    ``check(x)`` sees each batch's input before any forward (a study refusing inputs it cannot use raises there).
    """
    check_targets(named, target_fn)
    model = task.logits_model(model)  # idempotent: the study entry points have wrapped it already
    device = model_device(model)
    for x, y in batches(data):
        if check is not None:
            check(x)
        x, y = x.to(device), y.to(device)
        clean = forward(model, x)
        task.validate(clean, y, "y")
        out = []
        for name, atk in named:
            fn = target_for(target_fn, name)
            target = fn(x, y, clean) if fn is not None and is_targeted(atk) else y
            # through the run's cache: what evaluate() crafted for these samples is read back, not crafted again
            out.append(Attacked(name, atk, target, craft(atk, model, x, target)))
        yield Batch(x, y, clean, out)


def cat(chunks: Iterable[Tensor]) -> Tensor:
    return torch.cat([c.detach().cpu() for c in chunks])


def mean(values: Tensor) -> float | None:
    """Mean of a 1-D tensor ignoring NaN; ``None`` when nothing is left (JSON null)."""
    v = values[~torch.isnan(values)] if values.is_floating_point() else values
    return float(v.double().mean()) if v.numel() else None


def renormalization_notes(named: list[tuple[str, Attack]]) -> list[str]:
    """``meta["notes"]`` lines for attacks that renormalise their output (VAFA / VAFA-2D's ``renormalize``).

    Malik et al.'s (BMVC 2024) finding that VAFA's damage sits in the low DCT frequencies holds only with the
    per-slice min–max renormalisation of the reference codes on; that step is an unbounded, smooth slice-wise
    intensity change, not quantisation error (spec 003, §3.7). Each line says which mode ran and how to read a
    frequency result with it.
    """
    notes = []
    for name, atk in named:
        mode = getattr(atk, "renormalize", None)
        if mode is None:
            continue
        if mode == "slice_minmax":
            notes.append(
                f"{name}: VAFA ran with per-slice min–max renormalisation ON (renormalize='slice_minmax', as the "
                "reference codes do): part of its perturbation is an unbounded, smooth slice-wise intensity change, "
                "not quantisation error. The low-frequency concentration of VAFA's damage (Malik et al.) holds only "
                "in this mode, so a low band carrying most of the drop here reflects that step; rerun with "
                "renormalize='none' for the frequency profile of the quantisation error alone.")
        else:
            notes.append(
                f"{name}: VAFA ran with renormalisation OFF (renormalize={mode!r}): the perturbation is the "
                "quantisation error alone (per-block RMS <= q_max/2 grey levels). The low-frequency concentration of "
                "VAFA's damage (Malik et al.) holds only with the per-slice min–max renormalisation on: do not expect "
                "it here; a reading that differs from the paper's is not a contradiction.")
    return notes


def add_notes(meta: dict[str, Any], notes: Iterable[str]) -> None:
    """Append ``notes`` to ``meta["notes"]`` (a list of strings), skipping ones already there."""
    notes = list(notes)
    if not notes:
        return
    have = meta.setdefault("notes", [])
    for n in notes:
        if n not in have:
            have.append(n)


# --- a training split (the studies that train: defenses, gap) ------------------------------------------------
def gather(data: Any, what: str = "data") -> tuple[Tensor, Tensor]:
    """Every batch of ``data`` concatenated on the CPU: ``(x, y)``."""
    xs, ys = [], []
    for x, y in batches(data):
        xs.append(x.detach().cpu())
        ys.append(y.detach().cpu())
    if not xs:
        raise ValueError(f"`{what}` is empty")
    return torch.cat(xs), torch.cat(ys)


def split_train_eval(data: Any, train_data: Any, train_split: float | None, batch_size: int
                     ) -> tuple[tuple[Tensor, Tensor], Any, dict[str, Any]]:
    """``((x_train, y_train), eval_data, meta)``.

    With ``train_data`` the training set is all of it and ``data`` evaluates as given; otherwise the first
    ``round(train_split · n)`` samples of ``data`` train and the rest, in batches of ``batch_size``, evaluate.
    """
    if train_data is not None:
        if train_split is not None:
            raise ValueError("give either `train_data` (a separate training set) or `train_split` (a share of "
                             "`data`), not both")
        x, y = gather(train_data, "train_data")
        return (x, y), data, {"train": "train_data", "n_train": int(x.shape[0])}
    split = 0.5 if train_split is None else train_split
    if isinstance(split, bool) or not isinstance(split, int | float) or not 0.0 < float(split) < 1.0:
        raise ValueError(f"`train_split` must be a number in (0, 1) (the share of `data` that trains); got {split!r}")
    x, y = gather(data)
    k = int(round(float(split) * x.shape[0]))
    if not 0 < k < x.shape[0]:
        raise ValueError(f"`train_split` {split} of {x.shape[0]} samples leaves no training or no evaluation "
                         "sample; give more data or another split")
    xe, ye = x[k:], y[k:]
    ev = [(xe[i:i + batch_size], ye[i:i + batch_size]) for i in range(0, xe.shape[0], batch_size)]
    return (x[:k], y[:k]), ev, {"train": f"first {k} of {x.shape[0]} samples of data (train_split {split})",
                                "n_train": k, "n_eval": int(x.shape[0] - k)}
