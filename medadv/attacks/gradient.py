"""One projected-gradient loop for the whole gradient family.

FGSM, BIM, PGD, CosPGD and SegPGD differ only in their start (random or not), step count and the
per-element weighting of the task's loss; this module holds the loop, each attack module holds its
weighting. The loop follows DESIGN.md's engine rules: gradients w.r.t. the input only
(``torch.autograd.grad``), parameters frozen, everything on the model's device, no host
synchronisation inside the step loop (the optional active set synchronises once every
``check_every`` steps, by design).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..tasks import Task
from ..threats import Threat
from .base import Attack, make_generator

__all__ = ["GradientAttack"]


class GradientAttack(Attack):
    """Iterative first-order attack on the task's (optionally weighted) per-element loss.

    Untargeted: ascend the loss w.r.t. ``y`` (true labels or clean prediction). Targeted: descend the
    loss w.r.t. the target ``y``. Each step moves ``step_size`` (data units) along the threat's
    steepest-ascent direction (sign for L∞, normalised gradient for L2), projects onto the ε-ball and
    clips to the data bounds.

    Args:
        task: the model's :class:`~medadv.tasks.Task`.
        threat: :class:`~medadv.threats.Linf` or :class:`~medadv.threats.L2` (ε and bounds in data units).
        steps: number of gradient steps T (>= 1).
        step_size: step length α in data units; default ``2.5 * eps / steps`` (Madry et al.).
        random_start: start from a uniform random point of the ball instead of ``x``.
        restarts: number of random restarts; per sample the worst case is kept (fooled first, then the
            highest loss — lowest for targeted attacks).
        targeted: see :class:`~medadv.attacks.base.Attack`.
        seed: seed of the random start (same seed, same adversarial tensor).
        active_set: stop attacking samples once they are fooled (checked every ``check_every`` steps).
            Less work; a sample counted as fooled stays fooled.
        check_every: how often (steps) the active set is refreshed; each refresh is one host sync.
        amp: run forward/backward under bf16 autocast (CUDA fast path; the loss is computed in fp32).
        record_trace: keep the per-sample loss of every step in ``AttackResult.trace["loss"]``,
            ``(T * restarts, N)`` (restarts one after the other).
    """

    needs_clean_logits = False  # y is validated against the first step's forward instead

    def __init__(
        self,
        task: Task,
        threat: Threat,
        *,
        steps: int = 10,
        step_size: float | None = None,
        random_start: bool = True,
        restarts: int = 1,
        targeted: bool = False,
        seed: int | None = 0,
        active_set: bool = False,
        check_every: int = 1,
        amp: bool = False,
        record_trace: bool = False,
    ) -> None:
        if threat is None:
            raise TypeError("`threat` is required for gradient attacks (Linf or L2)")
        super().__init__(task, threat, targeted=targeted, seed=seed)
        if isinstance(steps, bool) or int(steps) != steps or int(steps) < 1:
            raise ValueError(f"`steps` must be an integer >= 1, got {steps}")
        if int(restarts) < 1:
            raise ValueError(f"`restarts` must be >= 1, got {restarts}")
        if int(check_every) < 1:
            raise ValueError(f"`check_every` must be >= 1, got {check_every}")
        self.steps = int(steps)
        if step_size is None:
            step_size = 2.5 * threat.eps / self.steps
        if not math.isfinite(float(step_size)) or float(step_size) < 0:
            raise ValueError(f"`step_size` must be a finite number >= 0 (data units), got {step_size}")
        self.step_size = float(step_size)
        self.random_start = bool(random_start)
        self.restarts = int(restarts)
        self.active_set = bool(active_set)
        self.check_every = int(check_every)
        self.amp = bool(amp)
        self.record_trace = bool(record_trace)

    # --- the part that differs between attacks ------------------------------------------------------------
    def element_weights(self, logits: Tensor, y: Tensor, step: int) -> Tensor | None:
        """Per-element weights of the loss at ``step`` (0-based), detached; ``None`` = uniform."""
        return None

    def objective(self, logits: Tensor, y: Tensor, step: int) -> Tensor:
        """Per-sample quantity to ascend, ``(N,)``."""
        w = self.element_weights(logits, y, step)
        loss = self.task.loss(logits, y, None if w is None else w.detach())
        return -loss if self.targeted else loss

    # --- the loop ------------------------------------------------------------------------------------------
    def _forward(self, model: nn.Module, x: Tensor) -> Tensor:
        if self.amp and x.device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(x).float()
        return model(x)

    def _start(self, x: Tensor, gen: torch.Generator | None) -> Tensor:
        if not self.random_start or self.threat.eps == 0:
            return x.clone()
        return self.threat.clip(x + self.threat.random_delta(x, gen))

    def _steps(self, model: nn.Module, x: Tensor, y: Tensor, x_adv: Tensor, trace: list[Tensor] | None,
               validate: bool = False) -> Tensor:
        threat, alpha = self.threat, self.step_size
        if not self.active_set:
            for t in range(self.steps):
                with torch.enable_grad():  # callers may be under no_grad
                    x_adv.requires_grad_(True)
                    logits = self._forward(model, x_adv)
                    if validate and t == 0:  # the one host sync: y checked against the model output
                        self.task.validate(logits, y, "y")
                    obj = self.objective(logits, y, t)
                    (g,) = torch.autograd.grad(obj.sum(), x_adv)
                if trace is not None:
                    trace.append(obj.detach())
                x_adv = threat.finalize(x, x_adv.detach() + alpha * threat.ascent_direction(g))
            return x_adv

        out = x_adv.clone()
        idx = torch.arange(x.shape[0], device=x.device)
        xs, ys, cur = x, y, x_adv
        for t in range(self.steps):
            with torch.enable_grad():  # callers may be under no_grad
                cur.requires_grad_(True)
                logits = self._forward(model, cur)
                if validate and t == 0:
                    self.task.validate(logits, ys, "y")
                obj = self.objective(logits, ys, t)
                (g,) = torch.autograd.grad(obj.sum(), cur)
            cur = cur.detach()
            if trace is not None:
                # samples no longer attacked are recorded as NaN
                full = torch.full((x.shape[0],), float("nan"), device=x.device, dtype=obj.dtype)
                trace.append(full.index_copy(0, idx, obj.detach()))
            if t % self.check_every == 0:
                keep = ~self.task.fooled(logits.detach(), ys, self.targeted)
                out[idx] = cur
                idx, xs, ys, cur, g = idx[keep], xs[keep], ys[keep], cur[keep], g[keep]
                if idx.numel() == 0:
                    if trace is not None:  # keep the documented (T, N) shape: steps not run are NaN
                        trace.extend(trace[-1].new_full((x.shape[0],), float("nan")) for _ in range(t + 1, self.steps))
                    return out
            cur = threat.finalize(xs, cur + alpha * threat.ascent_direction(g))
        out[idx] = cur
        return out

    def _score(self, model: nn.Module, x_adv: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            logits = self._forward(model, x_adv)
            loss = self.task.loss(logits, y)
            return self.task.fooled(logits, y, self.targeted), (-loss if self.targeted else loss)

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None):
        gen = make_generator(self.seed, x.device)
        trace: list[Tensor] | None = [] if self.record_trace else None
        best = None
        for r in range(self.restarts):
            x_adv = self._steps(model, x, y, self._start(x, gen), trace, validate=logits is None and r == 0)
            if self.restarts == 1:
                best = x_adv
                break
            fooled, score = self._score(model, x_adv, y)
            if best is None:
                best, best_fooled, best_score = x_adv, fooled, score
                continue
            better = (fooled & ~best_fooled) | ((fooled == best_fooled) & (score > best_score))
            shape = (-1,) + (1,) * (x.ndim - 1)
            best = torch.where(better.reshape(shape), x_adv, best)
            best_fooled = best_fooled | fooled
            best_score = torch.where(better, score, best_score)
        tr = None if trace is None else {"loss": torch.stack(trace)}
        return best, {}, tr
