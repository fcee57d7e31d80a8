"""torchattacks bridge, both directions, for multi-label and 2-D/3-D segmentation models.

torchattacks 3.5 assumes a softmax classifier on [0, 1] images: its attacks use ``nn.CrossEntropyLoss`` and
``clamp(0, 1)`` on every step (HU-valued CT is silently clipped), and ``set_normalization_used`` reshapes
mean/std to ``(1, C, 1, 1)`` (2-D only). This module offers:

* :class:`TorchattacksModel` -- wraps a medical model so torchattacks' **own, unmodified** attacks (FGSM,
  PGD, BIM, MIFGSM, APGD on multi-class, ...) attack it through the task's per-element loss:
  inputs live in the unit box and are mapped to data units (``lo + u * (hi - lo)``) before an optional
  per-channel normalisation of any spatial rank; multi-label logits ``z`` are presented as two-class logits
  ``[0, z]`` per label, for which torchattacks' cross-entropy *is* the per-label BCE; segmentation logits
  ``(N, C, *spatial)`` are already what its cross-entropy takes per voxel. :meth:`TorchattacksModel.attack`
  runs a torchattacks attack and returns the adversarial batch in data units.
* :class:`MedadvAttack` -- any medadv attack as a ``torchattacks.Attack``: torchattacks' targeted modes,
  ``set_normalization_used`` (multi-channel 2-D/3-D), ``set_model_training_mode`` and ``save`` work.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
import torchattacks
from torch import Tensor, nn

from medadv.attacks.autoattack import UnitBox
from medadv.attacks.base import Attack as MedadvBase
from medadv.tasks import MultiClass, MultiLabel, Segmentation, Task

from ._common import check_model, check_task

__all__ = ["TorchattacksModel", "MedadvAttack"]


class TorchattacksModel(nn.Module):
    """A medical model as torchattacks expects one: [0, 1] inputs, cross-entropy-compatible logits.

    Args:
        model: the PyTorch model (multi-class, multi-label or segmentation logits).
        task: its :class:`~medadv.tasks.Task`.
        bounds: ``(lo, hi)`` data range (HU, z-scores, ...), scalars or per-channel tensors broadcastable to
            one batch; the unit box [0, 1] torchattacks clamps to is mapped onto it.
        mean, std: optional per-channel normalisation applied after the mapping (data units), any rank.

    Use :meth:`unit_eps` for torchattacks' ``eps``/``alpha`` (data units to unit box) and :meth:`attack`
    to run an attack; or call the attack on :meth:`encode` (x) and :meth:`labels` (y) yourself.
    """

    def __init__(self, model: nn.Module, task: Task, bounds: tuple[Any, Any], *,
                 mean: Any = None, std: Any = None) -> None:
        super().__init__()
        check_model(model)
        check_task(task, (MultiClass, MultiLabel, Segmentation))
        if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
            raise TypeError(f"`bounds` must be a (lo, hi) pair, got {bounds!r}")
        if (mean is None) != (std is None):
            raise ValueError("give both `mean` and `std` or neither")
        self.task = task
        self.box = UnitBox(model, *bounds)
        self.norm = None if mean is None else _ChannelNorm(mean, std)
        # torchattacks restores the wrapper's flag onto the whole model; set the flags directly, because
        # self.train() would recurse and overwrite the wrapped model's per-submodule modes
        self.training = model.training
        self.box.training = model.training
        if self.norm is not None:
            self.norm.training = model.training

    # --- unit box <-> data units ----------------------------------------------------------------------------
    def encode(self, x: Tensor) -> Tensor:
        """Data units to the unit box torchattacks works in."""
        return self.box.encode(x)

    def decode(self, u: Tensor, x: Tensor | None = None) -> Tensor:
        """Unit box back to data units (pass the clean ``x`` for a bit-exact unperturbed part)."""
        return self.box.decode(u, x)

    def unit_eps(self, eps: float) -> float:
        """A budget in data units (ε, step size) as torchattacks' unit-box value."""
        return self.box.unit_eps(eps)

    def labels(self, y: Tensor) -> Tensor:
        """Labels in the form torchattacks' cross-entropy takes (class indices per sample/label/voxel)."""
        if isinstance(self.task, MultiLabel):
            if y.is_floating_point() and not bool(((y == 0) | (y == 1)).all()):
                raise ValueError("`y` must be multi-hot (0/1) for a MultiLabel task")
            return y.long()
        if y.is_floating_point() or y.dtype == torch.bool:
            raise TypeError(f"`y` must hold integer class labels, got dtype {y.dtype}")
        return y.long()

    # --- forward ----------------------------------------------------------------------------------------
    def forward(self, u: Tensor) -> Tensor:
        x = self.box.decode(u)
        if self.norm is not None:
            x = self.norm(x)
        z = self.box.model(x)
        if isinstance(self.task, MultiLabel):
            # CE over [0, z] with label y is exactly BCE-with-logits(z, y), per label
            return torch.stack((torch.zeros_like(z), z), dim=1)
        return z

    def logits(self, u: Tensor) -> Tensor:
        """The wrapped model's own logits (for ``task.metrics`` / ``task.fooled``)."""
        out = self(u)
        return out[:, 1] if isinstance(self.task, MultiLabel) else out

    def attack(self, atk: torchattacks.attack.Attack, x: Tensor, y: Tensor) -> Tensor:
        """Run torchattacks attack ``atk`` (built on this wrapper) on data-unit ``x``; returns data-unit x_adv.

        ``y`` are the task's labels, or the targets when ``atk`` is in ``set_mode_targeted_by_label``.
        """
        if not isinstance(atk, torchattacks.attack.Attack):
            raise TypeError(f"`atk` must be a torchattacks Attack, got {type(atk).__name__}")
        if atk.model is not self:
            raise ValueError("`atk` must be built on this TorchattacksModel, e.g. torchattacks.PGD(wrapped, ...)")
        u = self.encode(x)
        if bool((u < -1e-6).any()) or bool((u > 1 + 1e-6).any()):
            raise ValueError("`x` lies outside the declared `bounds`; torchattacks would clip it silently")
        with _modes_kept(self):
            u_adv = atk(u.clamp(0, 1), self.labels(y)).to(x)
        lo = self.box.lo.to(x)
        # decoding only the perturbation keeps untouched voxels exact; the clamp removes round-off
        return torch.clamp(self.decode(u_adv, x), lo, lo + self.box.scale.to(x))


