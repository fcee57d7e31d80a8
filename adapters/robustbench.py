"""RobustBench model zoo, offline, through RobustBench's own ``load_model``.

RobustBench 1.1.1 does not import as packaged: ``robustbench.eval`` imports ``autoattack`` while its
dependency installs ``pyautoattack``, and ``robustbench.loaders`` needs ``pkg_resources`` (setuptools < 81).
Its loader downloads from Google Drive when a checkpoint is missing. :func:`import_robustbench` installs
the two import shims; :func:`load_zoo_model` checks that the checkpoint file is where RobustBench looks
(``model_dir/<dataset>/<threat_model>/<name>.pt``), says exactly which file to put where when it is not,
and otherwise calls ``robustbench.utils.load_model`` unchanged. Checkpoints load with torch's default
``weights_only=True`` (torch >= 2.6), so they must be plain state dicts (:func:`save_zoo_checkpoint`); a
corrupt file or one of another architecture is reported in a few lines naming the file.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from medadv.models.io import CheckpointError, mismatch_lines, parse_load_error, read_checkpoint
from medadv.tasks import Task, get_task

__all__ = [
    "ZooModel", "import_robustbench", "zoo_checkpoint_paths", "load_zoo_model", "save_zoo_checkpoint",
    "build_zoo_architecture",
]

_DATASETS = ("cifar10", "cifar100", "imagenet")
_THREATS = ("Linf", "L2", "corruptions", "corruptions_3d")


def _shim_pkg_resources() -> None:
    """A minimal ``pkg_resources`` (``resource_filename`` only, all robustbench uses) when setuptools dropped it."""
    if "pkg_resources" in sys.modules or importlib.util.find_spec("pkg_resources") is not None:
        return
    mod = types.ModuleType("pkg_resources")

    def resource_filename(package: str, resource: str) -> str:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"package {package!r} not found")
        return str(Path(spec.origin).parent / resource)

    mod.resource_filename = resource_filename  # type: ignore[attr-defined]
    sys.modules["pkg_resources"] = mod


def import_robustbench() -> types.ModuleType:
    """Import ``robustbench`` (with ``robustbench.utils``) after installing its missing-import shims."""
    if importlib.util.find_spec("autoattack") is None and "autoattack" not in sys.modules:
        try:
            import pyautoattack
            import pyautoattack.state
        except ImportError as e:
            raise ImportError("robustbench needs pyautoattack: pip install pyautoattack") from e
        sys.modules["autoattack"] = pyautoattack
        sys.modules["autoattack.state"] = pyautoattack.state
    _shim_pkg_resources()
    try:
        rb = importlib.import_module("robustbench")
        importlib.import_module("robustbench.utils")
    except ImportError as e:
        raise ImportError(f"robustbench could not be imported ({e}); install it with: pip install robustbench") from e
    return rb


@dataclass
class ZooModel:
    """A RobustBench zoo model as a medadv classifier: inputs in ``bounds`` (RobustBench uses [0, 1])."""

    model: nn.Module
    task: Task
    bounds: tuple[float, float]
    name: str
    dataset: str
    threat_model: str
    num_classes: int


def _check_names(name: str, dataset: str, threat_model: str):
    if dataset not in _DATASETS:
        raise ValueError(f"`dataset` must be one of {_DATASETS}, got {dataset!r}")
    if threat_model not in _THREATS:
        raise ValueError(f"`threat_model` must be one of {_THREATS}, got {threat_model!r}")
    import_robustbench()
    from robustbench.model_zoo import model_dicts
    from robustbench.model_zoo.enums import BenchmarkDataset, ThreatModel

    ds = BenchmarkDataset(dataset)
    # RobustBench keeps 3-D corruption models under `corruptions`
    tm = ThreatModel(threat_model.replace("_3d", ""))
    zoo = model_dicts[ds][tm]
    if name not in zoo:
        raise ValueError(f"{name!r} is not a RobustBench {dataset}/{tm.value} model; known: {', '.join(sorted(zoo))}")
    return ds, tm, zoo[name]


def zoo_checkpoint_paths(name: str, model_dir: str | os.PathLike, dataset: str = "cifar10",
                         threat_model: str = "Linf") -> list[Path]:
    """The file(s) RobustBench's ``load_model`` reads for ``name`` (one per member for ensembles)."""
    ds, tm, entry = _check_names(name, dataset, threat_model)
    path = Path(model_dir) / ds.value / tm.value / f"{name}.pt"
    if isinstance(entry["gdrive_id"], list):
        return [Path(f"{path}_m{i}.pt") for i in range(len(entry["gdrive_id"]))]
    return [path]


