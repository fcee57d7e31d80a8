"""DAG — Dense Adversary Generation for 2-D and 3-D segmentation, with Paschali's target types.

Xie, Wang, Zhang, Zhou, Xie, Yuille. "Adversarial Examples for Semantic Segmentation and Object
Detection", ICCV 2017 (Algorithm 1 and the released code). Target types A/B/C from Paschali, Conjeti,
Navarro, Navab. "Generalizability vs. Robustness: Investigating Medical Imaging Networks Using
Adversarial Examples", MICCAI 2018.

DAG is a *targeted* attack on a whole label map: each step sums, over the voxels of the target region
that are not yet at their adversarial label (the active set), the difference "target logit − logit of
the currently predicted class", and moves the input along that gradient normalised to a step of
length γ (L∞ by default, as in Xie's code). It stops when at most ``stop_fraction`` of the target
region remains unfooled (1 % in Xie's code) or after ``max_iter`` steps. There is no ε-ball unless one
is given (the bounded variant used by segmentation benchmarks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..metrics.image import mse, ssim
from ..tasks import Segmentation, Task
from ..threats import Bounds, Linf, Threat, per_sample_norm
from .base import Attack, AttackResult, check_input, register

__all__ = ["DAG", "dag_target_a", "dag_target_b", "dag_target_c", "calibrate_gamma"]


# --- Paschali's adversarial targets ----------------------------------------------------------------------------
def _check_labels(y: Tensor) -> None:
    if not isinstance(y, Tensor):
        raise TypeError(f"`y` must be a torch.Tensor label map, got {type(y).__name__}")
    if y.is_floating_point() or y.dtype == torch.bool:
        raise TypeError(f"`y` must be an integer label map (N, *spatial), got dtype {y.dtype}")
    if y.ndim not in (3, 4):
        raise ValueError(f"`y` must be (N, H, W) or (N, D, H, W), got shape {tuple(y.shape)}")


def dag_target_a(y: Tensor, background: int = 0) -> tuple[Tensor, Tensor]:
    """Type A: every voxel to background. Returns ``(y_adv, target_mask)``.

    The target region is every non-background voxel of ``y`` (the voxels that must change).
    """
    _check_labels(y)
    return torch.full_like(y, background), y != background


def dag_target_b(
    y: Tensor,
    fraction: float = 0.05,
    background: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Type B: a random ``fraction`` of the foreground voxels to one random foreground class.

    Per sample, the class ``c`` is drawn uniformly from the non-background classes present in ``y``;
    then each non-background voxel whose label is not ``c`` joins the target with probability
    ``fraction`` (Paschali: "a small percentage of pixels, chosen at random"). Samples without two
    distinct foreground classes get an empty target. Returns ``(y_adv, target_mask)``.

    Args:
        fraction: expected share of eligible voxels that are retargeted, in (0, 1].
        generator: CPU ``torch.Generator`` for the random choices (seed it for reproducibility).
    """
    _check_labels(y)
    if not 0.0 < float(fraction) <= 1.0:
        raise ValueError(f"`fraction` must be in (0, 1], got {fraction}")
    yc = y.detach().cpu()
    y_adv = yc.clone()
    mask = torch.zeros_like(yc, dtype=torch.bool)
    for i in range(yc.shape[0]):  # per sample: class choice differs; not a step loop
        classes = torch.unique(yc[i])
        classes = classes[classes != background]
        if classes.numel() == 0:
            continue
        c = classes[torch.randint(classes.numel(), (1,), generator=generator)]
        eligible = (yc[i] != background) & (yc[i] != c)
        pick = eligible & (torch.rand(yc[i].shape, generator=generator) < float(fraction))
        y_adv[i][pick] = c
        mask[i] = pick
    return y_adv.to(y.device), mask.to(y.device)


