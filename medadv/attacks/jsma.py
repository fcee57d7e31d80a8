"""JSMA: the Jacobian-based saliency map attack, an L0 attack on multi-class classifiers.

Papernot, McDaniel, Jha, Fredrikson, Celik, Swami. "The Limitations of Deep Learning in Adversarial Settings",
IEEE EuroS&P 2016 (Algorithms 2-3, the saliency maps of Eq. 8-10). Paschali et al. (MICCAI 2018) used a saliency
map attack ("SMA", §2.3 of ``specs/001_paschali2018.md``) on skin-lesion classifiers.

Each iteration computes the forward derivative (the gradients of the logits) at the current input, picks the input
element (or pair of elements) whose change raises the target class's logit most while lowering the others', moves it
by ``θ`` and takes it out of the search domain. A *feature* is one input element (one channel of one pixel or
voxel). Everything is batched on the model's device: two backward passes per iteration whatever the number of
classes (the target logit, and the sum of all logits), the per-sample "still attacked" flag and search domain are
tensors, and the only host read in the loop is a check every ``_CHECK_EVERY`` iterations whether any sample is left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Bool, InvalidParameterError, Real
from ..runtime import forward_tensor
from ..tasks import Task
from ..threats import Box
from .base import Attack, AttackDetails, register

__all__ = ["JSMA", "JSMADetails", "PAIR_LIMIT"]

#: iterations between the host reads that end the loop once no sample is still attacked
_CHECK_EVERY = 16
#: the pairwise search holds a features × features saliency matrix per sample: refused above this many features
PAIR_LIMIT = 4096
#: elements of one chunk of pair-saliency matrices (several samples' matrices at once, bounded memory)
_PAIR_CHUNK = 1 << 24


@dataclass
class JSMADetails(AttackDetails):
    """JSMA's per-sample record.

    Attributes:
        iterations: ``(N,)`` long: iterations that changed the sample (each changes one feature, or two with
            ``pairs=True``).
        changed_fraction: ``(N,)`` the share of the input's features (elements) that differ in ``x_adv`` (the L0
            norm over the number of features; at most about ``gamma``).
        target: ``(N,)`` long: the class the saliency map pushed towards (``y`` when targeted, else the clean
            runner-up class).
    """

    columns: ClassVar[tuple[str, ...]] = ("iterations", "changed_fraction")
    sample_fields: ClassVar[tuple[str, ...]] = ("target",)
    iterations: Tensor
    changed_fraction: Tensor
    target: Tensor


@register("jsma")
class JSMA(Attack):
    """Jacobian saliency map attack (Papernot et al., EuroS&P 2016), multi-class, an L0 attack in a data box.

    With the logits ``z`` at the current input, the target ``t``, ``α_i = ∂z_t/∂x_i`` and
    ``β_i = Σ_{j≠t} ∂z_j/∂x_i`` (Papernot's forward derivative, on logits as torchattacks and ART take it):

    * single-feature mode (``pairs=False``, the default; Papernot's Eq. 8): the feature
      ``argmax_i α_i·|β_i|`` over the search domain with ``α_i > 0`` and ``β_i < 0`` (``θ > 0``; for ``θ < 0`` the
      signs flip: ``α_i < 0``, ``β_i > 0``, score ``|α_i|·β_i``);
    * pairwise mode (``pairs=True``, Papernot's Algorithm 3 and torchattacks' ``JSMA``): the pair ``p ≠ q``
      maximising ``(α_p + α_q)·|β_p + β_q|`` with ``α_p + α_q > 0`` and ``β_p + β_q < 0`` (signs flipped for
      ``θ < 0``). It holds a features × features matrix per sample, so it is refused above
      :data:`PAIR_LIMIT` features (use the single-feature mode at medical resolutions).

    The chosen features move by ``θ`` times the data range (``hi − lo``, per channel for per-channel boxes) and
    are clipped to the box; they leave the search domain, as do features that start at the bound they would move
    towards. A sample stops when the goal is reached (targeted: the prediction is ``y``; untargeted: it differs
    from ``y``), when no feature is admissible, or after ``⌈gamma · features / (2 if pairs else 1)⌉`` iterations.

    Untargeted rule: the saliency map pushes towards the clean *runner-up* class (the highest clean logit other
    than ``y``, the nearest class by the logits) and the sample stops at any misclassification. (torchattacks
    hard-codes ``(y + 1) % 10``; ART draws a random class; Foolbox 1.x runs a gradient attack to find one.)

    Args:
        task: a :class:`~medadv.tasks.MultiClass` task.
        box: the data :class:`~medadv.threats.Box` (bounded: ``θ`` is a fraction of its range). JSMA is an L0
            attack: there is no ε-ball; ``gamma`` bounds how many features change.
        theta: the change of a chosen feature, as a signed fraction of the data range: ``1.0`` (Papernot's and
            torchattacks' default on [0, 1] data) sets it to the top of the box, ``0.1`` is Foolbox's SMA step;
            negative values decrease features (Papernot's JSMA−). ``0 < |theta| <= 1``.
        gamma: the largest fraction of the features that may change (0 < gamma <= 1; Papernot: 0.145 on MNIST,
            torchattacks 0.1).
        pairs: pairwise search (Papernot's Algorithm 3) instead of single features.
        targeted: ``y`` is the target class (see :class:`~medadv.attacks.base.Attack`).
        seed: unused (JSMA is deterministic); kept for the common signature.
    """

    params: ClassVar[dict[str, Any]] = {
        "theta": Real(low=-1.0, high=1.0),
        "gamma": Real(low=0.0, high=1.0, low_open=True),
        "pairs": Bool(),
    }
    threat_kind = "box"
    tasks = ("MultiClass",)
    other_tasks = ("the saliency map is defined for multi-class classifiers ((N, K) logits, one class per sample): "
                   "use a loss-based attack instead, e.g. get_attack('apgd', task, threat) or 'pgd' (the task's loss), "
                   "or 'square'")
    positional: ClassVar[tuple[str, ...]] = ("task", "box")

    theta: float
    gamma: float
    pairs: bool

    def __init__(
        self,
        task: Task,
        box: Box | None = None,
        *,
        theta: float = 1.0,
        gamma: float = 0.1,
        pairs: bool = False,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, box, targeted=targeted, seed=seed)
        self._init_params(locals())
        if self.theta == 0.0:
            raise InvalidParameterError("`theta` of JSMA must be non-zero (a signed fraction of the data range); got 0")
        if not self.box.bounded:
            raise InvalidParameterError(
                "JSMA needs a bounded data box: `theta` is a fraction of its range (hi - lo); got Box.unbounded(). "
                "Declare the data's bounds, e.g. Box(0, 1) or Box(-1024, 3071) for CT in HU")

    def _check_call(self, model: Any, x: Any, y: Any) -> None:
        super()._check_call(model, x, y)
        features = math.prod(x.shape[1:])
        if self.pairs and features > PAIR_LIMIT:
            raise ValueError(
                f"JSMA(pairs=True) builds a features x features saliency matrix per sample and `x` has {features} "
                f"features per sample (more than {PAIR_LIMIT}); use pairs=False (single features) at this size")

    # --- the saliency maps -----------------------------------------------------------------------------------------
    @staticmethod
    def _single(a: Tensor, b: Tensor, domain: Tensor) -> tuple[Tensor, Tensor]:
        """Per sample the best feature ``(N,)`` and whether any feature is admissible ``(N,)`` (``a``, ``b``:
        ``(N, D)`` forward derivatives already signed so that ``a > 0``, ``b < 0`` is the admissible side)."""
        ok = domain & (a > 0) & (b < 0)
        score = torch.where(ok, a * b.abs(), torch.full_like(a, -1.0))
        return score.argmax(dim=1), ok.any(dim=1)

    @staticmethod
    def _pair(a: Tensor, b: Tensor, domain: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per sample the best pair ``(p, q)`` and whether any pair is admissible (see :meth:`_single`)."""
        n, d = a.shape
        off_diagonal = ~torch.eye(d, dtype=torch.bool, device=a.device)
        chunk = max(1, _PAIR_CHUNK // (d * d))
        best, found = [], []
        for s in range(0, n, chunk):  # bounded memory: a few samples' d x d matrices at a time
            ac, bc, dc = a[s:s + chunk], b[s:s + chunk], domain[s:s + chunk]
            alpha = ac.unsqueeze(2) + ac.unsqueeze(1)  # (c, d, d): alpha[p, q] = a_p + a_q
            beta = bc.unsqueeze(2) + bc.unsqueeze(1)
            ok = (dc.unsqueeze(2) & dc.unsqueeze(1)) & off_diagonal & (alpha > 0) & (beta < 0)
            score = torch.where(ok, alpha * beta.abs(), torch.full_like(alpha, -1.0))
            best.append(score.reshape(score.shape[0], -1).argmax(dim=1))
            found.append(ok.reshape(ok.shape[0], -1).any(dim=1))
        flat = torch.cat(best)
        return flat // d, flat % d, torch.cat(found)

    def _derivatives(self, model: nn.Module, x: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(α, β, logits)``: the gradients of the target logit and of the sum of the others, flattened ``(N, D)``
        and signed by θ's direction, and the model's output at ``x``."""
        v = x.detach().requires_grad_(True)
        with torch.enable_grad():
            out = forward_tensor(model, v)
            (ga,) = torch.autograd.grad(out.gather(1, target.unsqueeze(1)).sum(), v, retain_graph=True)
            (gall,) = torch.autograd.grad(out.sum(), v)
        n = x.shape[0]
        a, b = ga.reshape(n, -1), (gall - ga).reshape(n, -1)
        if self.theta < 0:
            a, b = -a, -b
        return a, b, out.detach()

    # --- the loop --------------------------------------------------------------------------------------------------
    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any):
        assert logits is not None
        n = x.shape[0]
        yl = y.long()
        if self.targeted:
            target = yl
        else:  # the clean runner-up class
            target = logits.detach().scatter(1, yl.unsqueeze(1), float("-inf")).argmax(dim=1)
        lo, hi = self.box.lohi(x)
        step = (self.theta * (hi - lo)).expand_as(x).reshape(n, -1)
        flat = x.reshape(n, -1).clone()
        lo_f, hi_f = lo.expand_as(x).reshape(n, -1), hi.expand_as(x).reshape(n, -1)
        domain = flat < hi_f if self.theta > 0 else flat > lo_f  # features that can still move
        d = flat.shape[1]
        per_iteration = 2 if self.pairs else 1
        max_iter = math.ceil(self.gamma * d / per_iteration)
        iterations = torch.zeros(n, dtype=torch.long, device=x.device)
        active = torch.ones(n, dtype=torch.bool, device=x.device)
        rows = torch.arange(n, device=x.device)
        for i in range(max_iter):
            a, b, out = self._derivatives(model, flat.reshape(x.shape), target)
            pred = out.argmax(dim=1)
            reached = pred == target if self.targeted else pred != yl
            if self.pairs:
                p, q, found = self._pair(a, b, domain)
            else:
                p, found = self._single(a, b, domain)
                q = p
            active = active & ~reached & found
            chosen = torch.zeros_like(domain)
            chosen[rows, p] = True
            chosen[rows, q] = True
            chosen = chosen & active.unsqueeze(1)
            flat = torch.where(chosen, torch.minimum(torch.maximum(flat + step, lo_f), hi_f), flat)
            domain = domain & ~chosen
            iterations += active.long()
            if (i + 1) % _CHECK_EVERY == 0 and i + 1 < max_iter and not bool(active.any()):
                break  # the one host read: no sample is left
        x_adv = flat.reshape(x.shape)
        changed = (x_adv != x).reshape(n, -1).sum(dim=1).to(x.dtype) / d
        return x_adv, JSMADetails(iterations=iterations, changed_fraction=changed, target=target), None
