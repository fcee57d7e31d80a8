"""Gaussian randomized smoothing: certified L2 radii for multi-class, multi-label and 2-D/3-D segmentation models.

The smoothed model ``g(x)`` predicts, for every element of the task's grid (the sample for multi-class, each
label for multi-label, each voxel for segmentation), the class the base model ``f`` returns most often under
isotropic Gaussian noise ``x + δ``, ``δ ~ N(0, σ² I)``. If that class has probability ``p_A ≥ p̲ > 1/2``, then
``g`` is constant on the L2 ball of radius ``σ Φ⁻¹(p̲)`` around ``x`` (Cohen, Rosenfeld & Kolter, ICML 2019,
Theorem 1; the ``p_B ≤ 1 − p̲`` form).

Statistics (Cohen et al., Algorithm 1, CERTIFY): the class is *selected* on ``n0`` noise draws and its
probability *estimated* on ``n`` fresh draws, so the selection does not bias the estimate; ``p̲`` is the one-sided
Clopper–Pearson lower bound at level ``1 − α`` (:func:`~medadv.certify.stats.lower_confidence_bound`); the model
*abstains* where ``p̲ ≤ 1/2``. With probability at least ``1 − α`` over the noise, every non-abstained claim of one
sample holds.

* **Multi-class**: one element per sample (CERTIFY and PREDICT of Cohen et al.).
* **Multi-label**: each label is a binary classifier (present iff its logit passes the task's threshold) and is
  certified on its own; the ``L`` claims of a sample are made simultaneous by a family-wise error correction over
  labels: Bonferroni (each bound at level ``α / L``, per-label radii) or Holm with a threshold ``τ``. MultiGuard's
  top-``k`` set guarantee (Jia et al., NeurIPS 2022) is **not** implemented: it needs a base classifier that
  returns top-``k'`` label sets and a bound over the joint label-set probabilities that we have not reproduced;
  per-label certification is a different (weaker for large ``L``, simpler) statement.
* **Segmentation, 2-D and 3-D** (SegCertify, Fischer, Baader & Vechev, ICML 2021): every voxel's majority class,
  abstaining where the test fails. With ``tau``: voxel ``v`` is certified when the binomial test of
  ``H0: p_v ≤ τ`` rejects after Holm (or Bonferroni) over all voxels of the sample at level ``α``; every
  certified voxel holds at radius ``σ Φ⁻¹(τ)``. Without ``tau`` (Bonferroni only): per-voxel bounds at level
  ``α / V`` and per-voxel radii ``σ Φ⁻¹(p̲_v)``.

Engine: the noise is drawn from a seeded ``torch.Generator`` on the model's device, ``batch_size`` noisy copies
per forward (copies of several samples share a forward when the samples are small), counts accumulate as integer
tensors on the device and every bound is a gather from a table of ``n + 1`` values; the model runs in eval mode
with frozen parameters and ``torch.no_grad`` (both restored), the caller's tensors are never modified. A model
wrapped for sliding-window inference (:class:`~medadv.models.sliding.SlidingWindow`) is an ``nn.Module`` like any
other. Noise is not clipped to the data box: the certificate is for the smoothed model on ``R^d``.

Models that return probabilities (a final softmax or sigmoid, such as deepbet's): with the task declared
``outputs="probabilities"`` the votes are read from the logits the task converts them to
(:meth:`~medadv.tasks.Task.logits_model`; arg-max and threshold give the same classes as on the probabilities);
undeclared, :meth:`certify` and :meth:`predict` refuse them on the first forward, in one line. Training for
smoothing needs the loss: :class:`~medadv.defenses.GaussianAugmentation` through
:class:`~medadv.defenses.AdversarialTrainer` reads the converted logits too; denoised smoothing's
:func:`~medadv.certify.fit_denoiser` never reads the model (an MSE objective on images).

``sigma`` and the certified radii are in the data's own units (HU, [0, 1], z-scores), as L2 norms over the whole
input (all channels and voxels). So ``sigma`` is checked against the data range by medadv's budget-scale rule
(:func:`medadv.threats.check_budget_scale`): above the whole range (:data:`~medadv.threats.MAX_SIGMA_FRACTION`;
``sigma=25`` on [0, 1] data is a 0-255 value, the noise drowns the image) it is refused when the smoother is built
with ``bounds`` (unless ``allow_large_budgets=True``) and warned at ``certify``/``predict`` without them (against the
range of ``x``, which may be narrower than the data's); below 0.1 % of the range
(:data:`~medadv.threats.MIN_BUDGET_FRACTION`; ``sigma=0.25`` on CT in HU) it warns: the radii are then
meaningless.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import (
    AnyOf,
    Bool,
    Configurable,
    Instance,
    Int,
    InvalidParameterError,
    Optional,
    Options,
    Pair,
    Real,
)
from ..runtime import attack_mode, check_input, check_model, forward_tensor, make_generator, model_device
from ..tasks import Task, registered_task_classes
from ..threats import MAX_SIGMA_FRACTION, Bounds, Box, check_budget_scale
from .stats import bonferroni_reject, holm_reject, lcb_table, pvalue_table, two_sided_pvalue

__all__ = ["RandomizedSmoothing", "CertifyResult", "SmoothedPrediction", "FAMILIES", "ABSTAIN"]

#: the class index of an abstained element in ``prediction``
ABSTAIN = -1


# --- the task kinds: one dict, no isinstance ladder --------------------------------------------------------------
@dataclass(frozen=True)
class _Family:
    """How smoothing reads one task kind: per element of the grid, a class among ``num_classes``."""

    #: logits ``(B, ...)`` -> ``(B, E)`` int64 class of every element
    classes: Callable[[Task, Tensor], Tensor]
    #: classes per element (``K``) of a logits batch
    num_classes: Callable[[Task, Tensor], int]
    #: element grid without the batch dim (``()``, ``(L,)``, spatial)
    grid: Callable[[Tensor], tuple[int, ...]]
    #: what an element is, for messages and docs
    element: str


def _multiclass_classes(task: Task, logits: Tensor) -> Tensor:
    return logits.max(dim=1).indices.unsqueeze(1)


def _multilabel_classes(task: Task, logits: Tensor) -> Tensor:
    return task.predict(logits).to(torch.int64)  # 1 = present (the task's threshold), 0 = absent


def _segmentation_classes(task: Task, logits: Tensor) -> Tensor:
    return logits.max(dim=1).indices.flatten(1)


FAMILIES: dict[str, _Family] = {
    "multiclass": _Family(_multiclass_classes, lambda t, lg: int(lg.shape[1]), lambda lg: (), "sample"),
    "multilabel": _Family(_multilabel_classes, lambda t, lg: 2, lambda lg: (int(lg.shape[1]),), "label"),
    "segmentation": _Family(_segmentation_classes, lambda t, lg: int(lg.shape[1]),
                            lambda lg: tuple(int(s) for s in lg.shape[2:]), "voxel"),
}


def _family_of(task: Any, owner: str) -> str:
    """The smoothing family ``task``'s kind declares (``traits.certify.family``), or a refusal naming the kinds that
    declare one (the registry is asked, so a new kind that declares a family is listed)."""
    traits = getattr(task, "traits", None) if isinstance(task, Task) else None
    fam = traits.certify.family if traits is not None else None
    if fam not in FAMILIES:
        kinds = [c.name for c in registered_task_classes() if c.traits.certify.family in FAMILIES]
        raise InvalidParameterError(
            f"`task` of {owner} must be a task kind that declares a randomized-smoothing family "
            f"(traits.certify.family, one of {', '.join(FAMILIES)}; the registered kinds {', '.join(kinds)}); "
            f"got {task!r}")
    return str(fam)


# --- results ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CertifyResult:
    """What :meth:`RandomizedSmoothing.certify` returns; every tensor is on the model's device.

    Element-grid tensors have the shape of the task's labels: ``(N,)`` multi-class, ``(N, L)`` multi-label,
    ``(N, *spatial)`` segmentation.

    Attributes:
        family: ``"multiclass"``, ``"multilabel"`` or ``"segmentation"``.
        task: the task.
        prediction: int64 certified class per element (0/1 per label for multi-label), :data:`ABSTAIN` (``-1``)
            where the smoothed model abstains.
        abstain: bool, where the smoothed model abstains.
        p_lower: float32 lower bound on the top class's probability that the radius rests on: the Clopper–Pearson
            bound at the corrected level (no ``tau``), or ``tau`` on certified elements (0 where abstained).
        radius: float32 certified L2 radius in data units (0 where abstained).
        top: int64 class selected on the ``n0`` draws (before abstention).
        count: int64 draws (of ``n``) in which the base model returned ``top``.
        y: the labels given to ``certify`` (or ``None``).
        sigma, n0, n, alpha, correction, tau: the settings used.
    """

    family: str
    task: Task
    prediction: Tensor
    abstain: Tensor
    p_lower: Tensor
    radius: Tensor
    top: Tensor
    count: Tensor
    y: Tensor | None
    sigma: float
    n0: int
    n: int
    alpha: float
    correction: str
    tau: float | None

    def __len__(self) -> int:
        return int(self.prediction.shape[0])

    def _flat(self, t: Tensor) -> Tensor:
        return t.reshape(t.shape[0], -1)

    @property
    def sample_radius(self) -> Tensor:
        """``(N,)`` float32: the radius within which *every* element of the sample is certified (0 if any abstains)."""
        r = self._flat(self.radius).min(dim=1).values
        return torch.where(self._flat(self.abstain).any(dim=1), torch.zeros_like(r), r)

    @property
    def abstain_fraction(self) -> Tensor:
        """``(N,)`` float32: the share of the sample's elements (labels, voxels) where the model abstains."""
        return self._flat(self.abstain).float().mean(dim=1)

    def columns(self, y: Tensor | None = None) -> dict[str, Tensor]:
        """Per-sample result columns (leading dim N, on the device) for result rows, like :class:`~medadv.tasks.Outcome`.

        Always ``cert_radius`` (:attr:`sample_radius`) and ``cert_abstain_fraction``; multi-class adds
        ``cert_prediction`` and ``cert_p_lower``; multi-label adds the per-label ``cert_prediction`` and
        ``cert_label_radius`` ``(N, L)``. With labels (``y`` or the ones given to ``certify``): ``cert_correct``
        (multi-class: certified and right; multi-label: every label certified and right) or, for segmentation,
        ``cert_pixel_accuracy`` and ``cert_mean_dice`` (abstentions as errors, at the smallest positive radius).
        """
        from .metrics import certified_accuracy, certified_dice

        y = self.y if y is None else y
        cols = {"cert_radius": self.sample_radius, "cert_abstain_fraction": self.abstain_fraction}
        if self.family == "multiclass":
            cols.update(cert_prediction=self.prediction, cert_p_lower=self.p_lower)
        elif self.family == "multilabel":
            cols.update(cert_prediction=self.prediction, cert_label_radius=self.radius)
        if y is not None:
            if self.family == "segmentation":
                cols["cert_pixel_accuracy"] = certified_accuracy(self, y, [0.0], reduction="none")[:, 0]
                cols["cert_mean_dice"] = certified_dice(self, y, [0.0], reduction="none")[:, 0]
            else:
                cols["cert_correct"] = certified_accuracy(self, y, [0.0], reduction="none")[:, 0] > 0.5
        return cols


