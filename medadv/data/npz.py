"""The ``npz`` data source: one ``.npz`` archive holding ``x`` (inputs, ``(N, C, *spatial)``) and ``y`` (labels),
checked before anything is loaded (issue 28).

What is checked from the archive's table of contents and the arrays' ``.npy`` headers, without reading the
arrays: the file is a readable zip (a 0-byte or truncated file is refused naming it), it holds ``x`` and ``y``,
they hold at least one case and as many cases each, and neither is complex (a float tensor would silently drop
the imaginary part) nor of Python objects. A damaged member (a CRC error) is found when the arrays are read,
before any attack runs, and named the same way.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..schema_base import ConfigError

__all__ = ["npz_header", "npz_loader", "check_integer_labels"]


def _header(z: zipfile.ZipFile, key: str) -> tuple[tuple[int, ...], np.dtype]:
    with z.open(f"{key}.npy") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    return tuple(int(s) for s in shape), np.dtype(dtype)


def _unreadable(path: Path, e: BaseException) -> ConfigError:
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return ConfigError([f"`data.path`: {path.name} is not a readable .npz ({type(e).__name__}: {first[:160]}): "
                        "damaged, truncated or not a zip of x.npy and y.npy as numpy.savez writes"])


def npz_header(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``{"x": (shape, dtype), "y": (shape, dtype)}`` of an ``.npz`` for medadv, from the headers only;
    a :class:`~medadv.config_schema.ConfigError` (one line naming ``data.path`` and the file) for anything
    that is not such an archive."""
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path.resolve()} (expected an .npz with arrays x and y)")
    if path.stat().st_size == 0:
        raise ConfigError([f"`data.path`: {path.name} is empty (0 bytes); expected an .npz with arrays x and y"])
    try:
        with zipfile.ZipFile(path) as z:
            files = [n[:-4] for n in z.namelist() if n.endswith(".npy")]
            missing = [k for k in ("x", "y") if k not in files]
            if missing:
                raise ConfigError([f"`data.path`: {path.name} has no array {' or '.join(map(repr, missing))} "
                                   f"(it has {', '.join(map(repr, files)) or 'none'}); an .npz for medadv holds "
                                   "x (inputs) and y (labels)"])
            heads = {k: _header(z, k) for k in ("x", "y")}
    except ConfigError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        # a truncated archive loses its table of contents (at the end of the file): "File is not a zip file"
        raise _unreadable(path, e) from None
    for key, (shape, dtype) in heads.items():
        if dtype.kind == "c":
            raise ConfigError([f"`data.path`: {path.name} array {key!r} is complex ({dtype}); medadv reads real "
                               "values and would drop the imaginary part: store the magnitude, or real and "
                               "imaginary parts as two channels"])
        if dtype.kind not in "biuf":
            raise ConfigError([f"`data.path`: {path.name} array {key!r} holds {dtype} values; expected numbers"])
        if not shape:
            raise ConfigError([f"`data.path`: {path.name} array {key!r} is a scalar; expected one entry per case"])
    (nx, ny) = heads["x"][0][0], heads["y"][0][0]
    if nx == 0:
        raise ConfigError([f"`data.path`: {path.name} holds 0 cases (x has shape {heads['x'][0]}); nothing to "
                           "evaluate"])
    if nx != ny:
        raise ConfigError([f"`data.path`: {path.name} has {nx} inputs (x) but {ny} labels (y); give one label "
                           "per input"])
    return heads


def npz_loader(path: Path, n: int | None) -> Callable[[], tuple[Tensor, Tensor]]:
    """Check the ``.npz`` at ``path`` (:func:`npz_header`) and return what loads its first ``n`` cases as
    ``(x float32, y)`` tensors; a member that fails its CRC when read is a one-line error naming the file."""
    npz_header(path)

    def load_npz() -> tuple[Tensor, Tensor]:
        try:
            with np.load(path, allow_pickle=False) as arr:
                x, y = arr["x"][:n], arr["y"][:n]
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:  # a member failing its CRC check
            raise _unreadable(path, e) from None
        return torch.from_numpy(np.ascontiguousarray(x)).float(), torch.from_numpy(np.ascontiguousarray(y))

    return load_npz


def check_integer_labels(y: Tensor, spec: Mapping[str, Any], label_source: str | None) -> None:
    """The labels ``y`` of a built-in source (an ``.npz``'s, for a task reading class indices or label maps,
    ``label_source`` "index" or "map") hold integers: a float ``y`` with a fraction, NaN or Inf is refused in
    one line naming the file (never rounded), before any batch is attacked."""
    if label_source not in ("index", "map"):
        return
    from .geometry import non_integer_values

    why = non_integer_values(y)
    if why:
        what = "class indices" if label_source == "index" else "label maps"
        where = f"`data.path`: {Path(str(spec['path'])).name} array 'y'" if spec.get("path") else "`data`: the labels"
        raise ConfigError([f"{where} holds {why}; the task reads {what}, which are integers"])
