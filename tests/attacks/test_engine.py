"""The one iterative engine: per-sample context through the active set, best-iterate keeping, stopping,
step rules. Toy attacks on a linear model make every expectation computable by hand."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from medadv.attacks.engine import IterativeAttack, StepContext
from medadv.attacks.steps import AdamStep, MomentumStep, NormalizedStep, SignStep, StepRule, ThreatStep
from medadv.tasks import MultiClass
from medadv.threats import Box, Linf


class _Probe(IterativeAttack):
    """Ascends ``x·w`` by signed steps; records what the hooks saw."""

    params: ClassVar[dict[str, Any]] = {}
    threat_kind = "box"

    def __init__(self, task, threat, *, steps: int = 6, active_set: bool = False, check_every: int = 1,
                 record_trace: bool = False, targeted: bool = False, seed: int | None = 0) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        self.seen: list[tuple[int, Tensor, Tensor]] = []
        self.stop_at: Tensor | None = None

    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        ctx.state["sid"] = ctx.index.clone()  # per-sample state: must follow the active set

    def objective(self, model, v, ctx):
        logits = model(v)
        self.seen.append((ctx.step, ctx.index.clone(), ctx.state["sid"].clone()))
        return v.flatten(1).sum(1), logits

    def step_rule(self) -> StepRule:
        return SignStep(0.1)

    def stop(self, logits, ctx):
        if self.stop_at is None:
            return None
        return ctx.step >= self.stop_at[ctx.index]  # sample i stops at step stop_at[i]


def _linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


def test_per_sample_state_follows_the_active_set_and_stopped_samples_freeze():
    model, x = _linear(), torch.zeros(5, 1, 2, 2)
    atk = _Probe(MultiClass(), Box.unbounded(), steps=6, active_set=True, check_every=2, record_trace=True)
    atk.stop_at = torch.tensor([0, 6, 2, 6, 3])
    res = atk(model, x)
    for _, index, sid in atk.seen:
        assert torch.equal(index, sid)  # hooks see the state of exactly the samples they work on
    # sample i moved stop_at[i] times by +0.1 per element (then froze), capped by the 6 steps
    moved = res.x_adv.flatten(1)[:, 0]
    torch.testing.assert_close(moved, torch.tensor([0.0, 0.6, 0.2, 0.6, 0.3]))
    # the active set was compacted (one sync every 2 steps): stopped samples left the batch
    assert atk.seen[-1][1].tolist() == [1, 3]
    tr = res.trace["objective"]
    assert tr.shape == (6, 5) and torch.isnan(tr[-1, 0]) and not torch.isnan(tr[-1, 1])


class _Best(_Probe):
    """Objective peaks at step 2 (score = −|v − 0.2|): keep_best must return that iterate."""

    keep_best = True

    def objective(self, model, v, ctx):
        return -(v.flatten(1).mean(1) - 0.2).abs(), model(v)

    def assess(self, model, v, logits, objective, ctx):
        return torch.ones_like(objective, dtype=torch.bool), objective


def test_keep_best_returns_the_best_iterate_not_the_last():
    model, x = _linear(), torch.zeros(2, 1, 2, 2)
    res = _Best(MultiClass(), Box.unbounded(), steps=6)(model, x)
    torch.testing.assert_close(res.x_adv, torch.full_like(x, 0.2))


def test_update_after_last_false_skips_the_last_update():
    class Skip(_Probe):
        update_after_last = False

    model, x = _linear(), torch.zeros(2, 1, 2, 2)
    res = Skip(MultiClass(), Box.unbounded(), steps=4)(model, x)
    torch.testing.assert_close(res.x_adv, torch.full_like(x, 0.3))  # 4 gradients, 3 updates
    res = _Probe(MultiClass(), Box.unbounded(), steps=4)(model, x)
    torch.testing.assert_close(res.x_adv, torch.full_like(x, 0.4))


def _ctx(v: Tensor) -> StepContext:
    return StepContext(step=0, steps=1, restart=0, index=torch.arange(v.shape[0]), x=v, y=v, clean_logits=None)


def test_adam_step_equals_torch_adam():
    torch.manual_seed(0)
    v0 = torch.randn(3, 4)
    grads = [torch.randn(3, 4) for _ in range(5)]
    rule, v = AdamStep(0.01), v0.clone()
    state = rule.init(v, _ctx(v))
    for g in grads:
        v = rule.step(v, g, g.sum(1), _ctx(v), state)
    p = v0.clone().requires_grad_(True)
    opt = torch.optim.Adam([p], lr=0.01)
    for g in grads:
        p.grad = -g  # torch minimises; the engine ascends the objective
        opt.step()
    torch.testing.assert_close(v, p.detach(), rtol=1e-6, atol=1e-7)


def test_step_rules_directions():
    g = torch.tensor([[3.0, -4.0], [0.0, 0.0]])
    v = torch.zeros(2, 2)
    threat = Linf(0.5, bounds=None)
    torch.testing.assert_close(ThreatStep(threat, 0.5).step(v, g, g[:, 0], _ctx(v), {}),
                               torch.tensor([[0.5, -0.5], [0.0, 0.0]]))
    # L2-normalised, zero gradient -> no move
    torch.testing.assert_close(NormalizedStep(1.0, 2.0).step(v, g, g[:, 0], _ctx(v), {}),
                               torch.tensor([[0.6, -0.8], [0.0, 0.0]]))
    rule = MomentumStep(threat, 0.1, decay=1.0)
    state = rule.init(v, _ctx(v))
    rule.step(v, g, g[:, 0], _ctx(v), state)
    torch.testing.assert_close(state["momentum"][0], torch.tensor([3 / 7, -4 / 7]))


def test_skip_leaves_other_samples_exactly_as_a_full_run(trained_multiclass):
    """Skipped samples cost no steps; the others get the same random start, hence the same result."""
    from medadv.attacks.apgd import APGD

    t = trained_multiclass
    atk = APGD(t.task, Linf(0.05, bounds=(0.0, 1.0)), steps=8, restarts=2, seed=5)
    skip = torch.arange(t.x.shape[0]) % 3 == 0
    full = atk.run(t.model, t.x, t.y, None)
    part = atk.run(t.model, t.x, t.y, None, skip=skip)
    assert torch.equal(part.x_adv[~skip], full.x_adv[~skip])
    assert bool((part.iterations[skip] == 0).all()) and bool((part.iterations[~skip] > 0).all())
    none = atk.run(t.model, t.x, t.y, None, skip=torch.ones_like(skip))
    assert bool((none.iterations == 0).all())
    assert float((none.x_adv - t.x).abs().max()) <= 0.05 + 1e-6
