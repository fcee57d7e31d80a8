"""YAML/dict configuration for ``medadv evaluate``: model, task, data, attacks x budgets.

Example::

    model:
      builder: small_unet            # a medadv.models builder, or "package.module:function"
      kwargs: {in_channels: 1, num_classes: 4, ndim: 3}
      checkpoint: unet.pt            # optional state_dict file (loaded with weights_only=True)
    task: {type: segmentation, num_classes: 4, include_background: false}
    data:
      source: mni152                 # mni152 | synthetic | npz | files | datalist | csv
      n: 8
      kwargs: {size: 32, split: test}
    threat: {norm: linf, bounds: [0.0, 1.0]}
    budgets: [0.0157, 0.0627]
    attacks:
      - {name: fgsm}
      - {name: pgd, steps: 10}
      - {name: pgd, id: pgd-50, steps: 50}      # same attack, other settings: a distinct id
      - {name: vafa, block: 8}                  # no ε-ball: run once on the data box
      - {name: dag}                             # targeted by nature: needs `target`
    target: background                          # background | least_likely | package.module:function
    batch_size: 4
    output: results/

``model`` names the network in one of five ways, each with ``kwargs`` (its keyword arguments) and an
optional ``checkpoint``::

    model: {builder: small_unet, kwargs: {num_classes: 4}}          # a medadv.models builder
    model: {monai: UNet, kwargs: {spatial_dims: 3, in_channels: 1, out_channels: 4,
                                  channels: [8, 16], strides: [2]}}  # monai.networks.nets by name
    model: {torchvision: resnet18, kwargs: {num_classes: 3}}        # never downloads: weights=None
    model: {builder: "nets/mynet.py:MyNet", kwargs: {width: 16}}   # a class or function in a file
    model: {builder: "mypackage.models:build"}                     # anything importable
    model: {torchscript: model.pt}                                  # torch.jit.save'd: no kwargs
    model: {zoo: deepbet, kwargs: {size: 192}}                      # medadv.models.zoo: published weights

Files are relative to the config's folder. ``checkpoint`` is a state dict, or a mapping holding one under
``state_dict``, ``model_state_dict`` or ``model``; ``strip_prefix: module.`` removes a prefix (as
``nn.DataParallel`` writes) from its keys; it is read with ``weights_only=True`` and loaded strictly (a
mismatch lists the missing and unexpected keys). Without a checkpoint the weights are random, drawn
with the config's ``seed`` (``model.seed`` to change it): the same every run, and a warning says so.

**A config can run code.** ``builder`` names a function that medadv calls, and a Python file named
there runs when the model is built (``medadv validate`` only reads it); ``target`` may name a function
too. Without ``--allow-code`` (or ``allow_code: true`` in the config) ``medadv evaluate`` builds only what
builds a network, decided before anything is called: an ``nn.Module`` class of medadv, MONAI or torchvision
(``issubclass``, nothing called), one of their declared network factories
(:func:`medadv.models.loading.network_factories`: torchvision's registered models, MONAI's network functions,
medadv's builders), or a class or function of a Python file inside the config's folder. Any other function,
even of an allow-listed package (``monai.utils.module:optional_import`` imports any module,
``monai.networks.utils:save_state`` writes anywhere), any ``target`` function, any MONAI transform that runs
code or writes files (:data:`CODE_TRANSFORM_ARGS`, a loader ``reader`` that is not one of MONAI's by name),
code elsewhere (``builder: "mypkg.nets:build"``, ``../nets/net.py:Net``, ``builder: "os:system"``) needs the
opt-in. With it, builders that are not an ``nn.Module`` class or a Python function returning one are still
refused, but these are guards against mistakes, not a sandbox: run only configs you would run as scripts.
Outputs are written only as regular files inside the output folder, never through a link
(:mod:`medadv.safe_io`).

``model.train: {data: {source: mni152, ...}, epochs: 10, lr: 0.01}`` fits the network to built-in data with the
task's loss before it is evaluated (weights cached in medadv's cache folder under a hash of the network, task,
section and seed: :func:`trained_weights`); ``model.name`` names it for the studies; ``models: {name: {...}}``
adds networks for the studies that compare models (:func:`study_models`). An ``attacks`` entry may give its own
``budgets`` and ``target`` (:func:`build_target_fns`); ``report: {title, results}`` heads the HTML report and
``report: {window: lung}`` (or ``[width, level]``) sets its case figures' grey window (:mod:`medadv.report.windows`).

Data from files (:mod:`medadv.data.sources`) stream through MONAI transforms declared by class name, one
batch at a time, each case named by its file (``case_id``)::

    data: {source: files, images: "images/*.nii.gz", labels: "labels/*.nii.gz",
           transforms: [{name: Spacingd, pixdim: [2, 2, 2]}]}       # NIfTI, DICOM folders, PNG, .npy
    data: {source: datalist, path: dataset.json, key: validation}   # a MONAI / Decathlon datalist
    data: {source: csv, path: labels.csv, image_column: image}      # multi-label: the other columns, 0/1

``inference: {roi_size: 96, overlap: 0.5, sw_batch_size: 4, mode: gaussian}`` runs the model through
MONAI sliding-window inference (:class:`medadv.models.sliding.SlidingWindow`), so attacks perturb whole
volumes within a budget on the whole volume; HD95 then uses each case's voxel spacing from its header.
``save_adversarial: true`` writes the adversarial examples into ``<output>/adversarial/``.

Budgets and bounds are in the data's units: an L∞ budget above half the data range (``budgets: [8]`` on
``bounds: [0, 1]``, meant as 8/255) is refused unless ``allow_large_budgets: true``. Every registered attack is built from its name with its
defaults plus the parameters given (``medadv attacks --params NAME`` lists them); an unknown parameter
is an error naming the closest valid one. Attacks with an ε-ball (``threat_kind`` "ball" or
"ball_or_box") get one instance per budget, named ``label@budget``, on the ``threat`` ball; attacks
without one (``threat_kind`` "box": VAFA) get the threat's data box once, named ``label``, with
budget ``None``. Components are given by name: ``explanation: gradcam`` or
``explanation: {name: smoothgrad, n_samples: 8}``; GAP's ``generator: {checkpoint: gap.pt}``.

The config is checked against one schema (:mod:`medadv.config_schema`) before anything runs: an unknown
key is an error naming the closest valid one, at every level; values have types and ranges
(``batch_size >= 1``, ``data.n >= 1``, ``hd95`` a YAML boolean); budgets are numbers or fractions such as
``8/255``. ``medadv validate config.yaml`` checks a config (schema, task, attacks, target, model builder,
data files) without building the model, loading the data or running anything.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .attacks.base import Attack, attack_class, get_attack
from .config_schema import (
    FILE_SOURCES,
    AttackPlan,
    ConfigError,
    CsvData,
    CustomTask,
    DatalistData,
    DataSection,
    FilesData,
    InferenceSection,
    Mni152Data,
    ModelSection,
    NpzData,
    SyntheticData,
    TaskSection,
    ThreatSection,
    entry_label,
    is_code_path,
    validate_config,
    validate_section,
)
from .params import InvalidParameterError, closest
from .tasks import Task, available_tasks, task_class
from .threats import L2, Box, LargeBudgetWarning, Linf, Threat

__all__ = ["ConfigError", "CodeNotAllowedError", "RandomWeightsWarning", "TRUSTED_PACKAGES", "load_config", "build_model",
           "check_model", "model_name", "build_task", "build_data", "build_loader", "check_data", "data_identity",
           "wrap_inference", "config_fingerprint", "build_attacks", "build_target_fn", "build_target_fns", "check_target",
           "check_targets", "class_names"]

#: packages whose functions a config may name without ``allow_code``
TRUSTED_PACKAGES = ("medadv", "monai", "torchvision")

TargetFn = Callable[[Tensor, Tensor, Tensor], Tensor]


class RandomWeightsWarning(UserWarning):
    """The model of a config has no checkpoint: its (seeded) random weights are evaluated."""


class CodeNotAllowedError(ConfigError):
    """A config names code outside medadv/MONAI/torchvision or a Python file outside its folder, and the
    user has not opted in (``--allow-code`` or ``allow_code: true``)."""


_OPT_IN = ("pass --allow-code (or set `allow_code: true` in the config) if you trust it: a config that names "
           "code runs it")


def _trusted_module(spec: str) -> bool:
    return spec.partition(":")[0].split(".")[0] in TRUSTED_PACKAGES


def _inside(path: Path, base_dir: str | None) -> bool:
    if not base_dir:
        return False
    try:
        path.resolve().relative_to(Path(base_dir).resolve())
        return True
    except ValueError:
        return False


def _allow_module(spec: str, where: str, allow_code: bool) -> None:
    if not allow_code and not _trusted_module(spec):
        raise CodeNotAllowedError([f"`{where}` {spec!r} is code outside {', '.join(TRUSTED_PACKAGES)}: {_OPT_IN}"])


def _allow_network(fn: Any, where: str, allow_code: bool) -> None:
    """Without ``allow_code``, only what builds a network: an ``nn.Module`` subclass or a declared network factory
    (:func:`medadv.models.loading.builds_network`), decided from the resolved object before anything is called.
    Any other function of medadv, MONAI or torchvision is code (``monai.utils.module:optional_import`` imports any
    module, ``torchvision.datasets.utils:extract_archive`` writes anywhere)."""
    from .models.loading import builds_network

    if allow_code or builds_network(fn):
        return
    kind = (f"the class {fn.__qualname__}, not an nn.Module" if isinstance(fn, type) else
            f"a {type(fn).__name__} that is not a declared network factory")
    raise CodeNotAllowedError([f"{where} is {kind}: without --allow-code a config names only nn.Module classes and "
                               "the network factories medadv declares (torchvision's registered models, MONAI's "
                               f"networks, medadv.models builders); {_OPT_IN}"])


def _allow_target(spec: str, allow_code: bool) -> None:
    """A ``target`` naming a function runs it: outside medadv/MONAI/torchvision as any code, and inside them too
    (no function of theirs is declared a target function) only with ``allow_code``; decided from the text."""
    _allow_module(spec, "target", allow_code)
    if not allow_code:
        raise CodeNotAllowedError([f"`target` {spec!r} names a function, which medadv would call: without "
                                   f"--allow-code `target` is one of {', '.join(TARGET_KINDS)}; {_OPT_IN}"])


#: arguments of MONAI transforms that run code or write files (``Lambdad(func=...)``, ``SaveImaged(output_dir=...)``,
#: ``WriteFileMappingd(mapping_file_path=...)``): a transform taking one is named only with ``allow_code``
CODE_TRANSFORM_ARGS = ("func", "inv_func", "post_func", "saver", "writer", "output_dir", "data_root_dir",
                       "savepath_in_metadict", "mapping_file_path", "logger_handler")


def _reader_class(value: Any) -> bool:
    """Whether a ``reader`` value names one of MONAI's image readers (a key of ``SUPPORTED_READERS`` or an
    ``ImageReader`` subclass of ``monai.data``): anything else, a dotted path above all, is code that MONAI would
    locate and call with the transform's arguments."""
    import monai.data
    from monai.transforms.io.array import SUPPORTED_READERS

    if value is None:
        return True
    if isinstance(value, list | tuple):
        return all(_reader_class(v) for v in value)
    if not isinstance(value, str):
        return False
    if value.lower() in SUPPORTED_READERS:
        return True
    obj = getattr(monai.data, value, None) if value.isidentifier() else None
    return isinstance(obj, type) and issubclass(obj, monai.data.ImageReader)


