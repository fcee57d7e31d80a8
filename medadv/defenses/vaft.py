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

from typing import Any

import torch
from torch import Tensor, nn

from ..attacks.vafa import VAFA, VAFA2D
from ..dct import dct
from ..tasks import Segmentation, Task
from ..threats import Bounds
from .base import TrainingStrategy

__all__ = ["VAFT", "frequency_consistency"]


def frequency_consistency(logits: Tensor, logits_adv: Tensor) -> Tensor:
    """``‖DCT(z) − DCT(z_adv)‖₁ / ‖DCT(z)‖₁`` over the whole spatial extent (scalar)."""
    if logits.shape != logits_adv.shape:
        raise ValueError(f"logit shapes differ: {tuple(logits.shape)} vs {tuple(logits_adv.shape)}")
    fz = dct(logits.float())
    fa = dct(logits_adv.float())
    return (fz - fa).abs().sum() / fz.abs().sum().clamp_min(1e-12)


class VAFT(TrainingStrategy):
    """VAFT training loss: clean + adversarial (VAFA) segmentation loss + logit frequency consistency.

    Args:
        attack: the train-time attack; default a :class:`~medadv.attacks.vafa.VAFA` built on first use
            for the loop's task with ``attack_kwargs`` (README recipe: q_max 20, 20 steps, 32³ blocks,
            SSIM on). Pass a :class:`VAFA2D` (or any segmentation attack) to change it.
        bounds: data range of the inputs in data units (for the default attack).
        clean_weight, adv_weight, freq_weight: weights of the three terms (all 1 in the paper).
        attack_kwargs: keyword arguments for the default VAFA (e.g. ``block=8, steps=5``).
    """

    name = "vaft"

    def __init__(self, attack: VAFA | VAFA2D | None = None, *, bounds: Bounds | None = None,
                 clean_weight: float = 1.0, adv_weight: float = 1.0, freq_weight: float = 1.0,
                 attack_kwargs: dict[str, Any] | None = None) -> None:
        if attack is None and bounds is None:
            raise ValueError("`bounds` (the data range in data units) is required when no `attack` is given")
        for n, w in (("clean_weight", clean_weight), ("adv_weight", adv_weight), ("freq_weight", freq_weight)):
            if not float(w) >= 0:
                raise ValueError(f"`{n}` must be >= 0, got {w}")
        self.attack = attack
        self.bounds = bounds
        self.clean_weight, self.adv_weight, self.freq_weight = float(clean_weight), float(adv_weight), float(freq_weight)
        self.attack_kwargs = dict(attack_kwargs or {})
        self.last_terms: dict[str, Tensor] = {}

    def _attack_for(self, task: Task):
        # the default attack is built for the loop's task on first use (the strategy has no task before)
        if self.attack is None:
            self.attack = VAFA(task, bounds=self.bounds, **self.attack_kwargs)
        return self.attack

    def loss(self, model: nn.Module, x: Tensor, y: Tensor, task: Task, generator: torch.Generator) -> Tensor:
        if not isinstance(task, Segmentation):
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
