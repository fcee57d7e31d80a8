"""Targets of targeted attacks from a config's ``target:`` (and an ``attacks`` entry's own): :func:`build_target_fn`,
:func:`build_target_fns`, :func:`check_target`, :func:`check_targets` and :data:`TARGET_KINDS`.

A target function is ``target_fn(x, y, clean_logits) -> target``, what :func:`medadv.evaluate` takes. The DAG
targets (Paschali et al.) are :mod:`medadv.attacks.dag`'s builders; this module names them for a config. These were
``medadv.config``'s; it re-exports them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..attacks.base import attack_class
from ..config_schema import AttackPlan, ConfigError, entry_label, validate_section
from ..params import closest
from .trust import OPT_IN, CodeNotAllowedError, allow_module, import_code, module_exists

if TYPE_CHECKING:
    from ..attacks.base import Attack
    from ..config_schema import Config
    from ..tasks import Task

__all__ = ["TARGET_KINDS", "TargetFn", "build_target_fn", "build_target_fns", "check_target", "check_targets"]

TargetFn = Callable[[Tensor, Tensor, Tensor], Tensor]

#: the built-in ``target`` kinds (:func:`build_target_fn`)
TARGET_KINDS = ("background", "least_likely", "dag_b", "dag_c")


def _allow_target(spec: str, allow_code: bool) -> None:
    """A ``target`` naming a function runs it: outside medadv/MONAI/torchvision as any code, and inside them too
    (no function of theirs is declared a target function) only with ``allow_code``; decided from the text."""
    allow_module(spec, "target", allow_code)
    if not allow_code:
        raise CodeNotAllowedError([f"`target` {spec!r} names a function, which medadv would call: without "
                                   f"--allow-code `target` is one of {', '.join(TARGET_KINDS)}; {OPT_IN}"])


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
    * ``dag_b``, ``dag_c`` (segmentation): Paschali et al.'s DAG targets: voxels and class drawn from the true label map, the
      map built on the clean prediction, so DAG attacks only the retargeted voxels: type B
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
        module_exists(spec, "target")
        return import_code(spec, "target")  # type: ignore[no-any-return]
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
        from ..attacks.dag import dag_target_b, dag_target_c

        if kind == "dag_b":
            def dag_b(x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
                # built on the clean prediction: DAG's default region (prediction != target) is then the retargeted
                # voxels only; on the label map it also held every clean mistake, which DAG "repaired" and so raised
                # Dice above the clean prediction (issue 32, benchmarks/dag.md)
                return dag_target_b(y, generator=torch.Generator().manual_seed(0),
                                    prediction=task.predict(logits))[0]

            # a new name: the resume fingerprint must not reuse rows attacked toward the old label-map target
            return _named(dag_b, "target:dag_b_pred")

        def dag_c(x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
            return dag_target_c(y, cls=1, prediction=task.predict(logits))[0]

        return _named(dag_c, "target:dag_c_pred")
    c = closest(kind, TARGET_KINDS)
    hint = f"; did you mean {c!r}?" if c else ""
    raise ValueError(f"`target` must be one of {', '.join(TARGET_KINDS)} or 'package.module:function', got "
                     f"{spec!r}{hint}")


def attack_plan(cfg: Config | AttackPlan | Mapping[str, Any]) -> Config | AttackPlan:
    """What the attack builders read (``threat``, ``budgets``, ``attacks``, ``allow_large_budgets``, ``target``):
    a typed :class:`~medadv.config_schema.Config` or ``AttackPlan`` as it is, a mapping validated once here."""
    from ..config_schema import Config

    if isinstance(cfg, Config | AttackPlan):
        return cfg
    if not isinstance(cfg, Mapping):
        raise ConfigError([f"the config must be a mapping or a medadv.config_schema.Config; got {type(cfg).__name__}"])
    return validate_section(AttackPlan, cfg)  # type: ignore[no-any-return]


def build_target_fns(cfg: Config | AttackPlan | Mapping[str, Any], task: Task, attacks: Mapping[str, Attack], *,
                     allow_code: bool = True, target: str | None = None) -> TargetFn | dict[str, TargetFn] | None:
    """The config's ``target`` function, or ``{attack name: fn}`` when an ``attacks`` entry gives its own
    ``target`` (the others keep the config's). What :func:`medadv.evaluate` takes as ``target_fn``.

    ``cfg`` is a typed :class:`~medadv.config_schema.Config` or a mapping (validated once); ``target`` is the
    config-wide target when ``cfg`` is an ``AttackPlan`` (which has none)."""
    plan = attack_plan(cfg)
    if target is None:
        target = getattr(plan, "target", None) if not isinstance(cfg, Mapping) else cfg.get("target")
    default = build_target_fn(target, task, allow_code=allow_code)
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
        module_exists(spec, "target")
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