def _allow_transforms(spec: Mapping[str, Any], allow_code: bool) -> None:
    """Without ``allow_code``, the data transforms a config names neither run code nor write files: no transform
    taking one of :data:`CODE_TRANSFORM_ARGS`, and a loader's ``reader`` one of MONAI's readers by name."""
    if allow_code:
        return
    conf = _file_source(spec)
    if conf is None or not conf.transforms:
        return
    from .data.sources import monai_transforms

    table = monai_transforms()
    for i, entry in enumerate(conf.transforms):
        cls = table.get(entry.name)
        if cls is None:
            continue
        try:
            params = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        code = [a for a in CODE_TRANSFORM_ARGS if a in params]
        if code:
            raise CodeNotAllowedError([f"`data.transforms[{i}]` {entry.name} takes `{code[0]}`: it runs code or writes "
                                       f"files, and a config does so only with --allow-code; {_OPT_IN}"])
        reader = entry.args().get("reader")
        if not _reader_class(reader):
            raise CodeNotAllowedError([f"`data.transforms[{i}].reader` {str(reader)[:80]!r} is not one of MONAI's "
                                       "image readers (ITKReader, NibabelReader, PILReader, PydicomReader, NumpyReader"
                                       f", ...): MONAI would import and call it; {_OPT_IN}"])


