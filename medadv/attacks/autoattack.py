"""AutoAttack (pyautoattack) as a medadv attack for multi-class models, in the data's own units.

Croce and Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse parameter-free
attacks", ICML 2020. The ensemble (APGD-CE, APGD-T, FAB-T, Square for ``version="standard"``) is
pyautoattack's own code; medadv only maps the data range onto the unit box AutoAttack works in, so CT in
HU or z-scored MRI is attacked without being clipped to [0, 1].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..tasks import MultiClass, Task
from ..threats import L2, Linf, Threat
from .base import Attack, register

__all__ = ["AutoAttack", "UnitBox"]

_VERSIONS = ("standard", "plus", "rand", "custom")
_ATTACKS = ("apgd-ce", "apgd-dlr", "fab", "square", "apgd-t", "fab-t")


class UnitBox(nn.Module):
    """``model`` seen through the unit box: input ``u`` in [0, 1] is the data ``lo + u * (hi - lo)``.

    Lets toolkits that hard-code [0, 1] (AutoAttack, torchattacks) attack data in other units. ``lo`` and
    ``hi`` are scalars or tensors broadcastable to one batch (per-channel ranges).
    """

    def __init__(self, model: nn.Module, lo: float | Tensor, hi: float | Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("lo", torch.as_tensor(lo, dtype=torch.float32).detach().clone(), persistent=False)
        self.register_buffer("scale", (torch.as_tensor(hi, dtype=torch.float32) - self.lo).detach().clone(),
                             persistent=False)
        if not bool((self.scale > 0).all()):
            raise ValueError("bounds must satisfy lo < hi")

    def encode(self, x: Tensor) -> Tensor:
        """Data units to the unit box."""
        return (x - self.lo.to(x)) / self.scale.to(x)

    def decode(self, u: Tensor, x: Tensor | None = None) -> Tensor:
        """Unit box to data units. With the clean ``x``, only the perturbation is rescaled, so elements the
        attack left alone come back bit-exact."""
        if x is None:
            return self.lo.to(u) + u * self.scale.to(u)
        return x + (u - self.encode(x)) * self.scale.to(u)

    def unit_eps(self, eps: float) -> float:
        """An ε in data units as an ε in the unit box (needs the same range for every element)."""
        if self.scale.numel() != 1 and not bool((self.scale == self.scale.flatten()[0]).all()):
            raise ValueError("an ε ball maps onto the unit box only when every element has the same range; "
                             "use scalar bounds")
        return float(eps) / float(self.scale.flatten()[0])

    def forward(self, u: Tensor) -> Tensor:
        return self.model(self.decode(u))


@register("autoattack")
class AutoAttack(Attack):
    """AutoAttack ensemble (pyautoattack) on a multi-class model; ε and bounds in data units.

    Croce and Hein, ICML 2020. Untargeted only (its targeted members, APGD-T and FAB-T, pick their own
    target classes).

    Args:
        task: :class:`~medadv.tasks.MultiClass` (AutoAttack is defined for softmax classifiers).
        threat: ``Linf`` or ``L2`` ball with finite scalar bounds ``(lo, hi)`` in data units.
        version: ``"standard"`` (APGD-CE, APGD-T, FAB-T, Square), ``"plus"``, ``"rand"`` or ``"custom"``.
        attacks: for ``version="custom"``, the members to run, e.g. ``["apgd-ce", "square"]``.
        batch_size: samples per AutoAttack batch (default: the whole batch).
        seed: AutoAttack's seed (same seed, same adversarial tensor on CPU).
    """

    def __init__(
        self,
        task: Task,
        threat: Threat,
        *,
        version: str = "standard",
        attacks: list[str] | None = None,
        batch_size: int | None = None,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        if not isinstance(task, MultiClass):
            raise TypeError(f"AutoAttack needs a MultiClass task, got {task!r}")
        if not isinstance(threat, (Linf, L2)):
            raise TypeError(f"`threat` must be Linf or L2 for AutoAttack, got {threat!r}")
        if threat.bounds is None or any(isinstance(b, Tensor) for b in threat.bounds):
            raise ValueError("AutoAttack needs finite scalar `bounds` (lo, hi) on the threat, got "
                             f"{threat.describe_bounds()}")
        if targeted:
            raise ValueError("AutoAttack is untargeted (its APGD-T/FAB-T members choose their own targets)")
        if version not in _VERSIONS:
            raise ValueError(f"`version` must be one of {_VERSIONS}, got {version!r}")
        if (attacks is None) == (version == "custom"):
            raise ValueError("`attacks` is required with version='custom' and not allowed otherwise")
        if attacks is not None:
            bad = [a for a in attacks if a not in _ATTACKS]
            if bad or not attacks:
                raise ValueError(f"`attacks` must be a non-empty list from {_ATTACKS}, got {attacks!r}")
        if batch_size is not None and int(batch_size) < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
        self.version = version
        self.attacks = None if attacks is None else list(attacks)
        self.batch_size = batch_size

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor):
        from pyautoattack import AutoAttack as _AutoAttack

        lo, hi = self.threat.bounds  # type: ignore[union-attr]
        box = UnitBox(model, lo, hi).to(x.device)
        norm = "Linf" if math.isinf(self.threat.p) else "L2"  # type: ignore[union-attr]
        aa = _AutoAttack(box, attacks=self.attacks, device=x.device, eps=box.unit_eps(self.threat.eps),  # type: ignore[union-attr]
                         norm=norm, seed=self.seed, version=self.version)
        u = box.encode(x)
        with torch.enable_grad():
            u_adv, _ = aa.run_standard_evaluation(u, y, batch_size=self.batch_size or x.shape[0])
        # back in data units, exactly inside the ball and bounds (undo the unit-box round-off)
        return self.threat.finalize(x, box.decode(u_adv.to(x), x))  # type: ignore[union-attr]
