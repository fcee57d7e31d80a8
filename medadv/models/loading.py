"""Networks named in a config: MONAI and torchvision networks by name, a class or function in a Python file.

These helpers resolve a name to what builds the network and check what can be checked before building it
(the name exists, with the closest valid one when it does not; the keyword arguments are ones it takes;
nothing would download weights). :func:`medadv.config.build_model` puts them together.

**A config is code.** Building a model from a config calls the function or class it names with the
arguments it gives, and a Python file named in it is executed. medadv refuses builders that are not an
``nn.Module`` class or a Python function returning one (``builder: "os:system"`` is refused), but this is
a check against mistakes, not a sandbox: a function that deletes files is a Python function. Run only
configs (and files) you trust, as you would run only scripts you trust.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import sys
import traceback
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from ..params import closest
from ..schema_base import ConfigError

__all__ = ["monai_networks", "resolve_monai", "torchvision_networks", "resolve_torchvision", "no_download",
           "refuse_downloads", "file_names", "check_file", "import_file", "check_builder", "check_kwargs",
           "call_builder", "DOWNLOAD_ARGS", "MEDADV_FACTORIES", "MONAI_FACTORIES", "network_factories",
           "builds_network"]

#: arguments through which MONAI and torchvision networks download weights, and the value that does not
DOWNLOAD_ARGS: dict[str, Any] = {"weights": None, "weights_backbone": None, "pretrained": False,
                                 "pretrained_backbone": False, "pretrained_url": None}


def _hint(name: str, options: list[str]) -> str:
    c = closest(name, options)
    return f"; did you mean {c!r}?" if c and c != name else ""


def _short(e: BaseException) -> str:
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    if len(first) > 200:
        first = first[:197] + "..."
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


# --- what builds a network, decided before anything is called ----------------------------------------------------
#: medadv's own network factory functions (``builder: small_unet``); classes need no entry (an nn.Module subclass
#: is recognised as such)
MEDADV_FACTORIES = ("medadv.models.nets:chexnet", "medadv.models.nets:small_cnn", "medadv.models.nets:small_unet",
                    "medadv.models.generators:build_generator")
#: MONAI's network factory functions that do not declare a network return type (``resnet18`` and the like, which
#: do, are recognised from their annotation); its other functions (``drop_connect``,
#: ``get_pretrained_resnet_medicalnet``) are not networks
MONAI_FACTORIES = ("MedNeXtB", "MedNeXtL", "MedNeXtLarge", "MedNeXtM", "MedNeXtMedium", "MedNeXtS", "MedNeXtSmall",
                   "MedNextB", "MedNextBase", "MedNextL", "MedNextLarge", "MedNextM", "MedNextMedium", "MedNextS",
                   "MedNextSmall", "vista3d132")


def _returns_module(fn: Any) -> bool:
    try:
        ret = typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable annotations declare nothing
        return False
    return inspect.isclass(ret) and issubclass(ret, nn.Module)


@functools.cache
def network_factories() -> frozenset[Any]:
    """The functions a config may name as a network builder without ``--allow-code`` (compared by identity):
    torchvision's registered model builders (``torchvision.models.list_models()``), MONAI's network functions
    (annotated to return an ``nn.Module``, or listed in :data:`MONAI_FACTORIES`) and :data:`MEDADV_FACTORIES`.

    Any other function of an allow-listed package (``monai.utils.module:optional_import`` imports any module,
    ``monai.networks.utils:save_state`` writes a file anywhere) is code, and refused before it is called."""
    import importlib

    import monai.networks.nets as nets
    import torchvision.models

    found: set[Any] = {torchvision.models.get_model_builder(n) for n in torchvision.models.list_models()}
    for name in dir(nets):
        obj = getattr(nets, name)
        if inspect.isfunction(obj) and not name.startswith("_") and (name in MONAI_FACTORIES or _returns_module(obj)):
            found.add(obj)
    for spec in MEDADV_FACTORIES:
        mod, _, attr = spec.partition(":")
        found.add(getattr(importlib.import_module(mod), attr))
    return frozenset(found)


def builds_network(obj: Any) -> bool:
    """Whether ``obj`` is what builds a network: an ``nn.Module`` subclass (decided with ``issubclass``, nothing
    called) or a declared network factory (:func:`network_factories`)."""
    if inspect.isclass(obj):
        return issubclass(obj, nn.Module)
    try:
        return obj in network_factories()
    except TypeError:  # unhashable: not a function
        return False


# --- MONAI and torchvision ---------------------------------------------------------------------------------------
@functools.cache
def monai_networks() -> dict[str, Callable[..., Any]]:
    """The networks of ``monai.networks.nets`` by name: its ``nn.Module`` classes and network factory functions
    (:func:`builds_network`; not its helpers such as ``drop_connect``)."""
    import monai.networks.nets as nets

    out: dict[str, Callable[..., Any]] = {}
    for name in dir(nets):
        obj = getattr(nets, name)
        if name.startswith("_") or isinstance(obj, ModuleType):
            continue
        if builds_network(obj):
            out[name] = obj
    return out


def resolve_monai(name: str, where: str = "`model.monai`") -> Callable[..., Any]:
    """The MONAI network class (or builder function) called ``name`` (``UNet``, ``DenseNet121``, ``SegResNet``)."""
    nets = monai_networks()
    if name in nets:
        return nets[name]
    classes = [n for n, o in nets.items() if inspect.isclass(o)]
    # MONAI has aliases (Unet, unet for UNet): among names equal but for case, suggest the class's own name
    options = sorted(nets, key=lambda n: getattr(nets[n], "__name__", None) == n)
    raise ConfigError([f"{where}: monai.networks.nets has no network {name!r}{_hint(name, options)} "
                       f"(e.g. {', '.join(n for n in ('UNet', 'SegResNet', 'DenseNet121', 'BasicUNet') if n in classes)})"])


@functools.cache
def torchvision_networks() -> tuple[str, ...]:
    """The names of torchvision's model builders (``torchvision.models.list_models()``)."""
    import torchvision.models

    return tuple(torchvision.models.list_models())


