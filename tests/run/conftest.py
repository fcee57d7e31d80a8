"""Fixtures of the medadv.run tests: a cheap valid config on disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml


def write_config(tmp_path: Path, **over: object) -> Path:
    """A cheap valid multi-class config (a tiny CNN, 4 random 8x8 images in an .npz) with ``over`` applied."""
    g = torch.Generator().manual_seed(0)
    np.savez(tmp_path / "data.npz", x=torch.rand(4, 1, 8, 8, generator=g).numpy(),
             y=torch.randint(0, 3, (4,), generator=g).numpy())
    cfg = {
        "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 3, "width": 4}},
        "task": {"type": "multiclass"},
        "data": {"source": "npz", "path": "data.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": ["8/255"],
        "attacks": [{"name": "fgsm"}, {"name": "pgd", "steps": 2}],
        "batch_size": 2,
        "cases": 1,
        "output": "out",
        **over,
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def make_config() -> Callable[..., Path]:
    """``make_config(tmp_path, **over)``: writes ``cfg.yaml`` (and its ``data.npz``) into ``tmp_path``."""
    return write_config
