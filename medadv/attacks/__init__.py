"""Attacks. Every attack is ``attack(model, x, y=None) -> AttackResult`` and registered by name."""

from .base import Attack, AttackResult, attack_mode, available_attacks, get_attack, register
from .bim import BIM
from .cospgd import CosPGD
from .fgsm import FGSM
from .gradient import GradientAttack
from .pgd import PGD
from .segpgd import SegPGD

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
]
