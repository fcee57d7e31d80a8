"""AutoAttack (pyautoattack) as a medadv attack for classifiers (K >= 2 classes, or one sigmoid logit), in data units.

Croce and Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse parameter-free
attacks", ICML 2020. The ensemble (APGD-CE, APGD-T, FAB-T, Square for ``version="standard"``) is
pyautoattack's own code; medadv only maps the data range onto the unit box AutoAttack works in, so CT in
HU or z-scored MRI is attacked without being clipped to [0, 1].
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..params import Constant, Int, InvalidParameterError, Names, Optional, Options
from ..runtime import forward_tensor
from ..tasks import Task
from ..threats import Threat
from .base import Attack, register

__all__ = ["AutoAttack", "SoftmaxForm", "UnitBox", "run_pyautoattack", "pyautoattack_members", "square_refusal"]

_VERSIONS = ("standard", "plus", "rand", "custom")
_ATTACKS = ("apgd-ce", "apgd-dlr", "fab", "square", "apgd-t", "fab-t")
#: the members each pyautoattack version runs (its ``AutoAttack.__init__``)
_VERSION_MEMBERS = {"standard": ("apgd-ce", "apgd-t", "fab-t", "square"),
                    "plus": ("apgd-ce", "apgd-dlr", "fab", "square", "apgd-t", "fab-t"),
                    "rand": ("apgd-ce", "apgd-dlr")}


def pyautoattack_members(version: str, attacks: list[str] | None) -> tuple[str, ...]:
    """The members pyautoattack runs for ``version`` (``attacks`` when given, as :func:`run_pyautoattack`)."""
    return tuple(attacks) if attacks is not None else _VERSION_MEMBERS.get(version, ())


def square_refusal(shape: tuple[int, ...], norm: str) -> str | None:
    """Why pyautoattack's Square cannot attack inputs of ``shape`` ``(N, C, *spatial)`` under ``norm``
    (``"Linf"`` / ``"L2"``); ``None`` when it can.

    Its Square unpacks ``(C, H, W)`` (2-D images only), and its L2 version tiles the initial perturbation in
    windows of ``H // 5`` rows (a ZeroDivisionError below 5 rows). APGD and FAB take any spatial rank.
    """
    if len(shape) != 4:
        return f"pyautoattack's Square attacks 2-D images (N, C, H, W) only, got shape {tuple(shape)}"
    if norm == "L2" and shape[2] < 5:
        return (f"pyautoattack's L2 Square needs images of at least 5 rows (its windows are H // 5 rows), got "
                f"shape {tuple(shape)}")
    return None


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: a channels_last model (or input) gives a
    channels_last gradient, which toolkits flatten with ``.view`` (pyautoattack's APGD, Square, checks)."""

    @staticmethod
    def forward(ctx: Any, u: Tensor) -> Tensor:
        return u.view_as(u)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad.contiguous()


class SoftmaxForm(nn.Module):
    """``model`` with its output in the task's softmax form (``task.softmax_logits``): ``(N, K)`` logits, K >= 2.

    Multi-class logits pass unchanged; a single-logit sigmoid head (multi-label, one label) becomes the 2-class
    logits ``[logit(threshold), z]``, so softmax-only code (pyautoattack) attacks the same decision.
    """

    def __init__(self, model: nn.Module, task: Task) -> None:
        super().__init__()
        self.model = model
        self.task: Any = task

    def forward(self, x: Tensor) -> Tensor:
        return self.task.softmax_logits(forward_tensor(self.model, x))