def _allow_file(path: Path, spec: str, where: str, base_dir: str | None, allow_code: bool) -> None:
    if not allow_code and not _inside(path, base_dir):
        raise CodeNotAllowedError([f"`{where}` {spec!r} is a Python file outside the config's folder "
                                   f"({path.resolve()}): {_OPT_IN}"])


@functools.cache
def _unique_key_loader() -> type:
    """A ``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    # `<<: *defaults` merges a mapping in (SafeLoader's flatten_mapping, in super() below); the
                    # keys given beside it override the merged ones, as YAML says: not a key given twice
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    twice = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    break
                if twice:
                    raise yaml.constructor.ConstructorError(None, None, f"key `{str(key)[:80]}` is given twice",
                                                            key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config file, checked against the schema (:mod:`medadv.config_schema`), as a plain mapping.

    Every section is there with its defaults filled in and its values normalised (budgets as floats,
    ``task.type`` in its canonical spelling); ``_dir`` is the config's folder (relative paths start there).
    Raises :class:`ConfigError` (one line per mistake) for a config that does not fit the schema.
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file not found: {p.resolve()}")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:  # a binary file, or text in another encoding: one line naming the file
        raise ConfigError([f"{p}: not a UTF-8 text file (byte 0x{data[e.start]:02x} at position {e.start}): a config "
                           "is YAML text; save it as UTF-8"]) from None
    try:
        raw = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise ConfigError([f"{p}: not valid YAML: nested too deeply"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError([f"{p}: not valid YAML{at}: {problem}"]) from None
    cfg = validate_config(raw).model_dump()
    if cfg["studies"] is not None:
        from .studies.schema import validate_studies

        # checked here (not in the schema) because each study has its own schema; every mistake at once
        # only the keys the config gave (`study` always): a default such as `bounds` (the attacks' box when
        # absent) must stay absent, not become an explicit null
        cfg["studies"] = [spec.model_dump(exclude_unset=True) for spec in validate_studies(cfg["studies"])]
        several = [s["study"] for s in cfg["studies"] if s["study"] in ("transfer", "models")]
        if several and not cfg["models"]:
            raise ConfigError([f"`studies`: {', '.join(map(repr, several))} compare several models, and the config "
                               "names one: add `models: {name: {monai: ..., ...}}` (more networks by name)"])
    cfg["_dir"] = str(p.parent.resolve())
    for m in [cfg["model"], *(cfg["models"] or {}).values()]:
        if m["seed"] is None:  # the model's random initial weights follow the config's seed
            m["seed"] = cfg["seed"]
    if cfg["models"] and study_model_name(cfg["model"]) in cfg["models"]:
        raise ConfigError([f"`models` has a model named {study_model_name(cfg['model'])!r}, the name of `model`: "
                           "give `model.name` (or rename the entry)"])
    return cfg


def study_model_name(spec: Mapping[str, Any]) -> str:
    """The name the studies know the config's ``model`` by: ``model.name``, else ``model``."""
    return str(spec.get("name") or "model")


def study_models(cfg: Mapping[str, Any], model: nn.Module, base_dir: str | None = None, *, allow_code: bool = True,
                 task: Task | None = None) -> dict[str, nn.Module]:
    """``{name: model}`` for the studies: the evaluated model first, then every entry of ``models`` built (and
    trained, for entries with ``train``) on the evaluated model's device."""
    out = {study_model_name(cfg["model"]): model}
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    for name, spec in (cfg.get("models") or {}).items():
        out[name] = wrap_inference(build_model(spec, base_dir, allow_code=allow_code, task=task),
                                   cfg.get("inference")).to(device)
    return out


def _check_call(fn: Callable[..., Any], kwargs: Mapping[str, Any], where: str, skip: tuple[str, ...] = ()) -> None:
    """Refuse keyword arguments ``fn`` does not take, naming the closest one it does."""
    from .models.loading import check_kwargs

    check_kwargs(fn, kwargs, where, required=False, skip=skip)


def _module_exists(spec: str, where: str) -> tuple[str, str]:
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


def _import(spec: str, where: str) -> Any:
    mod, name = _module_exists(spec, where)
    try:
        return getattr(importlib.import_module(mod), name)
    except AttributeError:
        raise ConfigError([f"`{where}` {spec!r}: module {mod!r} has no {name!r}"]) from None


def _relative(value: str, base_dir: str | None) -> Path:
    path = Path(value)
    return Path(base_dir) / path if base_dir and not path.is_absolute() else path


def _existing_file(value: str, base_dir: str | None, where: str, what: str = "file") -> Path:
    path = _relative(value, base_dir)
    if not path.is_file():
        relative = f" ({value!r} is relative to the config's folder)" if not Path(value).is_absolute() and base_dir \
            else ""
        there = "; a folder is there" if path.is_dir() else ""
        raise FileNotFoundError(f"`{where}`: file not found: {path.resolve()}{relative}{there}"
                                + (f" (expected {what})" if what != "file" else ""))
    return path


