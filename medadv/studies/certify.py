"""Certified vs. empirical robustness of one *smoothed* model, as a study (the ``certify`` entry of ``studies:``).

The model is smoothed with Gaussian noise of standard deviation ``sigma`` (data units) and certified per batch
with :class:`~medadv.certify.RandomizedSmoothing` (CERTIFY of Cohen, Rosenfeld & Kolter, ICML 2019; per label
with a family-wise correction for multi-label models; per voxel, SegCertify, for segmentation). Two curves of the
task's robust metric against the L2 radius ``r`` (data units) come out:

* **certified**: :func:`~medadv.certify.certified_accuracy` (multi-class accuracy, multi-label exact match) or
  :func:`~medadv.certify.certified_dice` (segmentation, mean Dice) at ``r``; abstentions and elements certified
  below ``r`` count as errors. Radius 0 is the smoothed model's certified clean metric.
* **empirical**: the *same smoothed model* attacked at ``r``. The smoothed classifier has no gradient, so the
  attack (medadv's ``auto``, ``version="fast"``, or PGD, L2 ball of radius ``r`` in the data box) runs on
  :class:`NoiseExpectation`, the expectation-over-noise surrogate of Salman et al. (NeurIPS 2019, "Provably
  robust deep learning via adversarially trained smoothed classifiers", SmoothAdv): the base model's
  probabilities (softmax, or sigmoid per label) averaged over ``draws`` Gaussian draws of the same σ. The draws
  are fixed (seeded) so the surrogate is a deterministic function and the gradient-masking checks see no
  randomness. The adversarial inputs are then classified by the smoothed model (the majority class of ``n``
  draws of :meth:`RandomizedSmoothing.predict`, the Monte Carlo estimate of the exact smoothed classifier ``g``
  the certificate talks about) and scored by the same metric code as the certificate (an element is right when
  its class is the label; for Dice, the same confusion counting). The robust metric at ``r`` is the infimum over
  the ball, so the empirical value of a sample at ``r`` is the worst of the points evaluated inside it: the
  clean input and the adversarial inputs at every radius ≤ ``r``.

Certified ≤ empirical must hold at every radius: a certificate says that ``g`` is constant on the ball (with
probability ≥ 1 − α over the certification noise), and the attacked input lies in the ball. What can break it
without a bug: the α event, and the Monte Carlo estimate of ``g`` at the attacked input erring on an element whose
top-class probability there is within sampling error of 1/2 (an element certified at a radius just above ``r``).
Each curve row has a ``violation`` flag (certified > empirical); the report flags any in red.

Rows (``StudyResult("certify")``, ``kind`` column):

* ``"curve"``: ``radius`` (0 and the given radii), ``certified``, ``empirical`` (``None`` with
  ``empirical="none"``), ``gap`` (empirical − certified), ``violation``, ``predict_abstain`` (the share of
  elements where PREDICT's binomial test abstains on the evaluated inputs: how close to 1/2 the votes are).
* ``"sample"``: one per sample: ``cert_radius`` (every element certified within it), ``median_radius`` over the
  elements (labels, voxels), ``abstain_fraction``, ``cert_fraction@r`` (share of elements certified at ≥ r),
  ``certified@r`` and ``empirical@r`` (the sample's metric).
* ``"label"`` (multi-label only): one per label: ``mean_radius``, ``abstain_fraction``, ``cert_fraction@r``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict, model_validator
from pydantic_core import PydanticCustomError
from torch import Tensor, nn

from ..certify import CertifyResult, RandomizedSmoothing, certified_accuracy, certified_dice
from ..params import InvalidParameterError, Real
from ..report.blocks import (
    PALETTE,
    Bullets,
    Section,
    StudyLike,
    Text,
    data_table,
    escape,
    figure_image,
    fmt,
    is_num,
    pyplot,
    raw_table,
    study_metric,
    style_axes,
)
from ..runtime import forward_tensor, model_device
from ..tasks import Task
from ..threats import L2, Bounds, Box
from ._common import AttackSpec, TargetFn, batches, check_model, check_task, mean
from .base import StudyResult
from .registry import Int, Number, StudySpec, data_box, one_model, register_study

__all__ = ["certify", "NoiseExpectation", "smoothed_metric", "empirical_smoothed", "EMPIRICAL"]

#: the empirical attacks on the smoothed model
EMPIRICAL = ("auto", "pgd", "none")
_TOL = 1e-9


class NoiseExpectation(nn.Module):
    """The smoothed model as a differentiable surrogate: ``E_δ[p(f(x + δ))]`` over ``draws`` fixed Gaussian draws.

    ``p`` is the softmax over classes (multi-class, segmentation: the output is the log of the averaged
    probabilities, a valid logit tensor) or the sigmoid per label (multi-label: the output is the logit of the
    averaged probability, so the task's threshold reads it as it reads the base model). This is the soft smoothed
    classifier that SmoothAdv attacks (Salman et al., NeurIPS 2019). The ``draws`` noise tensors, one per draw and
    shared by every sample of a batch, come from a generator seeded with ``seed`` at every forward: the surrogate
    is a deterministic function of ``x`` (independent of the batch it is in). Noise is not clipped, as in
    certification (the smoothed model is defined on ``R^d``).
    """

    def __init__(self, model: nn.Module, task: Task, sigma: float, draws: int = 8, seed: int = 0) -> None:
        super().__init__()
        self.model = model
        self.multilabel = task.traits.certify.family == "multilabel"  # the kind's declaration, not its name
        self.sigma = float(sigma)
        self.draws = int(draws)
        self.seed = int(seed)

    def forward(self, x: Tensor) -> Tensor:
        gen = torch.Generator(device=x.device).manual_seed(self.seed)
        noise = torch.randn((self.draws, *x.shape[1:]), generator=gen, device=x.device, dtype=x.dtype)
        noisy = (x.unsqueeze(0) + self.sigma * noise.unsqueeze(1)).reshape(-1, *x.shape[1:])
        out = forward_tensor(self.model, noisy)
        out = out.reshape(self.draws, x.shape[0], *out.shape[1:])
        eps = torch.finfo(out.dtype).eps
        if self.multilabel:
            p = torch.sigmoid(out).mean(dim=0).clamp(eps, 1.0 - eps)
            return torch.log(p) - torch.log1p(-p)
        return torch.log(torch.softmax(out, dim=2).mean(dim=0).clamp_min(eps))


def _as_result(rs: RandomizedSmoothing, prediction: Tensor, y: Tensor) -> CertifyResult:
    """A hard prediction without abstentions as a :class:`CertifyResult` valid at every radius, so that it is
    scored by exactly the code that scores certificates."""
    zeros = torch.zeros(prediction.shape, dtype=torch.float32, device=prediction.device)
    return CertifyResult(rs.family, rs.task, prediction, torch.zeros_like(prediction, dtype=torch.bool), zeros,
                         torch.full_like(zeros, math.inf), prediction, torch.zeros_like(prediction), y, rs.sigma,
                         rs.n0, rs.n, rs.alpha, rs.correction, rs.tau)


def _metric(result: CertifyResult, y: Tensor, radii: Sequence[float]) -> Tensor:
    """``(N, R)``: the certified metric of the task kind (Dice for segmentation, else accuracy / exact match)."""
    if result.family == "segmentation":
        return certified_dice(result, y, list(radii), reduction="none")
    return certified_accuracy(result, y, list(radii), reduction="none")


def smoothed_metric(rs: RandomizedSmoothing, model: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """The smoothed model's robust metric per sample on ``x`` (majority class of ``rs.n`` draws, Cohen et al.'s
    PREDICT without the abstention test), and the share of elements where PREDICT would abstain: ``(N,)`` each."""
    pred = rs.predict(model, x)
    assert pred.top is not None
    y = y.to(pred.top.device)
    per = _metric(_as_result(rs, pred.top, y), y, [0.0])[:, 0]
    return per, pred.abstain.reshape(pred.abstain.shape[0], -1).float().mean(dim=1)


def _attack(kind: str, task: Task, radius: float, bounds: Box | Bounds | None, steps: int | None, seed: int,
            options: Mapping[str, Any]) -> Any:
    threat = L2(radius, bounds=bounds)
    if kind == "pgd":
        from ..attacks.pgd import PGD

        return PGD(task, threat, **{"steps": steps if steps is not None else 20, "seed": seed, **options})
    from ..attacks.auto import AutoEvaluation

    return AutoEvaluation(task, threat, **{"version": "fast", "steps": steps, "seed": seed, **options})


def empirical_smoothed(rs: RandomizedSmoothing, model: nn.Module, x: Tensor, y: Tensor, radii: Sequence[float], *,
                       attack: str = "auto", bounds: Box | Bounds | None = None, steps: int | None = None,
                       draws: int = 8, seed: int = 0,
                       options: Mapping[str, Any] | None = None) -> tuple[Tensor, Tensor, list[str]]:
    """The empirical robust metric of the smoothed model (``rs`` around ``model``) at each radius.

    Crafts, per radius ``r`` of ``radii`` (all > 0), an ``attack`` (``"auto"`` or ``"pgd"``) in the L2 ball of
    radius ``r`` (box ``bounds``) on the :class:`NoiseExpectation` surrogate, and scores the smoothed model on the
    result with :func:`smoothed_metric`. Returns ``(metric, abstain, masking)``: ``metric`` ``(N, 1 + R)`` per
    sample at radius 0 (clean) and each radius, the worst over the clean input and the attacks at radii ≤ r (the
    robust metric is an infimum over the ball); ``abstain`` ``(1 + R,)`` the share of elements where PREDICT
    abstains on the inputs of each radius; ``masking`` the gradient-masking flags ``auto`` raised. ``options``: more
    keyword arguments of the attack (e.g. ``{"queries": 100}`` for ``auto``'s Square member).
    """
    if attack not in ("auto", "pgd"):
        raise InvalidParameterError(f"`attack` of empirical_smoothed must be 'auto' or 'pgd', got {attack!r}")
    model = rs.task.logits_model(model)  # declared probabilities: the surrogate averages the logits' softmax
    surrogate = NoiseExpectation(model, rs.task, rs.sigma, draws, seed)
    # the surrogate returns logits whatever the base model returns: the attack reads them as logits
    logit_task = rs.task.with_outputs("logits") if rs.task.outputs == "probabilities" else rs.task
    clean, abst = smoothed_metric(rs, model, x, y)
    cols, abstains, flags = [clean], [abst.mean()], []
    for r in radii:
        out = _attack(attack, logit_task, float(r), bounds, steps, seed, options or {})(surrogate, x, y)
        flags += [f"r={float(r):g}: {m}" for m in getattr(out.details, "masking", None) or []]
        per, abst = smoothed_metric(rs, model, out.x_adv, y)
        cols.append(per)
        abstains.append(abst.mean())
    metric = torch.stack(cols, dim=1).cummin(dim=1).values  # worst over the clean input and every smaller radius
    return metric, torch.stack(abstains), flags


def _radii(radii: Any) -> list[float]:
    if isinstance(radii, int | float) or not isinstance(radii, Sequence) or len(radii) == 0:
        raise InvalidParameterError(f"`radii` of the certify study must be a non-empty list of L2 radii > 0 (data "
                                    f"units), got {radii!r}")
    values = [Real(low=0.0, low_open=True).check(r, "radii", "the certify study") for r in radii]
    return sorted(set(float(v) for v in values))


def certify(
    model: nn.Module,
    task: Task,
    data: Any,
    *,
    sigma: float,
    radii: Sequence[float],
    n0: int = 100,
    n: int = 1000,
    alpha: float = 0.001,
    batch_size: int = 256,
    correction: str = "bonferroni",
    tau: float | None = None,
    seed: int | None = 0,
    empirical: str = "auto",
    empirical_steps: int | None = None,
    draws: int = 8,
    bounds: Box | Bounds | None = None,
) -> StudyResult:
    """Certified (randomized smoothing, Cohen et al. 2019) vs. empirical (SmoothAdv-style attack on the same
    smoothed model, Salman et al. 2019) robust metric at a list of L2 radii; see the module docstring.

    Args:
        model, task, data: as for ``evaluate`` (multi-class, multi-label, 2-D/3-D segmentation).
        sigma, n0, n, alpha, batch_size, correction, tau, seed: those of
            :class:`~medadv.certify.RandomizedSmoothing` (σ in data units).
        radii: L2 radii (data units, > 0) of the curves; radius 0 (the clean smoothed model) is added.
        empirical: ``"auto"`` (``version="fast"``), ``"pgd"`` or ``"none"`` (certified curve only).
        empirical_steps: iterations of the attack (``None``: auto's version default, 20 for PGD).
        draws: Gaussian draws of the :class:`NoiseExpectation` surrogate the attack runs on.
        bounds: the data box of the attack (``None``: unbounded; multi-class ``auto`` needs one).

    Returns:
        ``StudyResult("certify")`` with ``curve``, ``sample`` (and, multi-label, ``label``) rows.
    """
    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
    owner = "the certify study"
    rs = RandomizedSmoothing(task, sigma, n0=n0, n=n, alpha=alpha, batch_size=batch_size, correction=correction,
                             tau=tau, seed=seed)
    rlist = _radii(radii)
    if empirical not in EMPIRICAL:
        raise InvalidParameterError(f"`empirical` of {owner} must be one of {', '.join(map(repr, EMPIRICAL))}, "
                                    f"got {empirical!r}")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise InvalidParameterError(f"`draws` of {owner} must be an integer >= 1, got {draws!r}")
    if empirical_steps is not None and (isinstance(empirical_steps, bool) or not isinstance(empirical_steps, int)
                                        or empirical_steps < 1):
        raise InvalidParameterError(f"`empirical_steps` of {owner} must be an integer >= 1 or None, "
                                    f"got {empirical_steps!r}")
    all_r = [0.0, *rlist]
    cert: list[Tensor] = []  # (N, 1 + R) per batch, and so on: one list per column, concatenated at the end
    emp: list[Tensor] = []
    radius: list[Tensor] = []
    median: list[Tensor] = []
    abstain: list[Tensor] = []
    frac: list[Tensor] = []
    label_r: list[Tensor] = []
    label_abst: list[Tensor] = []
    label_frac: list[Tensor] = []
    emp_abst: list[Tensor] = []
    masking: list[str] = []
    device = model_device(model)
    for x, y in batches(data):
        x, y = x.to(device), y.to(device)
        res = rs.certify(model, x, y)
        y = res.y if res.y is not None else y
        cert.append(_metric(res, y, all_r).cpu())
        nb = len(res)
        rad = res.radius.reshape(nb, -1)
        ok = ~res.abstain.reshape(nb, -1)
        radius.append(res.sample_radius.cpu())
        median.append(rad.float().median(dim=1).values.cpu())
        abstain.append(res.abstain_fraction.cpu())
        at = ok.unsqueeze(1) & (rad.unsqueeze(1) >= torch.tensor(rlist, device=rad.device).view(1, -1, 1))
        frac.append(at.float().mean(dim=2).cpu())  # (N, R)
        if res.family == "multilabel":
            label_r.append(res.radius.cpu())
            label_abst.append(res.abstain.float().cpu())
            label_frac.append(at.float().cpu())  # (N, R, L)
        if empirical != "none":
            m, a, flags = empirical_smoothed(rs, model, x, y, rlist, attack=empirical, bounds=bounds,
                                             steps=empirical_steps, draws=draws, seed=0 if seed is None else seed)
            emp.append(m.cpu())
            emp_abst.append(a.cpu() * nb)
            masking += flags
    if not cert:
        raise ValueError("`data` is empty")
    cert_t = torch.cat(cert).double()
    emp_t = torch.cat(emp).double() if emp else None
    total = cert_t.shape[0]
    abst_t = torch.stack(emp_abst).sum(dim=0) / total if emp_abst else None
    rows: list[dict[str, Any]] = []
    violations: list[str] = []
    metric = task.robust_metric_name
    for j, r in enumerate(all_r):
        c = float(cert_t[:, j].mean())
        e = float(emp_t[:, j].mean()) if emp_t is not None else None
        bad = None if e is None else c > e + _TOL
        if bad:
            violations.append(f"r = {r:g}: certified {c:.4f} > empirical {e:.4f}")
        rows.append({"kind": "curve", "radius": r, "certified": c, "empirical": e,
                     "gap": None if e is None else e - c, "violation": bad,
                     "predict_abstain": None if abst_t is None else float(abst_t[j])})
    radius_t, median_t, abstain_t, frac_t = (torch.cat(t) for t in (radius, median, abstain, frac))
    for i in range(total):
        row: dict[str, Any] = {"kind": "sample", "sample": i, "cert_radius": float(radius_t[i]),
                               "median_radius": float(median_t[i]), "abstain_fraction": float(abstain_t[i])}
        for j, r in enumerate(rlist):
            row[f"cert_fraction@{r:g}"] = float(frac_t[i, j])
        for j, r in enumerate(all_r):
            row[f"certified@{r:g}"] = float(cert_t[i, j])
            if emp_t is not None:
                row[f"empirical@{r:g}"] = float(emp_t[i, j])
        rows.append(row)
    if label_r:
        lr, la, lf = torch.cat(label_r), torch.cat(label_abst), torch.cat(label_frac)
        for k in range(lr.shape[1]):
            row = {"kind": "label", "label": k, "mean_radius": float(lr[:, k].mean()),
                   "abstain_fraction": float(la[:, k].mean())}
            for j, r in enumerate(rlist):
                row[f"cert_fraction@{r:g}"] = float(lf[:, j, k].mean())
            rows.append(row)
    box = Box.coerce(bounds)
    meta = {"metric": metric, "family": rs.family, "sigma": rs.sigma, "n0": rs.n0, "n": rs.n, "alpha": rs.alpha,
            "correction": rs.correction, "tau": rs.tau, "seed": rs.seed, "radii": rlist, "empirical": empirical,
            "empirical_steps": empirical_steps, "draws": draws, "bounds": box.describe(), "samples": total,
            "abstain_fraction": mean(abstain_t), "violations": violations, "masking": masking}
    return StudyResult("certify", rows, meta)


# --- the report section -------------------------------------------------------------------------------------------
CERTIFY_RULE = ("certified ≤ empirical must hold at every radius (a certificate is a lower bound on the robust "
                "metric of the smoothed model); a violation would mean a bug")


def _draw_certify(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    """Certified vs. empirical curve of one smoothed model (:func:`medadv.studies.certify.certify`)."""
    metric = study_metric(study)
    meta = study.meta
    curve = sorted((r for r in study.rows if r.get("kind") == "curve"), key=lambda r: float(r["radius"]))
    if not curve:
        raise KeyError("no curve rows")
    radii = [float(r["radius"]) for r in curve]
    has_emp = any(is_num(r.get("empirical")) for r in curve)
    bad = [r for r in curve if r.get("violation")]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.2, 3.9))
    ax.plot(radii, [r.get("certified") for r in curve], marker="o", color=PALETTE[0], label="certified (smoothed)")
    attack = str(meta.get("empirical") or "auto")
    if has_emp:
        ax.plot(radii, [r.get("empirical") for r in curve], marker="s", ls="--", color=PALETTE[1],
                label=f"empirical: {attack} on the smoothed model")
        ax.fill_between(radii, [r.get("certified") for r in curve], [r.get("empirical") for r in curve],
                        color=PALETTE[1], alpha=0.08, lw=0)
    for r in bad:
        ax.plot([r["radius"]], [r.get("certified")], marker="X", ms=12, color="#c00000", ls="none",
                label="violation: certified > empirical" if r is bad[0] else None)
    style_axes(ax, "L2 radius (data units)", metric, f"{metric} of the smoothed model (σ = {fmt(meta.get('sigma'))})")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(radii)
    ax.legend(fontsize=8, loc="lower left", frameon=False)
    fig.tight_layout()
    intro = (f"Gaussian randomized smoothing (Cohen et al. 2019), σ = {escape(fmt(meta.get('sigma')))}, "
             f"n0 = {escape(meta.get('n0'))}, n = {escape(meta.get('n'))}, α = {escape(fmt(meta.get('alpha')))} "
             f"({escape(meta.get('correction'))}"
             f"{'' if meta.get('tau') is None else ', τ = ' + escape(fmt(meta.get('tau')))}): the <b>certified</b> "
             f"{escape(metric)} "
             "at each L2 radius, abstentions as errors (radius 0: the smoothed model's certified clean metric)")
    if has_emp:
        intro += (f", and the <b>empirical</b> {escape(metric)} of the same smoothed model under <code>{escape(attack)}</code> "
                  f"in the L2 ball of that radius, run on the average over {escape(meta.get('draws'))} fixed noise draws "
                  "(Salman et al. 2019) and scored by the smoothed model's majority vote")
    intro += f". <b>{CERTIFY_RULE}.</b>"
    blocks: list[Any] = []
    if bad:
        blocks.append(Bullets([f"<b>VIOLATION at r = {fmt(r['radius'])}</b>: certified {fmt(r.get('certified'))} &gt; "
                               f"empirical {fmt(r.get('empirical'))} (a bug, or the α event / Monte Carlo error of "
                               "the smoothed prediction)" for r in bad], "bad"))
    elif has_emp:
        blocks.append(Text([f"certified ≤ empirical holds at every radius ({len(curve)} radii checked)."]))
    blocks.append(figure_image(fig, "certified and empirical robustness curves of the smoothed model"))
    cols = ["radius", "certified", "empirical", "gap", "violation", "predict_abstain"]
    table = data_table(curve, [c for c in cols if any(c in r for r in curve)],
                       "curve rows; predict_abstain: share of elements where PREDICT's test would abstain")
    for row, r in zip(table.rows, curve, strict=True):
        if r.get("violation"):
            for cell in row:
                cell.cls = (cell.cls + " bad").strip()
    blocks.append(table)
    if meta.get("masking"):
        blocks.append(Bullets([f"gradient-masking check on the surrogate: {escape(m)}" for m in meta["masking"]], "warn"))
    others = [r for r in study.rows if r.get("kind") != "curve"]
    if others:
        blocks.append(raw_table(others, "per-sample (and per-label) rows: certified radius, abstentions, "
                                "certified share of the elements at each radius"))
    return Section("study-certify", f"Certified robustness (randomized smoothing) · {metric}", intro, blocks)


# --- the config entry ---------------------------------------------------------------------------------------------
def _needs_smoothing(task: Task) -> str | None:
    """Why randomized smoothing cannot smooth ``task`` (a kind that declares no smoothing family), or None."""
    from ..certify.smoothing import FAMILIES

    # the family a kind declares (traits.certify.family), as RandomizedSmoothing reads it
    family = task.traits.certify.family
    if family in FAMILIES:
        return None
    return f"randomized smoothing needs a task kind with a smoothing family ({', '.join(FAMILIES)})"


@register_study("certify", draw=_draw_certify, needs=_needs_smoothing,
                check_options={"sigma": 0.1, "radii": [0.1], "n0": 2, "n": 4, "draws": 1, "empirical_steps": 1})
class CertifySpec(StudySpec):
    """Randomized-smoothing certificates vs. an attack on the same smoothed model (Cohen et al. 2019, Salman et
    al. 2019): :func:`medadv.studies.certify.certify`. ``sigma`` and ``radii`` in data units (L2); ``bounds``: the
    attack's data box (default: the attacks' box; ``null``: unbounded)."""

    study: Literal["certify"]
    sigma: Number = Field(gt=0.0)
    radii: Annotated[list[Annotated[float, Strict(), Field(gt=0.0)]], Field(min_length=1)]
    n0: Int = Field(100, ge=1)
    n: Int = Field(1000, ge=1)
    alpha: Number = Field(0.001, gt=0.0, lt=1.0)
    batch_size: Int = Field(256, ge=1)
    correction: Literal["bonferroni", "holm"] = "bonferroni"
    tau: Annotated[float, Strict(), Field(gt=0.5, lt=1.0)] | None = None
    seed: Int | None = 0
    empirical: Literal["auto", "pgd", "none"] = "auto"
    empirical_steps: Annotated[int, Strict(), Field(ge=1)] | None = None
    draws: Int = Field(8, ge=1)
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None

    @model_validator(mode="after")
    def _holm_needs_tau(self) -> CertifySpec:
        if self.correction == "holm" and self.tau is None:
            raise PydanticCustomError("certify_tau", "needs `tau` with `correction: holm` (Holm tests p <= tau per "
                                      "element, e.g. tau: 0.75); use `correction: bonferroni` without it")
        return self

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        return certify(one_model(models, self), task, data, sigma=self.sigma, radii=self.radii, n0=self.n0, n=self.n,
                       alpha=self.alpha, batch_size=self.batch_size, correction=self.correction, tau=self.tau,
                       seed=self.seed, empirical=self.empirical, empirical_steps=self.empirical_steps,
                       draws=self.draws, bounds=data_box(self, attacks, "certify", required=False))
