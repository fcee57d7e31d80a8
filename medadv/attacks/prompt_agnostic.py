"""Prompt-agnostic attack on promptable segmenters: one perturbation of the image that holds across prompts.

A fixed-prompt attack (PGD on ``x = [image | code]``) fools the model for the one prompt in ``x``; a user who clicks
elsewhere in the same structure may get the right mask back. The prompt-agnostic attack ascends the *expected* loss
over the prompt distribution instead — an expectation over transformation (Athalye et al. 2018) where the
transformation is the prompt: every step draws ``prompts`` random prompts per sample for the structure ``y`` marks
(:meth:`~medadv.tasks.PromptableSegmentation.draw_prompts`: a click anywhere in the structure, a jittered box), runs
the model on the image with each, and steps along the gradient of the mean loss (the setting of prompt-agnostic
attacks on SAM, after Kirillov et al. 2023's click and box prompts; Malik et al. 2024 for medical segmenters).

The variable is the whole coded input; its code channels stay the clean prompt under every norm and budget (the
engine holds the task's fixed input channels, see :mod:`medadv.tasks.promptable`): the prompts drawn per step live only
in the attack's own copies. ``AttackResult.details`` holds the Dice of ``eval_prompts`` *held-out*
prompts (drawn with another seed than the attack's) per sample, before and after: the per-prompt Dice columns of a
result row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Int
from ..runtime import forward_tensor, make_generator
from ..tasks import Task
from ..threats import Threat
from .base import AttackDetails, register
from .engine import EngineOutput, IterativeAttack, StepContext
from .gradient import GradientAttack

__all__ = ["PromptAgnostic", "PromptAgnosticDetails", "heldout_prompt_dice"]

_HELDOUT_SEED = 7919  # held-out prompts: a stream the attack's own draws (seed, seed + 1) never use


@dataclass
class PromptAgnosticDetails(AttackDetails):
    """Dice of the prompted structure under held-out prompts (per sample, per prompt).

    Attributes:
        heldout_clean_dice: ``(N, P)`` Dice on the clean image with each of the P held-out prompts.
        heldout_adv_dice: ``(N, P)`` Dice on the adversarial image with the same prompts.
        heldout_adv_mean_dice: ``(N,)`` mean over the P prompts of ``heldout_adv_dice``.
    """

    columns: ClassVar[tuple[str, ...]] = ("heldout_clean_dice", "heldout_adv_dice", "heldout_adv_mean_dice")
    heldout_clean_dice: Tensor
    heldout_adv_dice: Tensor
    heldout_adv_mean_dice: Tensor


def _prompt_source(task: Task) -> Any:
    """The task's prompt sampler (``draw_prompts``) or ``None`` for a task without prompts."""
    draw = getattr(task, "draw_prompts", None)
    return draw if callable(draw) else None


def heldout_prompt_dice(model: nn.Module, task: Any, box: Any, x: Tensor, y: Tensor, prompts: int,
                        seed: int = _HELDOUT_SEED) -> Tensor:
    """``(N, prompts)`` Dice of ``model`` on the image of ``x`` with ``prompts`` random prompts per sample drawn for
    the structure ``y`` marks (``task.draw_prompts`` with its own seeded generator; no gradient)."""
    g = make_generator(seed, x.device)
    n = x.shape[0]
    with torch.no_grad():
        xs = task.draw_prompts(x, y, prompts, box, g)
        logits = forward_tensor(model, xs)
        dice = task.mean_dice(task.predict(logits), y.repeat(prompts, *([1] * (y.ndim - 1))))
    return dice.reshape(prompts, n).t().contiguous()


@register("prompt_agnostic")
class PromptAgnostic(IterativeAttack):
    """PGD on the expected loss over random prompts (module docstring).

    It shares PGD's start, step and projection (:class:`~medadv.attacks.GradientAttack`'s) but is not one of the
    gradient family: it needs a task that draws prompts.

    Args:
        task: a :class:`~medadv.tasks.PromptableSegmentation`.
        threat: ``Linf`` or ``L2`` ball whose box is the task's :class:`~medadv.tasks.promptable.PromptBox`.
        prompts: random prompts drawn per sample and step (the Monte-Carlo size of the expectation).
        eval_prompts: held-out prompts per sample scored in the details (0: none).
        steps, step_size, random_start, restarts, targeted, seed, active_set, check_every, amp, record_trace: see
            :class:`~medadv.attacks.GradientAttack`.
    """

    params: ClassVar[dict[str, Any]] = {**GradientAttack.params, "prompts": Int(low=1), "eval_prompts": Int(low=0)}
    tasks = ("PromptableSegmentation",)
    trace_key = "loss"
    needs_clean_logits = False  # y is validated against the first step's forward
    step_size: float | None
    random_start: bool
    # PGD's start, step length and rule (shared code, not a subclass: the gradient family's suites take every task)
    alpha = GradientAttack.alpha
    step_rule = GradientAttack.step_rule
    starts_at_input = GradientAttack.starts_at_input
    init_variable = GradientAttack.init_variable
    prompts: int
    eval_prompts: int

    def __init__(
        self,
        task: Task,
        threat: Threat,
        *,
        prompts: int = 4,
        eval_prompts: int = 8,
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
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())

    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        seed = None if self.seed is None else self.seed + 1  # not the random start's stream
        ctx.shared["prompt_generator"] = make_generator(seed, ctx.x.device)

    def objective(self, model: nn.Module, v: Tensor, ctx: StepContext) -> tuple[Tensor, Tensor]:
        draw = _prompt_source(self.task)
        assert draw is not None  # the declared task kind draws prompts
        k, n = self.prompts, v.shape[0]
        if ctx.shared.pop("validate_y", False):  # y must fit before prompts are drawn from it (one forward)
            with torch.no_grad():
                self.task.validate(self.forward(model, v.detach()), ctx.y, "y")
        drawn = draw(v.detach(), ctx.y, k, self.box, ctx.shared["prompt_generator"])
        xs = torch.cat([v, self.task.with_code(v.repeat(k, *([1] * (v.ndim - 1))), drawn)])  # type: ignore[attr-defined]
        out = self.forward(model, xs)
        logits, rest = out[:n], out[n:]
        yk = ctx.y.repeat(k, *([1] * (ctx.y.ndim - 1)))
        loss = self.task.loss(rest, yk).reshape(k, n).mean(dim=0)
        return (-loss if self.targeted else loss), logits

    def details(self, model: nn.Module, out: EngineOutput) -> AttackDetails | None:
        if _prompt_source(self.task) is None or self.eval_prompts == 0:
            return None
        seed = _HELDOUT_SEED if self.seed is None else _HELDOUT_SEED + self.seed
        ctx = out.ctx
        clean = heldout_prompt_dice(model, self.task, self.box, ctx.x, ctx.y, self.eval_prompts, seed)
        adv = heldout_prompt_dice(model, self.task, self.box, out.x_adv, ctx.y, self.eval_prompts, seed)
        return PromptAgnosticDetails(clean, adv, adv.mean(dim=1))