class UnitBox(nn.Module):
    """``model`` seen through the unit box: input ``u`` in [0, 1] is the data ``lo + u * (hi - lo)``.

    Lets toolkits that hard-code [0, 1] (AutoAttack, torchattacks) attack data in other units. ``lo`` and
    ``hi`` are scalars or tensors broadcastable to one batch (per-channel ranges).

    With ``dtype`` (the model's floating dtype, e.g. float64), the decoded input is cast to it and the
    output cast back to float32: toolkits such as pyautoattack cast their inputs to float32 (``.float()``),
    which a float64 model refuses ("Input type (float) and bias type (double)"). The gradient reaching ``u``
    is always contiguous (see :class:`_ContiguousGrad`).
    """

    lo: Tensor
    scale: Tensor

    def __init__(self, model: nn.Module, lo: float | Tensor, hi: float | Tensor,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype
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
        x = self.decode(_ContiguousGrad.apply(u))
        if self.dtype is None or self.dtype == x.dtype:
            return self.model(x)
        return self.model(x.to(self.dtype)).float()


@register("autoattack")
class AutoAttack(Attack):
    """AutoAttack ensemble (pyautoattack) on a classifier of K >= 2 classes or one sigmoid logit; ε in data units.

    Croce and Hein, ICML 2020. Untargeted only (its targeted members, APGD-T and FAB-T, pick their own
    target classes). pyautoattack seeds torch's global RNG; medadv runs it inside a fork of the global
    CPU (and CUDA) RNG state, so the caller's random stream is the same after the call as before.

    Any class count K >= 2: below 4 classes APGD-T's targeted DLR loss (it reads the 3rd and 4th largest logit)
    is replaced by the loss defined there, and on 2 classes APGD-DLR's by the logit margin (:data:`SMALL_CLASS_LOSSES`:
    K = 3: targeted DLR normalised by ``z_π1 − (z_π2 + z_π3)/2``; K = 2: targeted CE towards the other class, APGD-DLR on the
    margin); FAB-T and APGD-T try the K − 1 other classes at most; APGD-CE, FAB and Square are unchanged.

    Args:
        task: :class:`~medadv.tasks.MultiClass`, or :class:`~medadv.tasks.MultiLabel` with one label (a
            single-logit sigmoid head: ``y`` ``(N, 1)``), attacked as the 2 classes ``[logit(threshold), z]``
            (``task.softmax_logits``: the same decision, CE = the BCE from the threshold). Several labels are
            refused before any work (use ``auto``).
        threat: ``Linf`` or ``L2`` ball (ε in data units) with finite scalar bounds ``(lo, hi)``.
        version: ``"standard"`` (APGD-CE, APGD-T, FAB-T, Square), ``"plus"``, ``"rand"`` or ``"custom"``.
        attacks: for ``version="custom"`` (required there, refused otherwise), the members to run, e.g.
            ``["apgd-ce", "square"]``, from ``"apgd-ce"``, ``"apgd-dlr"``, ``"fab"``, ``"square"``,
            ``"apgd-t"``, ``"fab-t"``.
        batch_size: samples per AutoAttack batch (default: the whole batch).
        targeted: must be False (AutoAttack is untargeted).
        seed: AutoAttack's seed (same seed, same adversarial tensor on CPU); ``None`` draws one from
            torch's global RNG.
    """

    params: ClassVar[dict[str, Any]] = {
        "version": Options(*_VERSIONS),
        "attacks": Optional(Names(*_ATTACKS)),
        "batch_size": Optional(Int(low=1)),
        "targeted": Constant(False, "AutoAttack is untargeted: its APGD-T/FAB-T members choose their own targets"),
    }
    # a kind with a softmax form (``softmax_logits`` / ``softmax_labels``): multi-class, and multi-label with one
    # label (a single-logit sigmoid head, attacked as 2 classes); several labels are refused before any work
    tasks = ("MultiClass", "MultiLabel")
    version: str
    attacks: list[str] | None
    batch_size: int | None

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
        self._init_params(locals())
        if threat.bounds is None or any(isinstance(b, Tensor) for b in threat.bounds):
            raise InvalidParameterError("AutoAttack needs finite scalar `bounds` (lo, hi) on the threat, got "
                                        f"{threat.describe_bounds()}")
        if (self.attacks is None) == (self.version == "custom"):
            raise InvalidParameterError("`attacks` of AutoAttack is required with version='custom' and not "
                                        f"allowed with version={self.version!r}")

    def _check_call(self, model: Any, x: Any, y: Any) -> None:
        """Also refuse, before any work, inputs pyautoattack's Square cannot attack (:func:`square_refusal`)."""
        super()._check_call(model, x, y)
        if y is not None:  # a task without a softmax form of these labels (several labels) refuses here
            self.task.softmax_labels(y)  # type: ignore[attr-defined]
        assert self.threat is not None
        norm = "Linf" if math.isinf(self.threat.p) else "L2"
        members = pyautoattack_members(self.version, self.attacks)
        why = square_refusal(tuple(x.shape), norm) if "square" in members else None
        if why is not None:
            rest = [m for m in members if m != "square"]
            others = f"version='custom' with attacks={rest!r}, " if rest else ""
            raise ValueError(f"`x` of AutoAttack (version={self.version!r}, members {', '.join(members)}): {why}. "
                             f"Use {others}medadv's `auto` (its Square member takes any image size and 3-D "
                             "volumes), or medadv's `square` attack")

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any) -> Tensor:
        assert self.threat is not None
        task: Any = self.task
        y_cls = task.softmax_labels(y)  # several labels (y from the clean prediction) refuse after that forward
        return run_pyautoattack(SoftmaxForm(model, task), x, y_cls,
                                None if logits is None else task.softmax_logits(logits), self.threat,
                                version=self.version, attacks=self.attacks, seed=self.seed, batch_size=self.batch_size)