def _dilate(m: Tensor, iterations: int) -> Tensor:
    """Binary dilation with the cross element (4-connected in 2-D, 6-connected in 3-D)."""
    ndim = m.ndim - 1
    k = torch.zeros((3,) * ndim, dtype=torch.float32, device=m.device)
    centre = (1,) * ndim
    k[centre] = 1
    for a in range(ndim):
        for d in (0, 2):
            idx = list(centre)
            idx[a] = d
            k[tuple(idx)] = 1
    conv = F.conv2d if ndim == 2 else F.conv3d
    t = m.unsqueeze(1).float()
    for _ in range(iterations):
        t = (conv(t, k[None, None], padding=1) > 0).float()
    return t[:, 0].bool()


def dag_target_c(
    y: Tensor,
    cls: int,
    iterations: int = 6,
    background: int = 0,
    include_background: bool = False,
) -> tuple[Tensor, Tensor]:
    """Type C: dilate class ``cls`` by ``iterations`` steps of the cross element, keep the rest.

    The target region is the newly claimed voxels; voxels that were background are claimed only with
    ``include_background=True`` (Paschali's target set is non-background). ``y_adv`` differs from ``y``
    exactly on the returned mask. Returns ``(y_adv, target_mask)``.
    """
    _check_labels(y)
    if int(iterations) < 1:
        raise ValueError(f"`iterations` must be >= 1, got {iterations}")
    grown = _dilate(y == cls, int(iterations))
    mask = grown & (y != cls)
    if not include_background:
        mask = mask & (y != background)
    return torch.where(mask, torch.full_like(y, cls), y), mask


# --- the attack ---------------------------------------------------------------------------------------------------
_REQUIRED = object()  # bounds have no default: medadv never assumes a [0, 1] data range


