"""Defenses: adversarial-training strategies (the per-batch loss) on the shared fitting loop."""

from .base import TrainingStrategy
from .gaussian import GaussianAugmentation
from .maadvt import MAAdvT
from .mpadvt import MPAdvT
from .pgd_at import PGDAT
from .trades import TRADES, KLAttack
from .trainer import AdversarialTrainer
from .vaft import VAFT, frequency_consistency

__all__ = ["TrainingStrategy", "AdversarialTrainer", "PGDAT", "MPAdvT", "MAAdvT", "TRADES", "KLAttack", "VAFT",
           "frequency_consistency", "GaussianAugmentation"]
