"""Checkpoint I/O: state-dict files read with ``weights_only=True``, strict loading with short errors, TorchScript.

A checkpoint is a state dict (``torch.save(model.state_dict(), path)``) or a mapping holding one under
``state_dict``, ``model_state_dict`` or ``model`` (what training scripts and :func:`save_checkpoint` write).
Files are always read with ``torch.load(..., weights_only=True)``: tensors and plain containers only, no
pickled code. Every failure is a :class:`CheckpointError` (a ``ValueError``) of a few lines naming the
file: a missing file says which path was expected; a corrupt or truncated file says it is not a valid
PyTorch checkpoint, and a pickled model object says so, in one line (never torch's advice to retry with
``weights_only=False``, which would run the file's code); a state dict that does not fit the model lists
(at most :data:`SHOWN` of each) the missing and unexpected keys and the shape mismatches with their counts,
with a hint when a prefix such as ``module.`` (DataParallel) explains them.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["save_checkpoint", "load_checkpoint", "read_checkpoint", "state_dict_of", "load_state_dict",
           "load_torchscript", "cache_dir", "CheckpointError", "STATE_DICT_KEYS", "mismatch_lines",
           "parse_load_error"]

#: where a checkpoint mapping may hold the state dict, in the order they are looked for
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model")
#: how many keys of each kind an error lists before "... and N more"
SHOWN = 10


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model; the message names the file."""


