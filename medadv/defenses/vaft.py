"""VAFT — Volumetric Adversarial Frequency Training (Hanif et al., MICCAI 2023).

Hanif, Naseer, Khan, Shah, Khan. "Frequency Domain Adversarial Training for Robust Volumetric Medical
Segmentation", MICCAI 2023 (``train_epoch_freq_reg`` in the authors' code).

For each batch a VAFA example is crafted on the current model (eval mode, frozen parameters — the
attack restores train mode), then the model is trained on

    L = L_seg(F(x), y) + L_seg(F(x_adv), y) + ‖DCT(F(x)) − DCT(F(x_adv))‖₁ / ‖DCT(F(x))‖₁

where ``L_seg`` is the task's loss (the paper: DiceCE, i.e. ``Segmentation(K, loss="dicece")``) and the
DCT is orthonormal over the whole logit volume of each sample and class (one block, as in the
reference code); the L1 sums run over batch, classes and coefficients. All weights default to 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attacks.base import Attack
from ..attacks.vafa import VAFA
from ..dct import dct
from ..params import Configurable, Constraint, Instance, Optional, Real, renamed
from ..tasks import Task
from ..threats import Bounds, Box
from .base import TrainingStrategy

__all__ = ["VAFT", "frequency_consistency"]


def frequency_consistency(logits: Tensor, logits_adv: Tensor) -> Tensor:
    """``‖DCT(z) − DCT(z_adv)‖₁ / ‖DCT(z)‖₁`` over the whole spatial extent (scalar)."""
    if logits.shape != logits_adv.shape:
        raise ValueError(f"logit shapes differ: {tuple(logits.shape)} vs {tuple(logits_adv.shape)}")
    fz = dct(logits.float())
    fa = dct(logits_adv.float())
    return (fz - fa).abs().sum() / fz.abs().sum().clamp_min(1e-12)


class _BoxLike(Constraint):
    """A :class:`~medadv.threats.Box` or a ``(lo, hi)`` pair (stored as a Box)."""

    def describe(self) -> str:
        return "a Box or a (lo, hi) pair of data bounds"

    def convert(self, value: Any) -> Box:
        return Box.coerce(value)


class VAFT(TrainingStrategy, Configurable):
    """VAFT training loss: clean + adversarial (VAFA) segmentation loss + logit frequency consistency.

    Args:
        attack: the train-time attack; default a :class:`~medadv.attacks.vafa.VAFA` built on first use
            for the loop's task with ``attack_kwargs`` (README recipe: q_max 20, 20 steps, 32³ blocks,
            SSIM on). Pass a :class:`~medadv.attacks.vafa.VAFA2D` (or any segmentation attack) to change it.
        box: the data box of the inputs (a :class:`~medadv.threats.Box` or ``(lo, hi)`` in data units),
            for the default attack; required when no ``attack`` is given.
        clean_weight, adv_weight, freq_weight: weights of the three terms (all 1 in the paper).
        attack_kwargs: keyword arguments for the default VAFA (e.g. ``block=8, steps=5``), checked against
            VAFA's declared parameters when the strategy is built.

    The papers train with DiceCE and MONAI's ``squared_pred=True``:
    ``Segmentation(K, loss="dicece", include_background=True, squared_pred=True)`` as the loop's task.
    """

    name = "vaft"
    params: ClassVar[dict[str, Constraint]] = {
        "attack": Optional(Instance(Attack, text="a medadv segmentation attack (VAFA, VAFA2D, ...)")),
        "box": Optional(_BoxLike()),
        "clean_weight": Real(low=0),
        "adv_weight": Real(low=0),
        "freq_weight": Real(low=0),
        "attack_kwargs": Optional(Instance(Mapping, text="a mapping of VAFA parameters")),
    }
    attack: Attack | None
    box: Box | None
    clean_weight: float
    adv_weight: float
    freq_weight: float
    attack_kwargs: Mapping[str, Any] | None

    @renamed(bounds="box")
    def __init__(self, attack: Attack | None = None, *, box: Box | Bounds | None = None,
                 clean_weight: float = 1.0, adv_weight: float = 1.0, freq_weight: float = 1.0,
                 attack_kwargs: Mapping[str, Any] | None = None) -> None:
        self._init_params(locals())
        if attack is None and self.box is None:
            raise ValueError("`box` (the data box, Box(lo, hi) in data units) is required when no `attack` "
                             "is given")
        # unknown or misspelt VAFA parameters fail here, not at the first batch
        self._vafa_kwargs = VAFA.check_kwargs(dict(self.attack_kwargs or {}), what="VAFA (attack_kwargs)")
        self.last_terms: dict[str, Tensor] = {}

    def _attack_for(self, task: Task) -> Attack:
        # the default attack is built for the loop's task on first use (the strategy has no task before);
        # from then on `attack` is that VAFA
        if self.attack is None:
            assert self.box is not None
            self.attack = VAFA(task, self.box, **self._vafa_kwargs)
        return self.attack

    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        # the frequency term compares the DCT of logit maps and VAFA attacks label maps: a kind whose labels lie
        # on the input grid and are scored class by class (segmentation)
        if not (task.traits.labels.spatial_labels and task.traits.metrics.class_dice):
            raise TypeError(f"VAFT needs a Segmentation task, got {task!r}")
        attack = self._attack_for(task)
        x_adv = attack(model, x, y).x_adv.detach()  # eval + frozen params inside; train mode restored
        z = model(x)
        z_adv = model(x_adv)
        clean = task.loss(z, y).mean()
        adv = task.loss(z_adv, y).mean()
        freq = frequency_consistency(z, z_adv)
        self.last_terms = {"clean": clean.detach(), "adv": adv.detach(), "freq": freq.detach()}
        return self.clean_weight * clean + self.adv_weight * adv + self.freq_weight * freq