def _file_spec(name: str) -> tuple[str, str] | None:
    """``("path/to/file.py", "Name")`` for a builder given as a Python file, else ``None``."""
    left, colon, right = name.rpartition(":")
    return (left, right) if colon and left.endswith(".py") else None


def _network(conf: ModelSection, base_dir: str | None, *, load: bool,
             allow_code: bool = True) -> Callable[[], nn.Module] | None:
    """What builds the network (``None`` when ``load`` is false and only user code could tell more).

    Checked without building: the name resolves (with the closest valid one when it does not), the
    keyword arguments are ones the network takes, nothing downloads weights, files exist, and code
    outside medadv/MONAI/torchvision or a file outside the config's folder is named only with
    ``allow_code``. With ``load`` false no user module is imported and no user file is run: a Python
    file is read for its top-level names only, a ``package.module:function`` builder is looked at only
    if its module is already imported.
    """
    from .models import loading

    kind, name = conf.network()
    where = f"`model.{kind}` {name!r}"
    kwargs = dict(conf.kwargs)
    fn: Callable[..., Any]
    if kind == "torchscript":
        path = _existing_file(name, base_dir, "model.torchscript", "a TorchScript file written by torch.jit.save")
        if not load:
            return None

        def scripted() -> nn.Module:
            from .models.io import load_torchscript

            return load_torchscript(path, "cpu", where="`model.torchscript`")

        return scripted
    if kind == "zoo":  # published weights from an installed package: no code named, so no allow_code needed
        from .models import zoo

        try:
            zoo.check_kwargs(name, kwargs)
        except ValueError as e:
            raise ConfigError([f"`model.zoo`: {e}"]) from None
        if not load:  # `medadv validate`: the package and weights are looked up, not loaded
            why = zoo.missing(name) if "distribution" not in kwargs else None
            if why is not None:
                raise ConfigError([f"`model.zoo` {name!r}: {why}"])
            return None
        return functools.partial(zoo.load_model, name, **kwargs)
    # pretrained weights are refused by the argument's name, whatever module the builder comes from
    loading.refuse_downloads(kwargs, "model.kwargs")
    if kind == "monai":
        fn = loading.resolve_monai(name.rsplit(".", 1)[-1], "`model.monai`")
        kwargs = loading.no_download(fn, kwargs, "model.kwargs")
    elif kind == "torchvision":
        fn = loading.resolve_torchvision(name, "`model.torchvision`")
        kwargs = loading.no_download(fn, kwargs, "model.kwargs")
    elif (in_file := _file_spec(name)) is not None:
        path = _existing_file(in_file[0], base_dir, "model.builder", "a Python file")
        _allow_file(path, name, "model.builder", base_dir, allow_code)
        if not load:
            loading.check_file(path, in_file[1], where)
            return None
        fn = loading.import_file(path, in_file[1], where)
    elif ":" in name:
        # trust is decided from the text: finding the module imports its parent packages (their code runs)
        _allow_module(name, "model.builder", allow_code)
        mod, attr = _module_exists(name, "model.builder")
        # importing a user module runs its code: only find it (medadv, MONAI, torchvision are imported to check
        # that the name builds a network)
        if not load and mod not in sys.modules and not _trusted_module(name):
            return None
        fn = _import(name, "model.builder")
    else:
        from . import models

        builders = [n for n in getattr(models, "__all__", dir(models)) if callable(getattr(models, n, None))]
        if name.endswith(".py"):
            raise ConfigError([f"`model.builder` {name!r}: name the class or function after a colon, "
                               f"'{name}:Name'"])
        if not hasattr(models, name):
            c = closest(name, builders)
            hint = f"; did you mean {c!r}?" if c else ""
            raise ConfigError([f"`model.builder`: unknown model builder {name!r}{hint} (use a medadv.models builder, "
                               "'path/to/file.py:Name', 'package.module:function', or `monai:`/`torchvision:`)"])
        fn = getattr(models, name)
    # before anything is called: only what builds a network (a Python file beside the config is the user's own code,
    # trusted as the config is: _allow_file decided on it above)
    _allow_network(fn, where, allow_code or (kind == "builder" and _file_spec(name) is not None))
    loading.check_builder(fn, where)
    loading.check_kwargs(fn, kwargs, "model.kwargs")
    kwargs = loading.no_download(fn, kwargs, "model.kwargs")  # a default that downloads is switched off
    return functools.partial(loading.call_builder, fn, kwargs, where)


def model_name(spec: Mapping[str, Any]) -> str:
    """A short name of the configured network for reports: ``monai:UNet``, ``torchvision:resnet18``,
    ``builder:small_unet``, ``torchscript:model.pt``."""
    kind, name = validate_section(ModelSection, spec, ("model",)).network()
    return f"{kind}:{name}"


def check_model(spec: Mapping[str, Any], base_dir: str | None = None, *, allow_code: bool = True) -> None:
    """What :func:`build_model` would refuse, without building the model or running user code.

    The network's name resolves (MONAI/torchvision/medadv names with the closest valid one; a Python file
    exists and defines the name; an importable module exists), its keyword arguments are ones it takes,
    nothing would download weights, the checkpoint / TorchScript files exist and, with ``allow_code``
    false, no code outside medadv/MONAI/torchvision and no Python file outside the config's folder is named.
    """
    conf: ModelSection = validate_section(ModelSection, spec, ("model",))
    _network(conf, base_dir, load=False, allow_code=allow_code)
    _checkpoint(conf, base_dir)
    if conf.train is not None:
        _data_loader(conf.train.data.model_dump(), base_dir)


def _checkpoint(conf: ModelSection, base_dir: str | None) -> Path | None:
    if not conf.checkpoint:
        return None
    return _existing_file(conf.checkpoint, base_dir, "model.checkpoint")


