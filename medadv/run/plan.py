"""A :class:`Plan`: one config, read and checked once, that stays typed (the builders take its pydantic sections).

Read from YAML with :meth:`Plan.from_yaml` or built in Python (``Plan(config=Config(...), base_dir=...)``,
:meth:`Plan.from_dict`); :meth:`Plan.check` does what ``medadv validate`` checks (no model built, no data read);
:meth:`Plan.build` gives everything a run needs (:class:`Built`). :class:`medadv.run.Run` runs it into an output
folder.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import (
    build_attacks,
    build_model,
    build_task,
    check_model,
    class_names,
    config_dict,
    config_fingerprint,
    normalise_config,
    read_config_file,
    study_models,
    threat_box,
    wrap_inference,
)
from ..config_schema import Config, ConfigError, validate_config

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..attacks.base import Attack
    from ..config.targets import TargetFn
    from ..studies.schema import StudySpec
    from ..tasks import Task

__all__ = ["Plan", "Built"]


@dataclass(frozen=True)
class Built:
    """What :meth:`Plan.build` makes: everything :func:`medadv.evaluate` and the studies take."""

    #: the task that reads the model's output
    task: Task
    #: every attack run, by name (``label@budget``; box attacks: ``label``)
    attacks: dict[str, Attack]
    #: the evaluated model (sliding-window wrapped when the config says so; logits out), on the device asked for
    model: nn.Module
    #: ``{name: model}`` for the studies: the evaluated model first, then the config's ``models``
    models: dict[str, nn.Module]
    #: the data's batches, in a fixed order
    data: Iterable[Any]
    #: ``evaluate``'s ``target_fn``: one function, ``{attack: function}``, or None
    target_fn: TargetFn | dict[str, TargetFn] | None
    #: the names of the classes / labels for the report (None: indices)
    class_names: list[str] | None


def _check_studies(entries: list[Any] | None) -> tuple[StudySpec, ...]:
    """Each ``studies:`` entry checked against its own study's schema (every mistake at once)."""
    if not entries:
        return ()
    from ..studies.schema import validate_studies

    return tuple(validate_studies(entries))


