"""Training: the one fitting loop (epochs, seeded order, checkpoints, exact resume, progress) and what runs on it.

* :class:`Fitter` — the loop (:mod:`medadv.training.loop`);
* :func:`fit_supervised` — plain supervised training (also at ``medadv.models.fit_supervised``);
* :class:`GAPTrainer` — fits a GAP generator (also at ``medadv.GAPTrainer``);
* adversarial training, :class:`medadv.defenses.AdversarialTrainer`, runs on the same loop.
"""

from .gap import GAPTrainer
from .loop import Fitter, draw_seed
from .supervised import SupervisedFitter, fit_supervised

__all__ = ["Fitter", "draw_seed", "fit_supervised", "SupervisedFitter", "GAPTrainer"]
