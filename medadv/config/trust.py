"""What a config may name without ``--allow-code``: the one trust policy of configs (issue 28).

A config runs no code unless the user opts in (``--allow-code`` or ``allow_code: true``): without it, a model
builder must be an ``nn.Module`` class or a declared network factory, a ``package.module:function`` must come from
:data:`TRUSTED_PACKAGES`, and a Python file must sit inside the config's folder. The model, data, target and
transform builders (:mod:`medadv.config`, :mod:`medadv.config.data`, :mod:`medadv.config.targets`) all ask here,
so the rule is written once.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from ..schema_base import ConfigError

__all__ = ["TRUSTED_PACKAGES", "CodeNotAllowedError", "OPT_IN", "trusted_module", "inside", "allow_module",
           "allow_network", "allow_file", "module_exists", "import_code"]

#: packages whose functions a config may name without ``allow_code``
TRUSTED_PACKAGES = ("medadv", "monai", "torchvision")


class CodeNotAllowedError(ConfigError):
    """A config names code outside medadv/MONAI/torchvision or a Python file outside its folder, and the
    user has not opted in (``--allow-code`` or ``allow_code: true``)."""


OPT_IN = ("pass --allow-code (or set `allow_code: true` in the config) if you trust it: a config that names "
           "code runs it")


def trusted_module(spec: str) -> bool:
    return spec.partition(":")[0].split(".")[0] in TRUSTED_PACKAGES


def inside(path: Path, base_dir: str | None) -> bool:
    if not base_dir:
        return False
    try:
        path.resolve().relative_to(Path(base_dir).resolve())
        return True
    except ValueError:
        return False


def allow_module(spec: str, where: str, allow_code: bool) -> None:
    if not allow_code and not trusted_module(spec):
        raise CodeNotAllowedError([f"`{where}` {spec!r} is code outside {', '.join(TRUSTED_PACKAGES)}: {OPT_IN}"])


def allow_network(fn: Any, where: str, allow_code: bool) -> None:
    """Without ``allow_code``, only what builds a network: an ``nn.Module`` subclass or a declared network factory
    (:func:`medadv.models.loading.builds_network`), decided from the resolved object before anything is called.
    Any other function of medadv, MONAI or torchvision is code (``monai.utils.module:optional_import`` imports any
    module, ``torchvision.datasets.utils:extract_archive`` writes anywhere)."""
    from ..models.loading import builds_network

    if allow_code or builds_network(fn):
        return
    kind = (f"the class {fn.__qualname__}, not an nn.Module" if isinstance(fn, type) else
            f"a {type(fn).__name__} that is not a declared network factory")
    raise CodeNotAllowedError([f"{where} is {kind}: without --allow-code a config names only nn.Module classes and "
                               "the network factories medadv declares (torchvision's registered models, MONAI's "
                               f"networks, medadv.models builders); {OPT_IN}"])


def allow_file(path: Path, spec: str, where: str, base_dir: str | None, allow_code: bool) -> None:
    if not allow_code and not inside(path, base_dir):
        raise CodeNotAllowedError([f"`{where}` {spec!r} is a Python file outside the config's folder "
                                   f"({path.resolve()}): {OPT_IN}"])


def module_exists(spec: str, where: str) -> tuple[str, str]:
    mod, _, name = spec.partition(":")
    try:
        found = importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        found = False
    if not found or not name:
        raise ConfigError([f"`{where}` {spec!r}: no module {mod!r} to import (give 'package.module:function' "
                           "importable from here)" if not found else f"`{where}` {spec!r}: name the function "
                           "after the colon, 'package.module:function'"])
    return mod, name


def import_code(spec: str, where: str) -> Any:
    mod, name = module_exists(spec, where)
    try:
        return getattr(importlib.import_module(mod), name)
    except AttributeError:
        raise ConfigError([f"`{where}` {spec!r}: module {mod!r} has no {name!r}"]) from None