def load_zoo_model(name: str, model_dir: str | os.PathLike, dataset: str = "cifar10",
                   threat_model: str = "Linf") -> ZooModel:
    """Load a RobustBench zoo model from a local ``model_dir`` with RobustBench's own loader, never downloading.

    Args:
        name: zoo name, e.g. ``"Standard"``, ``"Ding2020MMA"``.
        model_dir: RobustBench's ``model_dir`` (files at ``model_dir/<dataset>/<threat_model>/<name>.pt``).
        dataset: ``"cifar10"``, ``"cifar100"`` or ``"imagenet"``.
        threat_model: ``"Linf"``, ``"L2"``, ``"corruptions"`` or ``"corruptions_3d"``.

    Returns a :class:`ZooModel` (eval mode, ``MultiClass`` task, bounds ``(0, 1)``).
    Raises ``FileNotFoundError`` naming the exact file and directory when a checkpoint is missing, and a short
    :class:`~medadv.models.io.CheckpointError` naming the file when it is not a valid PyTorch checkpoint or
    does not fit the architecture (the first missing / unexpected keys and their counts).
    """
    ds, tm, entry = _check_names(name, dataset, threat_model)
    import timm

    timm_name = f"{name.lower().replace('-', '_')}_{ds.value.lower()}_{tm.value.lower()}"
    if timm.is_model(timm_name) or (ds.value == "imagenet" and "Standard" in name) or entry["gdrive_id"] is None:
        raise ValueError(f"RobustBench builds {name!r} from downloaded pretrained weights inside the constructor "
                         "(timm / torchvision), so it cannot be loaded offline from `model_dir`")
    paths = zoo_checkpoint_paths(name, model_dir, dataset, threat_model)
    missing = [p for p in paths if not p.is_file()]
    if missing:
        where = ", ".join(str(p.resolve()) for p in missing)
        raise FileNotFoundError(
            f"RobustBench checkpoint for {name!r} ({ds.value}/{tm.value}) not found: expected the file(s) {where} "
            f"in directory {missing[0].parent.resolve()}. Put the checkpoint there (a plain state_dict, e.g. via "
            "medadv.adapters.robustbench.save_zoo_checkpoint); medadv never downloads at run time."
        )
    from robustbench.model_zoo.enums import BenchmarkDataset
    from robustbench.utils import DATASET_CLASSES, load_model

    try:
        model = load_model(name, model_dir=str(model_dir), dataset=ds, threat_model=tm).eval()
    except Exception as e:
        raise _zoo_load_error(e, name, f"{ds.value}/{tm.value}", paths) from None
    return ZooModel(model=model, task=get_task("multiclass"), bounds=(0.0, 1.0), name=name, dataset=ds.value,
                    threat_model=tm.value, num_classes=int(DATASET_CLASSES[BenchmarkDataset(ds.value)]))


def _zoo_load_error(error: Exception, name: str, where: str, paths: list[Path]) -> Exception:
    """A short error for a zoo checkpoint RobustBench could not load, or ``error`` itself when it is another failure.

    torch's messages are not passed on: a wrong architecture names every key (21 000 characters), and a file
    torch cannot unpickle comes with the advice to retry with ``weights_only=False``, which runs its code.
    """
    source = f"RobustBench checkpoint for {name!r} ({where})"
    for path in paths:  # read again only now that loading failed: which file is not a valid checkpoint?
        try:
            read_checkpoint(path, where=source)
        except CheckpointError as bad:
            return bad
    parsed = parse_load_error(str(error))
    if parsed is None:
        return error
    files = ", ".join(str(p) for p in paths)
    lines = mismatch_lines(f"{source}: {files} does not fit RobustBench's {name} architecture (strict loading); "
                           "is it the checkpoint of another zoo model?", *parsed)
    return CheckpointError("\n".join(lines))


def build_zoo_architecture(name: str, dataset: str = "cifar10", threat_model: str = "Linf") -> nn.Module:
    """The zoo architecture for ``name`` with fresh weights (RobustBench's constructor; nothing downloaded)."""
    _, _, entry = _check_names(name, dataset, threat_model)
    return entry["model"]()


def save_zoo_checkpoint(model: nn.Module, name: str, model_dir: str | os.PathLike, dataset: str = "cifar10",
                        threat_model: str = "Linf") -> Path:
    """Write ``model``'s weights (a plain tensor state_dict) where RobustBench's loader expects ``name``."""
    paths = zoo_checkpoint_paths(name, model_dir, dataset, threat_model)
    if len(paths) != 1:
        raise ValueError(f"{name!r} is an ensemble; save each member to {', '.join(map(str, paths))}")
    path = paths[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path
