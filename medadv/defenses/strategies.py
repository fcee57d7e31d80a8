"""Training strategies by name: what a config (``model.train.defense``) and the defenses study both build.

A strategy entry is a name (``pgd_at``) or a mapping ``{name: pgd_at, eps: 8/255, steps: 4}``: the
:class:`~medadv.defenses.base.TrainingStrategy` subclass of that ``name`` and its constructor's parameters, plus
the keys of :data:`STUDY_KEYS` that belong to whoever trains with it (``eps``, the training ε in data units; the
defenses study's ``id``, ``epochs`` and ``lr``). ``none`` (:data:`NONE`) is plain training on clean data.

It lives here, in the defenses room, so that both :mod:`medadv.config` and :mod:`medadv.studies.defenses` can
use it: the studies import the config's data builders, so the config cannot import the studies.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from pydantic_core import PydanticCustomError

from ..params import InvalidParameterError, closest
from ..schema_base import parse_budget
from ..threats import Box, Linf, Threat
from .base import TrainingStrategy

__all__ = ["NONE", "STUDY_KEYS", "strategy_classes", "normalize_entry", "label_of", "build_strategy",
           "needs_threat"]

#: the strategy name for plain (clean) training with the same recipe
NONE = "none"
#: keys of a strategy entry that belong to the trainer (the study or the config), not to the strategy's constructor
STUDY_KEYS = ("name", "id", "epochs", "lr", "eps")


def strategy_classes() -> dict[str, type[TrainingStrategy]]:
    """``{name: TrainingStrategy subclass}`` of every concrete strategy defined so far (``medadv.defenses``
    imported first), read from the class hierarchy: a subclass that sets its own ``name`` is a strategy of that
    name (medadv's own class wins a name clash)."""
    from .. import defenses as _defenses  # noqa: F401  (defines the built-in strategies)

    out: dict[str, type[TrainingStrategy]] = {}
    todo: list[type[TrainingStrategy]] = list(TrainingStrategy.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        name = cls.__dict__.get("name")
        if not isinstance(name, str) or name in ("strategy", NONE) or inspect.isabstract(cls):
            continue
        if name in out and out[name].__module__.startswith("medadv.") and not cls.__module__.startswith("medadv."):
            continue
        out[name] = cls
    return out


def _required(cls: type) -> list[str]:
    """Constructor arguments of a strategy without a default that the trainer does not supply."""
    sig = inspect.signature(cls.__init__)  # type: ignore[misc]
    return [n for n, p in sig.parameters.items()
            if n != "self" and p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in getattr(cls, "positional", ())]


def needs_threat(cls: type[TrainingStrategy]) -> bool:
    """Whether a strategy trains in a fixed ε-ball (its constructor takes a ``threat``: PGD-AT, MAAdvT, TRADES)."""
    return "threat" in getattr(cls, "positional", ())


def normalize_entry(entry: Any, known: Mapping[str, type[TrainingStrategy]] | None = None) -> dict[str, Any]:
    """A ``strategies`` entry (a name, or a mapping with ``name`` and options) as a checked mapping.

    Raises ``ValueError`` naming the entry's mistake (unknown name or parameter, a missing required one)."""
    known = strategy_classes() if known is None else known
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
        raise ValueError(f"a strategy is a name or a mapping with `name:`; got {entry!r}")
    out = dict(entry)
    name = out["name"]
    names = [NONE, *known]
    if name not in names:
        c = closest(name, names)
        raise ValueError(f"unknown strategy {name!r}{f'; did you mean {c!r}?' if c else ''} "
                         f"(strategies: {', '.join(names)})")
    if "id" in out and (not isinstance(out["id"], str) or not out["id"]):
        raise ValueError(f"`id` of strategy {name!r} must be non-empty text; got {out['id']!r}")
    if "epochs" in out and (isinstance(out["epochs"], bool) or not isinstance(out["epochs"], int)
                            or out["epochs"] < 0):
        raise ValueError(f"`epochs` of strategy {name!r} must be an integer >= 0; got {out['epochs']!r}")
    if "eps" in out:
        try:
            out["eps"] = parse_budget(out["eps"])  # a number or a fraction such as 4/255, in data units
        except PydanticCustomError:
            raise ValueError(f"`eps` of strategy {name!r} must be a number >= 0 or a fraction such as 4/255; got "
                             f"{out['eps']!r}") from None
    v = out.get("lr")
    if "lr" in out and (isinstance(v, bool) or not isinstance(v, int | float) or not v > 0):
        raise ValueError(f"`lr` of strategy {name!r} must be a number > 0; got {v!r}")
    params = {k: v for k, v in out.items() if k not in STUDY_KEYS}
    if name == NONE:
        if params or "eps" in out:
            extra = sorted(params) + (["eps"] if "eps" in out else [])
            raise ValueError(f"strategy 'none' (clean training) takes only `epochs`, `lr` and `id`; got {extra}")
        return out
    cls = known[name]
    try:
        cls.check_kwargs(params, what=f"strategy {name!r}")
    except InvalidParameterError as e:
        raise ValueError(str(e)) from None
    missing = [n for n in _required(cls) if n not in params]
    if missing:
        raise ValueError(f"strategy {name!r} needs {', '.join(f'`{m}`' for m in missing)} (e.g. "
                         f"{{name: {name}, {missing[0]}: ...}})")
    if "eps" in out and not needs_threat(cls):
        raise ValueError(f"`eps` of strategy {name!r}: it takes no threat model (only strategies with a fixed ball, "
                         "such as pgd_at, maadvt, trades, take a training ε)")
    return out


def label_of(entry: Mapping[str, Any]) -> str:
    """The row label of a strategy entry: its ``id``, else its name."""
    return str(entry.get("id") or entry["name"])


def build_strategy(entry: Mapping[str, Any], *, threat: Threat | None, box: Box | None) -> TrainingStrategy | None:
    """The :class:`~medadv.defenses.base.TrainingStrategy` of a (normalised) entry; ``None`` for ``none``.

    Args:
        entry: ``{name, ...its parameters}`` (see :func:`normalize_entry`); ``eps`` (data units) replaces the
            ε of ``threat`` for this strategy.
        threat: the training ball of strategies with a ``threat`` argument (PGD-AT, MAAdvT, TRADES).
        box: the data box of strategies with a ``box`` argument (MPAdvT; VAFT's default attack).
    """
    entry = normalize_entry(entry)
    name = entry["name"]
    if name == NONE:
        return None
    cls = strategy_classes()[name]
    params = {k: v for k, v in entry.items() if k not in STUDY_KEYS}
    args: list[Any] = []
    for p in getattr(cls, "positional", ()):
        if p == "threat":
            if threat is None and "eps" not in entry:
                raise ValueError(f"strategy {name!r} trains in an ε-ball: give `eps:` (data units) in the study or the "
                                 "entry, or an ε-ball attack whose threat model it takes")
            if "eps" in entry:
                kind = type(threat) if threat is not None else Linf
                t_box = threat.box if threat is not None else box
                if t_box is None:
                    raise ValueError(f"strategy {name!r} needs the data box: give `bounds: [lo, hi]`")
                threat = kind(float(entry["eps"]), bounds=t_box)
            args.append(threat)
        elif p == "box":
            if box is None:
                raise ValueError(f"strategy {name!r} needs the data box: give `bounds: [lo, hi]`, or attacks whose "
                                 "box it takes")
            args.append(box)
        else:
            raise ValueError(f"strategy {name!r} takes a `{p}` argument the defenses study cannot build; train it "
                             "with medadv.defenses.AdversarialTrainer directly")
    if "box" in cls.param_names() and "box" not in params and "box" not in cls.positional:
        if box is None:
            raise ValueError(f"strategy {name!r} needs the data box: give `bounds: [lo, hi]`")
        params["box"] = box
    try:
        return cls(*args, **params)
    except (InvalidParameterError, TypeError) as e:
        raise ValueError(f"strategy {label_of(entry)!r}: {e}") from None
