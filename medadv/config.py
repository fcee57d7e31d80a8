"""YAML/dict configuration for ``medadv evaluate``: model, task, data, attacks x budgets.

Example::

    model:
      builder: small_unet            # a medadv.models builder, or "package.module:function"
      kwargs: {in_channels: 1, num_classes: 4, ndim: 3}
      checkpoint: unet.pt            # optional state_dict file (loaded with weights_only=True)
    task: {type: segmentation, num_classes: 4, include_background: false}
    data:
      source: mni152                 # mni152 | synthetic | npz
      n: 8
      kwargs: {size: 32, split: test}
    threat: {norm: linf, bounds: [0.0, 1.0]}
    budgets: [0.0157, 0.0627]
    attacks:
      - {name: fgsm}
      - {name: pgd, steps: 10}
      - {name: pgd, label: pgd-50, steps: 50}   # same attack, other settings: a distinct label
    batch_size: 4
    output: results/

Budgets and bounds are in the data's units.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .attacks.base import Attack, get_attack
from .tasks import MultiClass, MultiLabel, Segmentation, Task
from .threats import L2, Linf, Threat

__all__ = ["load_config", "build_model", "build_task", "build_data", "build_attacks"]


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file not found: {p.resolve()}")
    cfg = yaml.safe_load(p.read_text())
    if not isinstance(cfg, dict):
        raise ValueError(f"config {p} must be a YAML mapping, got {type(cfg).__name__}")
    for key in ("model", "task", "data", "attacks", "threat"):
        if key not in cfg:
            raise ValueError(f"config {p} is missing the `{key}` section")
    cfg.setdefault("_dir", str(p.parent.resolve()))
    return cfg


def _resolve(name: str):
    if ":" in name:
        mod, fn = name.split(":", 1)
        return getattr(importlib.import_module(mod), fn)
    from . import models

    if not hasattr(models, name):
        raise ValueError(f"unknown model builder {name!r}; use a medadv.models builder or 'package.module:function'")
    return getattr(models, name)


def build_model(spec: dict[str, Any], base_dir: str | None = None) -> nn.Module:
    from .models.io import load_checkpoint

    if "builder" not in spec:
        raise ValueError("`model.builder` is required")
    model = _resolve(spec["builder"])(**spec.get("kwargs", {}))
    ckpt = spec.get("checkpoint")
    if ckpt:
        path = Path(ckpt)
        if not path.is_absolute() and base_dir:
            path = Path(base_dir) / path
        load_checkpoint(path, model)
    return model.eval()


def build_task(spec: dict[str, Any]) -> Task:
    kind = str(spec.get("type", "")).lower()
    kw = {k: v for k, v in spec.items() if k != "type"}
    if kind in ("multiclass", "multi_class"):
        return MultiClass(**kw)
    if kind in ("multilabel", "multi_label"):
        return MultiLabel(**kw)
    if kind == "segmentation":
        return Segmentation(**kw)
    raise ValueError(f"`task.type` must be multiclass, multilabel or segmentation, got {spec.get('type')!r}")


def build_data(spec: dict[str, Any], base_dir: str | None = None) -> tuple[Tensor, Tensor]:
    source = str(spec.get("source", "")).lower()
    kw = dict(spec.get("kwargs", {}))
    if source == "mni152":
        from .data.mni152 import tissue_patches

        return tissue_patches(int(spec.get("n", 8)), **kw)
    if source == "synthetic":
        from .data import synthetic

        fn = getattr(synthetic, kw.pop("kind", "segmentation_blobs"))
        return fn(n=int(spec.get("n", 8)), **kw)
    if source == "npz":
        import numpy as np

        path = Path(spec["path"])
        if not path.is_absolute() and base_dir:
            path = Path(base_dir) / path
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path.resolve()} (expected an .npz with arrays x and y)")
        arr = np.load(path)
        return torch.from_numpy(arr["x"]).float(), torch.from_numpy(arr["y"])
    raise ValueError(f"`data.source` must be mni152, synthetic or npz, got {spec.get('source')!r}")


def _threat(spec: dict[str, Any], eps: float) -> Threat:
    norm = str(spec.get("norm", "linf")).lower()
    if "bounds" not in spec:
        raise ValueError("`threat.bounds` is required (the data range in data units, or null for unbounded)")
    b = spec["bounds"]
    if b is not None and (not isinstance(b, list | tuple) or len(b) != 2):
        raise ValueError(f"`threat.bounds` must be [lo, hi] or null, got {b!r}")
    bounds = None if b is None else (float(b[0]), float(b[1]))
    if norm == "linf":
        return Linf(eps, bounds=bounds)
    if norm == "l2":
        return L2(eps, bounds=bounds)
    raise ValueError(f"`threat.norm` must be linf or l2, got {spec.get('norm')!r}")


def build_attacks(cfg: dict[str, Any], task: Task) -> dict[str, Attack]:
    """``{"name@budget": attack}`` for every attack x budget of the config."""
    budgets = cfg.get("budgets", [cfg["threat"].get("eps")])
    if not isinstance(budgets, list | tuple):
        raise ValueError(f"`budgets` must be a list of numbers (data units), got {budgets!r}")
    if not budgets or any(b is None for b in budgets):
        raise ValueError("give `budgets: [...]` (or `threat.eps`) in data units")
    out: dict[str, Attack] = {}
    for spec in cfg["attacks"]:
        spec = dict(spec)
        name = spec.pop("name", None)
        if not name:
            raise ValueError(f"each entry of `attacks` needs a `name`, got {spec}")
        label = spec.pop("label", name)  # to run one attack with two settings: give each a label
        for eps in budgets:
            key = f"{label}@{float(eps):.6g}"
            if key in out:
                raise ValueError(f"two `attacks` entries are both called {label!r}; give them distinct `label`s")
            out[key] = get_attack(name, task, _threat(cfg["threat"], float(eps)), **spec)
    return out