@register("dag")
class DAG(Attack):
    """Dense Adversary Generation (Xie et al. 2017): targeted, per-voxel, logit-difference steps.

    Call as ``attack(model, x, y_adv, target_mask=None)`` where ``y_adv`` is the adversarial label map
    (for example from :func:`dag_target_a`/``b``/``c``). ``target_mask`` marks the voxels that must
    reach their target; by default, those whose clean prediction differs from ``y_adv``.

    At step m the active set is ``A_m = target_mask ∧ (prediction ≠ y_adv)``; the ascent direction is
    ``∇_x Σ_{p∈A_m} [z_{y_adv(p)}(p) − z_{pred(p)}(p)]`` on the logits, normalised per sample to
    length ``gamma`` in the chosen norm (Xie's code uses L∞: ``r' = γ ∇/‖∇‖∞``). A sample stops moving
    once at most ``stop_fraction`` of its target region remains; the loop ends when every sample has
    stopped (checked every ``check_every`` steps, the only host synchronisation) or after ``max_iter``.

    Args:
        task: a :class:`~medadv.tasks.Segmentation` task (2-D or 3-D logits).
        threat: optional :class:`~medadv.threats.Linf` ball for the bounded variant (ε and bounds in data
            units); ``None`` for the unbounded original (then ``bounds`` gives the data range).
        bounds: ``(lo, hi)`` data range in data units, required when ``threat`` is None (pass ``None``
            for unbounded data). Ignored when ``threat`` is given (the threat's bounds are used).
        gamma: step length γ in data units (0.5/255 on [0, 1] data is Xie's 0.5 on a 0–255 scale).
        max_iter: maximum number of steps M₀ (200 for segmentation in Xie et al.).
        stop_fraction: stop once the unfooled share of the target region is at most this (Xie: 0.01).
        norm: ``"linf"`` (Xie) or ``"l2"`` (the Naeem & Paschali PyTorch port) step normalisation.
        check_every: steps between checks that every sample has stopped (each check is one host sync;
            stopped samples no longer move in between, so this only bounds wasted steps).
        seed: unused (DAG is deterministic); kept for the common signature.

    ``AttackResult.extras`` holds per-sample ``mse``, ``linf``, ``l2``, ``ssim``, ``fooled_fraction``
    (share of the target region at its target) and the number of ``iterations`` run.
    """

    def __init__(
        self,
        task: Task,
        threat: Threat | None = None,
        *,
        bounds: Bounds | None | object = _REQUIRED,
        gamma: float = 0.5 / 255,
        max_iter: int = 200,
        stop_fraction: float = 0.01,
        norm: str = "linf",
        check_every: int = 10,
        seed: int | None = 0,
    ) -> None:
        if not isinstance(task, Segmentation):
            raise TypeError(f"`task` must be a Segmentation task for DAG, got {task!r}")
        if threat is not None and not isinstance(threat, Linf):
            raise TypeError(f"`threat` must be a Linf ball or None for DAG, got {threat!r}")
        super().__init__(task, threat, targeted=True, seed=seed)
        if not float(gamma) > 0:
            raise ValueError(f"`gamma` must be > 0 (data units), got {gamma}")
        if int(max_iter) < 1:
            raise ValueError(f"`max_iter` must be >= 1, got {max_iter}")
        if not 0.0 <= float(stop_fraction) < 1.0:
            raise ValueError(f"`stop_fraction` must be in [0, 1), got {stop_fraction}")
        if norm not in ("linf", "l2"):
            raise ValueError(f"`norm` must be 'linf' or 'l2', got {norm!r}")
        if int(check_every) < 1:
            raise ValueError(f"`check_every` must be >= 1, got {check_every}")
        if threat is None and bounds is _REQUIRED:
            raise ValueError("`bounds` is required when `threat` is None: the data range (lo, hi) in data "
                             "units, or None for unbounded data")
        if bounds is _REQUIRED:
            bounds = None
        # an unbounded Linf with eps=inf would be a hack; keep a plain clip helper instead
        self._clip_threat = threat if threat is not None else (None if bounds is None else Linf(0.0, bounds=bounds))
        self.gamma = float(gamma)
        self.max_iter = int(max_iter)
        self.stop_fraction = float(stop_fraction)
        self.norm = norm
        self.check_every = int(check_every)
        self._mask: Tensor | None = None

    @property
    def bounds(self):
        return None if self._clip_threat is None else self._clip_threat.bounds

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor | None = None,
                 target_mask: Tensor | None = None) -> AttackResult:
        if y is None:
            raise ValueError("`y` (the adversarial target map, e.g. from dag_target_a) is required for DAG")
        check_input(x, self._clip_threat if self.threat is None else self.threat)
        if target_mask is not None:
            if not isinstance(target_mask, Tensor) or target_mask.dtype != torch.bool:
                raise TypeError("`target_mask` must be a bool tensor (N, *spatial)")
            if isinstance(y, Tensor) and target_mask.shape != y.shape:
                raise ValueError(f"`target_mask` must have the shape of `y` {tuple(y.shape)}, got {tuple(target_mask.shape)}")
        self._mask = target_mask
        try:
            return super().__call__(model, x, y)
        finally:
            self._mask = None  # no state carried between calls

    def _clip(self, x0: Tensor, x: Tensor) -> Tensor:
        if self.threat is not None:
            return self.threat.finalize(x0, x)
        return x if self._clip_threat is None else self._clip_threat.clip(x)

    def _direction(self, g: Tensor) -> Tensor:
        p = float("inf") if self.norm == "linf" else 2.0
        n = per_sample_norm(g, p).reshape(-1, *([1] * (g.ndim - 1)))
        # a sample with no active voxel has a zero gradient: it must not move
        return torch.where(n > 0, g / n.clamp_min(1e-30), torch.zeros_like(g))

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor):
        pred0 = logits.argmax(dim=1)
        region = (pred0 != y) if self._mask is None else self._mask.to(x.device)
        valid = self.task.valid_mask(y)
        if valid is not None:
            region = region & valid
        y_safe = self.task.safe_labels(y)
        target = y_safe.unsqueeze(1)
        n_region = region.reshape(x.shape[0], -1).sum(dim=1).clamp_min(1)
        shape = (-1,) + (1,) * (x.ndim - 1)
        x_adv = x.clone()
        done = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
        iterations = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        for m in range(self.max_iter):
            with torch.enable_grad():
                x_adv.requires_grad_(True)
                z = model(x_adv)
                pred = z.detach().argmax(dim=1)
                active = region & (pred != y_safe)
                remaining = active.reshape(x.shape[0], -1).sum(dim=1) / n_region
                done = done | (remaining <= self.stop_fraction)
                diff = z.gather(1, target) - z.gather(1, pred.unsqueeze(1))
                g_obj = (diff.squeeze(1) * active.to(z.dtype)).sum()
                (g,) = torch.autograd.grad(g_obj, x_adv)
            step = self.gamma * self._direction(g) * (~done).reshape(shape).to(g.dtype)
            iterations = iterations + (~done).long()
            x_adv = self._clip(x, x_adv.detach() + step)
            if (m + 1) % self.check_every == 0 and bool(done.all()):
                break
        with torch.no_grad():
            pred = model(x_adv).argmax(dim=1)
        hit = (region & (pred == y_safe)).reshape(x.shape[0], -1).sum(dim=1)
        delta = x_adv - x
        win = min(7, *[s - (1 - s % 2) for s in x.shape[2:]])
        extras = {
            "mse": mse(x, x_adv),
            "linf": per_sample_norm(delta, float("inf")),
            "l2": per_sample_norm(delta, 2.0),
            "ssim": ssim(x, x_adv, data_range=self._data_range(x), win_size=max(1, win)),
            "fooled_fraction": hit.to(x.dtype) / n_region.to(x.dtype),
            "target_region_size": region.reshape(x.shape[0], -1).sum(dim=1),
            "iterations": iterations,
        }
        return x_adv, extras

    def _data_range(self, x: Tensor) -> float:
        b = self.bounds
        if b is None or isinstance(b[0], Tensor) or isinstance(b[1], Tensor):
            return float(x.max() - x.min()) or 1.0
        return float(b[1]) - float(b[0])


