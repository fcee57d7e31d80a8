"""Checkpoint I/O: plain ``state_dict`` files, loaded with ``weights_only=True``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["save_checkpoint", "load_checkpoint", "cache_dir"]


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
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike, model: nn.Module | None = None, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; if ``model`` is given, load its state dict (strict).

    Raises ``FileNotFoundError`` naming the expected file when it is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: expected a file at {path.resolve()}")
    payload = torch.load(path, map_location=map_location, weights_only=True)
    if model is not None:
        state = payload.get("state_dict", payload) if isinstance(payload, dict) else payload
        model.load_state_dict(state)
    return payload
