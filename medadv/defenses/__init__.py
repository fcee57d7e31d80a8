"""Defenses: one adversarial-training loop and pluggable strategies (the per-batch loss)."""

from .base import TrainingStrategy
from .maadvt import MAAdvT
from .mpadvt import MPAdvT
from .pgd_at import PGDAT
from .trades import TRADES
from .trainer import AdversarialTrainer
from .vaft import VAFT, frequency_consistency

__all__ = ["TrainingStrategy", "AdversarialTrainer", "PGDAT", "MPAdvT", "MAAdvT", "TRADES", "VAFT", "frequency_consistency"]