@contextlib.contextmanager
def _modes_kept(model: nn.Module) -> Iterator[None]:
    """Restore every sub-module's train/eval flag: torchattacks only restores the top-level one."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


class _ChannelNorm(nn.Module):
    """``(x - mean) / std`` with per-channel vectors broadcast over any number of spatial dims."""

    mean: Tensor
    std: Tensor

    def __init__(self, mean: Any, std: Any) -> None:
        super().__init__()
        m = torch.as_tensor(mean, dtype=torch.float32).flatten()
        s = torch.as_tensor(std, dtype=torch.float32).flatten()
        if m.shape != s.shape:
            raise ValueError(f"`mean` and `std` must have the same length, got {m.numel()} and {s.numel()}")
        if not bool((s > 0).all()):
            raise ValueError("`std` must be > 0")
        self.register_buffer("mean", m, persistent=False)
        self.register_buffer("std", s, persistent=False)

    def _shape(self, x: Tensor) -> tuple[int, ...]:
        c = self.mean.numel()
        if c != 1 and x.shape[1] != c:
            raise ValueError(f"normalisation has {c} channels, the input has {x.shape[1]}")
        return (1, c) + (1,) * (x.ndim - 2)

    def forward(self, x: Tensor) -> Tensor:
        shape = self._shape(x)
        return (x - self.mean.to(x).reshape(shape)) / self.std.to(x).reshape(shape)

    def inverse(self, x: Tensor) -> Tensor:
        shape = self._shape(x)
        return x * self.std.to(x).reshape(shape) + self.mean.to(x).reshape(shape)


class _Logits(nn.Module):
    """The torchattacks attack's ``get_logits`` (its normalisation included) as a module to attack."""

    def __init__(self, owner: MedadvAttack) -> None:
        super().__init__()
        self.net = owner.model  # registered, so medadv's attack_mode freezes and restores it
        self._owner = [owner]  # a list keeps the (non-module) owner out of the module tree

    def forward(self, x: Tensor) -> Tensor:
        return self._owner[0].get_logits(x)


class MedadvAttack(torchattacks.attack.Attack):
    """A medadv attack (task-aware, bounds in data units) as a ``torchattacks.Attack``.

    ``atk(inputs, labels)`` returns the adversarial batch like any torchattacks attack. Targeted modes
    (``set_mode_targeted_by_label``, ``..._by_function``; ``..._random``/``..._least_likely`` for
    multi-class) drive the medadv attack towards ``get_target_label``; ``set_normalization_used(mean, std)``
    accepts per-channel statistics for 2-D and 3-D inputs and, as in torchattacks, then expects normalised
    inputs and returns normalised outputs. ``save`` works (its printed accuracy is multi-class only, so use
    ``verbose=False`` for multi-label and segmentation models).

    Args:
        attack: a configured medadv attack, e.g. ``PGD(MultiLabel(), Linf(2/255, bounds=(0, 1)))``.
        model: the PyTorch model.
    """

    def __init__(self, attack: MedadvBase, model: nn.Module) -> None:
        if not isinstance(attack, MedadvBase):
            raise TypeError(f"`attack` must be a medadv Attack, got {type(attack).__name__}")
        check_model(model)
        super().__init__(f"Medadv{type(attack).__name__}", model)
        self.medadv_attack = attack
        self.supported_mode = ["default", "targeted"]
        self._norm: _ChannelNorm | None = None

    # --- normalisation of any rank (torchattacks reshapes to (1, C, 1, 1)) ---------------------------------
    def set_normalization_used(self, mean: Any, std: Any) -> None:
        self._norm = _ChannelNorm(mean, std)
        # filled after assignment: torchattacks' __setattr__ cannot scan dicts of tensors
        self.normalization_used = {}
        self.normalization_used["mean"] = self._norm.mean
        self.normalization_used["std"] = self._norm.std
        self._set_normalization_applied(True)

    def normalize(self, inputs: Tensor) -> Tensor:
        return self._norm(inputs)  # type: ignore[misc]

    def inverse_normalize(self, inputs: Tensor) -> Tensor:
        return self._norm.inverse(inputs)  # type: ignore[union-attr]

    # --- the attack -------------------------------------------------------------------------------------
    def __call__(self, inputs: Tensor, labels: Tensor | None = None, *args: Any, **kwargs: Any) -> Tensor:
        with _modes_kept(self.model):
            return super().__call__(inputs, labels, *args, **kwargs)

    def forward(self, inputs: Tensor, labels: Tensor | None = None) -> Tensor:
        x = inputs.clone().detach().to(self.device)
        y = None if labels is None else labels.clone().detach().to(self.device)
        atk = copy.copy(self.medadv_attack)  # a copy: the configured attack itself is never mutated
        if not atk.always_targeted:  # DAG-like attacks: y is always their target map
            atk.targeted = bool(self.targeted)
        if self.targeted:
            y = self.get_target_label(x, y)
        return atk(_Logits(self), x, y).x_adv