@dataclass(frozen=True)
class Plan:
    """One config, checked: the typed :class:`~medadv.config_schema.Config` with the folder its relative paths start
    from and whether it may run code.

    Made, the config is checked beyond its schema once (each ``studies:`` entry by its study's schema, comparing
    studies need ``models``, model seeds default to the config's ``seed``) and kept as a checked copy: the
    ``config`` given is not changed. ``allow_code`` ORs with the config's own ``allow_code`` (:attr:`code_allowed`).
    """

    #: the whole config, typed (a normalised copy of the one given)
    config: Config
    #: the folder relative paths start from (a config file's folder); None: the working directory
    base_dir: str | None = None
    #: let the config run code (``--allow-code``); the config's ``allow_code: true`` does too
    allow_code: bool = False
    #: the YAML file the config was read from (named in the results and the report's title), if any
    source: Path | None = None
    #: the checked ``studies:`` entries, in order
    studies: tuple[StudySpec, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if not isinstance(self.config, Config):
            raise TypeError(f"Plan: `config` must be a medadv.config_schema.Config (Plan.from_dict takes a mapping); "
                            f"got {type(self.config).__name__}")
        if self.base_dir is not None and not isinstance(self.base_dir, str | os.PathLike):
            raise TypeError(f"Plan: `base_dir` must be a folder path or None; got {type(self.base_dir).__name__}")
        if not isinstance(self.allow_code, bool):
            raise TypeError(f"Plan: `allow_code` must be True or False; got {self.allow_code!r}")
        if self.source is not None and not isinstance(self.source, str | os.PathLike):
            raise TypeError(f"Plan: `source` must be a file path or None; got {type(self.source).__name__}")
        studies = _check_studies(self.config.studies)  # before the rest: as load_config always did
        set_ = functools.partial(object.__setattr__, self)  # a frozen dataclass settles its own fields once
        set_("config", normalise_config(self.config))
        set_("studies", studies)
        if self.base_dir is not None:
            set_("base_dir", str(Path(self.base_dir).resolve()))
        if self.source is not None:
            set_("source", Path(self.source))

    # --- made from ------------------------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | os.PathLike, *, allow_code: bool = False) -> Plan:
        """The config file at ``path`` (relative paths start at its folder); ``ConfigError`` lists every mistake."""
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"Plan.from_yaml: `path` must be a file path; got {type(path).__name__}")
        p = Path(path)
        conf = validate_config(read_config_file(p))
        return cls(config=conf, base_dir=str(p.parent.resolve()), allow_code=allow_code, source=p)

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any], *, base_dir: str | os.PathLike | None = None,
                  allow_code: bool = False) -> Plan:
        """A config given as a mapping (as the YAML would hold it); relative paths start at ``base_dir``."""
        if not isinstance(mapping, Mapping):
            raise TypeError(f"Plan.from_dict: `mapping` must be a mapping of sections; got {type(mapping).__name__}")
        given = {k: v for k, v in mapping.items() if k != "_dir"}  # a load_config mapping carries its folder too
        if base_dir is None and isinstance(mapping.get("_dir"), str):
            base_dir = mapping["_dir"]
        return cls(config=validate_config(given), base_dir=None if base_dir is None else str(base_dir),
                   allow_code=allow_code)

    # --- what the config says -------------------------------------------------------------------------------
    @property
    def code_allowed(self) -> bool:
        """Whether the config may run code: ``allow_code`` here or ``allow_code: true`` in the config."""
        return self.allow_code or self.config.allow_code

    @property
    def output_dir(self) -> Path:
        """The config's ``output`` folder (relative to :attr:`base_dir`)."""
        out = Path(self.config.output)
        return out if out.is_absolute() or self.base_dir is None else Path(self.base_dir) / out

    @property
    def title(self) -> str:
        """The HTML report's default title: ``medadv: <config file name>``."""
        return f"medadv: {self.source.name}" if self.source is not None else "medadv"

    def to_dict(self) -> dict[str, Any]:
        """The plain mapping :func:`medadv.config.load_config` gives for this config (studies checked)."""
        return config_dict(self.config, self.base_dir, list(self.studies) if self.config.studies else None)

    def fingerprint(self) -> str:
        """The config and data fingerprint a run keeps in ``run.json`` (:func:`medadv.config.config_fingerprint`)."""
        return config_fingerprint(self.to_dict())

    # --- built, stage by stage (Run checks everything before it builds the model) ----------------------------
    def task(self) -> Task:
        """The task of ``task:``."""
        return build_task(self.config.task, allow_code=self.code_allowed)

    def attacks(self, task: Task) -> dict[str, Attack]:
        """Every attack run of the config, by name."""
        return build_attacks(self.config, task, base_dir=self.base_dir)

    def target_fns(self, task: Task, attacks: Mapping[str, Attack]) -> TargetFn | dict[str, TargetFn] | None:
        """``evaluate``'s ``target_fn`` (the config's ``target``, or per attack where an entry gives its own)."""
        from ..config.targets import build_target_fns

        return build_target_fns(self.config, task, attacks, allow_code=self.code_allowed)

    def preflight(self, task: Task, attacks: Mapping[str, Attack],
                  target_fn: TargetFn | dict[str, TargetFn] | None) -> list[str] | None:
        """Config mistakes cost nothing: the target, the models' names and code and the data files and transforms
        are checked before any user code runs, any model is built or any image read. Returns the class names."""
        from ..config.data import check_data
        from ..config.targets import check_targets

        check_targets(attacks, self.config.target, target_fn if isinstance(target_fn, dict) else None)
        for spec in [self.config.model, *(self.config.models or {}).values()]:
            check_model(spec, self.base_dir, allow_code=self.code_allowed)
        check_data(self.config.data, self.base_dir, task, allow_code=self.code_allowed)
        return class_names(self.config, self.base_dir)

    def model(self, task: Task, device: torch.device | str | None = None) -> nn.Module:
        """The evaluated model: built (seeded; trained or loaded as ``model`` says), behind sliding-window inference
        when ``inference:`` is given, on ``device``, giving logits (``outputs: probabilities`` converted).

        Seeds torch's global RNG with the config's ``seed`` first, as ``medadv evaluate`` always has: the model's
        random parts (initial weights, training draws) follow the config, whoever builds it."""
        import torch  # at call time: importing medadv.run (the CLI) does not import torch

        torch.manual_seed(self.config.seed)
        model = wrap_inference(build_model(self.config.model, self.base_dir, allow_code=self.code_allowed, task=task,
                                           box=threat_box(self.config.threat, task)),
                               self.config.inference)
        if device is not None:
            model = model.to(device)
        return task.logits_model(model)

    def extra_models(self, model: nn.Module, task: Task) -> dict[str, nn.Module]:
        """``{name: model}`` for the studies: ``model`` first, then each of ``models:`` built on its device."""
        return study_models(self.config, model, self.base_dir, allow_code=self.code_allowed, task=task)

    def loader(self, task: Task) -> Iterable[Any]:
        """The data's batches (``batch_size`` of the config), in a fixed order."""
        from ..config.data import build_loader

        c = self.config
        return build_loader(c.data, self.base_dir, batch_size=c.batch_size, task=task, seed=c.seed,
                            allow_code=self.code_allowed)

    def prepare(self) -> tuple[Task, dict[str, Attack], TargetFn | dict[str, TargetFn] | None, list[str] | None]:
        """The stages before any model or data: task, attacks, target functions, then :meth:`preflight` (returns
        them with the class names). :meth:`build` and :class:`~medadv.run.Run` both start here."""
        task = self.task()
        attacks = self.attacks(task)
        target_fn = self.target_fns(task, attacks)
        return task, attacks, target_fn, self.preflight(task, attacks, target_fn)

    def build(self, device: torch.device | str | None = None) -> Built:
        """Everything a run needs, checked first (:meth:`prepare`), then the model and the data."""
        task, attacks, target_fn, names = self.prepare()
        model = self.model(task, device)
        return Built(task=task, attacks=attacks, model=model, models=self.extra_models(model, task),
                     data=self.loader(task), target_fn=target_fn, class_names=names)

    # --- checked without building ---------------------------------------------------------------------------
    def check(self, output: str | os.PathLike | None = None) -> list[str]:
        """What ``medadv validate`` checks: the task, attacks, targets, model builders and data files, the class
        names and that the output folder (``output``, else the config's) can be written. No model is built, no data
        read, nothing run. Returns the attack runs' names; ``ConfigError`` lists every mistake found, one per line.
        """
        from ..config.data import check_data
        from ..config.targets import build_target_fns, check_target, check_targets
        from .output import check_output_writable

        c, allow = self.config, self.code_allowed
        errors: list[str] = []

        def attempt(check: Callable[[], Any]) -> Any:
            try:
                return check()
            except (ValueError, TypeError, FileNotFoundError, FileExistsError) as e:
                errors.extend(str(e).splitlines())
                return None

        task = attempt(self.task)
        attacks: Any = None
        if task is not None:
            attacks = attempt(lambda: self.attacks(task))
            attempt(lambda: check_target(c.target, task, allow_code=allow))
            own = [e.target for e in c.attacks if e.target]
            for target in own:
                attempt(functools.partial(check_target, target, task, allow_code=allow))
            if attacks is not None:
                fns = attempt(lambda: build_target_fns(c, task, attacks, allow_code=allow)) if own else None
                attempt(lambda: check_targets(attacks, c.target, fns if isinstance(fns, dict) else None))
        for model in [c.model, *(c.models or {}).values()]:
            attempt(functools.partial(check_model, model, self.base_dir, allow_code=allow))
        attempt(lambda: check_data(c.data, self.base_dir, task, allow_code=allow))
        attempt(lambda: class_names(c, self.base_dir))
        out = Path(output) if output is not None else self.output_dir
        attempt(lambda: check_output_writable(out))  # created and removed again if it is not there
        if errors:
            raise ConfigError(errors)
        return list(attacks)
