"""The conformance factory: a minimal instance of every registered attack on every task setting it supports.

The machinery lives in :mod:`medadv.testing.attack_checks` (the public :func:`medadv.testing.check_attack` runs
it); everything is derived from the attack classes' metadata and the task registry, never from a hand-kept list:

* the settings are every registered task kind's ``Task.examples()`` (a 2-D classifier, multi-class and multi-label,
  a 2-D segmenter on two channels with a per-channel box, a 3-D segmenter, and every kind registered after them);
* ``Attack.tasks`` (task class names) and ``spatial_dims`` pick the settings an attack admits;
* ``threat_kind`` and ``norms`` pick the threat; ``always_targeted`` attacks get the example's target;
* ``SMALL`` shrinks the declared *cost* knobs only, and a GAP-style ``generator`` gets a tiny generator module.

``pytest_generate_tests`` parametrizes the conformance tests from ``available_attacks()`` and ``available_tasks()``:
a new attack or a new task kind gets every check without editing a list.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import medadv  # noqa: F401  (registers every attack and task kind)
from medadv.attacks.base import Attack, attack_class, available_attacks
from medadv.tasks import available_tasks
from medadv.testing import attack_checks as checks
from medadv.testing._common import model_state, prepare_model
from medadv.testing._values import ANY, candidates
from medadv.testing.attack_checks import SMALL, AttackCase, Setting, admits, make_threat

#: every registered kind's examples (multiclass, multilabel, seg2d, seg3d, then the kinds registered later)
SETTINGS: tuple[Setting, ...] = tuple(checks.settings())
Case = AttackCase


def settings_for(cls: type[Attack]) -> list[Setting]:
    """The settings whose task kind and spatial rank the attack's declarations admit."""
    return [s for s in SETTINGS if admits(cls, s)]


def all_cases() -> list[AttackCase]:
    return [AttackCase(n, s) for n in available_attacks() for s in settings_for(attack_class(n))]


def first_case(name: str) -> AttackCase:
    cls = attack_class(name)
    ss = settings_for(cls)
    if not ss:
        raise AssertionError(f"attack {name!r} admits none of the conformance settings "
                             f"(tasks={cls.tasks}, spatial_dims={cls.spatial_dims})")
    return AttackCase(name, ss[0])


def _builds(case: AttackCase) -> bool:
    try:
        case.build()
    except (ValueError, TypeError):  # refused at construction (a kind the attack does not apply to)
        return False
    return True


def norm_cases() -> list[AttackCase]:
    """Every norm an attack declares (and the plain box for "ball_or_box" attacks), on the last setting it admits and
    does not refuse (dense segmentation where supported)."""
    out = []
    for n in available_attacks():
        cls = attack_class(n)
        last = next((s for s in reversed(settings_for(cls)) if _builds(AttackCase(n, s))), None)
        if last is not None:
            out += [AttackCase(n, last, k) for k in checks._norm_kinds(cls)]
    return out


def param_cases() -> list[tuple[str, str]]:
    return [(n, p) for n in available_attacks() for p in attack_class(n).param_names()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = metafunc.fixturenames
    if "case" in names:
        cases = all_cases()
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])
    if "norm_case" in names:
        cases = norm_cases()
        metafunc.parametrize("norm_case", cases, ids=[c.id for c in cases])
    if "attack_name" in names:
        metafunc.parametrize("attack_name", available_attacks())
    if "attack_alias" in names:
        al = [(n, old, new) for n in available_attacks() for old, new in attack_class(n).aliases.items()]
        metafunc.parametrize("attack_alias", al, ids=[f"{n}-{o}" for n, o, _ in al])
    if "attack_param" in names:
        pcs = param_cases()
        metafunc.parametrize("attack_param", pcs, ids=[f"{n}-{p}" for n, p in pcs])
    if "task_kind" in names:
        metafunc.parametrize("task_kind", available_tasks())


@pytest.fixture
def factory(device: torch.device) -> Any:
    """The helpers above, for the test modules (conftest helpers are not importable under importlib mode), and the
    ``--device`` the conformance runs use."""

    class F:
        pass

    f = F()
    f.device = device
    for k, v in {
        "Case": Case, "first_case": first_case, "candidates": candidates, "model_state": model_state,
        "prepare_model": prepare_model, "make_threat": make_threat, "SMALL": SMALL, "ANY": ANY,
        "settings_for": settings_for, "SETTINGS": SETTINGS,
    }.items():
        setattr(f, k, v)
    return f