def build_model(spec: Mapping[str, Any], base_dir: str | None = None, *, seed: int | None = None,
                allow_code: bool = True, task: Task | None = None) -> nn.Module:
    """The configured network in eval mode, with the checkpoint's weights when one is given.

    The network is built with torch's CPU random generator seeded with ``seed`` (else ``model.seed``, which
    :func:`load_config` sets to the config's ``seed``; else 0) inside :func:`torch.random.fork_rng`, so
    its initial weights are the same every run and the caller's random state is untouched. Without a
    checkpoint those random weights are what is evaluated: a warning says so. The checkpoint is read with
    ``weights_only=True`` and loaded strictly (:func:`medadv.models.io.load_checkpoint`).

    ``allow_code`` false (what ``medadv evaluate`` passes unless ``--allow-code`` or ``allow_code: true``)
    refuses builders outside medadv, MONAI and torchvision and Python files outside ``base_dir``
    (:class:`CodeNotAllowedError`) before anything runs. From Python it defaults to true: the caller is
    running code already.

    With ``model.train`` the network is then fitted to that data with ``task``'s loss (required then), or its
    trained weights are loaded from medadv's cache (:func:`trained_weights`).
    """
    from .models.io import load_checkpoint
    from .offline import no_network

    conf: ModelSection = validate_section(ModelSection, spec, ("model",))
    path = _checkpoint(conf, base_dir)  # a missing file is found before any user code runs
    make = _network(conf, base_dir, load=True, allow_code=allow_code)
    assert make is not None
    seed = seed if seed is not None else conf.seed if conf.seed is not None else 0
    with torch.random.fork_rng(devices=[]), no_network("while the model was built"):
        torch.manual_seed(seed)  # nothing downloads: a builder that tries to is stopped with a clear error
        model = make()
    if path is not None:
        load_checkpoint(path, model, strip_prefix=conf.strip_prefix, where="`model.checkpoint`")
    if conf.train is not None:
        if task is None:
            raise ValueError("`model.train` needs the task whose loss it minimises: pass `task=`")
        trained_weights(model, conf, task, base_dir, seed)
    elif path is None and conf.torchscript is None and conf.zoo is None:  # a zoo model has its weights
        kind, name = conf.network()
        warnings.warn(f"model {kind} {name!r} has no `checkpoint`: its weights are random, drawn with seed {seed} "
                      "(the same every run); give `model.checkpoint` to evaluate trained weights",
                      RandomWeightsWarning, stacklevel=2)
    return model.eval()