def calibrate_gamma(
    model: nn.Module,
    task: Segmentation,
    x: Tensor,
    y_adv: Tensor,
    target_mask: Tensor | None = None,
    *,
    target_mse: float = 0.004,
    low: float = 1e-4,
    high: float = 0.05,
    iters: int = 6,
    **dag_kwargs,
) -> tuple[float, AttackResult]:
    """Choose DAG's step γ so the mean MSE of the attack is close to ``target_mse``.

    Paschali et al. report the size of their DAG perturbations, not the step (MSE 0.004 for type A,
    0.002 for types B and C, on [0, 1] images), so the spec calibrates γ to the MSE rather than copying
    it. This is a geometric bisection on ``[low, high]``, one full DAG run per iteration. Larger steps
    give larger perturbations until the stopping rule ends the run. Returns the γ with the closest
    mean MSE and its result.
    """
    if not float(target_mse) > 0:
        raise ValueError(f"`target_mse` must be > 0, got {target_mse}")
    if not 0 < float(low) < float(high):
        raise ValueError(f"need 0 < low < high, got low={low}, high={high}")
    if int(iters) < 1:
        raise ValueError(f"`iters` must be >= 1, got {iters}")
    lo, hi = float(low), float(high)
    best: tuple[float, float, AttackResult] | None = None
    for _ in range(int(iters)):
        gamma = (lo * hi) ** 0.5
        res = DAG(task, gamma=gamma, **dag_kwargs)(model, x, y_adv, target_mask=target_mask)
        m = float(res.extras["mse"].mean())
        if best is None or abs(m - target_mse) < best[0]:
            best = (abs(m - target_mse), gamma, res)
        if m < target_mse:
            lo = gamma
        else:
            hi = gamma
    assert best is not None
    return best[1], best[2]
