"""Gradient-masking checks: signs that a robustness evaluation cannot be trusted.

They live with the attacks because ``auto`` runs them on every batch and the unbounded check runs APGD; the
public home :mod:`medadv.masking` re-exports them (it sits above the attacks, with the results that read the
flags).

A gradient attack that fails to fool a model proves nothing when the model hides its gradient: randomness
in the forward pass, probabilities instead of logits, non-differentiable layers (quantisation, rounding,
thresholds) all make gradient attacks weak while the model stays easy to fool (Athalye, Carlini, Wagner,
"Obfuscated gradients give a false sense of security", ICML 2018; Carlini et al., "On evaluating adversarial
robustness", 2019). AutoAttack (Croce & Hein, ICML 2020) warns about some of them; these checks cover the
medical tasks too (multi-label, 2-D and 3-D segmentation), each through the task's own metric.

Every check returns a :class:`MaskingFlag` (what was measured, why it matters, what to do) or ``None``; none
raises for a masked model, only for bad arguments. :func:`run_checks` runs the checks that need the model
on one batch; :func:`check_black_box` and :func:`check_monotone` / :func:`monotone_flags` read the results
of an evaluation. :data:`CHECKS` describes every check for reports.

No check modifies the caller's tensors, the model's parameters, their ``.grad``, or its train/eval flags
(the model runs under :func:`~medadv.runtime.attack_mode`), and none re-seeds torch's global RNG (a
randomised model draws from it as it always does).

Thresholds (defaults, all documented at each function):

* randomised: two forwards differ by more than ``rtol = 1e-4`` relative L2 difference per sample
  (AutoAttack's α; deterministic CPU forwards are bitwise equal, GPU atomics differ by ~1e-6).
* probability outputs: every output in ``[0, 1]`` (to ``atol = 1e-3``, loose enough for half-precision
  softmax) and, for class-axis tasks, every class-axis sum within ``atol`` of 1; or every one of at least
  ``min_values = 8`` outputs in ``[0, 1]`` (sigmoid heads).
* zero gradients: mean share of exactly-zero (or non-finite) input-gradient elements ``>= 0.5``, or any
  sample with no usable gradient element. Honest ReLU networks have some (dead units over constant
  background: ~6 % on the test suite's small CNN), never most.
* black box wins: the black-box component is lower than the best white-box one by more than
  ``tolerance = 0.01`` (metric units) on more than ``min_share = 0.002`` of the samples (AutoAttack's
  α = 0.2 % for Square).
* non-monotone: the mean robust metric at a larger ε exceeds the lowest mean at a smaller ε by more than
  ``tolerance = 0.01`` (one point of accuracy, 0.01 Dice).
* unbounded run not at the floor: APGD with an L∞ ball as wide as the data range leaves a mean robust
  metric above ``floor + 0.05`` (more than ~5 % of the samples survive an attack that can reach any input).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..params import Int, Optional, Real
from ..runtime import attack_mode, check_input, check_model, forward_tensor, model_device
from ..tasks import Task
from ..threats import Bounds, Box, LargeBudgetWarning, Linf
from .apgd import APGD

__all__ = [
    "CHECKS",
    "MaskingFlag",
    "check_randomised",
    "check_probability_outputs",
    "check_zero_gradients",
    "check_black_box",
    "check_monotone",
    "monotone_flags",
    "check_unbounded",
    "run_checks",
    "headline_columns",
]

#: every check: id -> one-line description (for reports)
CHECKS: dict[str, str] = {
    "randomised": "two forward passes of the same batch in eval mode give different outputs",
    "probability_outputs": "the model outputs probabilities (softmax rows summing to 1, or sigmoid values in "
                           "[0, 1]) instead of logits",
    "zero_gradients": "a large share of the input gradient of the task loss is exactly zero",
    "black_box_wins": "the black-box (score-based) component beats the best white-box components on some samples",
    "non_monotone": "the robust metric is higher at a larger budget ε than at a smaller one",
    "unbounded_not_floor": "an attack with an L∞ ball as wide as the data range does not drive the robust metric "
                           "to its floor",
}

#: the per-sample robust-metric column of :func:`~medadv.evaluation.sample_rows`, per task, in lookup order
def headline_columns() -> tuple[str, ...]:
    """``adv_<column>`` of every registered task kind's robust metric (``adv_correct``, ``adv_exact_match``,
    ``adv_mean_dice``, ...): the columns :func:`masking_table` reads when none is named."""
    from ..tasks import robust_metric_columns

    return tuple(dict.fromkeys("adv_" + c for c in robust_metric_columns().values()))


@dataclass(frozen=True)
class MaskingFlag:
    """One gradient-masking warning.

    Attributes:
        check: the check's id (a key of :data:`CHECKS`).
        message: what was measured, why it suggests gradient masking or an unreliable evaluation, and what
            to do, in one or two plain sentences.
        value: the measured number (its meaning is given by each check function).
        attack: the attack the flag is about when it reads a results table (:func:`monotone_flags`);
            ``None`` for the checks of one model and batch.
    """

    check: str
    message: str
    value: float
    attack: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """``{"check", "message", "value", "attack"}`` as plain JSON-serialisable values."""
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.check}] {self.message}"


# --- helpers -------------------------------------------------------------------------------------------------
def _model_batch(model: Any, x: Any, box: Box | None, owner: str) -> tuple[nn.Module, Tensor]:
    """Validated model and ``x`` detached on the model's device (never modified in place)."""
    check_model(model)
    check_input(x, box)
    if torch.is_inference_mode_enabled():
        raise RuntimeError(f"{owner} needs gradients or fresh forwards: call it outside torch.inference_mode()")
    return model, x.detach().to(model_device(model, x.device))