def cache_dir(*parts: str) -> Path:
    """medadv's user cache directory (``$MEDADV_CACHE`` or ``~/.cache/medadv``), created on demand."""
    root = Path(os.environ.get("MEDADV_CACHE", Path.home() / ".cache" / "medadv"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_checkpoint(path: str | os.PathLike, model: nn.Module | None = None, **extra: Any) -> None:
    """Write ``{"state_dict": model.state_dict(), **extra}`` atomically (tensors and plain values only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = dict(extra)
    if model is not None:
        payload["state_dict"] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    import io

    from ..safe_io import write_bytes

    buf = io.BytesIO()
    torch.save(payload, buf)
    write_bytes(path, buf.getvalue())  # atomic, never through a link (medadv.safe_io)


def _existing(path: str | os.PathLike, where: str, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        there = " (a folder is there)" if p.is_dir() else ""
        raise FileNotFoundError(f"{where}: file not found: expected {what} at {p.resolve()}{there}")
    return p


def _is_pickle(p: Path) -> bool:
    """Whether ``p`` starts as a pickle does (the PROTO opcode, protocol 2 or later) or as a ``torch.save`` zip
    archive: a file that does, yet that the weights-only unpickler refuses, holds objects, not damage."""
    try:
        with open(p, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return False
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head == b"PK\x03\x04"


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", *, where: str = "checkpoint") -> Any:
    """``torch.load(path, weights_only=True)``; a missing, corrupt or code-holding file is one line naming it."""
    p = _existing(path, where, "checkpoint")
    try:
        return torch.load(p, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError, KeyError, ... for bad files
        # never repeat torch's advice to retry with weights_only=False: that runs the file's code
        text = str(e)
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", text)
        if found:
            raise CheckpointError(
                f"{where}: {p} holds a pickled Python object ({found.group(1)}), which medadv does not load "
                "(weights_only=True: a pickle can run code); save the weights instead: "
                "torch.save(model.state_dict(), path)") from None
        if "Weights only load failed" in text and _is_pickle(p):  # objects the weights-only unpickler refuses
            detail = re.search(r"WeightsUnpickler error: \s*([^\n]+)", text)
            why = f" ({detail.group(1).strip()[:120]})" if detail else ""
            raise CheckpointError(
                f"{where}: {p} holds objects that torch.load(weights_only=True) refuses{why}: a pickle of Python "
                "objects (it can run code), not only tensors; medadv does not load it. Re-save the weights from "
                "the code that made it: torch.save(model.state_dict(), path)") from None
        raise CheckpointError(f"{where}: cannot read {p}: the file is corrupt or truncated, or was not written by "
                              f"torch.save ({type(e).__name__}): not a valid PyTorch checkpoint") from None


def _is_state_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(k, str) for k in value) \
        and any(isinstance(v, Tensor) for v in value.values())


def state_dict_of(payload: Any, source: str = "the checkpoint") -> dict[str, Any]:
    """The state dict in ``payload``: the payload itself, or the mapping under one of :data:`STATE_DICT_KEYS`."""
    if isinstance(payload, Mapping):
        for key in STATE_DICT_KEYS:
            if _is_state_dict(payload.get(key)):
                return dict(payload[key])
        if _is_state_dict(payload):
            return dict(payload)
        keys = ", ".join(map(repr, list(payload)[:SHOWN])) + (" ..." if len(payload) > SHOWN else "")
        raise CheckpointError(f"{source} holds no state dict: expected a mapping of parameter names to tensors, or "
                              f"one under {' / '.join(map(repr, STATE_DICT_KEYS))}; it has keys {keys or 'none'}")
    raise CheckpointError(f"{source} holds a {type(payload).__name__}, not a state dict (a mapping of parameter "
                          "names to tensors, e.g. torch.save(model.state_dict(), path))")


def _listed(keys: Sequence[str]) -> str:
    more = f" ... and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def mismatch_lines(head: str, missing: Sequence[str], unexpected: Sequence[str], shapes: Sequence[str]) -> list[str]:
    """The lines of a short state-dict mismatch message: ``head``, then each kind of mismatch with its count and
    at most :data:`SHOWN` names (torch's own message names every key: 21 000 characters for a ResNet)."""
    lines = [head]
    if missing:
        lines.append(f"{len(missing)} key(s) of the model missing in the checkpoint: {_listed(missing)}")
    if unexpected:
        lines.append(f"{len(unexpected)} unexpected key(s) in the checkpoint: {_listed(unexpected)}")
    if shapes:
        lines.append(f"{len(shapes)} shape mismatch(es): {_listed(shapes)}")
    return lines


_TORCH_KEYS = re.compile(r"(Missing|Unexpected) key\(s\) in state_dict: (.*?)\.\s*(?:\n|$)")
_TORCH_SHAPE = re.compile(r"size mismatch for ([^:\s]+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from "
                          r"checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)")


def parse_load_error(message: str) -> tuple[list[str], list[str], list[str]] | None:
    """(missing, unexpected, shape mismatches) from torch's ``load_state_dict`` error, or None if it is not one.

    For loaders medadv does not control (RobustBench's ``load_model``), whose strict-loading error would
    otherwise reach the user whole.
    """
    if "Error(s) in loading state_dict" not in message:
        return None
    found: dict[str, list[str]] = {"Missing": [], "Unexpected": []}
    for kind, keys in _TORCH_KEYS.findall(message):
        found[kind] += re.findall(r'"([^"]+)"', keys)
    shapes = [f"{k} (checkpoint ({a[1:-1]}), model ({b[1:-1]}))" for k, a, b in _TORCH_SHAPE.findall(message)]
    return found["Missing"], found["Unexpected"], shapes


def _strip(state: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}


def _prefix_hint(state: Mapping[str, Any], expected: Sequence[str]) -> str:
    """A prefix whose removal makes the checkpoint's keys the model's (``module.`` from DataParallel)."""
    wanted = set(expected)
    for prefix in sorted({k.split(".", 1)[0] + "." for k in state if "." in k}):
        if set(_strip(state, prefix)) == wanted:
            return f"hint: the checkpoint's keys start with {prefix!r}: give `strip_prefix: {prefix}`"
    for prefix in sorted({k.split(".", 1)[0] + "." for k in wanted if "." in k}):
        if {prefix + k for k in state} == wanted:
            return f"hint: the model's keys start with {prefix!r} and the checkpoint's do not: it holds the " \
                   f"weights of the submodule {prefix[:-1]!r} only"
    return ""


def load_state_dict(model: nn.Module, state: Mapping[str, Any], *, strip_prefix: str | None = None,
                    source: str = "the checkpoint") -> None:
    """Load ``state`` into ``model`` strictly; a mismatch raises a short :class:`CheckpointError`.

    ``strip_prefix`` is removed from the start of every key that has it (``module.`` for a model saved
    from ``nn.DataParallel``/DDP, ``_orig_mod.`` from ``torch.compile``). The error lists at most
    :data:`SHOWN` missing and unexpected keys and shape mismatches each, then a count — not torch's
    message, which names every key.
    """
    given = state
    if strip_prefix:
        state = _strip(state, strip_prefix)
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} (checkpoint {tuple(state[k].shape)}, model {tuple(own[k].shape)})" for k in own
              if k in state and isinstance(state[k], Tensor) and isinstance(own[k], Tensor)
              and state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        lines = mismatch_lines(f"{source} does not fit the model ({type(model).__name__}, strict loading):",
                               missing, unexpected, shapes)
        if strip_prefix and not any(k.startswith(strip_prefix) for k in given):
            lines.append(f"no key of the checkpoint starts with strip_prefix {strip_prefix!r}")
        if missing and unexpected and (hint := _prefix_hint(given, list(own))):
            lines.append(hint)
        raise CheckpointError("\n".join(lines))
    model.load_state_dict(state, strict=True)


def load_checkpoint(path: str | os.PathLike, model: nn.Module | None = None, map_location: Any = "cpu", *,
                    strip_prefix: str | None = None, where: str = "checkpoint") -> Any:
    """Read a checkpoint (``weights_only=True``); with ``model``, load its state dict into it (strict).

    The state dict is the file itself or the mapping under ``state_dict``/``model_state_dict``/``model``.
    Returns what the file holds. Raises ``FileNotFoundError`` naming the expected file when it is missing
    and :class:`CheckpointError` for a corrupt file or a state dict that does not fit.
    """
    payload = read_checkpoint(path, map_location, where=where)
    if model is not None:
        source = f"{where}: {Path(path)}"
        load_state_dict(model, state_dict_of(payload, source), strip_prefix=strip_prefix, source=source)
    return payload


def load_torchscript(path: str | os.PathLike, map_location: Any = "cpu", *, where: str = "torchscript") -> nn.Module:
    """A TorchScript module (``torch.jit.save``) loaded with ``torch.jit.load(path, map_location)``."""
    p = _existing(path, where, "TorchScript file")
    try:
        with warnings.catch_warnings():
            # torch marks torch.jit as deprecated; the user chose this format: loading it is not their mistake
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.load.* is deprecated", category=FutureWarning)
            module: nn.Module = torch.jit.load(str(p), map_location=map_location)
    except Exception as e:
        what = "a state dict or other torch.save file" if "constants.pkl" in str(e) else "corrupt or not TorchScript"
        raise CheckpointError(f"{where}: cannot load {p} as TorchScript ({what}): write one with "
                              "torch.jit.save(torch.jit.script(model), path); a state dict goes in `checkpoint:` "
                              "beside the network that reads it") from None
    return module
