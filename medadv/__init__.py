"""medadv: adversarial robustness for medical imaging models.

Tasks say what a model output means, threat models say where an attack may search (in the data's
own units), attacks are ``attack(model, x, y) -> AttackResult``, and ``evaluate`` tabulates clean vs
adversarial metrics. Toolkit bridges live in ``medadv.adapters`` (ART, Foolbox, torchattacks,
RobustBench).
"""

from . import data, defenses, explain, metrics, models
from .attacks import (
    BIM,
    DAG,
    FGSM,
    GAP,
    PGD,
    VAFA,
    VAFA2D,
    Attack,
    AttackResult,
    AutoAttack,
    CosPGD,
    GAPTrainer,
    GradientAttack,
    SaliencyRelevance,
    SaliencyResistance,
    SegPGD,
    available_attacks,
    get_attack,
)
from .defenses import PGDAT, TRADES, VAFT, AdversarialTrainer, MAAdvT, MPAdvT
from .evaluation import evaluate
from .results import Results
from .tasks import MultiClass, MultiLabel, Segmentation, Task
from .threats import L2, Linf, Threat

__version__ = "0.1.0"

__all__ = [
    "Task", "MultiClass", "MultiLabel", "Segmentation",
    "Threat", "Linf", "L2",
    "Attack", "AttackResult", "GradientAttack", "FGSM", "BIM", "PGD", "CosPGD", "SegPGD",
    "AutoAttack", "DAG", "VAFA", "VAFA2D", "GAP", "GAPTrainer", "SaliencyRelevance", "SaliencyResistance",
    "available_attacks", "get_attack",
    "AdversarialTrainer", "PGDAT", "MPAdvT", "MAAdvT", "TRADES", "VAFT",
    "evaluate", "Results",
    "data", "defenses", "explain", "metrics", "models",
]
