"""DeepFool: the minimal-norm, linearise-and-project attack for multi-class classifiers.

Moosavi-Dezfooli, Fawzi, Frossard. "DeepFool: a simple and accurate method to fool deep neural networks",
CVPR 2016 (Algorithm 2, multi-class; §3.3 for the ℓ∞ variant). Used by Paschali et al., MICCAI 2018 (§2.2 of
``specs/001_paschali2018.md``), through Foolbox.

At each iterate the classifier is linearised around ``x_i`` and the input moves to the nearest linearised
decision boundary of a candidate class; the loop ends for a sample as soon as its prediction leaves its label.
Everything is batched on the model's device: the per-sample "still correct" flag is a tensor, the Jacobian rows
of the candidate logits come from one backward pass per candidate, and the only host read in the loop is a
check every ``_CHECK_EVERY`` steps whether any sample is still being attacked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Constant, Int, Options, Real
from ..runtime import forward_tensor
from ..tasks import Task
from ..threats import Linf, Threat
from .base import Attack, AttackDetails, register

__all__ = ["DeepFool", "DeepFoolDetails"]

#: steps between the host reads that end the loop once no sample is still attacked
_CHECK_EVERY = 10
#: denominators below this (a zero gradient difference) give no step instead of a division by zero
_TINY = 1e-12


@dataclass
class DeepFoolDetails(AttackDetails):
    """DeepFool's per-sample record.

    Attributes:
        iterations: ``(N,)`` long: linearisation steps that moved the sample (0 for a sample already
            misclassified on the clean input, which is returned unchanged).
        minimal_norm: ``(N,)`` the norm (the threat's: L2 or L∞, data units) of the perturbation DeepFool found,
            *before* it was capped to the ε-ball; larger than ε where the cap cut it (such a sample may then not
            be fooled). 0 for an unchanged sample.
    """

    columns: ClassVar[tuple[str, ...]] = ("iterations", "minimal_norm")
    iterations: Tensor
    minimal_norm: Tensor


@register("deepfool")
class DeepFool(Attack):
    """DeepFool (Moosavi-Dezfooli et al., CVPR 2016), multi-class, L2 or L∞, untargeted.

    Per sample with label ``y`` (the clean prediction when ``y`` is not given) and candidate classes ``k ≠ y``,
    at the iterate ``x_i``: ``f'_k = z_k(x_i) − z_y(x_i)`` (logits), ``w'_k = ∇z_k(x_i) − ∇z_y(x_i)``,
    ``l = argmin_k |f'_k| / ‖w'_k‖_q`` and the step to the linearised boundary of class ``l``:

    * L2 (``q = 2``): ``r_i = |f'_l| / ‖w'_l‖₂² · w'_l``;
    * L∞ (``q = 1``, the dual norm): ``r_i = |f'_l| / ‖w'_l‖₁ · sign(w'_l)``.

    The overshoot η pushes the iterate past the boundary: ``overshoot_mode="total"`` (the paper, its reference code
    and Foolbox 3): ``x_{i+1} = clip(x + (1 + η) Σ_j r_j)``; ``"per_step"`` (Foolbox 1.x, which Paschali et al.
    used with ``1 + η = 1.05``, and torchattacks): ``x_{i+1} = clip(x_i + (1 + η) r_i)``; ``clip`` is the data
    box. A sample stops as soon as its prediction differs from ``y``; a sample misclassified on the clean input
    is returned unchanged (Foolbox's rule). Near the box's bounds the clip removes part of every step, so the
    iterate may reach the boundary only asymptotically and end on a near-tie of two logits (as in torchattacks and
    Foolbox); ``steps`` bounds that work.

    **ε is a cap, not a target.** DeepFool looks for the *smallest* perturbation; the iterations run inside the data
    box only, and the perturbation found is then projected onto the threat's ε-ball (and clipped to the box), as
    Foolbox 3 does for its minimisation attacks. A sample whose minimal perturbation is longer than ε is therefore
    cut back and may not be fooled; :class:`DeepFoolDetails` keeps the norm before the cap (``minimal_norm``).
    For the uncapped attack pass an ε no smaller than the box's diameter (e.g. ``L2(eps=1e3, bounds=(0, 1))``).

    Multi-class only: its step needs one logit per class and per sample. For multi-label, segmentation or
    regression models use a loss-based attack (``pgd``, ``apgd`` with the task's loss, or ``auto``); targeted use is
    refused (DeepFool moves to the *nearest* boundary, whichever class is behind it).

    Args:
        task: a :class:`~medadv.tasks.MultiClass` task.
        threat: :class:`~medadv.threats.L2` (the paper's and Paschali's choice) or :class:`~medadv.threats.Linf`:
            the geometry of the steps, and ε (data units) caps the final perturbation.
        steps: maximum number of linearisation steps (100: Foolbox, the paper-era default; torchattacks uses 50).
        overshoot: η ≥ 0, a fraction of the step (0.02 in the paper and Foolbox 3; Paschali's Foolbox 1.x: 0.05
            with ``overshoot_mode="per_step"``).
        overshoot_mode: ``"total"`` or ``"per_step"`` (see above).
        candidates: how many classes are considered, the label included: the label and the ``candidates − 1``
            classes with the highest clean logits (Foolbox's ``candidates=10``); capped at the number of classes.
        targeted: must be False.
        seed: unused (DeepFool is deterministic); kept for the common signature.
    """

    params: ClassVar[dict[str, Any]] = {
        "steps": Int(low=1),
        "overshoot": Real(low=0.0),
        "overshoot_mode": Options("total", "per_step"),
        "candidates": Int(low=2),
        "targeted": Constant(False, "DeepFool is untargeted: it moves to the nearest decision boundary; for a "
                                    "targeted attack use pgd or apgd with targeted=True"),
    }
    tasks = ("MultiClass",)
    other_tasks = ("DeepFool is defined for multi-class classifiers ((N, K) logits, one class per sample): use a "
                   "loss-based attack instead, e.g. get_attack('apgd', task, threat) or 'pgd' (the task's loss), or "
                   "'auto'")

    steps: int
    overshoot: float
    overshoot_mode: str
    candidates: int

    def __init__(
        self,
        task: Task,
        threat: Threat,
        *,
        steps: int = 100,
        overshoot: float = 0.02,
        overshoot_mode: str = "total",
        candidates: int = 10,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())

    # --- one linearisation ---------------------------------------------------------------------------------------
    def _step(self, model: nn.Module, x: Tensor, cand: Tensor) -> tuple[Tensor, Tensor]:
        """``(r, logits)``: the DeepFool step of every sample at ``x`` (towards the nearest linearised boundary of
        ``cand[:, 1:]``, away from ``cand[:, 0]``) and the model's output there (detached)."""
        v = x.detach().requires_grad_(True)
        with torch.enable_grad():
            out = forward_tensor(model, v)
            f = out.gather(1, cand)  # (N, k): the label's logit first
            rows = []
            for j in range(cand.shape[1]):
                (g,) = torch.autograd.grad(f[:, j].sum(), v, retain_graph=j + 1 < cand.shape[1])
                rows.append(g)
        n = x.shape[0]
        jac = torch.stack(rows, dim=1).reshape(n, cand.shape[1], -1)  # (N, k, D)
        w = jac[:, 1:] - jac[:, :1]  # (N, k-1, D)
        fd = (f[:, 1:] - f[:, :1]).detach().abs()  # (N, k-1)
        linf = isinstance(self.threat, Linf)
        wn = w.abs().sum(dim=2) if linf else w.norm(dim=2)  # the dual norm of the step's geometry
        dist = fd / wn.clamp_min(_TINY)
        best = dist.argmin(dim=1)
        idx = best.reshape(n, 1, 1).expand(n, 1, w.shape[2])
        wl = w.gather(1, idx).squeeze(1)  # (N, D)
        fl = fd.gather(1, best.unsqueeze(1))  # (N, 1)
        wnl = wn.gather(1, best.unsqueeze(1))
        ok = wnl > _TINY  # a zero gradient difference: no step (instead of a division by zero)
        if linf:
            r = torch.where(ok, fl / wnl.clamp_min(_TINY), torch.zeros_like(fl)) * wl.sign()
        else:
            r = torch.where(ok, fl / wnl.clamp_min(_TINY).square(), torch.zeros_like(fl)) * wl
        return r.reshape(x.shape), out.detach()

    # --- the loop --------------------------------------------------------------------------------------------------
    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any):
        assert logits is not None and self.threat is not None
        n, classes = logits.shape
        k = min(self.candidates, classes)
        # the label first, then the classes with the highest clean logits
        ranked = logits.detach().scatter(1, y.long().unsqueeze(1), float("inf"))
        cand = ranked.argsort(dim=1, descending=True)[:, :k]
        yl = y.long()
        active = logits.argmax(dim=1) == yl  # a misclassified clean sample is returned unchanged
        iterations = torch.zeros(n, dtype=torch.long, device=x.device)
        total = torch.zeros_like(x)
        xi = x.clone()
        scale = 1.0 + self.overshoot
        shape = (n,) + (1,) * (x.ndim - 1)
        for i in range(self.steps):
            r, out = self._step(model, xi, cand)
            active = active & (out.argmax(dim=1) == yl)
            r = r * active.reshape(shape).to(r.dtype)
            total = total + r
            if self.overshoot_mode == "total":
                xi = self.box.clip(x + scale * total)
            else:
                xi = self.box.clip(xi + scale * r)
            iterations += active.long()
            if (i + 1) % _CHECK_EVERY == 0 and i + 1 < self.steps and not bool(active.any()):
                break  # the one host read: every sample is fooled (or was misclassified from the start)
        minimal = self.threat.norm(xi - x)
        x_adv = self.threat.finalize(x, xi)
        return x_adv, DeepFoolDetails(iterations=iterations, minimal_norm=minimal), None
