"""Attacks. Every attack is ``attack(model, x, y=None) -> AttackResult`` and registered by name."""

from .autoattack import AutoAttack
from .base import Attack, AttackResult, attack_mode, available_attacks, get_attack, register
from .bim import BIM
from .cospgd import CosPGD
from .dag import DAG, calibrate_gamma, dag_target_a, dag_target_b, dag_target_c
from .fgsm import FGSM
from .gap import GAP, GAPTrainer
from .gradient import GradientAttack
from .pgd import PGD
from .relevance import SaliencyRelevance
from .resistance import SaliencyResistance
from .saliency import SaliencyAttack
from .segpgd import SegPGD
from .vafa import VAFA, VAFA2D, soft_quantize, soft_round

__all__ = [
    "Attack",
    "AttackResult",
    "attack_mode",
    "available_attacks",
    "get_attack",
    "register",
    "GradientAttack",
    "FGSM",
    "BIM",
    "PGD",
    "CosPGD",
    "SegPGD",
    "AutoAttack",
    "DAG",
    "dag_target_a",
    "dag_target_b",
    "dag_target_c",
    "calibrate_gamma",
    "VAFA",
    "VAFA2D",
    "soft_round",
    "soft_quantize",
    "GAP",
    "GAPTrainer",
    "SaliencyAttack",
    "SaliencyRelevance",
    "SaliencyResistance",
]