def resolve_torchvision(name: str, where: str = "`model.torchvision`") -> Callable[..., Any]:
    """torchvision's builder called ``name`` (``resnet18``, ``densenet121``, ``segmentation.fcn_resnet50``)."""
    import torchvision.models

    short = name.rsplit(".", 1)[-1]
    names = list(torchvision_networks())
    if short not in names:
        raise ConfigError([f"{where}: torchvision has no model {name!r}{_hint(short, names)} "
                           "(torchvision.models.list_models() lists them)"])
    builder: Callable[..., Any] = torchvision.models.get_model_builder(short)
    return builder


def refuse_downloads(kwargs: Mapping[str, Any], where: str) -> None:
    """Refuse keyword arguments that request pretrained weights (``weights: DEFAULT``, ``pretrained: true``),
    whatever the builder (MONAI, torchvision, a module path, a file): decided from the names alone, before
    anything is imported or built.

    medadv runs offline and loads weights from a checkpoint file the user gives. (``progress`` is not one of
    them: it only draws a bar while a download runs, and none does.)
    """
    for arg, off in DOWNLOAD_ARGS.items():
        if arg in kwargs and kwargs[arg] != off:
            value = repr(kwargs[arg])
            value = value if len(value) <= 80 else f"{value[:80]}…({len(value)} chars)"
            raise ConfigError([f"`{where}.{arg}`: {value} would download weights, and medadv downloads "
                               f"nothing: give `{arg}: {'null' if off is None else 'false'}` (or leave it out) "
                               "and your trained weights as `model.checkpoint` (a state dict file)"])


