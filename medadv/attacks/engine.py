"""The one iterative engine: every gradient-based medadv attack is a set of hooks on this loop.

The loop owns the random start, restarts with per-sample worst-case selection, the active set, the
trace, bf16 autocast and best-iterate keeping. An attack plugs in (Foolbox 3's hooks, our own shape):

* :meth:`IterativeAttack.setup` — per-call, per-sample constants (tensors with a leading batch dim; they
  follow the active set) and shared constants;
* :meth:`IterativeAttack.init_variable` — the optimised variable (the adversarial input by default; VAFA
  optimises quantisation tables);
* :meth:`IterativeAttack.objective` — the per-sample quantity to *ascend* and the model output;
* a :class:`~medadv.attacks.steps.StepRule` (sign, L2-normalised, momentum, Adam, APGD's schedule);
* :meth:`IterativeAttack.project` — back into the feasible set (ε-ball and box by default);
* :meth:`IterativeAttack.stop` — a per-sample stop test (the active set);
* :meth:`IterativeAttack.assess` and :meth:`IterativeAttack.better` — the per-sample "admissible /
  score" of an iterate and the order used for best-iterate keeping and restarts.

Every hook receives a :class:`StepContext` with the active samples' indices, their clean inputs,
labels, clean logits (when the attack needs them), per-sample state and the step number.

Engine rules (DESIGN.md): everything stays on the model's device; gradients w.r.t. the variable only
(``torch.autograd.grad``); no host synchronisation in the step loop — the stop test is evaluated every
step on the device (a stopped sample never moves again) and the active set is compacted, one host sync,
only every ``check_every`` steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Bool, Int
from ..runtime import forward_tensor, make_generator
from .base import Attack, AttackDetails, PerturbOutput, hold_fixed_channels
from .steps import StepRule

__all__ = ["IterativeAttack", "StepContext", "EngineOutput"]


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    """A per-sample ``(n,)`` mask broadcastable over a batch tensor ``like``."""
    return mask.reshape((-1,) + (1,) * (like.ndim - 1))


def _take(value: Any, keep: Tensor) -> Any:
    """Subset the leading (batch) dim of tensors, recursively through dicts; other values unchanged."""
    if isinstance(value, Tensor) and value.ndim >= 1:
        return value[keep]
    if isinstance(value, dict):
        return {k: _take(v, keep) for k, v in value.items()}
    return value


@dataclass
class StepContext:
    """What every hook sees about the samples it works on (the active ones).

    Attributes:
        step: the current step, 0-based (``-1`` during setup and final assessment).
        steps: the number of steps T of one restart.
        restart: the current restart, 0-based.
        index: ``(n,)`` positions of the active samples in the caller's batch.
        x: ``(n, ...)`` clean inputs of the active samples.
        y: labels (or targets) of the active samples.
        clean_logits: clean model output of the active samples (``None`` unless the attack needs it).
        state: per-sample tensors of the attack (leading dim ``n``), subset with the active set.
        shared: constants that do not follow the active set (matrices, schedules).
    """

    step: int
    steps: int
    restart: int
    index: Tensor
    x: Tensor
    y: Tensor
    clean_logits: Tensor | None
    state: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)

    def subset(self, keep: Tensor) -> StepContext:
        return replace(self, index=self.index[keep], x=self.x[keep], y=self.y[keep],
                       clean_logits=None if self.clean_logits is None else self.clean_logits[keep],
                       state=_take(self.state, keep))


@dataclass
class EngineOutput:
    """What one engine run returns: the final input, variable, and per-sample bookkeeping."""

    x_adv: Tensor
    variable: Tensor
    admissible: Tensor  # (N,) bool: the kept iterate passed the attack's admissibility test
    score: Tensor  # (N,) the kept iterate's score (higher is better)
    iterations: Tensor  # (N,) long: updates actually applied to each sample
    trace: dict[str, Tensor] | None
    ctx: StepContext  # the full-batch context after setup (state of every sample)
    start_logits: Tensor | None = None  # the first step's output when it was the clean forward (starts_at_input)


class IterativeAttack(Attack):
    """Base of every iterative attack: declares the loop's common parameters and runs the loop.

    Args (common to every iterative attack):
        steps: number of steps T (>= 1).
        restarts: number of runs from (random) starts; per sample the best run is kept by
            :meth:`better` (fooled/admissible first, then the higher score).
        active_set: stop attacking samples once :meth:`stop` holds for them (fooled, target reached).
            Less work; a stopped sample never moves again.
        check_every: how often (steps) the active set is compacted; each compaction is one host sync.
        record_trace: keep the per-sample objective of every step in ``trace["objective"]``,
            ``(T * restarts, N)`` (NaN for samples no longer attacked).
        amp: run forward/backward under bf16 autocast on CUDA (the objective is computed in fp32).
    """

    params: ClassVar[dict[str, Any]] = {
        "steps": Int(low=1),
        "restarts": Int(low=1),
        "active_set": Bool(),
        "check_every": Int(low=1),
        "record_trace": Bool(),
        "amp": Bool(),
    }
    #: keep the best iterate (by :meth:`assess`/:meth:`better`) instead of the last one
    keep_best: ClassVar[bool] = False
    #: samples with no admissible iterate get the last iterate ("last") or the best-scoring one ("best")
    fallback: ClassVar[str] = "best"
    #: apply the step rule after the last forward (False: the last gradient is not used, as in VAFA's code)
    update_after_last: ClassVar[bool] = True
    #: name of the trace entry
    trace_key: ClassVar[str] = "objective"

    # defaults for attacks that do not expose every loop option as a parameter
    steps: int = 10
    restarts: int = 1
    active_set: bool = False
    check_every: int = 1
    record_trace: bool = False
    amp: bool = False

    # --- hooks ---------------------------------------------------------------------------------------------
    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        """Fill ``ctx.state`` (per-sample) and ``ctx.shared`` before the first restart."""

    def init_variable(self, ctx: StepContext, generator: torch.Generator | None) -> Tensor:
        """The starting variable of a restart (default: the clean input)."""
        return ctx.x.clone()

    def to_input(self, v: Tensor, ctx: StepContext) -> Tensor:
        """The model input for variable ``v`` (identity when the variable is the input)."""
        return v

    def starts_at_input(self) -> bool:
        """Whether the first iterate is the clean input itself: then the first step's forward pass is the clean
        forward, and the attack returns its output as ``AttackResult.clean_logits`` (no separate clean pass for
        a caller that needs it). True when none of :meth:`init_variable`, :meth:`to_input` and :meth:`objective`
        is overridden (an objective may run a stand-in model); attacks with an optional random start, or whose
        objective's output is the model's, override it."""
        cls = type(self)
        return cls.init_variable is IterativeAttack.init_variable and cls.to_input is IterativeAttack.to_input \
            and cls.objective is IterativeAttack.objective

    def forward(self, model: nn.Module, x_adv: Tensor) -> Tensor:
        """The model output (bf16 autocast on CUDA when ``amp``; the output is returned in fp32)."""
        if self.amp and x_adv.device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return forward_tensor(model, x_adv).float()
        return forward_tensor(model, x_adv)

    def objective(self, model: nn.Module, v: Tensor, ctx: StepContext) -> tuple[Tensor, Tensor]:
        """``(objective (n,) to ascend, logits)`` at variable ``v``; must be differentiable in ``v``."""
        logits = self.forward(model, self.to_input(v, ctx))
        if ctx.shared.pop("validate_y", False):  # the one host sync: y checked against the first output
            self.task.validate(logits, ctx.y, "y")
        return self.logits_objective(logits, ctx), logits

    def logits_objective(self, logits: Tensor, ctx: StepContext) -> Tensor:
        """The objective as a function of the model output (default: the task's loss, ascended untargeted,
        descended targeted). Also scores the final iterate of best-keeping attacks and of restarts."""
        loss = self.task.loss(logits, ctx.y)
        return -loss if self.targeted else loss

    def step_rule(self) -> StepRule:
        """The update rule (a fresh object per call; its state is per sample)."""
        raise NotImplementedError

    def project(self, v: Tensor, ctx: StepContext) -> Tensor:
        """Back into the feasible set: the ε-ball around ``ctx.x`` and the box (box only without a ball)."""
        if self.threat is not None:
            return self.threat.finalize(ctx.x, v)
        return self.box.clip(v)

    def stop(self, logits: Tensor, ctx: StepContext) -> Tensor | None:
        """Per-sample stop test on the current iterate's output (``None``: never stop)."""
        if not self.active_set:
            return None
        return self.task.fooled(logits.detach(), ctx.y, self.targeted)

    def assess(self, model: nn.Module, v: Tensor, logits: Tensor, objective: Tensor,
               ctx: StepContext) -> tuple[Tensor, Tensor]:
        """``(admissible (n,) bool, score (n,))`` of an iterate, higher score better (default: the task's
        fooled test and the objective). Called with no gradient, on the output the step already computed."""
        return self.task.fooled(logits.detach(), ctx.y, self.targeted), objective.detach()

    def _assess_finite(self, model: nn.Module, v: Tensor, logits: Tensor, objective: Tensor,
                       ctx: StepContext) -> tuple[Tensor, Tensor]:
        """:meth:`assess`, with an iterate holding NaN/Inf never admissible and scored ``-inf``: the output of
        a NaN input (arg-max of NaN logits) would pass the task's "fooled" test, and best-iterate keeping
        would return the NaN input as the attack's success. On the device, no host sync."""
        ok, score = self.assess(model, v, logits, objective, ctx)
        finite = torch.isfinite(v.reshape(v.shape[0], -1)).all(dim=1)
        return ok & finite, torch.where(finite, score, torch.full_like(score, float("-inf")))

    def better(self, ok: Tensor, score: Tensor, best_ok: Tensor, best_score: Tensor) -> Tensor:
        """Per sample: is ``(ok, score)`` better than the best so far? Admissible first, then higher score."""
        return (ok & ~best_ok) | ((ok == best_ok) & (score > best_score))

    def details(self, model: nn.Module, out: EngineOutput) -> AttackDetails | None:
        """Typed attack-specific results (default none)."""
        return None

    def _assess_every(self) -> int:
        return self.check_every

    # --- the loop --------------------------------------------------------------------------------------------
    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any):
        out = self.run(model, x, y, logits, **call_args)
        return PerturbOutput(out.x_adv, self.details(model, out), out.trace, out.start_logits)

    def run(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, *, skip: Tensor | None = None,
            **call_args: Any) -> EngineOutput:
        """Run every restart and keep, per sample, the best by :meth:`better`.

        ``skip``: ``(N,)`` bool, samples not to attack (an ensemble's already-broken ones). They leave the
        active set before the first step, so they cost nothing but their share of the random start, which
        is still drawn for the whole batch: every other sample gets the same start, hence the same result,
        as in a run without ``skip``. Skipped samples come back at their start point, unassessed.
        """
        n = x.shape[0]
        ctx = StepContext(step=-1, steps=self.steps, restart=0, index=torch.arange(n, device=x.device), x=x, y=y,
                          clean_logits=logits, state={}, shared=dict(call_args))
        self.setup(model, ctx)
        gen = make_generator(self.seed, x.device)
        trace: list[Tensor] | None = [] if self.record_trace else None
        best: EngineOutput | None = None
        start_logits = None
        for r in range(self.restarts):
            res = self._restart(model, replace(ctx, restart=r), gen, trace,
                                validate=logits is None and r == 0, skip=skip)
            if best is None:
                best, start_logits = res, res.start_logits
                continue
            b = self.better(res.admissible, res.score, best.admissible, best.score)
            best = EngineOutput(
                x_adv=torch.where(_rows(b, x), res.x_adv, best.x_adv),
                variable=torch.where(_rows(b, res.variable), res.variable, best.variable),
                admissible=torch.where(b, res.admissible, best.admissible),
                score=torch.where(b, res.score, best.score),
                iterations=best.iterations + res.iterations,
                trace=None, ctx=ctx)
        assert best is not None
        best.ctx = ctx
        best.trace = None if trace is None else {self.trace_key: torch.stack(trace)}
        best.start_logits = start_logits
        return best

    def _restart(self, model: nn.Module, ctx: StepContext, gen: torch.Generator | None,
                 trace: list[Tensor] | None, validate: bool, skip: Tensor | None = None) -> EngineOutput:
        n = ctx.x.shape[0]
        v = self.init_variable(ctx, gen)
        # the task's fixed input channels (prompt codes) are outside the search set: held at the clean values at the
        # start, after every projection, and given no gradient (an L2 step's length goes to the image channels)
        hold = bool(self.task.fixed_input_channels()) and type(self).to_input is IterativeAttack.to_input
        if hold:
            v = hold_fixed_channels(self.task, v, ctx.x)
        rule = self.step_rule()
        rule_state = rule.init(v, ctx)
        track = self.keep_best or self.restarts > 1
        # full-batch outputs, written when samples leave the active set and at the end
        out_v = v.clone()
        iterations = torch.zeros(n, dtype=torch.long, device=v.device)
        best_v = v.clone() if self.keep_best else None
        best_ok = torch.zeros(n, dtype=torch.bool, device=v.device)
        best_score = torch.full((n,), float("-inf"), device=v.device, dtype=torch.float64)  # any score dtype fits
        stopped = torch.zeros(n, dtype=torch.bool, device=v.device)
        full_ctx = ctx
        steps = self.steps
        assess_every = self._assess_every()
        # the first forward of the first restart is the clean forward when it sees the whole clean batch in fp32
        capture = ctx.restart == 0 and skip is None and not self.amp and self.starts_at_input()
        start_logits = None
        if skip is not None:  # leave the active set before the first step (one host sync)
            stopped = skip.to(device=v.device, dtype=torch.bool).clone()
            keep = ~stopped
            if not bool(keep.all()):
                ctx = ctx.subset(keep)
                v = v[keep]
                rule_state = _take(rule_state, keep)
                if validate and v.shape[0] == 0:
                    self.task.validate(self.forward(model, self.to_input(out_v[:1], full_ctx)), full_ctx.y[:1], "y")
        for t in range(steps if v.shape[0] else 0):
            ctx.step = t
            with torch.enable_grad():  # callers may be under no_grad
                v = v.detach().requires_grad_(True)
                if validate and t == 0:  # attacks without clean logits check y on their first forward
                    ctx.shared["validate_y"] = True
                obj, logits = self.objective(model, v, ctx)
                if capture and t == 0:
                    start_logits = logits.detach()
                last = t == steps - 1
                need_grad = self.update_after_last or not last
                g = torch.autograd.grad(obj.sum(), v)[0] if need_grad else None
            if hold and g is not None:
                g = hold_fixed_channels(self.task, g, None)
            v = v.detach()
            obj = obj.detach()
            if trace is not None:
                full = torch.full((n,), float("nan"), device=v.device, dtype=obj.dtype)
                trace.append(full.index_copy(0, ctx.index, obj))
            halt = self.stop(logits, ctx)
            if halt is not None:
                stopped_now = stopped[ctx.index] | halt
                stopped = stopped.index_copy(0, ctx.index, stopped_now)
            if self.keep_best and (t % assess_every == 0 or last):
                with torch.no_grad():
                    ok, score = self._assess_finite(model, v, logits, obj, ctx)
                cur_ok, cur_score = best_ok[ctx.index], best_score[ctx.index]
                b = self.better(ok, score, cur_ok, cur_score)
                best_ok = best_ok.index_copy(0, ctx.index, torch.where(b, ok, cur_ok))
                best_score = best_score.index_copy(0, ctx.index, torch.where(b, score.to(cur_score.dtype), cur_score))
                assert best_v is not None
                best_v = best_v.index_copy(0, ctx.index, torch.where(_rows(b, v), v, best_v[ctx.index]))
            if g is not None:
                new_v = self.project(rule.step(v, g, obj, ctx, rule_state), ctx)
                if hold:
                    new_v = hold_fixed_channels(self.task, new_v, ctx.x)
                if halt is not None:
                    frozen = stopped[ctx.index]
                    new_v = torch.where(_rows(frozen, new_v), v, new_v)
                    iterations = iterations.index_add(0, ctx.index, (~frozen).long())
                else:
                    iterations = iterations.index_add(0, ctx.index, torch.ones_like(ctx.index))
                v = new_v
            if halt is not None and (t + 1) % self.check_every == 0 and not last:
                keep = ~stopped[ctx.index]  # one host sync below (boolean indexing)
                if not bool(keep.all()):
                    out_v = out_v.index_copy(0, ctx.index, v)
                    if not bool(keep.any()):
                        if trace is not None:  # keep the documented (T, N) shape: steps not run are NaN
                            trace.extend(trace[-1].new_full((n,), float("nan")) for _ in range(t + 1, steps))
                        ctx = ctx.subset(keep)
                        v = v[keep]
                        break
                    ctx = ctx.subset(keep)
                    v = v[keep]
                    rule_state = _take(rule_state, keep)
        if trace is not None and len(trace) < (ctx.restart + 1) * steps:  # nothing was active: NaN rows
            trace.extend(out_v.new_full((n,), float("nan")) for _ in range(len(trace), (ctx.restart + 1) * steps))
        out_v = out_v.index_copy(0, ctx.index, v) if v.shape[0] else out_v
        ctx = full_ctx
        ctx.step = -1
        if self.keep_best:
            assert best_v is not None
            # the last iterate (after the final update) may be better still: assess it too
            if self.update_after_last:
                with torch.no_grad():
                    logits = self.forward(model, self.to_input(out_v, ctx))
                    ok, score = self._assess_finite(model, out_v, logits, self.logits_objective(logits, ctx), ctx)
                b = self.better(ok, score, best_ok, best_score)
                best_ok, best_score = torch.where(b, ok, best_ok), torch.where(b, score.to(best_score.dtype), best_score)
                best_v = torch.where(_rows(b, out_v), out_v, best_v)
            if self.fallback == "last":
                final_v = torch.where(_rows(best_ok, out_v), best_v, out_v)
            else:
                final_v = best_v
            ok_final, score_final = best_ok, best_score
        else:
            final_v = out_v
            if track:
                with torch.no_grad():
                    logits = self.forward(model, self.to_input(final_v, ctx))
                    ok_final, score_final = self._assess_finite(model, final_v, logits,
                                                                self.logits_objective(logits, ctx), ctx)
            else:
                ok_final = torch.zeros(n, dtype=torch.bool, device=final_v.device)
                score_final = torch.zeros(n, device=final_v.device)
        with torch.no_grad():
            x_adv = self.to_input(final_v, ctx).detach()
        return EngineOutput(x_adv=x_adv, variable=final_v, admissible=ok_final, score=score_final,
                            iterations=iterations, trace=None, ctx=ctx, start_logits=start_logits)