@dataclass(frozen=True)
class SmoothedPrediction:
    """What :meth:`RandomizedSmoothing.predict` returns (Cohen et al.'s PREDICT), on the model's device.

    Attributes:
        prediction: int64, the smoothed model's class per element, :data:`ABSTAIN` where the test fails.
        abstain: bool, where it abstains.
        pvalue: float64 two-sided binomial p-value of the top count against the runner-up (before correction).
        top: int64, the majority class of the ``n`` draws per element before the test (first on ties): the Monte
            Carlo estimate of the exact smoothed classifier ``g``, which never abstains.
    """

    prediction: Tensor
    abstain: Tensor
    pvalue: Tensor
    top: Tensor | None = None


# --- the smoother ----------------------------------------------------------------------------------------------
class RandomizedSmoothing(Configurable):
    """Gaussian randomized smoothing of a model for one task; certifies L2 balls (see the module docstring).

    Args:
        task: the task (:class:`~medadv.tasks.MultiClass`, :class:`~medadv.tasks.MultiLabel` or
            :class:`~medadv.tasks.Segmentation`, 2-D or 3-D).
        sigma: standard deviation of the Gaussian noise, in the data's units (> 0).
        n0: noise draws that select each element's class (Cohen et al.: 100).
        n: noise draws that estimate the selected class's probability (Cohen et al.: 100 000; each certified
            radius is at most ``σ Φ⁻¹(α^{1/n})``).
        alpha: the error level: with probability ≥ ``1 − alpha`` every claim about one sample holds (0 < α < 1).
        batch_size: noisy copies per forward pass (the memory bound; copies of several small samples share one).
        correction: family-wise error control over the elements (labels, voxels) of a sample: ``"bonferroni"``
            (per-element level ``α / m``) or ``"holm"`` (Holm's step-down; needs ``tau``). One element per
            sample (multi-class) needs none: both give the same result.
        tau: SegCertify's threshold, ``1/2 < τ < 1``: certify the elements whose top-class probability exceeds
            ``τ`` (binomial tests at level α with the correction), all at radius ``σ Φ⁻¹(τ)``; ``None``: per-element
            radii from Clopper–Pearson bounds at the (Bonferroni-) corrected level.
        seed: seed of the noise generator on the model's device (``None``: the global RNG); a ``generator`` given
            to :meth:`certify` or :meth:`predict` takes precedence.
        bounds: the data box ``(lo, hi)`` (or a :class:`~medadv.threats.Box`) in data units, or ``None``. Given, a
            ``sigma`` above the data range is refused here, before any work (a value on another scale: ``sigma=25``
            meant as 25/255 on [0, 1] data), and inputs outside the box are refused; ``None``: ``sigma`` is
            compared with the range of each ``x`` and only warned about. A ``sigma`` below 0.1 % of the range
            warns either way. The noise itself is never clipped.
        allow_large_budgets: accept a ``sigma`` above the data range (as the config's ``allow_large_budgets``).
    """

    positional: ClassVar[tuple[str, ...]] = ("task",)
    params: ClassVar[dict[str, Any]] = {
        "sigma": Real(low=0.0, low_open=True),
        "n0": Int(low=1),
        "n": Int(low=1),
        "alpha": Real(low=0.0, high=1.0, low_open=True, high_open=True),
        "batch_size": Int(low=1),
        "correction": Options("bonferroni", "holm"),
        "tau": Optional(Real(low=0.5, high=1.0, low_open=True, high_open=True)),
        "seed": Optional(Int()),
        "bounds": Optional(AnyOf(Instance(Box), Pair(Real()))),
        "allow_large_budgets": Bool(),
    }

    task: Task
    sigma: float
    n0: int
    n: int
    alpha: float
    batch_size: int
    correction: str
    tau: float | None
    seed: int | None
    bounds: Box | tuple[float, float] | None
    allow_large_budgets: bool

    def __init__(self, task: Task, sigma: float, *, n0: int = 100, n: int = 1000, alpha: float = 0.001,
                 batch_size: int = 256, correction: str = "bonferroni", tau: float | None = None,
                 seed: int | None = 0, bounds: Box | Bounds | None = None, allow_large_budgets: bool = False) -> None:
        self.family = _family_of(task, type(self).__name__)
        self.task = task
        self._init_params(locals())
        try:
            self._box = Box.coerce(self.bounds)
        except (TypeError, ValueError) as err:
            raise InvalidParameterError(f"`bounds` of RandomizedSmoothing: {err}") from None
        self._check_sigma(self._box, " (`bounds`)", large="raise", stacklevel=3)
        if self.correction == "holm" and self.tau is None:
            raise InvalidParameterError(
                "`tau` of RandomizedSmoothing must be given with correction='holm' (Holm's procedure tests "
                "H0: p <= tau per element, SegCertify: e.g. tau=0.75); use correction='bonferroni' for "
                "per-element radii without a threshold")

    # --- the public calls ------------------------------------------------------------------------------------
    def certify(self, model: nn.Module, x: Tensor, y: Tensor | None = None, *,
                generator: torch.Generator | None = None) -> CertifyResult:
        """CERTIFY (Cohen et al., Algorithm 1; SegCertify per voxel) for a batch ``x`` ``(N, C, *spatial)``.

        ``y`` (optional) is validated against the task and kept in the result for :meth:`CertifyResult.columns`
        and the certified metrics; certification itself never reads it.
        """
        model, x, gen, device = self._prepare(model, x, generator)
        fam = FAMILIES[self.family]
        with attack_mode(model), torch.no_grad():
            sel, shape, k = self._sample(model, x, self.n0, gen, fam, None)
            top = sel.argmax(dim=1)  # (N, E): the selected class (first on ties)
            count, _, _ = self._sample(model, x, self.n, gen, fam, top)
        y = self._labels(y, x.shape[0], shape, k, device)
        m = top.shape[1]
        if self.tau is None:
            level = self.alpha / m  # Bonferroni (m = 1: Cohen's bound at level 1 - alpha)
            p_lower = lcb_table(self.n, level, device)[count]
            abstain = p_lower <= 0.5
            radius = self.sigma * _norm_ppf(p_lower.clamp(0.5, 1.0))
        else:
            pv = pvalue_table(self.n, self.tau, device)[count]
            reject = holm_reject(pv, self.alpha) if self.correction == "holm" else bonferroni_reject(pv, self.alpha)
            abstain = ~reject
            p_lower = torch.where(abstain, torch.zeros_like(pv), torch.full_like(pv, self.tau))
            radius = torch.full_like(pv, self.sigma * _norm_ppf_scalar(self.tau))
        radius = torch.where(abstain, torch.zeros_like(radius), radius)
        pred = torch.where(abstain, torch.full_like(top, ABSTAIN), top)
        n = x.shape[0]

        def grid(t: Tensor) -> Tensor:
            return t.reshape(n, *shape)

        return CertifyResult(self.family, self.task, grid(pred), grid(abstain), grid(p_lower.float()),
                             grid(radius.float()), grid(top), grid(count.long()), y, self.sigma, self.n0, self.n,
                             self.alpha, self.correction, self.tau)

    def predict(self, model: nn.Module, x: Tensor, *, generator: torch.Generator | None = None) -> SmoothedPrediction:
        """PREDICT (Cohen et al., Algorithm 1): the smoothed class per element from ``n`` draws, abstaining where the
        two-sided binomial test of the top count against the runner-up fails at level ``alpha`` (corrected over
        the elements by ``correction``; Holm needs no ``tau`` here). P(a wrong, non-abstained answer) ≤ alpha."""
        model, x, gen, _ = self._prepare(model, x, generator)
        fam = FAMILIES[self.family]
        with attack_mode(model), torch.no_grad():
            counts, shape, _ = self._sample(model, x, self.n, gen, fam, None)
        best = counts.topk(2, dim=1)
        pv = two_sided_pvalue(best.values[:, 0], best.values[:, 1])
        reject = holm_reject(pv, self.alpha) if self.correction == "holm" else bonferroni_reject(pv, self.alpha)
        cls = best.indices[:, 0]
        pred = torch.where(reject, cls, torch.full_like(cls, ABSTAIN))
        n = x.shape[0]
        return SmoothedPrediction(pred.reshape(n, *shape), (~reject).reshape(n, *shape), pv.reshape(n, *shape),
                                  cls.reshape(n, *shape))

    # --- internals -------------------------------------------------------------------------------------------
    def _check_sigma(self, box: Box, where: str, large: str, stacklevel: int = 4) -> None:
        """medadv's budget-scale rule on ``sigma``: noise above the data range, or below 0.1 % of it."""
        check_budget_scale(
            self.sigma, box, name="sigma", owner="RandomizedSmoothing ", where=where, max_fraction=MAX_SIGMA_FRACTION,
            large=large, allow_large_budgets=self.allow_large_budgets, stacklevel=stacklevel,
            advice="sigma is in data units, e.g. 25/255 for 25 on a 0-255 scale; pass allow_large_budgets=True "
                   "if you mean it")

    def _prepare(self, model: Any, x: Any, generator: Any) -> tuple[nn.Module, Tensor, torch.Generator | None,
                                                                     torch.device]:
        # a task declared with outputs="probabilities" reads its model's logits (the one conversion,
        # Task.logits_model): the multi-label threshold is the task's on logits, and a probability read as a
        # logit would be "present" everywhere; undeclared probabilities are refused by task.validate on the
        # first noisy forward, before any count
        model = self.task.logits_model(check_model(model))
        check_input(x)
        if self._box.bounded:
            self._box.check_inside(x, "x")
        elif x.numel():
            # no declared box: the range of x is a lower bound of the data's, so only a warning (one host read)
            lo, hi = float(x.min()), float(x.max())
            if hi > lo:
                self._check_sigma(Box(lo, hi), " (the range of `x`; give RandomizedSmoothing bounds=(lo, hi) to "
                                  "check against the declared data range)", large="warn")
        device = model_device(model, x.device)
        if generator is not None:
            if not isinstance(generator, torch.Generator):
                raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}")
            if generator.device.type != device.type:
                raise ValueError(f"`generator` is on {generator.device}, the model on {device}: the noise is drawn "
                                 f"on the model's device (torch.Generator(device={str(device)!r}))")
            gen: torch.Generator | None = generator
        else:
            gen = make_generator(self.seed, device)
        return model, x.detach().to(device), gen, device

    def _labels(self, y: Any, num: int, shape: tuple[int, ...], k: int, device: torch.device) -> Tensor | None:
        if y is None:
            return None
        if not isinstance(y, Tensor):
            raise TypeError(f"`y` must be a torch.Tensor or None, got {type(y).__name__}")
        # the labels are checked against the logits' shape only (a meta tensor: no data, no forward)
        logit_shape = {"multiclass": (num, k), "multilabel": (num, *shape)}.get(self.family, (num, k, *shape))
        self.task.validate_labels(torch.empty(logit_shape, device="meta"), y, "y")
        return y.to(device)

    def _sample(self, model: nn.Module, x: Tensor, num: int, gen: torch.Generator | None, fam: _Family,
                target: Tensor | None) -> tuple[Tensor, tuple[int, ...], int]:
        """Draw ``num`` noisy copies of every sample, ``batch_size`` copies per forward.

        ``target`` None: class counts ``(N, K, E)``; else ``(N, E)`` counts of ``target`` (the selected classes).
        Returns the counts, the element grid shape and the classes per element ``K``.
        """
        n_samples, device = x.shape[0], x.device
        total = n_samples * num
        out: Tensor | None = None
        shape: tuple[int, ...] = ()
        k = e = 0
        for start in range(0, total, self.batch_size):
            idx = torch.arange(start, min(start + self.batch_size, total), device=device) // num
            xb = x.index_select(0, idx)  # a new tensor: the in-place noise never reaches the caller's x
            xb.add_(torch.randn(xb.shape, generator=gen, device=device, dtype=xb.dtype), alpha=self.sigma)
            logits = forward_tensor(model, xb)
            if out is None:
                self.task.validate(logits, None)
                shape, k = fam.grid(logits), fam.num_classes(self.task, logits)
                e = max(1, math.prod(shape))
                out = torch.zeros((n_samples, k, e) if target is None else (n_samples, e), dtype=torch.int32,
                                  device=device)
            cls = fam.classes(self.task, logits)  # (B, E)
            if target is None:
                key = (idx.unsqueeze(1) * k + cls) * e + torch.arange(e, device=device)
                out.view(-1).scatter_add_(0, key.reshape(-1), torch.ones(key.numel(), dtype=torch.int32,
                                                                          device=device))
            else:
                out.index_add_(0, idx, (cls == target.index_select(0, idx)).to(torch.int32))
        assert out is not None
        return out, shape, k


def _norm_ppf(p: Tensor) -> Tensor:
    """Φ⁻¹ in float64 on the device (``torch.special.ndtri``)."""
    return torch.special.ndtri(p.double())


def _norm_ppf_scalar(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)
