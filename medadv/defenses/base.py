"""The interface between the adversarial-training loop and its strategies.

A strategy turns one batch into one scalar training loss (PGD-AT, MPAdvT, MAAdvT, TRADES, VAFT, ...).
The loop (:class:`~medadv.defenses.trainer.AdversarialTrainer`, on the shared
:class:`~medadv.training.loop.Fitter`) owns the optimiser, checkpoints, progress and randomness; the strategy
owns the loss. Train-time attacks are medadv attacks on the iterative engine, which put the model in eval mode
with frozen parameters for the attack and restore train mode afterwards.

Strategies declare their parameters like attacks do (:mod:`medadv.params`): validation, ``get_params()``,
``repr`` and ``fingerprint()`` derive from the declaration. The search set is a positional argument: a
:class:`~medadv.threats.Threat` (norm ball + data box) for strategies with a fixed ball, a
:class:`~medadv.threats.Box` for those that draw their ball (MPAdvT).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Configurable, InvalidParameterError
from ..tasks import Task
from ..threats import Box, Threat

__all__ = ["TrainingStrategy"]


class TrainingStrategy(Configurable, ABC):
    """One adversarial-training recipe: ``loss(model, x, y, task, generator) -> scalar``.

    ``model`` is in train mode on entry and must be in train mode on exit. ``generator`` is the
    loop's seeded ``torch.Generator`` (CPU), used for every random choice of the strategy so that a
    seeded run is reproducible and resumable.

    Subclasses declare ``params`` and call ``self._init_params(locals())`` (see :mod:`medadv.params`);
    ``positional`` names the threat or box argument (shown by ``repr``, part of the fingerprint, not a
    hyper-parameter of ``get_params()``).
    """

    name: str = "strategy"
    positional: ClassVar[tuple[str, ...]] = ()

    def _set_threat(self, threat: Any) -> Threat:
        """Validate and store the strategy's threat model (a norm ball with the data box)."""
        if not isinstance(threat, Threat):
            hint = " (a Box has no ball: use e.g. Linf(eps, bounds=box))" if isinstance(threat, Box) else ""
            raise InvalidParameterError(f"`threat` of {type(self).__name__} must be a medadv Threat (Linf or L2 "
                                        f"with the data bounds){hint}; got {threat!r}")
        self.threat = threat
        return threat

    @abstractmethod
    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        """Scalar loss for one batch (autograd graph to the model parameters attached)."""

    def state_dict(self) -> dict[str, Any]:
        """Strategy state to checkpoint (tensors and plain Python values only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