def run_pyautoattack(model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, threat: Threat, *,
                     version: str, attacks: list[str] | None, seed: int | None, batch_size: int | None = None,
                     steps: int | None = None, targets: int | None = None, queries: int | None = None) -> Tensor:
    """pyautoattack's ensemble (``version``) or the members ``attacks`` on ``x``, in the data's units.

    ``version="standard"`` with ``attacks`` runs those members with the standard version's settings (one
    restart, 9 target classes, 5000 Square queries); ``steps`` (APGD iterations), ``targets`` (target
    classes of APGD-T / FAB-T) and ``queries`` (Square) override them. The threat needs finite scalar
    bounds. The caller's global RNG stream is left as it was.

    pyautoattack works in float32 on contiguous tensors: a model of another floating dtype is run in its
    own dtype behind the unit box (the result comes back in ``x``'s dtype), channels_last inputs and
    gradients are made contiguous. Inputs its Square cannot take (:func:`square_refusal`) are refused
    before any work when ``square`` is among the members.
    """
    from pyautoattack import AutoAttack as _AutoAttack

    assert threat.bounds is not None
    lo, hi = threat.bounds
    norm = "Linf" if math.isinf(threat.p) else "L2"
    why = square_refusal(tuple(x.shape), norm) if "square" in pyautoattack_members(version, attacks) else None
    if why is not None:
        raise ValueError(f"{why}: run the other members (version='custom'), or medadv's `square` attack")
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    box = UnitBox(model, lo, hi, dtype=None if param is None else param.dtype).to(x.device)
    # seed=None: one seed from the global RNG (the caller's stream, used like any unseeded attack)
    seed = seed if seed is not None else int(torch.randint(2**31 - 1, ()).item())
    u = box.encode(x).float().contiguous()  # pyautoattack's own dtype and layout (it `.view`s and `.float()`s)
    # pyautoattack calls torch.manual_seed / torch.cuda.manual_seed: fork the global CPU and CUDA RNG
    # states so the caller's stream is untouched (medadv never changes global RNG state)
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        custom = version == "custom"
        aa = _AutoAttack(box, attacks=attacks if custom else None, device=x.device, eps=box.unit_eps(threat.eps),
                         norm=norm, seed=seed, version=version)
        if not custom and attacks is not None:
            aa.attacks_to_run = list(attacks)
        aa.verbose = False
        # APGD-T and FAB-T try 9 target classes (the top non-true ones); a model with K <= 9 classes has
        # only K - 1, and pyautoattack would index past the logits: cap at K - 1
        num_classes = int(logits.shape[1]) if logits is not None else int(box(u[:1]).shape[1])
        # DLR divides by z_π1 − (z_π3 + z_π4)/2 (targeted) or z_π1 − z_π3: below 4 (3) classes those logits do
        # not exist (pyautoattack indexes past them), so the members take the losses defined there
        _small_class_losses(aa, num_classes)
        # pyautoattack's class-count warning ("not possible to use the DLR loss") is void once the losses above
        # are in place: drop that one record from its shared logger for this run
        quiet = _DropRecords("classes it is not possible to use")
        aa.logger.addFilter(quiet)
        for member in (aa.apgd_targeted, aa.fab):
            member.n_target_classes = min(targets or member.n_target_classes, num_classes - 1)
        if steps is not None:
            aa.apgd.n_iter = aa.apgd_targeted.n_iter = steps
        if queries is not None:
            aa.square.n_queries = queries
        try:
            u_adv, _ = aa.run_standard_evaluation(u, y, batch_size=batch_size or x.shape[0])
        finally:
            aa.logger.removeFilter(quiet)
    # back in data units, exactly inside the ball and bounds (undo the unit-box round-off); only the
    # perturbation is rescaled (against the float32 ``u`` pyautoattack saw), so elements it left alone come
    # back bit-exact in x's own dtype
    return threat.finalize(x, x + (u_adv.to(u) - u).to(x) * box.scale.to(x))


