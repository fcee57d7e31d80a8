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
section and seed: :func:`trained_weights`); ``train: {..., defense: {name: pgd_at, eps: 8/255, steps: 4}}`` trains it
with a training strategy of :mod:`medadv.defenses` instead (adversarial training, in the data box of ``threat``);
``model.name`` names it for the studies; ``models: {name: {...}}``
adds networks for the studies that compare models (:func:`study_models`). An ``attacks`` entry may give its own
``budgets``, ``target`` (:func:`build_target_fns`) and ``norm`` (its ε-ball's, instead of ``threat.norm``); ``report: {title, results}`` heads the HTML report and
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

The builders take the typed sections of :mod:`medadv.config_schema` (``ModelSection``, ``Config``, ...), as a
:class:`medadv.run.Plan` holds them (read and checked once; what ``medadv evaluate`` and ``medadv validate`` use), or
plain mappings, validated once at the boundary. The data builders live in :mod:`medadv.config.data` and the targets
of targeted attacks in :mod:`medadv.config.targets`; both are re-exported here.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from ..attacks.base import Attack, attack_class, get_attack
from ..config_schema import (
    AttackPlan,
    Config,
    ConfigError,
    CustomTask,
    InferenceSection,
    ModelSection,
    TaskSection,
    ThreatSection,
    is_code_path,
    validate_config,
    validate_section,
)
from ..params import InvalidParameterError, closest
from ..tasks import Task, available_tasks, task_class
from ..threats import L2, Box, LargeBudgetWarning, Linf, Threat
from .data import (
    CODE_TRANSFORM_ARGS,
    _relative,
    build_data,
    build_loader,
    check_data,
    data_identity,
)
from .targets import (
    TARGET_KINDS,
    TargetFn,
    attack_plan,
    build_target_fn,
    build_target_fns,
    check_target,
    check_targets,
)
from .trust import TRUSTED_PACKAGES, CodeNotAllowedError
from .trust import allow_file as _allow_file
from .trust import allow_module as _allow_module
from .trust import allow_network as _allow_network
from .trust import import_code as _import
from .trust import module_exists as _module_exists
from .trust import trusted_module as _trusted_module

__all__ = ["ConfigError", "CodeNotAllowedError", "RandomWeightsWarning", "TRUSTED_PACKAGES", "CODE_TRANSFORM_ARGS",
           "TARGET_KINDS", "load_config", "read_config_file", "normalise_config", "config_dict", "model_section",
           "task_section", "study_model_name", "study_models", "build_model", "threat_box", "check_model", "model_name", "build_task",
           "build_data", "build_loader", "check_data", "data_identity",
           "wrap_inference", "config_fingerprint", "build_attacks", "build_target_fn", "build_target_fns", "check_target",
           "check_targets", "class_names", "TargetFn"]

class RandomWeightsWarning(UserWarning):
    """The model of a config has no checkpoint: its (seeded) random weights are evaluated."""


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


def read_config_file(path: str | os.PathLike) -> Any:
    """The YAML of a config file, parsed (a key given twice is refused) but not yet checked against the schema.

    Raises ``FileNotFoundError`` for a missing file and :class:`ConfigError` (one line naming the file) for text
    that is not UTF-8 or not YAML."""
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
        return yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise ConfigError([f"{p}: not valid YAML: nested too deeply"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError([f"{p}: not valid YAML{at}: {problem}"]) from None


def _study_name(entry: Any) -> Any:
    """The study an entry of ``studies:`` names (a bare name, or the ``study`` of a mapping or a spec)."""
    if isinstance(entry, Mapping):
        return entry.get("study")
    return getattr(entry, "study", entry)


def normalise_config(conf: Config) -> Config:
    """A checked copy of ``conf`` with what the schema alone cannot settle settled (``conf`` is not changed).

    Each model's ``seed`` defaults to the config's ``seed`` (its random initial weights follow it); a study that
    compares models needs ``models``; no entry of ``models`` may take the evaluated model's name."""
    several = [n for n in map(_study_name, conf.studies or []) if n in ("transfer", "models")]
    if several and not conf.models:
        raise ConfigError([f"`studies`: {', '.join(map(repr, several))} compare several models, and the config "
                           "names one: add `models: {name: {monai: ..., ...}}` (more networks by name)"])
    conf = conf.model_copy(deep=True)
    for m in [conf.model, *(conf.models or {}).values()]:
        if m.seed is None:  # the model's random initial weights follow the config's seed
            m.seed = conf.seed
    if conf.models and study_model_name(conf.model) in conf.models:
        raise ConfigError([f"`models` has a model named {study_model_name(conf.model)!r}, the name of `model`: "
                           "give `model.name` (or rename the entry)"])
    return conf


def config_dict(conf: Config, base_dir: str | None, studies: list[Any] | None = None) -> dict[str, Any]:
    """The plain mapping :func:`load_config` returns, from a checked config: every section with its defaults, ``_dir``
    the config's folder. ``studies`` replaces the ``studies`` entries (checked specs: only the keys given)."""
    cfg = conf.model_dump()
    if studies is not None:
        # only the keys the config gave (`study` always): a default such as `bounds` (the attacks' box when absent)
        # must stay absent, not become an explicit null
        cfg["studies"] = [s.model_dump(exclude_unset=True) if hasattr(s, "model_dump") else s for s in studies]
    elif cfg["studies"] is not None:
        cfg["studies"] = [s if isinstance(s, Mapping) else {"study": s} for s in cfg["studies"]]
    cfg["_dir"] = base_dir
    return cfg


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config file, checked against the schema (:mod:`medadv.config_schema`), as a plain mapping.

    Every section is there with its defaults filled in and its values normalised (budgets as floats,
    ``task.type`` in its canonical spelling); ``_dir`` is the config's folder (relative paths start there).
    Raises :class:`ConfigError` (one line per mistake) for a config that does not fit the schema.

    The entries of ``studies:`` are given as written (a bare name as ``{study: name}``): each study's own schema
    checks them in :class:`medadv.run.Plan` (``Plan.from_yaml(path).to_dict()`` is this mapping with the studies
    checked), which is what ``medadv evaluate`` and ``medadv validate`` read.
    """
    p = Path(path)
    conf = normalise_config(validate_config(read_config_file(p)))
    return config_dict(conf, str(p.parent.resolve()))


def study_model_name(spec: ModelSection | Mapping[str, Any]) -> str:
    """The name the studies know the config's ``model`` by: ``model.name``, else ``model``."""
    name = spec.name if isinstance(spec, ModelSection) else spec.get("name")
    return str(name or "model")


def study_models(cfg: Config | Mapping[str, Any], model: nn.Module, base_dir: str | None = None, *,
                 allow_code: bool = True, task: Task | None = None) -> dict[str, nn.Module]:
    """``{name: model}`` for the studies: the evaluated model first, then every entry of ``models`` built (and
    trained, for entries with ``train``; with its ``train.defense`` in the data box of the config's ``threat``) on the
    evaluated model's device. ``cfg``: a typed config or a loaded one (:func:`load_config`)."""
    if isinstance(cfg, Config):
        main_spec: Any = cfg.model
        extra: Mapping[str, Any] = cfg.models or {}
        inference: Any = cfg.inference
        threat: Any = cfg.threat
    else:
        main_spec, extra, inference = cfg["model"], cfg.get("models") or {}, cfg.get("inference")
        threat = cfg.get("threat")
    out = {study_model_name(main_spec): model}
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    box = threat_box(threat, task) if task is not None and threat is not None else None
    for name, spec in extra.items():
        out[name] = wrap_inference(build_model(spec, base_dir, allow_code=allow_code, task=task, box=box),
                                   inference).to(device)
    return out


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
    from ..models import loading

    kind, name = conf.network()
    where = f"`model.{kind}` {name!r}"
    kwargs = dict(conf.kwargs)
    fn: Callable[..., Any]
    if kind == "torchscript":
        path = _existing_file(name, base_dir, "model.torchscript", "a TorchScript file written by torch.jit.save")
        if not load:
            return None

        def scripted() -> nn.Module:
            from ..models.io import load_torchscript

            return load_torchscript(path, "cpu", where="`model.torchscript`")

        return scripted
    if kind == "zoo":  # published weights from an installed package: no code named, so no allow_code needed
        from ..models import zoo

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
        from .. import models

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


def model_section(spec: ModelSection | Mapping[str, Any], where: str = "model") -> ModelSection:
    """``spec`` as a typed :class:`~medadv.config_schema.ModelSection`: one as it is, a mapping checked once here."""
    if isinstance(spec, ModelSection):
        return spec
    if not isinstance(spec, Mapping):
        raise ConfigError([f"`{where}` must be a mapping or a ModelSection; got {type(spec).__name__}"])
    return validate_section(ModelSection, spec, tuple(where.split(".")))  # type: ignore[no-any-return]


def model_name(spec: ModelSection | Mapping[str, Any]) -> str:
    """A short name of the configured network for reports: ``monai:UNet``, ``torchvision:resnet18``,
    ``builder:small_unet``, ``torchscript:model.pt``."""
    kind, name = model_section(spec).network()
    return f"{kind}:{name}"


def check_model(spec: ModelSection | Mapping[str, Any], base_dir: str | None = None, *, allow_code: bool = True) -> None:
    """What :func:`build_model` would refuse, without building the model or running user code.

    The network's name resolves (MONAI/torchvision/medadv names with the closest valid one; a Python file
    exists and defines the name; an importable module exists), its keyword arguments are ones it takes,
    nothing would download weights, the checkpoint / TorchScript files exist and, with ``allow_code``
    false, no code outside medadv/MONAI/torchvision and no Python file outside the config's folder is named.
    """
    conf = model_section(spec)
    _network(conf, base_dir, load=False, allow_code=allow_code)
    _checkpoint(conf, base_dir)
    if conf.train is not None:
        from .data import _data_loader

        _data_loader(conf.train.data, base_dir)


def _checkpoint(conf: ModelSection, base_dir: str | None) -> Path | None:
    if not conf.checkpoint:
        return None
    return _existing_file(conf.checkpoint, base_dir, "model.checkpoint")


def build_model(spec: ModelSection | Mapping[str, Any], base_dir: str | None = None, *, seed: int | None = None,
                allow_code: bool = True, task: Task | None = None, box: Box | None = None) -> nn.Module:
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
    trained weights are loaded from medadv's cache (:func:`trained_weights`); ``box`` is the data box that a
    ``train.defense`` trains in (:func:`threat_box` of the config's ``threat``).
    """
    from ..models.io import load_checkpoint
    from ..offline import no_network

    conf = model_section(spec)
    if box is not None and not isinstance(box, Box):
        raise TypeError(f"`box` must be a medadv.threats.Box or None; got {type(box).__name__}")
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
        trained_weights(model, conf, task, base_dir, seed, box=box)
    elif path is None and conf.torchscript is None and conf.zoo is None:  # a zoo model has its weights
        kind, name = conf.network()
        warnings.warn(f"model {kind} {name!r} has no `checkpoint`: its weights are random, drawn with seed {seed} "
                      "(the same every run); give `model.checkpoint` to evaluate trained weights",
                      RandomWeightsWarning, stacklevel=2)
    return model.eval()


def trained_weights(model: nn.Module, conf: ModelSection, task: Task, base_dir: str | None, seed: int, *,
                    box: Box | None = None) -> Path:
    """Fit ``model`` in place as ``conf.train`` says, or load the weights a previous run cached; returns the file.

    Without ``train.defense`` the network is fitted with the task's loss (:func:`~medadv.training.fit_supervised`);
    with one, by :class:`~medadv.defenses.trainer.AdversarialTrainer` with that strategy
    (:func:`medadv.defenses.strategies.build_strategy`: an ε-ball strategy trains in the L∞ ball of its ``eps`` on
    ``box``, which MPAdvT and VAFT need too). The cache key hashes the network section (without ``train``/``name``),
    the task, the ``train`` section (its defense included), the initial-weights seed and the checkpoint file's bytes,
    so a change to any of them trains anew."""
    import hashlib
    import json

    from ..data.save import safe_name
    from ..models.io import cache_dir, load_checkpoint, save_checkpoint

    tr = conf.train
    assert tr is not None
    strategy = _defense_strategy(tr.defense, box)  # a strategy that cannot be built is refused before any training
    net = conf.model_dump(exclude={"train", "name"})
    ckpt = _checkpoint(conf, base_dir)
    # without a defense the section dumps as it did before `defense` existed: weights cached then still load
    key = json.dumps({"net": net, "task": repr(task), "train": tr.model_dump(mode="json"), "seed": seed,
                      "checkpoint": hashlib.sha256(ckpt.read_bytes()).hexdigest() if ckpt else None},
                     sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    kind, name = conf.network()
    path = cache_dir("trained") / f"{safe_name(Path(name).name)}-{digest}.pt"
    if tr.cache and path.is_file():
        load_checkpoint(path, model, where=f"the cached weights {path}")
        return path
    x, y = build_data(tr.data, base_dir)
    x, y = x.to(next((p.device for p in model.parameters()), x.device)), y.to(x.device)
    if strategy is None:
        from ..training.supervised import fit_supervised

        fit_supervised(model, task, x, y, epochs=tr.epochs, batch_size=tr.batch_size, lr=tr.lr, seed=tr.seed)
    else:
        from ..defenses.trainer import AdversarialTrainer
        from ..runtime import model_device

        dev = model_device(model, x.device)
        # a layer's own draws (dropout) use the global RNG: forked and seeded, so the same section gives the same
        # weights, and the caller's random stream is not advanced
        with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
            torch.manual_seed(tr.seed)
            AdversarialTrainer(model, task, strategy, epochs=tr.epochs, batch_size=tr.batch_size, lr=tr.lr,
                               seed=tr.seed).fit(x, y)
    if tr.cache:
        save_checkpoint(path, model, key=key)
    return path


def _defense_strategy(entry: Mapping[str, Any] | None, box: Box | None) -> Any:
    """The training strategy of ``model.train.defense`` (``None``: plain training), on the data box ``box``."""
    if entry is None:
        return None
    from ..defenses.strategies import build_strategy

    try:
        return build_strategy(entry, threat=None, box=box)
    except ValueError as e:
        why = str(e)
        if box is None and "box" in why:  # from Python: the config's `threat.bounds` is not known here
            why = f"strategy {entry['name']!r} needs the data box: pass `box=` (config.threat_box(threat, task))"
        raise ConfigError([f"`model.train.defense`: {why}"]) from None


def _task_from_code(spec: str, allow_code: bool) -> type[Task]:
    """The Task class a config names by dotted path (``package.module:Class`` or ``package.module.Class``)."""
    path = spec if ":" in spec else ":".join(spec.rsplit(".", 1))
    _allow_module(path, "task.type", allow_code)  # from the text, before finding the module imports its package
    cls = _import(path, "task.type")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError([f"`task.type` {spec!r} is not a medadv Task subclass (got {cls!r}); name a class derived "
                           f"from medadv.tasks.Task, or one of the kinds {', '.join(available_tasks())}"])
    return cls


def task_section(spec: BaseModel | Mapping[str, Any]) -> BaseModel:
    """The ``task:`` section typed (one of :data:`~medadv.config_schema.TaskSection`'s models as it is; a mapping
    checked once here)."""
    if isinstance(spec, BaseModel):
        return spec
    if not isinstance(spec, Mapping):
        raise ConfigError([f"`task` must be a mapping or a task section; got {type(spec).__name__}"])
    return validate_section(TaskSection, spec, ("task",))  # type: ignore[no-any-return]


def task_class_of(spec: BaseModel | Mapping[str, Any], *, allow_code: bool = True) -> type[Task]:
    """The task class the ``task:`` section names (a registered kind or, with ``allow_code``, a dotted path)."""
    conf: Any = task_section(spec)
    if isinstance(conf, CustomTask) and is_code_path(conf.type):
        return _task_from_code(conf.type, allow_code)
    return task_class(conf.type)


def build_task(spec: BaseModel | Mapping[str, Any], *, allow_code: bool = True) -> Task:
    """The task of a ``task:`` section: ``type`` is a registered kind (``medadv tasks`` lists them) or a Task class
    by dotted path (``package.module:Class``; code outside medadv only with ``allow_code``); the other keys are the
    class's parameters, checked against its schema (:meth:`~medadv.tasks.Task.config_schema`)."""
    conf: Any = task_section(spec)
    cls = task_class_of(conf, allow_code=allow_code)
    if isinstance(conf, CustomTask):  # a class named by path, or a kind with a schema of its own: its keys checked now
        given = dict(spec) if isinstance(spec, Mapping) else conf.model_dump(exclude_unset=True)
        named = {**given, "type": cls.name} if cls.name in available_tasks() else given
        conf = validate_section(cls.config_schema(), named, ("task",))
    kw = conf.model_dump(exclude={"type", "class_names"})  # class names are for the report
    try:
        return cls(**kw)
    except (ValueError, TypeError) as e:
        raise ConfigError([f"`task`: {e}"]) from None


def _get(section: Any, key: str) -> Any:
    """A key of a section, typed (an attribute; absent: None) or a loaded mapping."""
    return section.get(key) if isinstance(section, Mapping) else getattr(section, key, None)


def _label_source(task: Any) -> str | None:
    """The ``label_source`` of a registered kind named by ``task.type`` (``None`` for classes named by path)."""
    try:
        return task_class(str(_get(task, "type"))).label_source
    except InvalidParameterError:
        return None


def class_names(cfg: Config | Mapping[str, Any], base_dir: str | None = None) -> list[str] | None:
    """The names of the classes / labels of a config (typed, relative paths from ``base_dir``; or loaded by
    :func:`load_config`, from its ``_dir``), for the report.

    ``task.class_names`` when given; else the label columns of a multi-label ``csv`` source (its
    ``label_columns``, or every column but the image and id columns), or the tissue names of the built-in
    ``mni152`` source for a 4-class segmentation; else None (the report shows indices). A multi-label CSV
    whose label columns are not as many as the ``class_names`` given is a :class:`ConfigError`.
    """
    if isinstance(cfg, Config):
        task, data = cfg.task, cfg.data
    else:
        task, data, base_dir = cfg["task"], cfg["data"], cfg.get("_dir")
    given = _get(task, "class_names")
    source = _label_source(task)
    if source == "vector" and _get(data, "source") == "csv" and _get(data, "label_column") is None:
        columns = _get(data, "label_columns")
        if columns is None:
            import csv

            path = _relative(str(_get(data, "path")), base_dir)
            try:
                with path.open(newline="", encoding="utf-8-sig") as f:  # a byte-order mark is no column name
                    header = next(csv.reader(f), [])
            except (OSError, ValueError):  # check_data names a missing or undecodable CSV
                header = []
            columns = [c for c in header if c not in (_get(data, "image_column"), _get(data, "id_column"))] or None
        if columns is not None and given is not None and len(given) != len(columns):
            raise ConfigError([f"`task.class_names` lists {len(given)} names for the {len(columns)} label columns "
                               f"of `data` ({', '.join(columns)})"])
        return list(given or columns or []) or None
    if given is None and _get(data, "source") == "mni152" and source == "map" and _get(task, "num_classes") == 4:
        from ..data.mni152 import TISSUE_CLASSES

        return list(TISSUE_CLASSES)
    return list(given) if given is not None else None


def wrap_inference(model: nn.Module, spec: InferenceSection | Mapping[str, Any] | None) -> nn.Module:
    """``model`` behind MONAI sliding-window inference when the config has an ``inference`` section.

    The wrapper (:class:`medadv.models.sliding.SlidingWindow`) takes whole volumes: attacks perturb the
    whole volume, under a budget on the whole volume, and the gradient flows through every window.
    """
    if spec is None:
        return model
    from ..models.sliding import SlidingWindow

    conf: InferenceSection = spec if isinstance(spec, InferenceSection) else \
        validate_section(InferenceSection, spec, ("inference",))
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
    from ..params import stable_hash

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


def threat_box(spec: ThreatSection | Mapping[str, Any], task: Task) -> Box:
    """The data box of a config's ``threat:`` section (typed, or a mapping checked here): ``threat.bounds`` as the
    task's inputs need it (:meth:`~medadv.tasks.Task.input_box`), what the attacks and a ``model.train.defense`` run
    in."""
    conf = spec if isinstance(spec, ThreatSection) else validate_section(ThreatSection, spec, ("threat",))
    return _box(conf, task)


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


def build_attacks(cfg: Config | AttackPlan | Mapping[str, Any], task: Task, *,
                  base_dir: str | None = None) -> dict[str, Attack]:
    """Every attack of the config, by label.

    Ball attacks (``threat_kind`` "ball" or "ball_or_box") get one instance per entry of ``budgets`` on
    the ``threat`` ball, named ``label@budget``; box attacks (``threat_kind`` "box") get the threat's data
    box once, named ``label`` (their budget is ``None``). ``label`` defaults to the attack's name. An entry's
    ``norm`` (``linf``/``l2``) puts that entry's budgets on a ball of that norm instead of ``threat.norm`` (the
    uncapped L2 DeepFool, ``{name: deepfool, norm: l2, budgets: [100]}``, beside L∞ FGSM), except for an attack
    that declares a ``norm`` parameter of its own (DAG), which gets it as that parameter. The
    other keys of an entry are the attack's parameters (validated by its declarations; an unknown key is
    an error naming the closest valid parameter).

    ``cfg`` is a typed :class:`~medadv.config_schema.Config` (or ``AttackPlan``), component files relative to
    ``base_dir``, or a mapping (a loaded config: ``base_dir`` defaults to its ``_dir``), checked once here.
    """
    plan = attack_plan(cfg)
    if base_dir is None and isinstance(cfg, Mapping):
        base_dir = cfg.get("_dir")
    box = _box(plan.threat, task)
    out: dict[str, Attack] = {}
    for entry in plan.attacks:
        cls = attack_class(entry.name)  # an unknown name gets the closest registered one
        # to run one attack with two settings, give each entry an `id` (or a `label`)
        label, params = entry.entry_name(cls.param_names(), cls.name)
        params = {k: _relative_paths(v, base_dir) for k, v in params.items()}
        made: dict[str, Threat | Box]
        if cls.threat_kind == "box":
            if entry.threat_norm(cls.param_names()) is not None:
                raise ConfigError([f"`attacks` entry {label!r}: `norm` sets the norm of an ε-ball, and {cls.name} runs "
                                   "on the data box (no ball): leave `norm` out"])
            made = {label: box}
        else:
            budgets = list(entry.budgets) if entry.budgets is not None else AttackPlan.budget_list(plan)  # type: ignore[arg-type]
            if budgets is None:
                raise ConfigError([f"`attacks` entry {label!r} needs an ε: give `budgets: [...]` (or `threat.eps`) "
                                   "in data units, e.g. budgets: [8/255]"])
            threat_spec = plan.threat
            norm = entry.threat_norm(cls.param_names())
            if norm is not None and norm != threat_spec.norm:  # this entry's own ball (DeepFool in L2 beside FGSM in L∞)
                ball = "Linf" if norm == "linf" else "L2"
                if ball not in cls.norms:
                    raise ConfigError([f"`attacks` entry {label!r}: `norm: {norm}`, and {cls.name} runs only in "
                                       f"{' or '.join(cls.norms)} balls"])
                threat_spec = threat_spec.model_copy(update={"norm": norm})
            made = {f"{label}@{eps:.6g}": _threat(threat_spec, eps, task, plan.allow_large_budgets) for eps in budgets}
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


