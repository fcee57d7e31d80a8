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
      - {name: vafa, block: 8}                  # no ε-ball: run once on the data box
      - {name: dag}                             # targeted by nature: needs `target`
    target: background                          # background | least_likely | package.module:function
    batch_size: 4
    output: results/

Budgets and bounds are in the data's units. Every registered attack is built from its name with its
defaults plus the parameters given (``medadv attacks --params NAME`` lists them); an unknown parameter
is an error naming the closest valid one. Attacks with an ε-ball (``threat_kind`` "ball" or
"ball_or_box") get one instance per budget, named ``label@budget``, on the ``threat`` ball; attacks
without one (``threat_kind`` "box": VAFA) get the threat's data box once, named ``label``, with
budget ``None``. Components are given by name: ``explanation: gradcam`` or
``explanation: {name: smoothgrad, n_samples: 8}``; GAP's ``generator: {checkpoint: gap.pt}``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .attacks.base import Attack, attack_class, get_attack
from .params import InvalidParameterError, closest
from .tasks import MultiClass, MultiLabel, Segmentation, Task
from .threats import L2, Box, Linf, Threat

__all__ = ["load_config", "build_model", "build_task", "build_data", "build_attacks", "build_target_fn"]

TargetFn = Callable[[Tensor, Tensor, Tensor], Tensor]


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


_THREAT_KEYS = ("norm", "bounds", "eps")


def _box(spec: Mapping[str, Any]) -> Box:
    if not isinstance(spec, Mapping):
        raise ValueError(f"`threat` must be a mapping such as {{norm: linf, bounds: [0.0, 1.0]}}, got {spec!r}")
    for k in spec:
        if k not in _THREAT_KEYS:
            c = closest(str(k), _THREAT_KEYS)
            hint = f"; did you mean `{c}`?" if c else ""
            raise ValueError(f"unknown key `{k}` in `threat`{hint} (valid keys: {', '.join(_THREAT_KEYS)})")
    if "bounds" not in spec:
        raise ValueError("`threat.bounds` is required (the data range in data units, or null for unbounded)")
    b = spec["bounds"]
    if b is not None and (not isinstance(b, list | tuple) or len(b) != 2):
        raise ValueError(f"`threat.bounds` must be [lo, hi] or null, got {b!r}")
    return Box.unbounded() if b is None else Box(float(b[0]), float(b[1]))


def _threat(spec: Mapping[str, Any], eps: float) -> Threat:
    norm = str(spec.get("norm", "linf")).lower()
    box = _box(spec)
    if norm == "linf":
        return Linf(eps, bounds=box)
    if norm == "l2":
        return L2(eps, bounds=box)
    raise ValueError(f"`threat.norm` must be linf or l2, got {spec.get('norm')!r}")


def _budgets(cfg: Mapping[str, Any]) -> list[float]:
    budgets = cfg.get("budgets", [cfg["threat"].get("eps")] if isinstance(cfg.get("threat"), Mapping) else None)
    if not isinstance(budgets, list | tuple):
        raise ValueError(f"`budgets` must be a list of numbers (data units), got {budgets!r}")
    if not budgets or any(b is None for b in budgets):
        raise ValueError("give `budgets: [...]` (or `threat.eps`) in data units: the ε of the ball attacks")
    return [float(b) for b in budgets]


def _entries(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    attacks = cfg.get("attacks")
    if not isinstance(attacks, list | tuple) or not attacks:
        raise ValueError(f"`attacks` must be a non-empty list such as [{{name: pgd, steps: 10}}], got {attacks!r}")
    out = []
    for spec in attacks:
        if isinstance(spec, str):  # `- fgsm` is `- {name: fgsm}`
            spec = {"name": spec}
        if not isinstance(spec, Mapping) or not spec.get("name"):
            raise ValueError(f"each entry of `attacks` needs a `name`, got {spec!r}")
        out.append(dict(spec))
    return out


def build_attacks(cfg: dict[str, Any], task: Task) -> dict[str, Attack]:
    """Every attack of the config, by label.

    Ball attacks (``threat_kind`` "ball" or "ball_or_box") get one instance per entry of ``budgets`` on
    the ``threat`` ball, named ``label@budget``; box attacks (``threat_kind`` "box") get the threat's data
    box once, named ``label`` (their budget is ``None``). ``label`` defaults to the attack's name. The
    other keys of an entry are the attack's parameters (validated by its declarations; an unknown key is
    an error naming the closest valid parameter).
    """
    entries = _entries(cfg)
    box = _box(cfg["threat"])
    out: dict[str, Attack] = {}
    budgets: list[float] | None = None
    for spec in entries:
        name = spec.pop("name")
        cls = attack_class(name)  # an unknown name gets the closest registered one
        label = str(spec.pop("label", cls.name))  # to run one attack with two settings: give each a label
        made: dict[str, Threat | Box]
        if cls.threat_kind == "box":
            made = {label: box}
        else:
            budgets = _budgets(cfg) if budgets is None else budgets
            made = {f"{label}@{eps:.6g}": _threat(cfg["threat"], eps) for eps in budgets}
        for key, threat in made.items():
            if key in out:
                raise ValueError(f"two `attacks` entries are both called {label!r}; give them distinct `label`s")
            try:
                out[key] = get_attack(cls.name, task, threat, **spec)
            except InvalidParameterError as e:
                raise InvalidParameterError(f"`attacks` entry {label!r}: {e}") from None
    return out


# --- targets of targeted attacks ---------------------------------------------------------------------------------
def _named(fn: TargetFn, name: str) -> TargetFn:
    # evaluate() puts the target function's name in the resume fingerprint: give each kind its own
    fn.__qualname__ = fn.__name__ = name
    return fn


def build_target_fn(spec: str | None, task: Task) -> TargetFn | None:
    """``target_fn(x, y, clean_logits) -> target`` for targeted attacks, from the config's ``target``.

    * ``background``: class 0 everywhere (segmentation: an all-background map, DAG's type-A target;
      multi-class: class 0; multi-label: no label);
    * ``least_likely``: the clean prediction's least-likely class (per voxel for segmentation, the
      flipped prediction of every label for multi-label);
    * ``package.module:function``: your own ``function(x, y, clean_logits) -> target``.
    """
    if spec is None:
        return None
    if not isinstance(spec, str):
        raise ValueError(f"`target` must be background, least_likely or 'package.module:function', got {spec!r}")
    if ":" in spec:
        mod, fn = spec.split(":", 1)
        return getattr(importlib.import_module(mod), fn)  # type: ignore[no-any-return]
    kind = spec.lower()
    if kind == "background":
        def background(x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
            return torch.zeros_like(y)

        return _named(background, "target:background")
    if kind == "least_likely":
        def least_likely(x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
            return task.least_likely(logits).to(y.dtype)

        return _named(least_likely, "target:least_likely")
    c = closest(kind, ("background", "least_likely"))
    hint = f"; did you mean {c!r}?" if c else ""
    raise ValueError(f"`target` must be background, least_likely or 'package.module:function', got {spec!r}{hint}")