class _DropRecords(logging.Filter):
    """Drops the log records whose message contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def dlr_targeted_3(logits: Tensor, y: Tensor, target: Tensor) -> Tensor:
    """AutoAttack's targeted DLR loss for 3 classes, per sample ``(N,)`` (ascended by APGD-T).

    ``−(z_y − z_t) / (z_π1 − (z_π2 + z_π3)/2 + 1e-12)``. The reference normaliser ``z_π1 − (z_π3 + z_π4)/2`` (Croce &
    Hein, ICML 2020, eq. 7) needs a 4th logit; its 3-class analogue ``z_π1 − z_π3`` is the numerator itself when the
    target is the lowest class and the label the top one (a ratio of exactly 1, zero gradient: APGD-T's 2nd
    target). The mean of the two lower logits keeps the ratio invariant to shifting and rescaling the logits and
    never proportional to a difference of two of them.
    """
    srt = logits.sort(dim=1).values
    u = torch.arange(logits.shape[0], device=logits.device)
    return -(logits[u, y] - logits[u, target]) / (srt[:, -1] - 0.5 * (srt[:, -2] + srt[:, -3]) + 1e-12)


def ce_targeted(logits: Tensor, target: Tensor) -> Tensor:
    """Targeted cross-entropy ``−CE(z, t)`` per sample ``(N,)``: APGD-T's loss on 2 classes, where no DLR ratio
    is defined (any logit-difference ratio of two logits is ±1, with a zero gradient)."""
    return -F.cross_entropy(logits, target, reduction="none")


def margin_untargeted(logits: Tensor, y: Tensor) -> Tensor:
    """``−(z_y − max_{j≠y} z_j)`` per sample ``(N,)``: APGD-DLR's loss on 2 classes, DLR's numerator without its
    normaliser ``z_π1 − z_π3`` (no third logit). On 2 classes CE is ``softplus`` of the same difference, so the
    steps follow CE's direction; the member is a further run from its own random start."""
    u = torch.arange(logits.shape[0], device=logits.device)
    other = logits.scatter(1, y[:, None], float("-inf")).max(dim=1).values
    return -(logits[u, y] - other)


#: the loss of APGD-T and APGD-DLR by class count K (``medadv attacks --params autoattack`` / ``auto`` docs)
SMALL_CLASS_LOSSES = {
    2: {"apgd-t": "targeted CE towards the other class", "apgd-dlr": "the logit margin (DLR without normaliser)"},
    3: {"apgd-t": "targeted DLR normalised by z_π1 − (z_π2 + z_π3)/2", "apgd-dlr": "DLR (z_π1 − z_π3, as for K >= 3)"},
}


def _small_class_losses(aa: Any, num_classes: int) -> None:
    """Give pyautoattack's APGD-T (below 4 classes) and APGD-DLR (2 classes) the losses defined there.

    pyautoattack picks a member's loss by name in ``attack_single_run`` and looks the function up on the
    instance (``self.dlr_loss_targeted`` / ``self.dlr_loss``), so an instance attribute replaces it for this
    run only; the rest of each member (schedule, restarts, targets ``sort()[:, -t]``) is the reference code.
    """
    if num_classes < 2:
        raise ValueError(f"AutoAttack needs (N, K) logits with K >= 2 classes, got K = {num_classes}")
    targeted = aa.apgd_targeted
    if num_classes == 3:
        targeted.dlr_loss_targeted = lambda z, y: dlr_targeted_3(z, y, targeted.y_target)
    elif num_classes == 2:
        targeted.dlr_loss_targeted = lambda z, y: ce_targeted(z, targeted.y_target)
        aa.apgd.dlr_loss = margin_untargeted