def _labels(task: Task, logits: Tensor, y: Any) -> Tensor:
    """``y`` on the logits' device in the dtype the loss expects; the clean prediction when ``y`` is None."""
    if y is None:
        y = task.predict(logits)
    if not isinstance(y, Tensor):
        raise TypeError(f"`y` must be a torch.Tensor, got {type(y).__name__}")
    # Task.validate without its probability refusal: these checks diagnose such a model (a flag), they do not
    # refuse it
    task.validate_logits(logits)
    task.validate_labels(logits, y, "y")
    return task.to_target(y.detach().to(logits.device), logits)


def _check_task(task: Any) -> Task:
    if not isinstance(task, Task):
        raise TypeError(f"`task` must be a medadv Task (a task kind of `medadv.tasks.available_tasks()`), got {task!r}")
    return task


def _clean_logits(model: nn.Module, x: Tensor) -> Tensor:
    with attack_mode(model), torch.no_grad():
        return forward_tensor(model, x)


def _forward_with_path(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(x_var, logits)`` of a forward with ``x_var`` (a copy of ``x``) requiring grad, in attack mode.

    ``logits.requires_grad`` tells whether the output has an autograd path to the input at all (a model
    that detaches its input or casts it to integers has none)."""
    with attack_mode(model), torch.enable_grad():
        xv = x.clone().requires_grad_(True)
        return xv, forward_tensor(model, xv)


def _input_gradient(model: nn.Module, task: Task, x: Tensor, y: Any) -> tuple[Tensor | None, Tensor, Tensor]:
    """``(grad, logits, y)``: the input gradient of ``(task.loss − task.margin)(model(x), y).sum()`` (``None`` when
    the output has no autograd path to the input), the detached logits and the validated labels."""
    with attack_mode(model):
        xv, logits = _forward_with_path(model, x)
        y0 = _labels(task, logits.detach(), y)
        if not logits.requires_grad:
            return None, logits.detach(), y0
        # plus the margin: a confident single sigmoid logit (|z| > ~17) rounds BCE's float32 gradient to exactly 0
        # (σ(z) − y), a loss saturation that margin attacks do not have, not masking
        loss = (task.loss(logits, y0) - task.margin(logits, y0)).sum()
        (g,) = torch.autograd.grad(loss, xv, allow_unused=True)
    return (torch.zeros_like(x) if g is None else g), logits.detach(), y0


def _has(task: Task, method: str) -> bool:
    """Whether the task overrides one of :class:`Task`'s optional methods (``robust_metric``, ``element_margin``)."""
    return getattr(type(task), method) is not getattr(Task, method)


def _as_vector(value: Any, name: str) -> Tensor:
    try:
        t = torch.as_tensor(value, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"`{name}` must be a tensor or a sequence of numbers, got {type(value).__name__}") from None
    return t


# --- 1. randomised forward ---------------------------------------------------------------------------------------
def check_randomised(model: nn.Module, x: Tensor, *, repeats: int = 2, rtol: float = 1e-4) -> MaskingFlag | None:
    """Flag a model whose forward pass is random in eval mode.

    The batch is forwarded ``repeats`` times in attack mode (eval, frozen parameters; both restored). The
    value is the largest relative difference ``‖o_r − o_1‖₂ / ‖o_1‖₂`` (per sample, over the whole output)
    between a later forward ``o_r`` and the first one; the model is flagged when it exceeds ``rtol``.
    ``1e-4`` is AutoAttack's threshold: deterministic CPU forwards are bitwise equal and nondeterministic GPU
    kernels (atomic adds) differ by about ``1e-6``. The model's own randomness draws from torch's global RNG
    as usual; the check does not re-seed it.

    Args:
        model: the network (an ``nn.Module`` returning one tensor).
        x: a batch ``(N, C, *spatial)``; not modified.
        repeats: number of forwards, ``>= 2``.
        rtol: relative-difference threshold, ``>= 0``.
    """
    owner = "check_randomised"
    repeats = Int(2).check(repeats, "repeats", owner)
    rtol = Real(0.0).check(rtol, "rtol", owner)
    model, x0 = _model_batch(model, x, None, owner)
    worst = 0.0
    with attack_mode(model), torch.no_grad():
        first = forward_tensor(model, x0).reshape(x0.shape[0], -1).double()
        scale = first.norm(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
        for _ in range(repeats - 1):
            out = forward_tensor(model, x0).reshape(x0.shape[0], -1).double()
            if out.shape != first.shape:
                worst = math.inf  # a forward whose output shape changes is as random as it gets
                break
            rel = ((out - first).norm(dim=1) / scale).nan_to_num(nan=math.inf)
            worst = max(worst, float(rel.max()))
    if worst <= rtol:
        return None
    return MaskingFlag(
        "randomised",
        f"Two forward passes of the same batch in eval mode differ (largest relative difference {worst:.3g} > "
        f"{rtol:g}): the model is randomised, so one gradient is a noisy estimate and a single forward a noisy "
        "verdict, which can overstate robustness. Attack with Expectation over Transformation (average "
        "gradients over several forwards) and report the metric averaged over several forwards.",
        worst,
    )


# --- 2. probabilities instead of logits ----------------------------------------------------------------------------
def check_probability_outputs(task: Task, logits: Tensor, *, atol: float = 1e-3,
                              min_values: int = 8) -> MaskingFlag | None:
    """Flag model outputs that look like probabilities rather than logits.

    Losses computed on probabilities (a softmax fed to cross-entropy again, a sigmoid fed to BCE with
    logits) saturate: their gradient vanishes where the model is confident, which weakens gradient attacks.

    The rule is :meth:`medadv.tasks.Task.probability_evidence`, the same that makes every attack and
    :func:`~medadv.evaluate` refuse such a model when the task does not declare its ``outputs``
    (:meth:`~medadv.tasks.Task.check_outputs`; this check flags it instead, per-class sigmoids included):

    * Class-axis tasks (multi-class, segmentation, any task but multi-label): flagged when every value lies
      in ``[-atol, 1 + atol]`` and the sum over the class axis (dim 1) is within ``atol`` of 1 for every
      sample (and voxel); the value is the largest ``|sum − 1|``.
    * Any class-score task, multi-label in particular (sigmoid outputs do not sum to 1): flagged when every one
      of at least ``min_values`` outputs lies in ``[-atol, 1 + atol]``; the value is that share (1.0). An honest
      logit model almost never has every logit of a batch in ``[0, 1]``: labels that are absent get negative
      logits, confident ones logits beyond 1. ``min_values`` keeps a lone sample with a few small logits from
      being flagged.

    Args:
        task: the model's task (decides which test applies; validates the shape).
        logits: the model's output on a batch.
        atol: tolerance, in output units, ``>= 0`` (1e-3 admits half-precision softmax rounding).
        min_values: outputs needed for the "every value in [0, 1]" test, ``>= 1``.
    """
    owner = "check_probability_outputs"
    task = _check_task(task)
    atol = Real(0.0).check(atol, "atol", owner)
    min_values = Int(1).check(min_values, "min_values", owner)
    if not isinstance(logits, Tensor):
        raise TypeError(f"`logits` must be a torch.Tensor (the model's output), got {type(logits).__name__}")
    task.validate_logits(logits)  # the shape only: the probability test is this check's (a flag, not a refusal)
    # the one rule, shared with the refusal of every attack and evaluate() (Task.probability_evidence)
    found = task.probability_evidence(logits, atol=atol, min_values=min_values)
    if found is None:
        return None
    if found.kind == "softmax":
        return MaskingFlag(
            "probability_outputs",
            f"Every output lies in [0, 1] and the class scores sum to 1 (largest deviation {found.value:.2g}): "
            "the model seems to return softmax probabilities instead of logits, and a loss on probabilities "
            "saturates and hides the gradient. Attack the logits, not probabilities (remove the final "
            "softmax, or wrap the model to return the layer before it), or declare `outputs: probabilities` on "
            "the task to have them converted.",
            found.value,
        )
    what = "bounded scores (e.g. per-class sigmoids)" if task.exclusive_classes else "sigmoid probabilities"
    return MaskingFlag(
        "probability_outputs",
        f"All {logits.numel()} outputs of the batch lie in [0, 1], which real logits almost never do: the model "
        f"seems to return {what} instead of logits, and a loss on probabilities saturates and hides the "
        "gradient. Attack the logits, not probabilities (remove the final sigmoid/softmax), or declare "
        "`outputs: probabilities` on the task to have them converted.",
        found.value,
    )


# --- 3. zero input gradients ----------------------------------------------------------------------------------------
def check_zero_gradients(model: nn.Module, task: Task, x: Tensor, y: Tensor | None, *,
                         threshold: float = 0.5) -> MaskingFlag | None:
    """Flag a model whose input gradient is mostly exactly zero.

    The gradient of ``(task.loss − task.margin)(model(x), y).sum()`` (the margin keeps it from rounding to 0 on
    a confident sigmoid logit, where BCE saturates) with respect to ``x`` (one forward and backward in
    attack mode: no parameter gradients, the caller's ``.grad`` untouched). An element is *unusable* when it
    is exactly zero or not finite. Flagged when the mean per-sample share of unusable elements is
    ``>= threshold``, or when some sample has no usable element at all (AutoAttack's zero-gradient test);
    the value is the mean share. A model whose output has no autograd path to the input (it detaches the
    input or casts it to integers) has share 1.0. Honest ReLU networks have some exact zeros (dead units
    over constant background), far from half.

    Args:
        model: the network.
        task: its task (the loss).
        x: a batch; not modified.
        y: labels (``None``: the clean prediction).
        threshold: mean share of unusable elements that raises the flag, ``0 < threshold <= 1``.
    """
    owner = "check_zero_gradients"
    task = _check_task(task)
    threshold = Real(0.0, 1.0, low_open=True).check(threshold, "threshold", owner)
    model, x0 = _model_batch(model, x, None, owner)
    model = task.logits_model(model)  # declared `outputs: probabilities`: the loss reads their logits
    g, _, _ = _input_gradient(model, task, x0, y)
    n = x0.shape[0]
    if g is None:
        share = torch.ones(n, dtype=torch.float64)
    else:
        flat = g.detach().reshape(n, -1)
        share = ((flat == 0) | ~torch.isfinite(flat)).double().mean(dim=1).cpu()
    mean = float(share.mean())
    dead = int((share == 1.0).sum())
    if mean < threshold and dead == 0:
        return None
    cause = ("the model's output has no gradient path to the input (it detaches or casts it), so"
             if g is None else
             f"{mean:.1%} of the input-gradient elements of the task loss are exactly zero or not finite "
             f"({dead} of {n} samples have no usable gradient), so")
    return MaskingFlag(
        "zero_gradients",
        f"{cause[0].upper()}{cause[1:]} gradient attacks cannot move from those inputs and their robust metric "
        "is no worst case. Look for non-differentiable layers (quantisation, rounding, thresholds) and attack "
        "through them with BPDA (a differentiable approximation in the backward pass), or trust the black-box "
        "component more.",
        mean,
    )


# --- 4. the black-box component beats the white-box ones -------------------------------------------------------------
def check_black_box(white: Tensor | Sequence[float], black: Tensor | Sequence[float], *, tolerance: float = 0.01,
                    min_share: float = 0.002) -> MaskingFlag | None:
    """Flag a black-box attack that does better than the gradient attacks.

    Per sample, the robust metric (lower is worse for the model, :meth:`~medadv.tasks.Task.robust_metric`)
    after the best white-box component against the one after the black-box component. A sample is *beaten*
    when the black-box metric is lower by more than ``tolerance``. Flagged when the share of beaten samples
    exceeds ``min_share`` (0.2 %, AutoAttack's threshold for Square; below 500 samples one beaten sample is
    enough); the value is that share. A score-based attack with no gradient should not beat gradient
    attacks on a differentiable model.

    Args:
        white: ``(N,)`` per-sample metric of the best white-box component, or ``(K, N)`` for K white-box
            components (the per-sample minimum is taken). NaN: no result for that sample (ignored).
        black: ``(N,)`` per-sample metric of the black-box component (NaN where it did not run).
        tolerance: per-sample margin in metric units, ``>= 0`` (0.01: one Dice point; any flip of a 0/1 metric).
        min_share: share of beaten samples tolerated, ``0 <= min_share < 1``.
    """
    owner = "check_black_box"
    tolerance = Real(0.0).check(tolerance, "tolerance", owner)
    min_share = Real(0.0, 1.0, high_open=True).check(min_share, "min_share", owner)
    w, b = _as_vector(white, "white"), _as_vector(black, "black")
    if b.ndim != 1 or b.numel() == 0:
        raise ValueError(f"`black` must be a non-empty (N,) vector of per-sample metrics, got shape {tuple(b.shape)}")
    if w.ndim == 2:
        w = w.nan_to_num(nan=math.inf).min(dim=0).values
        w = torch.where(torch.isinf(w), torch.full_like(w, math.nan), w)
    if w.shape != b.shape:
        raise ValueError(f"`white` must be (N,) or (K, N) with N = {b.numel()} like `black`, got shape "
                         f"{tuple(_as_vector(white, 'white').shape)}")
    valid = ~(torch.isnan(w) | torch.isnan(b))
    count = int(valid.sum())
    if count == 0:
        return None
    gain = (w - b)[valid]
    beaten = gain > tolerance
    share = float(beaten.double().mean())
    if share <= min_share:
        return None
    mean_gain = float(gain[beaten].mean())
    return MaskingFlag(
        "black_box_wins",
        f"The black-box attack lowered the robust metric below the best white-box result on {share:.1%} of the "
        f"samples ({int(beaten.sum())} of {count}, by {mean_gain:.3g} on average): a score-based attack "
        "beating gradient attacks points to masked or obfuscated gradients, so the white-box numbers are "
        "unreliable. Check the other masking flags, run the black-box attack with more queries and restarts, "
        "and consider an adaptive attack (BPDA, EOT).",
        share,
    )


# --- 5. monotone in ε --------------------------------------------------------------------------------------------------
def check_monotone(budgets: Sequence[float], metrics: Sequence[float], *, tolerance: float = 0.01,
                   name: str = "robust metric") -> MaskingFlag | None:
    """Flag a robust metric that is higher at a larger budget than at a smaller one.

    A larger ε-ball contains every perturbation of a smaller one, so a reliable attack can only do as well
    or better: the mean robust metric must not rise with ε. Flagged when the metric at some budget exceeds
    the lowest metric at any smaller budget by more than ``tolerance`` (metric units; 0.01 is one point of
    accuracy or 0.01 Dice); the value is the largest such rise. NaN metrics are ignored.

    Args:
        budgets: the budgets ε (data units; any order, no duplicates).
        metrics: the mean robust metric at each budget.
        tolerance: rise tolerated, ``>= 0``.
        name: what the metric is, for the message (e.g. ``"mean Dice of auto"``).
    """
    owner = "check_monotone"
    tolerance = Real(0.0).check(tolerance, "tolerance", owner)
    eps, met = _as_vector(budgets, "budgets"), _as_vector(metrics, "metrics")
    if eps.ndim != 1 or met.shape != eps.shape:
        raise ValueError(f"`budgets` and `metrics` must be sequences of the same length, got shapes "
                         f"{tuple(eps.shape)} and {tuple(met.shape)}")
    if not bool(torch.isfinite(eps).all()):
        raise ValueError("`budgets` must be finite numbers")
    if eps.unique().numel() != eps.numel():
        raise ValueError(f"`budgets` has duplicates: {eps.tolist()}")
    keep = ~torch.isnan(met)
    eps, met = eps[keep], met[keep]
    order = eps.argsort()
    worst, pair = 0.0, None
    lowest, lowest_eps = math.inf, math.nan
    for e, m in zip(eps[order].tolist(), met[order].tolist(), strict=True):
        if m - lowest > worst:
            worst, pair = m - lowest, (lowest_eps, lowest, e, m)
        if m < lowest:
            lowest, lowest_eps = m, e
    if pair is None or worst <= tolerance:
        return None
    e1, m1, e2, m2 = pair
    return MaskingFlag(
        "non_monotone",
        f"The {name} rises from {m1:.4g} at ε = {e1:g} to {m2:.4g} at ε = {e2:g}, although the larger budget "
        "contains every perturbation of the smaller one: the attacks did not converge or the gradients are "
        "masked. Run more iterations and restarts, and look at the other masking flags.",
        worst,
    )


def _base_name(name: Any) -> Any:
    """``"auto@0.0314"`` -> ``"auto"`` (the per-budget suffix of config entries); other names unchanged."""
    if isinstance(name, str) and "@" in name:
        head, _, tail = name.rpartition("@")
        try:
            float(tail)
        except ValueError:
            return name
        return head
    return name


def monotone_flags(results: Any, attack: str | None = None, *, column: str | None = None,
                   tolerance: float = 0.01) -> list[MaskingFlag]:
    """:func:`check_monotone` per attack of a :class:`~medadv.results.Results` table.

    Rows are grouped by ``attack`` (only ``attack`` when given); rows without a numeric ``budget`` are
    skipped. The metric is ``column`` or, by default, the task's headline per-sample column of
    :func:`~medadv.evaluation.sample_rows` (:func:`headline_columns`: ``adv_correct`` multi-class,
    ``adv_exact_match`` multi-label, ``adv_mean_dice`` segmentation). Each budget's mean is taken over the
    samples present at every budget of that attack (so a partly resumed table compares like with like).
    Attacks with fewer than two budgets or without the column give no flag, nor attacks that do not search for
    the worst case of the task's metric (listed in ``results.meta["off_metric"]`` by :func:`~medadv.evaluate`:
    noise, a volume objective).

    Returns:
        the flags, one per non-monotone attack, with :attr:`MaskingFlag.attack` set and the attack named in
        each message.
    """
    rows = list(getattr(results, "rows", results))
    meta = getattr(results, "meta", None)
    # attacks that search nothing or another objective (``Attack.optimises_task_metric``, recorded by evaluate)
    skip = {_base_name(n) for n in meta.get("off_metric") or ()} if isinstance(meta, dict) else set()
    if attack is not None and not any(r.get("attack") == attack or _base_name(r.get("attack")) == attack
                                      for r in rows):
        names = sorted({str(r.get("attack")) for r in rows})
        raise ValueError(f"`attack` {attack!r} has no rows in the results (attacks: {', '.join(names) or 'none'})")
    by_attack: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        b = r.get("budget")
        if (attack is None or attack in (r.get("attack"), _base_name(r.get("attack")))) and isinstance(b, int | float) and not isinstance(b, bool):
            # configs name an entry per budget (``auto@0.0314``): one attack across its budgets
            by_attack.setdefault(_base_name(r.get("attack")), []).append(r)
    flags = []
    for name, group in by_attack.items():
        if name in skip:
            continue
        col = column or next((c for c in headline_columns() if any(r.get(c) is not None for r in group)), None)
        if col is None:
            continue
        per_budget: dict[float, dict[Any, float]] = {}
        for r in group:
            v = r.get(col)
            if v is None:
                continue
            per_budget.setdefault(float(r["budget"]), {})[r.get("sample")] = float(v)
        if len(per_budget) < 2:
            continue
        common = set.intersection(*(set(s) for s in per_budget.values()))
        means = [sum(s[k] for k in common) / len(common) if common else sum(s.values()) / len(s)
                 for s in per_budget.values()]
        flag = check_monotone(list(per_budget), means, tolerance=tolerance, name=f"mean {col} of {name}")
        if flag is not None:
            flags.append(replace(flag, attack=str(name)))
    return flags


# --- 6. an unbounded attack reaches the floor ---------------------------------------------------------------------------
def _widest(box: Box, x: Tensor) -> float:
    """The largest width of the box (per-channel boxes: the widest channel); ``x``'s range when unbounded."""
    if not box.bounded:
        return box.data_range(x)
    lo, hi = box.lohi(x)
    return float((hi - lo).max())


def check_unbounded(model: nn.Module, task: Task, x: Tensor, y: Tensor | None, box: Box | Bounds | None, *,
                    steps: int = 50, seed: int | None = 0, tolerance: float | None = None,
                    eps: float | None = None) -> MaskingFlag | None:
    """Flag a model that an attack allowed to reach any input cannot drive to the metric's floor.

    Runs :class:`~medadv.attacks.apgd.APGD` (on the task's logit margin, which does not saturate like the
    cross-entropy; the task loss when the task defines no margin) with an L∞ ball as large as the data box: ε is the
    box's data range (per-channel boxes: the widest channel; an unbounded box: the range of ``x``), so every
    input in the box is reachable. On a differentiable model the robust metric then falls to
    :attr:`~medadv.tasks.Task.metric_floor` on (nearly) every sample (the test suite's models reach it in 10
    steps; ``steps = 50`` leaves room for larger models). Flagged when the mean robust metric stays above ``floor + tolerance``; the value is that mean. The
    default tolerance is 0.05 for classifiers (more than ~5 % of the samples survive) and 0.1 for segmentation
    (a mean Dice above 0.1: a sound 2-D UNet ends near 0.03–0.05, a few voxels of small structures survive at
    region borders, so 0.05 would flag sound segmenters).

    The attack starts at ``x`` (no random start): at this radius a random start is a random image, which
    fools any model by chance and would hide a model whose gradient leads nowhere.

    Args:
        model, task, x, y: the model, its task, a batch (not modified) and its labels (``None``: the clean
            prediction).
        box: the data box (:class:`~medadv.threats.Box`, ``(lo, hi)`` or ``None`` for unbounded data).
        steps: APGD iterations, ``>= 1``.
        seed: APGD's seed.
        tolerance: mean metric above the floor that raises the flag, ``>= 0`` (default: 0.05, segmentation 0.1).
        eps: the L∞ radius in data units (default: the box's widest range).
    """
    owner = "check_unbounded"
    task = _check_task(task)
    if not _has(task, "robust_metric"):
        raise TypeError(f"check_unbounded needs the task's robust metric and {task!r} defines none "
                        "(implement `robust_metric` and `metric_floor`)")
    steps = Int(1).check(steps, "steps", owner)
    seed = Optional(Int()).check(seed, "seed", owner)
    tolerance = Optional(Real(0.0)).check(tolerance, "tolerance", owner)
    if tolerance is None:
        tolerance = task.unbounded_tolerance
    eps = Optional(Real(0.0, low_open=True)).check(eps, "eps", owner)
    box = Box.coerce(box, "box")
    model, x0 = _model_batch(model, x, box, owner)
    model = task.logits_model(model)  # declared `outputs: probabilities`: labels and metric read their logits
    _, logits = _forward_with_path(model, x0)
    y0 = _labels(task, logits.detach(), y)
    radius = _widest(box, x0) if eps is None else eps
    floor = float(task.metric_floor)
    if not logits.requires_grad:
        # no autograd path: APGD cannot take a step; the inputs stay where they are
        metric = float(task.robust_metric(logits.detach(), y0).double().mean())
        how = "could not take a step (the output has no gradient path to the input)"
    else:
        with warnings.catch_warnings():  # a ball as wide as the data range is the point of this check
            warnings.simplefilter("ignore", LargeBudgetWarning)
            ball = Linf(radius, bounds=box)
        attack = APGD(task, ball, steps=steps, seed=seed, random_start=False,
                      loss="margin" if _has(task, "element_margin") else "ce")
        result = attack(model, x0, y0)
        metric = float(task.robust_metric(result.logits, result.y).double().mean())
        how = f"left the mean robust {task.robust_metric_name} at {metric:.3g}"
    if metric <= floor + tolerance:
        return None
    return MaskingFlag(
        "unbounded_not_floor",
        f"With an L∞ budget as large as the data range (ε = {radius:.4g}), where any input in the box can be "
        f"reached, {steps}-step APGD {how}, not near its floor {floor:g}: gradient steps do not find even "
        "these easy adversarial inputs, which suggests masked gradients. Check the other flags and use an "
        "adaptive attack (BPDA for non-differentiable layers, EOT for randomness).",
        metric,
    )


# --- all model checks on one batch -------------------------------------------------------------------------------------
def run_checks(
    model: nn.Module,
    task: Task,
    x: Tensor,
    y: Tensor | None,
    box: Box | Bounds | None,
    *,
    logits: Tensor | None = None,
    unbounded: bool = True,
    repeats: int = 2,
    rtol: float = 1e-4,
    zero_threshold: float = 0.5,
    steps: int = 50,
    seed: int | None = 0,
    tolerance: float | None = None,
) -> list[MaskingFlag]:
    """The checks that need the model, on one batch: randomised, probability outputs, zero gradients and
    (``unbounded=True``) the unbounded run, in that order. Returns the flags raised (empty: no sign of masking).

    Args:
        model, task, x, y, box: the model, its task, a batch inside ``box`` (not modified), its labels
            (``None``: the clean prediction) and the data box.
        logits: the clean output on ``x`` if already computed (saves a forward).
        unbounded: also run :func:`check_unbounded` (``steps`` APGD iterations: the costly check); skipped
            for a user-defined task without :meth:`~medadv.tasks.Task.robust_metric`.
        repeats, rtol: of :func:`check_randomised`.
        zero_threshold: ``threshold`` of :func:`check_zero_gradients`.
        steps, seed, tolerance: of :func:`check_unbounded`.
    """
    task = _check_task(task)
    box = Box.coerce(box, "box")
    model, x0 = _model_batch(model, x, box, "run_checks")
    model = task.logits_model(model)  # declared `outputs: probabilities`: every check reads their logits
    if logits is None:
        logits = _clean_logits(model, x0)
    elif not isinstance(logits, Tensor):
        raise TypeError(f"`logits` must be a torch.Tensor (the model's output on `x`), got {type(logits).__name__}")
    y0 = _labels(task, logits.detach(), y)
    flags = [
        check_randomised(model, x0, repeats=repeats, rtol=rtol),
        check_probability_outputs(task, logits),
        check_zero_gradients(model, task, x0, y0, threshold=zero_threshold),
    ]
    if unbounded and _has(task, "robust_metric"):  # a user task without a robust metric has no floor to reach
        flags.append(check_unbounded(model, task, x0, y0, box, steps=steps, seed=seed, tolerance=tolerance))
    return [f for f in flags if f is not None]

