"""``auto``: an AutoAttack-style worst-case ensemble for multi-class, multi-label and 2-D/3-D segmentation.

A single PGD run overestimates robustness. ``auto`` runs a fixed, documented sequence of diverse attacks,
each only on the samples not yet at the floor of the task's metric, and keeps per sample the worst case by
that metric (:meth:`~medadv.tasks.Task.robust_metric`: accuracy, exact match of every label, mean Dice).

* Multi-class: AutoAttack's members through pyautoattack (Croce & Hein, ICML 2020): APGD-CE, APGD-T,
  FAB-T, Square, one at a time so each one's contribution and time are recorded. On inputs pyautoattack's
  Square cannot take (3-D volumes; L2 on images of fewer than 5 rows) the Square member is medadv's own
  :class:`~medadv.attacks.square.Square` on the logit margin, as for the other tasks.
* Multi-label: APGD on the per-label BCE, APGD on the per-label margin, APGD focused on flipping each
  sample's least-confident labels (one run per label, the multi-label analogue of APGD-T), and the
  score-based Square attack on the smallest label margin (a black-box member that exposes masked gradients).
* Segmentation (2-D and 3-D): APGD with several per-voxel losses (the task's loss, class-balanced CE,
  Jensen–Shannon to the one-hot label, the CosPGD and SegPGD weightings), optionally with SEA's progressive
  radius (Croce, Singh, Hein, ECCV 2024: phases at 2ε and 1.5ε, then ε; the result always in the ε-ball), then
  Square on the mean voxel margin; the worst case per sample by mean Dice.

Every member but pyautoattack's gets the whole batch with the samples already at the floor skipped before
the first step (:meth:`IterativeAttack.run` ``skip``; Square likewise): random numbers are drawn for the
whole batch, so a sample's result is the one it would get from that member alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Bool, Constant, Int, InvalidParameterError, Names, Optional, Options, _did_you_mean
from ..runtime import forward_tensor
from ..tasks import Segmentation, Task, task_family
from ..threats import Threat
from .apgd import APGD
from .base import Attack, AttackDetails, register
from .engine import StepContext
from .square import Square

__all__ = ["AutoEvaluation", "AutoDetails", "COMPONENTS", "VERSIONS", "auto_components"]

#: the members each task can use, in the standard order (``attacks`` of ``version="custom"`` picks among them)
COMPONENTS: dict[str, tuple[str, ...]] = {
    "multiclass": ("apgd-ce", "apgd-t", "fab-t", "square", "apgd-dlr", "fab"),
    "multilabel": ("apgd-ce", "apgd-margin", "apgd-flip", "square", "apgd-js", "apgd-cospgd", "apgd-segpgd"),
    "segmentation": ("apgd-ce", "apgd-balanced-ce", "apgd-js", "apgd-cospgd", "apgd-segpgd", "square",
                     "apgd-margin"),
}

#: per task: the members of ``standard`` and ``fast``, and their defaults (APGD steps, targets, Square queries)
VERSIONS: dict[str, dict[str, dict[str, Any]]] = {
    "multiclass": {
        "standard": {"attacks": ("apgd-ce", "apgd-t", "fab-t", "square"), "steps": 100, "targets": 9,
                     "queries": 5000},
        "fast": {"attacks": ("apgd-ce", "apgd-t", "square"), "steps": 20, "targets": 3, "queries": 500},
    },
    "multilabel": {
        "standard": {"attacks": ("apgd-ce", "apgd-margin", "apgd-flip", "square"), "steps": 100, "targets": 3,
                     "queries": 1000},
        "fast": {"attacks": ("apgd-ce", "apgd-margin", "apgd-flip", "square"), "steps": 20, "targets": 1,
                 "queries": 500},
    },
    "segmentation": {
        "standard": {"attacks": ("apgd-ce", "apgd-balanced-ce", "apgd-js", "apgd-cospgd", "apgd-segpgd", "square"),
                     "steps": 100, "targets": 1, "queries": 500},
        "fast": {"attacks": ("apgd-ce", "apgd-balanced-ce", "apgd-js", "apgd-segpgd", "square"), "steps": 20,
                 "targets": 1, "queries": 100},
    },
}

#: every member name of any task (which ones a task accepts is checked with the task)
MEMBER_NAMES = tuple(dict.fromkeys(n for names in COMPONENTS.values() for n in names))

#: SEA's progressive radius: (radius in units of ε, fraction of the steps), then ε for the rest
RADIUS_SCHEDULE = ((2.0, 0.3), (1.5, 0.3))


def _task_key(task: Task) -> str:
    key = task_family(task)
    if key is None:
        raise TypeError(f"`auto` supports MultiClass, MultiLabel and Segmentation tasks, got {task!r}")
    return key


def auto_components(task: Task, version: str = "standard") -> tuple[str, ...]:
    """The members ``auto`` runs for ``task`` with ``version`` (``"standard"`` or ``"fast"``), in order."""
    return tuple(VERSIONS[_task_key(task)][version]["attacks"])


class _ComponentAPGD(APGD):
    """APGD as a member of ``auto``: stops a sample and keeps its iterate by the task's robust metric.

    With ``radius`` (SEA's progressive radius reduction), the run is split into phases: APGD in the ball of
    radius 2ε, then 1.5ε, each phase starting from the previous one's result projected onto its ball, with
    a fresh step-size schedule; the last phase is an ordinary APGD run in the ε-ball, so the result is
    always feasible. Only the last phase stops samples at the floor.
    """

    radius: tuple[tuple[float, float], ...] = ()

    def run(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, *, skip: Tensor | None = None,
            **call_args: Any):
        phases = [(factor, round(share * self.steps)) for factor, share in self.radius]
        last = self.steps - sum(steps for _, steps in phases)
        if not self.radius or last < 1 or any(steps < 1 for _, steps in phases):
            return super().run(model, x, y, logits, skip=skip, **call_args)
        assert self.threat is not None
        start: Tensor | None = None
        out = None
        for i, (factor, steps) in enumerate([*phases, (1.0, last)]):
            threat = self.threat.with_eps(self.threat.eps * factor)
            sub = _ComponentAPGD(self.task, threat, steps=steps, restarts=self.restarts if i == 0 else 1,
                                 loss=self.loss, rho=self.rho, momentum=self.momentum,
                                 random_start=self.random_start and i == 0, seed=self.seed,
                                 active_set=self.active_set and factor == 1.0,
                                 check_every=max(1, min(self.check_every, steps)))
            if start is not None:
                call_args["start"] = threat.finalize(x, start)  # the previous result, in this phase's ball
            out = sub.run(model, x, y, logits, skip=skip, **call_args)
            start = out.x_adv
        assert out is not None
        return out

    def starts_at_input(self) -> bool:
        return False  # a later phase starts from the previous phase's result

    def init_variable(self, ctx: StepContext, generator: torch.Generator | None) -> Tensor:
        start = ctx.shared.get("start")
        if start is not None:  # a later phase of the progressive radius: continue from the previous result
            return start[ctx.index].clone()
        return super().init_variable(ctx, generator)

    def stop(self, logits: Tensor, ctx: StepContext) -> Tensor | None:
        if not self.active_set:
            return None
        return self.task.robust_metric(logits.detach(), ctx.y) <= self.task.metric_floor

    def assess(self, model: nn.Module, v: Tensor, logits: Tensor, objective: Tensor,
               ctx: StepContext) -> tuple[Tensor, Tensor]:
        if isinstance(self.task, Segmentation):  # the worst case by Dice, not by the surrogate loss
            metric = self.task.robust_metric(logits.detach(), ctx.y)
            return metric <= self.task.metric_floor, -metric.to(torch.float64)
        return super().assess(model, v, logits, objective, ctx)


class _ComponentSquare(Square):
    """Square as a member of ``auto``: a sample is done at the floor of the task's robust metric
    (segmentation: Dice 0, not the task's ``fooled`` threshold)."""

    def finished(self, logits: Tensor, y: Tensor) -> Tensor:
        return self.task.robust_metric(logits, y) <= self.task.metric_floor


#: a member: (model, x, y, clean logits, skip mask) -> adversarial batch (rows of skipped samples ignored)
Runner = Callable[[nn.Module, Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass
class AutoDetails(AttackDetails):
    """What ``auto`` records per sample, and about the run.

    Attributes:
        metric_after: ``(N, K)`` the sample's worst-case robust metric after each of the K members (the
            clean value before the first); its last column is the result.
        attacked: ``(N, K)`` bool, whether each member attacked the sample (it was not at the floor yet).
        seconds: ``(N, K)`` each member's wall time split evenly over the samples it attacked, so summing a
            column over the rows of a table gives the member's total time.
        source: ``(N,)`` index of the member whose adversarial example is kept (-1: none beat the clean
            input).
        components: the member names, in order.
        metric: the name of the robust metric (``accuracy``, ``exact_match``, ``mean_dice``).
        masking: ids of the gradient-masking checks that fired on this batch (:mod:`medadv.masking`).
        masking_messages: their explanations.
    """

    columns: ClassVar[tuple[str, ...]] = ("metric_after", "attacked", "seconds", "components", "metric",
                                          "masking", "masking_messages")
    metric_after: Tensor
    attacked: Tensor
    seconds: Tensor
    source: Tensor
    components: list[str] = field(default_factory=list)
    metric: str = ""
    masking: list[str] = field(default_factory=list)
    masking_messages: list[str] = field(default_factory=list)


@register("auto")
class AutoEvaluation(Attack):
    """Worst-case robustness of a multi-class, multi-label or segmentation model: an ensemble of attacks.

    Runs a fixed sequence of members (see :data:`VERSIONS` and the module docstring), each only on the
    samples whose robust metric is not yet at its floor, and keeps per sample the worst case by the task's
    metric (:meth:`~medadv.tasks.Task.robust_metric`). ``details`` (:class:`AutoDetails`) record the metric
    after each member, which samples each attacked and its time; with ``checks``, the gradient-masking
    checks of :mod:`medadv.masking` run on the batch and their flags are recorded (never raised).

    Versions: ``"standard"`` (the strong default: 100 APGD iterations per member; 5000 Square queries for
    multi-class as in AutoAttack, 1000 for multi-label, 500 for segmentation; 9 target classes / 3 flipped
    labels), ``"fast"`` (20 iterations,
    fewer targets and queries: for regression tests in CI) and ``"custom"`` (``attacks`` names the members,
    from :data:`COMPONENTS`, run in the given order with the standard settings unless overridden).

    Args:
        task: the model's task.
        threat: ``Linf`` or ``L2`` ball with the data box, ε in data units (multi-class: scalar bounds, as
            pyautoattack works in the unit box).
        version: ``"standard"``, ``"fast"`` or ``"custom"``.
        attacks: the members of ``version="custom"`` (required there, refused otherwise).
        steps: APGD iterations per member (default: the version's).
        restarts: random restarts of each APGD member (multi-label and segmentation).
        targets: multi-class: target classes of APGD-T and FAB-T (capped at K − 1); multi-label: the
            least-confident labels APGD-flip tries to flip, one run each (default: the version's).
        queries: Square's query budget per sample (default: the version's).
        progressive_radius: SEA's progressive radius reduction for the APGD members: 30 % of the steps in a
            ball of 2ε, 30 % at 1.5ε (each phase starting from the previous result, with a fresh step-size
            schedule), then ε. Off by default: on the UNets of ``benchmarks/auto.md`` it left the ensemble's
            Dice equal (3-D) or higher (2-D). Not available for multi-class (pyautoattack's members).
        checks: run the gradient-masking checks on each batch (a few forwards, one backward and a short
            unbounded APGD run) and record their flags.
        seed: seed of every member (member k uses ``seed + k``); ``None`` uses torch's global RNG.
        targeted: must be False (``auto`` is an untargeted worst-case evaluation).
    """

    params: ClassVar[dict[str, Any]] = {
        "version": Options("standard", "fast", "custom"),
        "attacks": Optional(Names(*MEMBER_NAMES)),
        "steps": Optional(Int(low=1)),
        "restarts": Int(low=1),
        "targets": Optional(Int(low=1)),
        "queries": Optional(Int(low=1)),
        "progressive_radius": Bool(),
        "checks": Bool(),
        "targeted": Constant(False, "auto is an untargeted worst-case evaluation"),
    }
    tasks = ("MultiClass", "MultiLabel", "Segmentation")
    version: str
    attacks: list[str] | None
    steps: int | None
    restarts: int
    targets: int | None
    queries: int | None
    progressive_radius: bool
    checks: bool

    def __init__(
        self,
        task: Task,
        threat: Threat,
        *,
        version: str = "standard",
        attacks: list[str] | None = None,
        steps: int | None = None,
        restarts: int = 1,
        targets: int | None = None,
        queries: int | None = None,
        progressive_radius: bool = False,
        checks: bool = True,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        key = _task_key(task)
        if (self.attacks is None) == (self.version == "custom"):
            raise InvalidParameterError("`attacks` of auto is required with version='custom' and not allowed with "
                                        f"version={self.version!r}")
        if self.attacks is not None:
            for name in self.attacks:
                if name not in COMPONENTS[key]:
                    raise InvalidParameterError(
                        f"`attacks` of auto: unknown member {name!r} for {type(task).__name__}"
                        f"{_did_you_mean(name, COMPONENTS[key])}; available: {', '.join(COMPONENTS[key])}")
        if key == "multiclass":
            if self.progressive_radius:
                raise InvalidParameterError("`progressive_radius` of auto applies to the APGD members of multi-label "
                                            "and segmentation tasks; multi-class runs pyautoattack's members")
            if threat.bounds is None or any(isinstance(b, Tensor) for b in threat.bounds):
                raise InvalidParameterError("auto on a multi-class model runs pyautoattack, which needs finite scalar "
                                            f"`bounds` (lo, hi) on the threat; got {threat.describe_bounds()}")
        defaults = VERSIONS[key]["standard" if self.version == "custom" else self.version]
        self._key = key
        self._members = tuple(self.attacks if self.attacks is not None else defaults["attacks"])
        self._steps = self.steps if self.steps is not None else int(defaults["steps"])
        self._targets = self.targets if self.targets is not None else int(defaults["targets"])
        self._queries = self.queries if self.queries is not None else int(defaults["queries"])
        # off by default: on the benchmarks' 2-D and 3-D UNets it left the ensemble's Dice higher or equal
        # (benchmarks/auto.md); kept as an option
        self._radius = self.progressive_radius
        self._runners = [self._runner(i, name) for i, name in enumerate(self._members)]

    # --- members ---------------------------------------------------------------------------------------------
    @property
    def components(self) -> tuple[str, ...]:
        """The members this instance runs, in order."""
        return self._members

    def _seed(self, i: int) -> int | None:
        return None if self.seed is None else self.seed + i

    def _apgd(self, i: int, loss: str) -> _ComponentAPGD:
        assert self.threat is not None
        atk = _ComponentAPGD(self.task, self.threat, steps=self._steps, restarts=self.restarts, loss=loss,
                             seed=self._seed(i), active_set=True, check_every=max(1, self._steps // 10))
        atk.radius = RADIUS_SCHEDULE if self._radius else ()
        return atk

    def _runner(self, i: int, name: str) -> Runner:
        if self._key == "multiclass":
            return self._pyautoattack_runner(i, name)
        if name == "square":
            return self._square_runner(i)
        if name == "apgd-flip":
            return self._flip_runner(self._apgd(i, "margin"))
        atk = self._apgd(i, name.removeprefix("apgd-"))

        def run(model: nn.Module, x: Tensor, y: Tensor, logits: Tensor, skip: Tensor) -> Tensor:
            return atk.run(model, x, y, logits, skip=skip).x_adv

        return run

    def _flip_runner(self, atk: _ComponentAPGD) -> Runner:
        """APGD on the margin of one label at a time: each sample's least-confident labels, in order."""
        task = self.task
        targets = self._targets

        def run(model: nn.Module, x: Tensor, y: Tensor, logits: Tensor, skip: Tensor) -> Tensor:
            order = task.element_margin(logits, y).argsort(dim=1)  # smallest margin: closest to flipping
            best = x.clone()
            done = skip.clone()
            for j in range(min(targets, y.shape[1])):
                if bool(done.all()):
                    break
                weight = torch.zeros_like(y, dtype=x.dtype).scatter_(1, order[:, j:j + 1], 1.0)
                x_adv = atk.run(model, x, y, logits, skip=done, weight=weight).x_adv
                with torch.no_grad():
                    broken = task.robust_metric(forward_tensor(model, x_adv), y) <= task.metric_floor
                # the first run's result for every attacked sample (its best margin if no label flips), then
                # the result of the run that flipped a label
                take = ~done if j == 0 else broken & ~done
                best = torch.where(take.reshape((-1,) + (1,) * (x.ndim - 1)), x_adv, best)
                done = done | broken
            return best

        return run

    def _square_runner(self, i: int) -> Runner:
        assert self.threat is not None
        loss = "min-margin" if self._key == "multilabel" else "margin"
        atk = _ComponentSquare(self.task, self.threat, queries=self._queries, loss=loss, seed=self._seed(i))

        def run(model: nn.Module, x: Tensor, y: Tensor, logits: Tensor, skip: Tensor) -> Tensor:
            return atk.perturb(model, x, y, logits, skip=skip)[0]

        return run

    def _pyautoattack_runner(self, i: int, name: str) -> Runner:
        from .autoattack import run_pyautoattack, square_refusal

        threat = self.threat
        assert threat is not None
        norm = "Linf" if threat.p == float("inf") else "L2"
        # pyautoattack's Square takes 2-D images only (and L2 ones of >= 5 rows): medadv's Square otherwise
        fallback = self._square_runner(i) if name == "square" else None

        def run(model: nn.Module, x: Tensor, y: Tensor, logits: Tensor, skip: Tensor) -> Tensor:
            if fallback is not None and square_refusal(tuple(x.shape), norm) is not None:
                return fallback(model, x, y, logits, skip)
            keep = ~skip
            out = x.clone()
            if bool(keep.any()):
                out[keep] = run_pyautoattack(model, x[keep], y[keep], logits[keep], threat, version="standard",
                                             attacks=[name], seed=self._seed(i), steps=self._steps,
                                             targets=self._targets, queries=self._queries)
            return out

        return run

    # --- the ensemble ----------------------------------------------------------------------------------------
    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any):
        assert logits is not None and self.threat is not None
        task, floor = self.task, self.task.metric_floor
        n, k = x.shape[0], len(self._members)
        best_x = x.clone()
        best_metric = task.robust_metric(logits, y)
        best_margin = task.margin(logits, y)
        metric_after = torch.empty(n, k, device=x.device)
        attacked = torch.zeros(n, k, dtype=torch.bool, device=x.device)
        seconds = torch.zeros(n, k, device=x.device)
        source = torch.full((n,), -1, dtype=torch.long, device=x.device)
        flags: list[Any] = []
        white = None
        for j, (name, run) in enumerate(zip(self._members, self._runners, strict=True)):
            skip = best_metric <= floor
            todo = int((~skip).sum())
            if name == "square" and white is None:
                white = best_metric.clone()
            if todo:
                start = _now(x)
                x_adv = self.threat.finalize(x, run(model, x, y, logits, skip))
                with torch.no_grad():
                    adv_logits = forward_tensor(model, x_adv)
                metric, margin = task.robust_metric(adv_logits, y), task.margin(adv_logits, y)
                # a member output holding NaN/Inf is never a worst case (NaN logits score Dice 0 / wrong)
                finite = torch.isfinite(x_adv.reshape(n, -1)).all(dim=1)
                worse = ~skip & finite & ((metric < best_metric) | ((metric == best_metric) & (margin < best_margin)))
                rows = worse.reshape((-1,) + (1,) * (x.ndim - 1))
                best_x = torch.where(rows, x_adv, best_x)
                best_metric = torch.where(worse, metric, best_metric)
                best_margin = torch.where(worse, margin, best_margin)
                source = torch.where(worse, torch.full_like(source, j), source)
                elapsed = _now(x) - start
                attacked[:, j] = ~skip
                seconds[:, j] = torch.where(~skip, elapsed / todo, 0.0)
            metric_after[:, j] = best_metric
        if self.checks:
            flags = self._masking(model, x, y, logits, white, best_metric)
        details = AutoDetails(metric_after=metric_after, attacked=attacked, seconds=seconds, source=source,
                              components=list(self._members), metric=task.robust_metric_name,
                              masking=[f.check for f in flags], masking_messages=[f.message for f in flags])
        return best_x, details, None

    def _masking(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor, white: Tensor | None,
                 final: Tensor) -> list[Any]:
        from ..masking import check_black_box, run_checks

        # the unbounded run gets as many steps as each member (at most 50: a sound model falls in a few)
        flags = list(run_checks(model, self.task, x, y, self.box, logits=logits, seed=self.seed or 0,
                                steps=min(50, self._steps)))
        if white is not None:
            flag = check_black_box(white, final)
            if flag is not None:
                flags.append(flag)
        return flags


def _now(x: Tensor) -> float:
    if x.device.type == "cuda":  # time the device work, not the launch
        torch.cuda.synchronize(x.device)
    return time.perf_counter()
