"""Attacks. Every attack is ``attack(model, x, y=None) -> AttackResult`` and registered by name.

All of them share one contract (declared parameters, a Box or a threat, typed details) and the iterative
ones one engine (:mod:`medadv.attacks.engine`, step rules in :mod:`medadv.attacks.steps`).
"""

from .apgd import APGD, APGDDetails
from .auto import AutoDetails, AutoEvaluation
from .autoattack import AutoAttack
from .base import (
    Attack,
    AttackDetails,
    AttackResult,
    attack_class,
    attack_mode,
    available_attacks,
    get_attack,
    register,
)
from .bim import BIM
from .cospgd import CosPGD
from .dag import (
    DAG,
    DAGDetails,
    calibrate_gamma,
    calibrate_step_size,
    dag_target_a,
    dag_target_b,
    dag_target_c,
)
from .deepfool import DeepFool, DeepFoolDetails
from .engine import EngineOutput, IterativeAttack, StepContext
from .fgsm import FGSM
from .gap import GAP
from .gradient import GradientAttack
from .jsma import JSMA, JSMADetails
from .noise import Noise
from .pgd import PGD
from .prompt_agnostic import PromptAgnostic, PromptAgnosticDetails
from .relevance import RelevanceDetails, SaliencyRelevance
from .resistance import ResistanceDetails, SaliencyResistance
from .saliency import SaliencyAttack, SaliencyDetails
from .segpgd import SegPGD
from .square import Square, SquareDetails
from .steps import AdamStep, MomentumStep, NormalizedStep, SignStep, StepRule, ThreatStep
from .tilewise import TileDetails, attack_tilewise
from .vafa import VAFA, VAFA2D, VAFADetails, soft_quantize, soft_round

__all__ = [
    "Attack", "AttackResult", "AttackDetails", "attack_mode", "available_attacks", "get_attack", "attack_class",
    "register",
    "IterativeAttack", "StepContext", "EngineOutput",
    "StepRule", "ThreatStep", "SignStep", "NormalizedStep", "MomentumStep", "AdamStep",
    "GradientAttack", "FGSM", "BIM", "PGD", "PromptAgnostic", "PromptAgnosticDetails", "CosPGD", "SegPGD", "APGD", "APGDDetails",
    "AutoAttack", "AutoEvaluation", "AutoDetails",
    "DAG", "DAGDetails", "dag_target_a", "dag_target_b", "dag_target_c", "calibrate_step_size", "calibrate_gamma",
    "VAFA", "VAFA2D", "VAFADetails", "soft_round", "soft_quantize",
    "GAP",
    "Square", "SquareDetails",
    "DeepFool", "DeepFoolDetails", "JSMA", "JSMADetails", "Noise",
    "SaliencyAttack", "SaliencyDetails", "SaliencyRelevance", "RelevanceDetails", "SaliencyResistance",
    "ResistanceDetails", "attack_tilewise", "TileDetails",
]


def __getattr__(name: str):
    # GAPTrainer (published as medadv.training.GAPTrainer) is defined with GAP; kept importable from here lazily
    if name == "GAPTrainer":
        from .gap import GAPTrainer

        return GAPTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