def no_download(fn: Callable[..., Any], kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``kwargs`` with every download argument ``fn`` takes set to the value that downloads nothing.

    A value that would download (``weights: DEFAULT``, ``pretrained: true``) is refused
    (:func:`refuse_downloads`); a default that would (MONAI's ``EfficientNetBN(pretrained=True)``) is
    switched off.
    """
    refuse_downloads(kwargs, where)
    params = _parameters(fn)
    out = dict(kwargs)
    for arg, off in DOWNLOAD_ARGS.items():
        if params is not None and arg in params:
            out[arg] = off
    return out


# --- a class or function in a Python file ------------------------------------------------------------------------
def file_names(path: Path) -> list[str]:
    """The names a Python file defines at top level (classes, functions, assignments, imports), unexecuted."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as e:
        raise ConfigError([f"{path}: not valid Python at line {e.lineno}: {e.msg}"]) from None
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names += [(a.asname or a.name).split(".")[0] for a in node.names]
    return names


def check_file(path: Path, name: str, where: str) -> None:
    """``path`` exists and defines ``name`` at top level (read, not executed)."""
    if not path.is_file():
        raise FileNotFoundError(f"{where}: file not found: expected a Python file at {path.resolve()}")
    names = file_names(path)
    if name not in names:
        defined = [n for n in names if not n.startswith("_")]
        raise ConfigError([f"{where}: {path.name} defines no {name!r}{_hint(name, defined)} "
                           f"(it defines {', '.join(defined[:10]) or 'nothing'})"])


def import_file(path: Path, name: str, where: str) -> Any:
    """``name`` from the Python file ``path``, imported by its path (``sys.path`` is not changed).

    The file runs as a module of its own (``medadv_user_<stem>_<hash of the path>``), so two configs'
    ``model.py`` files do not collide; the modules it imports must be importable (installed), as for any
    script. An error while running it is one line naming the file and line (``--debug`` shows the rest).
    """
    check_file(path, name, where)
    resolved = path.resolve()
    modname = f"medadv_user_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(modname, resolved)
    if spec is None or spec.loader is None:
        raise ConfigError([f"{where}: cannot import {resolved} as a Python module"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module  # classes defined there find their module (dataclasses, pickling, typing)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(modname, None)
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == resolved]
        at = f" at line {lines[-1]}" if lines else ""
        raise ConfigError([f"{where}: running {resolved}{at} failed: {_short(e)}"]) from e
    return getattr(module, name)


# --- builders ----------------------------------------------------------------------------------------------------
def _parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter] | None:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None


def check_builder(obj: Any, where: str) -> None:
    """``obj`` is an ``nn.Module`` class or a Python function (not a built-in, not one annotated to return
    something other than a module); anything else is refused before it is called."""
    what = "an nn.Module class or a Python function returning an nn.Module"
    if isinstance(obj, nn.Module):
        raise ConfigError([f"{where} is an nn.Module instance ({type(obj).__name__}); name its class, or a "
                           "function that returns it"])
    if inspect.isclass(obj):
        if not issubclass(obj, nn.Module):
            raise ConfigError([f"{where} is the class {obj.__qualname__}, which is not an nn.Module; name {what}"])
        return
    if not (inspect.isfunction(obj) or inspect.ismethod(obj) or isinstance(obj, functools.partial)):
        kind = "a built-in function" if inspect.isbuiltin(obj) else f"a {type(obj).__name__}"
        raise ConfigError([f"{where} is {kind}, not {what}; medadv calls the builder a config names "
                           "(a config is code), so it refuses anything else"])
    try:
        ret = typing.get_type_hints(obj).get("return")
    except Exception:  # unresolvable annotations: nothing to learn from them
        ret = None
    if ret is type(None) or (inspect.isclass(ret) and not issubclass(ret, nn.Module)):
        returned = "None" if ret is type(None) else getattr(ret, "__qualname__", repr(ret))
        raise ConfigError([f"{where} is a function annotated to return {returned}, not an nn.Module; name {what}"])


def check_kwargs(fn: Callable[..., Any], kwargs: Mapping[str, Any], where: str, *, required: bool = True,
                 skip: tuple[str, ...] = ()) -> None:
    """Refuse keyword arguments ``fn`` does not take (naming the closest one it does) and, with
    ``required``, say which arguments it needs that are not given."""
    params = _parameters(fn)
    if params is None:
        return
    named = {n: p for n, p in params.items() if n not in skip
             and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for k in kwargs:
            if k not in named:
                c = closest(str(k), named)
                hint = f"; did you mean `{c}`?" if c else ""
                raise ConfigError([f"unknown key `{k}` in `{where}`{hint} (valid keys: {', '.join(named)})"])
    if required:
        needed = [n for n, p in named.items() if p.default is inspect.Parameter.empty and n not in kwargs
                  and p.kind is not inspect.Parameter.POSITIONAL_ONLY]
        if needed:
            raise ConfigError([f"`{where}` lacks {', '.join(f'`{n}`' for n in needed)} (required; "
                               f"it takes {', '.join(named)})"])


def call_builder(fn: Callable[..., Any], kwargs: Mapping[str, Any], where: str) -> nn.Module:
    """``fn(**kwargs)``, which must return an ``nn.Module``; an exception inside is one line naming ``where``."""
    from ..offline import blocked_in

    try:
        model = fn(**kwargs)
    except Exception as e:
        blocked = blocked_in(e)  # build_model blocks the network while building: say so, not "URLError"
        if blocked is not None:
            raise ConfigError([f"{where} tried to connect to {blocked.address} while the model was built: medadv "
                               "downloads nothing; give the trained weights as `model.checkpoint` (a state dict "
                               "file) and turn off what fetches them (pretrained weights, a hub or repository "
                               "id)"]) from e
        raise ConfigError([f"{where}: building the model failed: {_short(e)}"]) from e
    if not isinstance(model, nn.Module):
        raise ConfigError([f"{where} returned a {type(model).__name__}, not an nn.Module"])
    return model
