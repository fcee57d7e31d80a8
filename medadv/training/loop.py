"""The one fitting loop: epochs, seeded data order, checkpoints, exact resume and a progress bar.

Defined in :mod:`medadv.models.fitting` (below the attacks, so that ``medadv.models.fit_supervised`` imports
nothing above the models: ``tests/test_layout.py``) and re-exported here, its public home.

:class:`Fitter` owns what every medadv training shares — plain supervised training
(:func:`~medadv.training.fit_supervised`), adversarial training
(:class:`~medadv.defenses.AdversarialTrainer`) and GAP's generator fitting
(:class:`~medadv.training.GAPTrainer`). A subclass supplies the per-batch loss and, where it needs to, the
modes around an epoch, the per-epoch record and extra checkpoint state:

* :meth:`Fitter.batch_loss` — the scalar loss of one batch (graph attached to the trained parameters);
* :meth:`Fitter.session` — a context around the whole fit (train/eval modes, frozen models);
* :meth:`Fitter.begin_epoch` / :meth:`Fitter.end_epoch` — modes before an epoch, the epoch's history
  record after it (validation, best-model tracking);
* :meth:`Fitter.checkpoint_state` / :meth:`Fitter.load_checkpoint_state` — what else a checkpoint holds.

Every random choice (the data order, and the strategy's draws through the generator handed to
:meth:`Fitter.batch_loss`) comes from one seeded CPU ``torch.Generator``, whose state is checkpointed
after every epoch: a run interrupted and resumed from its checkpoint ends with exactly the parameters of an
uninterrupted run. The global RNG is never touched.
"""

from __future__ import annotations

from ..models.fitting import Fitter, draw_seed

__all__ = ["Fitter", "draw_seed"]