def trained_weights(model: nn.Module, conf: ModelSection, task: Task, base_dir: str | None, seed: int) -> Path:
    """Fit ``model`` in place as ``conf.train`` says, or load the weights a previous run cached; returns the file.

    The cache key hashes the network section (without ``train``/``name``), the task, the ``train`` section, the
    initial-weights seed and the checkpoint file's bytes, so a change to any of them trains anew."""
    import hashlib
    import json

    from .data.save import safe_name
    from .models.io import cache_dir, load_checkpoint, save_checkpoint
    from .training.supervised import fit_supervised

    tr = conf.train
    assert tr is not None
    net = conf.model_dump(exclude={"train", "name"})
    ckpt = _checkpoint(conf, base_dir)
    key = json.dumps({"net": net, "task": repr(task), "train": tr.model_dump(mode="json"), "seed": seed,
                      "checkpoint": hashlib.sha256(ckpt.read_bytes()).hexdigest() if ckpt else None},
                     sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    kind, name = conf.network()
    path = cache_dir("trained") / f"{safe_name(Path(name).name)}-{digest}.pt"
    if tr.cache and path.is_file():
        load_checkpoint(path, model, where=f"the cached weights {path}")
        return path
    x, y = build_data(tr.data.model_dump(), base_dir)
    x, y = x.to(next((p.device for p in model.parameters()), x.device)), y.to(x.device)
    fit_supervised(model, task, x, y, epochs=tr.epochs, batch_size=tr.batch_size, lr=tr.lr, seed=tr.seed)
    if tr.cache:
        save_checkpoint(path, model, key=key)
    return path


def _task_from_code(spec: str, allow_code: bool) -> type[Task]:
    """The Task class a config names by dotted path (``package.module:Class`` or ``package.module.Class``)."""
    path = spec if ":" in spec else ":".join(spec.rsplit(".", 1))
    _allow_module(path, "task.type", allow_code)  # from the text, before finding the module imports its package
    cls = _import(path, "task.type")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError([f"`task.type` {spec!r} is not a medadv Task subclass (got {cls!r}); name a class derived "
                           f"from medadv.tasks.Task, or one of the kinds {', '.join(available_tasks())}"])
    return cls


def task_class_of(spec: Mapping[str, Any], *, allow_code: bool = True) -> type[Task]:
    """The task class the ``task:`` section names (a registered kind or, with ``allow_code``, a dotted path)."""
    conf = validate_section(TaskSection, spec, ("task",))
    if isinstance(conf, CustomTask) and is_code_path(conf.type):
        return _task_from_code(conf.type, allow_code)
    return task_class(conf.type)


def build_task(spec: Mapping[str, Any], *, allow_code: bool = True) -> Task:
    """The task of a ``task:`` section: ``type`` is a registered kind (``medadv tasks`` lists them) or a Task class
    by dotted path (``package.module:Class``; code outside medadv only with ``allow_code``); the other keys are the
    class's parameters, checked against its schema (:meth:`~medadv.tasks.Task.config_schema`)."""
    cls = task_class_of(spec, allow_code=allow_code)
    conf = validate_section(TaskSection, spec, ("task",))
    if isinstance(conf, CustomTask):
        named = {**dict(spec), "type": cls.name} if cls.name in available_tasks() else dict(spec)
        conf = validate_section(cls.config_schema(), named, ("task",))
    kw = conf.model_dump(exclude={"type", "class_names"})  # class names are for the report
    try:
        return cls(**kw)
    except (ValueError, TypeError) as e:
        raise ConfigError([f"`task`: {e}"]) from None


def _label_source(task: Mapping[str, Any]) -> str | None:
    """The ``label_source`` of a registered kind named by ``task.type`` (``None`` for classes named by path)."""
    try:
        return task_class(str(task.get("type"))).label_source
    except InvalidParameterError:
        return None


def class_names(cfg: Mapping[str, Any]) -> list[str] | None:
    """The names of the classes / labels of a loaded config (:func:`load_config`), for the report.

    ``task.class_names`` when given; else the label columns of a multi-label ``csv`` source (its
    ``label_columns``, or every column but the image and id columns), or the tissue names of the built-in
    ``mni152`` source for a 4-class segmentation; else None (the report shows indices). A multi-label CSV
    whose label columns are not as many as the ``class_names`` given is a :class:`ConfigError`.
    """
    task, data = cfg["task"], cfg["data"]
    given = task.get("class_names")
    source = _label_source(task)
    if source == "vector" and data.get("source") == "csv" and data.get("label_column") is None:
        columns = data.get("label_columns")
        if columns is None:
            import csv

            path = _relative(str(data["path"]), cfg.get("_dir"))
            try:
                with path.open(newline="", encoding="utf-8-sig") as f:  # a byte-order mark is no column name
                    header = next(csv.reader(f), [])
            except (OSError, ValueError):  # check_data names a missing or undecodable CSV
                header = []
            columns = [c for c in header if c not in (data.get("image_column"), data.get("id_column"))] or None
        if columns is not None and given is not None and len(given) != len(columns):
            raise ConfigError([f"`task.class_names` lists {len(given)} names for the {len(columns)} label columns "
                               f"of `data` ({', '.join(columns)})"])
        return list(given or columns or []) or None
    if given is None and data.get("source") == "mni152" and source == "map" and task.get("num_classes") == 4:
        from .data.mni152 import TISSUE_CLASSES

        return list(TISSUE_CLASSES)
    return list(given) if given is not None else None



def _data_loader(spec: Mapping[str, Any], base_dir: str | None) -> Callable[[], tuple[Tensor, Tensor]]:
    """Check a built-in ``data`` section (names, files, arrays present) and return what loads it."""
    conf: Mni152Data | SyntheticData | NpzData = validate_section(DataSection, spec, ("data",))
    if isinstance(conf, FilesData | DatalistData | CsvData):
        raise ConfigError([f"`data.source: {conf.source}` streams cases from files: use build_loader(), which "
                           "returns a DataLoader of dict batches"])
    if isinstance(conf, NpzData):
        from .data.npz import npz_loader

        # every check of the archive (0 cases, damaged, complex) lives with the data sources
        return npz_loader(_relative(conf.path, base_dir), conf.n)
    kw = dict(conf.kwargs)
    fn: Callable[..., tuple[Tensor, Tensor]]
    if isinstance(conf, SyntheticData):
        from .data import synthetic

        kinds = ("segmentation_blobs", "multiclass_blobs", "multilabel_blobs")
        kind = kw.pop("kind", "segmentation_blobs")
        if kind not in kinds:
            c = closest(str(kind), kinds)
            raise ConfigError([f"`data.kwargs.kind` must be one of {', '.join(map(repr, kinds))}; got {kind!r}"
                               + (f"; did you mean {c!r}?" if c else "")])
        fn = getattr(synthetic, kind)
    else:
        from .data import mni152

        kind = kw.pop("kind", "patches")
        if kind not in mni152.KINDS:
            c = closest(str(kind), list(mni152.KINDS))
            raise ConfigError([f"`data.kwargs.kind` must be one of {', '.join(map(repr, mni152.KINDS))}; got {kind!r}"
                               + (f"; did you mean {c!r}?" if c else "")])
        fn = mni152.KINDS[kind]
    _check_call(fn, kw, "data.kwargs", skip=("n",))
    n = conf.n
    return lambda: fn(n=n, **kw)


def _file_source(spec: Mapping[str, Any]) -> FilesData | DatalistData | CsvData | None:
    conf = validate_section(DataSection, spec, ("data",))
    return conf if conf.source in FILE_SOURCES else None


def check_data(spec: Mapping[str, Any], base_dir: str | None = None, task: Task | None = None, *,
               allow_code: bool = True) -> None:
    """What :func:`build_loader` would refuse, without reading an image or an array.

    Built-in sources: the names, keyword arguments and files. File sources (``files``, ``datalist``,
    ``csv``): the files exist, the labels fit ``task``, and the MONAI transforms resolve, take the
    arguments given and name keys the cases have (:func:`medadv.data.sources.check_source`); with
    ``allow_code`` false, no transform runs code or writes files (:data:`CODE_TRANSFORM_ARGS`, a ``reader``
    that is not one of MONAI's by name).
    """
    _allow_transforms(spec, allow_code)  # before any transform is built: building one may import and call code
    conf = _file_source(spec)
    if conf is None:
        _data_loader(spec, base_dir)
        return
    from .data.sources import check_source

    check_source(conf, base_dir, task.label_source if task is not None else None)


def build_data(spec: Mapping[str, Any], base_dir: str | None = None) -> tuple[Tensor, Tensor]:
    """The ``(x, y)`` tensors of a built-in source (``mni152``, ``synthetic``, ``npz``); for any source,
    :func:`build_loader` streams batches."""
    return _data_loader(spec, base_dir)()


def build_loader(spec: Mapping[str, Any], base_dir: str | None = None, *, batch_size: int = 8,
                 task: Task | None = None, seed: int = 0, allow_code: bool = True) -> Iterable[Any]:
    """The configured data as an iterable of batches, in a fixed order.

    File sources stream MONAI-collated dict batches (``image``, ``label``, ``case_id``; see
    :mod:`medadv.data.sources`) through a ``DataLoader``: only one batch is read at a time. Built-in
    sources give ``(x, y)`` tensor batches. ``allow_code`` false refuses transforms that run code or write
    files (:func:`check_data`).
    """
    _allow_transforms(spec, allow_code)
    conf = _file_source(spec)
    if conf is not None:
        from .data.sources import make_loader

        return make_loader(conf, base_dir, batch_size=batch_size, label_source=task.label_source if task is not None else None,
                           seed=seed)
    x, y = build_data(spec, base_dir)
    if task is not None:  # class indices and label maps are integers: refused before any batch is attacked
        from .data.npz import check_integer_labels

        check_integer_labels(y, spec, task.label_source)
    return [(x[i: i + batch_size], y[i: i + batch_size]) for i in range(0, x.shape[0], batch_size)]


def data_identity(spec: Mapping[str, Any], base_dir: str | None = None) -> Any:
    """What identifies the data beyond the config: ``[path, size, mtime_ns]`` of every file read (the
    cases of a file source and their datalist/CSV, an ``.npz``); built-in sources are their settings."""
    conf = _file_source(spec)
    if conf is not None:
        from .data.sources import data_identity as files_identity

        return files_identity(conf, base_dir)
    npz = validate_section(DataSection, spec, ("data",))
    if isinstance(npz, NpzData):
        path = _relative(npz.path, base_dir)
        if path.is_file():
            st = path.stat()
            return [[str(path.resolve()), st.st_size, st.st_mtime_ns]]
    return []


def wrap_inference(model: nn.Module, spec: Mapping[str, Any] | None) -> nn.Module:
    """``model`` behind MONAI sliding-window inference when the config has an ``inference`` section.

    The wrapper (:class:`medadv.models.sliding.SlidingWindow`) takes whole volumes: attacks perturb the
    whole volume, under a budget on the whole volume, and the gradient flows through every window.
    """
    if spec is None:
        return model
    from .models.sliding import SlidingWindow

    conf: InferenceSection = validate_section(InferenceSection, spec, ("inference",))
    return SlidingWindow(model, conf.roi_size, overlap=conf.overlap, mode=conf.mode,
                         sw_batch_size=conf.sw_batch_size, checkpoint=conf.checkpoint)


def _file_state(path: Path) -> list[Any]:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def config_fingerprint(cfg: Mapping[str, Any]) -> str:
    """A short hash of a loaded config (:func:`load_config`) and of what it reads: every setting but
    ``output``, the data's identity (:func:`data_identity`) and the size and modification time of the
    model's files (checkpoint, TorchScript, Python builder). ``medadv evaluate`` resumes into an output
    folder only when it holds results of the same fingerprint."""
    from .params import stable_hash

    base = cfg.get("_dir")
    # what only changes the report (class names, how many cases it draws) does not change the results
    settings = {k: v for k, v in cfg.items() if k not in ("output", "_dir", "cases")}
    if isinstance(settings.get("task"), Mapping):
        settings["task"] = {k: v for k, v in settings["task"].items() if k != "class_names"}
    files = []
    model = cfg.get("model") or {}
    named = [model.get("checkpoint"), model.get("torchscript")]
    if isinstance(model.get("builder"), str) and (spec := _file_spec(model["builder"])) is not None:
        named.append(spec[0])
    for value in named:
        if isinstance(value, str) and (path := _relative(value, base)).is_file():
            files.append(_file_state(path))
    return stable_hash({"config": settings, "data": data_identity(cfg["data"], base), "files": files})


def _box(spec: ThreatSection, task: Task) -> Box:
    """The data box of ``threat.bounds``, as the task's inputs need it (:meth:`Task.input_box`)."""
    b = spec.bounds
    box = task.input_box(None, None) if b is None else task.input_box(b[0], b[1])
    assert isinstance(box, Box)
    return box


def _threat(spec: ThreatSection, eps: float, task: Task, allow_large: bool = False) -> Threat:
    with warnings.catch_warnings():
        if allow_large:  # the config opted in (`allow_large_budgets: true`): no warning on top
            warnings.simplefilter("ignore", LargeBudgetWarning)
        return (Linf if spec.norm == "linf" else L2)(eps, bounds=_box(spec, task))


def _relative_paths(value: Any, base_dir: str | None) -> Any:
    """Component files (``generator: {checkpoint: gap.pt}``) are relative to the config's folder, like
    ``model.checkpoint`` and ``data.path``."""
    if base_dir and isinstance(value, Mapping) and isinstance(value.get("checkpoint"), str):
        path = Path(value["checkpoint"])
        if not path.is_absolute():
            return {**value, "checkpoint": str(Path(base_dir) / path)}
    return value


def build_attacks(cfg: Mapping[str, Any], task: Task) -> dict[str, Attack]:
    """Every attack of the config, by label.

    Ball attacks (``threat_kind`` "ball" or "ball_or_box") get one instance per entry of ``budgets`` on
    the ``threat`` ball, named ``label@budget``; box attacks (``threat_kind`` "box") get the threat's data
    box once, named ``label`` (their budget is ``None``). ``label`` defaults to the attack's name. The
    other keys of an entry are the attack's parameters (validated by its declarations; an unknown key is
    an error naming the closest valid parameter).
    """
    plan: AttackPlan = validate_section(AttackPlan, cfg)
    box = _box(plan.threat, task)
    out: dict[str, Attack] = {}
    for entry in plan.attacks:
        cls = attack_class(entry.name)  # an unknown name gets the closest registered one
        # to run one attack with two settings, give each entry an `id` (or a `label`)
        label, params = entry.entry_name(cls.param_names(), cls.name)
        params = {k: _relative_paths(v, cfg.get("_dir")) for k, v in params.items()}
        made: dict[str, Threat | Box]
        if cls.threat_kind == "box":
            made = {label: box}
        else:
            budgets = list(entry.budgets) if entry.budgets is not None else plan.budget_list()
            if budgets is None:
                raise ConfigError([f"`attacks` entry {label!r} needs an ε: give `budgets: [...]` (or `threat.eps`) "
                                   "in data units, e.g. budgets: [8/255]"])
            made = {f"{label}@{eps:.6g}": _threat(plan.threat, eps, task, plan.allow_large_budgets) for eps in budgets}
        for key, threat in made.items():
            if key in out:
                raise ConfigError([f"two `attacks` entries are both called {label!r}; give them distinct `id`s"])
            try:
                out[key] = get_attack(cls.name, task, threat, **params)
                if getattr(out[key], "trained", True) is False:  # refuse before any other attack runs
                    raise InvalidParameterError(
                        "the generator of GAP is built fresh from its name and untrained: give "
                        "`generator: {checkpoint: gap.pt}` (a file written by medadv.GAPTrainer)")
            except InvalidParameterError as e:
                raise InvalidParameterError(f"`attacks` entry {label!r}: {e}") from None
    return out


# --- targets of targeted attacks ---------------------------------------------------------------------------------
def _named(fn: TargetFn, name: str) -> TargetFn:
    # evaluate() puts the target function's name in the resume fingerprint: give each kind its own
    fn.__qualname__ = fn.__name__ = name
    return fn


def build_target_fn(spec: str | None, task: Task, *, allow_code: bool = True) -> TargetFn | None:
    """``target_fn(x, y, clean_logits) -> target`` for targeted attacks, from the config's ``target``.

    * ``background``: class 0 everywhere (segmentation: an all-background map, DAG's type-A target;
      multi-class: class 0; multi-label: no label);
    * ``least_likely``: the clean prediction's least-likely class (per voxel for segmentation, the
      flipped prediction of every label for multi-label);
    * ``dag_b``, ``dag_c`` (segmentation): Paschali et al.'s DAG targets from the true label map: type B
      (:func:`~medadv.attacks.dag.dag_target_b`: 5 % of the foreground voxels to one other foreground class,
      drawn with a generator seeded per call, so every run draws the same) and type C
      (:func:`~medadv.attacks.dag.dag_target_c`: class 1 grown by 6 steps of the cross element over the other
      foreground classes); type A is ``background``;
    * ``package.module:function``: your own ``function(x, y, clean_logits) -> target`` (outside medadv,
      MONAI and torchvision only with ``allow_code``).
    """
    if spec is None:
        return None
    if not isinstance(spec, str):
        raise ValueError(f"`target` must be background, least_likely or 'package.module:function', got {spec!r}")
    if ":" in spec:
        _allow_target(spec, allow_code)  # from the text, before finding the module imports its package
        _module_exists(spec, "target")
        return _import(spec, "target")
    kind = spec.lower()
    if kind == "background":
        def background(x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
            return torch.zeros_like(y)

        return _named(background, "target:background")
    if kind == "least_likely":
        if not task.class_scores:  # values (regression) have no least-likely class: refused before any work
            raise ValueError(f"`target: least_likely` needs class scores, and the outputs of {task!r} are values: "
                             "give your own `target: package.module:function`")

        def least_likely(x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
            return task.least_likely(logits).to(y.dtype)

        return _named(least_likely, "target:least_likely")
    if kind in ("dag_b", "dag_c"):
        if not task.spatial_labels:
            raise ValueError(f"`target: {kind}` is a DAG target (Paschali et al.) made from a label map: it needs a "
                             f"segmentation task, got {task!r}; use background or least_likely")
        from .attacks.dag import dag_target_b, dag_target_c

        if kind == "dag_b":
            def dag_b(x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
                return dag_target_b(y, generator=torch.Generator().manual_seed(0))[0]

            return _named(dag_b, "target:dag_b")

        def dag_c(x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
            return dag_target_c(y, cls=1)[0]

        return _named(dag_c, "target:dag_c")
    c = closest(kind, TARGET_KINDS)
    hint = f"; did you mean {c!r}?" if c else ""
    raise ValueError(f"`target` must be one of {', '.join(TARGET_KINDS)} or 'package.module:function', got "
                     f"{spec!r}{hint}")


#: the built-in ``target`` kinds (:func:`build_target_fn`)
TARGET_KINDS = ("background", "least_likely", "dag_b", "dag_c")


def build_target_fns(cfg: Mapping[str, Any], task: Task, attacks: Mapping[str, Attack], *,
                     allow_code: bool = True) -> TargetFn | dict[str, TargetFn] | None:
    """The config's ``target`` function, or ``{attack name: fn}`` when an ``attacks`` entry gives its own
    ``target`` (the others keep the config's). What :func:`medadv.evaluate` takes as ``target_fn``."""
    plan: AttackPlan = validate_section(AttackPlan, cfg)
    default = build_target_fn(cfg.get("target"), task, allow_code=allow_code)
    own = {}
    for entry in plan.attacks:
        if entry.target is None:
            continue
        cls = attack_class(entry.name)
        label, _ = entry.entry_name(cls.param_names(), cls.name)
        own[label] = build_target_fn(entry.target, task, allow_code=allow_code)
    if not own:
        return default
    out: dict[str, TargetFn] = {}
    for key in attacks:
        fn = own.get(entry_label(key), default)
        if fn is not None:
            out[key] = fn
    return out


def check_target(spec: str | None, task: Task, *, allow_code: bool = True) -> None:
    """What :func:`build_target_fn` would refuse, without importing a user module."""
    if isinstance(spec, str) and ":" in spec:
        _allow_target(spec, allow_code)  # from the text, before finding the module imports its package
        _module_exists(spec, "target")
    else:
        build_target_fn(spec, task)


def check_targets(attacks: Mapping[str, Attack], target: str | None,
                  own: Mapping[str, Any] | None = None) -> None:
    """Targeted attacks need a ``target`` in the config (or their entry's own, ``own``: a :func:`build_target_fns`
    mapping)."""
    targeted = [k for k, a in attacks.items() if (a.targeted or a.always_targeted) and not (own and k in own)]
    if targeted and target is None:
        raise ConfigError([f"attack(s) {', '.join(targeted)} are targeted; give "
                           "`target: background | least_likely | package.module:function` in the config"])
