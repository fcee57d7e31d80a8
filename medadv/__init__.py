"""medadv: adversarial robustness for medical imaging models.

Tasks say what a model output means, threat models say where an attack may search (in the data's
own units), attacks are ``attack(model, x, y) -> AttackResult``, and ``evaluate`` tabulates clean vs
adversarial metrics. Toolkit bridges live in ``medadv.adapters`` (ART, Foolbox, torchattacks,
RobustBench).

``import medadv`` is cheap: every name below (and every subpackage) is imported on first use (PEP 562),
so a user who only wants PGD never pays for the explanation, plotting or toolkit stacks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


def _version() -> str:
    """The installed distribution's version: ``pyproject.toml`` is its one source (no copy here to drift)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("medadv")
    except PackageNotFoundError:  # imported from a source tree that was never installed (pip install -e .)
        return "0+unknown"


__version__ = _version()

# public name -> module that defines it (imported on first access)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Task", "MultiClass", "MultiLabel", "Segmentation", "Regression", "PromptableSegmentation"),
                   "medadv.tasks"),
    **dict.fromkeys(("available_tasks", "get_task", "register_task"), "medadv.tasks"),
    **dict.fromkeys(("Threat", "Linf", "L2", "Box"), "medadv.threats"),
    **dict.fromkeys(("Attack", "AttackResult", "available_attacks", "get_attack"), "medadv.attacks.base"),
    "GradientAttack": "medadv.attacks.gradient",
    "FGSM": "medadv.attacks.fgsm",
    "BIM": "medadv.attacks.bim",
    "PGD": "medadv.attacks.pgd",
    "CosPGD": "medadv.attacks.cospgd",
    "SegPGD": "medadv.attacks.segpgd",
    "APGD": "medadv.attacks.apgd",
    "AutoAttack": "medadv.attacks.autoattack",
    "AutoEvaluation": "medadv.attacks.auto",
    "Square": "medadv.attacks.square",
    "DeepFool": "medadv.attacks.deepfool",
    "JSMA": "medadv.attacks.jsma",
    "Noise": "medadv.attacks.noise",
    "DAG": "medadv.attacks.dag",
    **dict.fromkeys(("VAFA", "VAFA2D"), "medadv.attacks.vafa"),
    "GAP": "medadv.attacks.gap",
    "GAPTrainer": "medadv.training.gap",
    "SaliencyRelevance": "medadv.attacks.relevance",
    "SaliencyResistance": "medadv.attacks.resistance",
    **dict.fromkeys(("AdversarialTrainer", "PGDAT", "MPAdvT", "MAAdvT", "TRADES", "VAFT"), "medadv.defenses"),
    "evaluate": "medadv.evaluation",
    "Results": "medadv.results",
    **dict.fromkeys(("Plan", "Run"), "medadv.run"),
    **dict.fromkeys(("AttackCache", "attack_once"), "medadv.attack_cache"),
}

# subpackages and modules reachable as attributes (``medadv.data``) before anyone imported them
_SUBMODULES = frozenset({
    "adapters", "attacks", "certify", "cli", "config", "data", "dct", "defenses", "demo", "evaluation", "explain",
    "frequency", "masking", "metrics", "models", "params", "report", "results", "runtime", "tasks", "testing",
    "studies", "threats", "training", "distributed", "run", "attack_cache", "fingerprints",
})

__all__ = [
    "Task", "MultiClass", "MultiLabel", "Segmentation", "Regression", "PromptableSegmentation",
    "Threat", "Linf", "L2", "Box",
    "Attack", "AttackResult", "GradientAttack", "FGSM", "BIM", "PGD", "CosPGD", "SegPGD", "APGD",
    "AutoAttack", "AutoEvaluation", "Square", "DeepFool", "JSMA", "Noise", "DAG", "VAFA", "VAFA2D", "GAP", "GAPTrainer", "SaliencyRelevance", "SaliencyResistance",
    "available_attacks", "get_attack", "available_tasks", "get_task", "register_task",
    "AdversarialTrainer", "PGDAT", "MPAdvT", "MAAdvT", "TRADES", "VAFT",
    "evaluate", "Results", "Plan", "Run", "AttackCache", "attack_once",
    "data", "defenses", "explain", "metrics", "models",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        # importing any attack module imports medadv.attacks first, which registers every attack
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)


if TYPE_CHECKING:  # the eager imports, for type checkers and IDEs only
    from . import data, defenses, explain, metrics, models
    from .attack_cache import AttackCache, attack_once
    from .attacks.apgd import APGD
    from .attacks.auto import AutoEvaluation
    from .attacks.autoattack import AutoAttack
    from .attacks.base import Attack, AttackResult, available_attacks, get_attack
    from .attacks.bim import BIM
    from .attacks.cospgd import CosPGD
    from .attacks.dag import DAG
    from .attacks.fgsm import FGSM
    from .attacks.gap import GAP
    from .attacks.gradient import GradientAttack
    from .attacks.pgd import PGD
    from .attacks.relevance import SaliencyRelevance
    from .attacks.resistance import SaliencyResistance
    from .attacks.segpgd import SegPGD
    from .attacks.square import Square
    from .attacks.vafa import VAFA, VAFA2D
    from .defenses import PGDAT, TRADES, VAFT, AdversarialTrainer, MAAdvT, MPAdvT
    from .evaluation import evaluate
    from .results import Results
    from .run import Plan, Run
    from .tasks import (
        MultiClass,
        MultiLabel,
        PromptableSegmentation,
        Regression,
        Segmentation,
        Task,
        available_tasks,
        get_task,
        register_task,
    )
    from .threats import L2, Box, Linf, Threat
    from .training.gap import GAPTrainer
