"""``auto``: an AutoAttack-style worst-case ensemble for multi-class, multi-label and 2-D/3-D segmentation.

A single PGD run overestimates robustness. ``auto`` runs a fixed, documented sequence of diverse attacks,
each only on the samples not yet at the floor of the task's metric, and keeps per sample the worst case by
that metric (:meth:`~medadv.tasks.Task.robust_metric`: accuracy, exact match of every label, mean Dice).

* Multi-class: AutoAttack's members through pyautoattack (Croce & Hein, ICML 2020): APGD-CE, APGD-T,
  FAB-T, Square, one at a time so each one's contribution and time are recorded. On inputs pyautoattack's
  Square cannot take (3-D volumes; L2 on images of fewer than 5 rows) the Square member is medadv's own
  :class:`~medadv.attacks.square.Square` on the logit margin, as for the other tasks. Any class count K >= 2:
  APGD-T and FAB-T try at most K − 1 target classes, and below 4 classes APGD-T's targeted DLR (it reads the 3rd
  and 4th largest logit) becomes the loss defined there (K = 3: DLR normalised by ``z_π1 − (z_π2 + z_π3)/2``;
  K = 2: targeted CE; :data:`medadv.attacks.autoattack.SMALL_CLASS_LOSSES`).
* A binary classifier with one sigmoid logit is multi-label with one label: the members below on its BCE and its
  signed margin ``(2y − 1)(z − logit(threshold))``.
* Multi-label: APGD on the per-label BCE, APGD on the per-label margin, APGD focused on flipping each
  sample's least-confident labels (one run per label, the multi-label analogue of APGD-T), and the
  score-based Square attack on the smallest label margin (a black-box member that exposes masked gradients).
* Regression (:class:`~medadv.tasks.Regression`): APGD on the task's loss (MSE / L1 / Huber), APGD on the
  signed error (one run driving the outputs up, one down, the larger deviation kept), optionally APGD on the
  tolerance margin, and Square on the smallest margin (the largest error); the worst case per sample by the
  closeness ``1 / (1 + largest error in tolerance units)``, which is graded beyond the tolerance, so the members
  keep enlarging the deviation.
* Segmentation (2-D and 3-D): APGD with several per-voxel losses (the task's loss, class-balanced CE,
  Jensen–Shannon to the one-hot label, the CosPGD and SegPGD weightings), optionally with SEA's progressive
  radius (Croce, Singh, Hein, ECCV 2024: phases at 2ε and 1.5ε, then ε; the result always in the ε-ball), then
  Square on the mean voxel margin; the worst case per sample by mean Dice. The clinical endpoint has two members
  for ``version="custom"`` (``attacks=["apgd-volume-shrink", ...]``), not in ``standard``/``fast``:
  ``apgd-volume-shrink`` / ``apgd-volume-grow``, APGD with ``loss="volume"`` on class 1's soft volume
  (:class:`~medadv.attacks.losses.VolumeObjective`); as every member, ``auto`` keeps their examples by its metric
  (a volume member counts where its shrinking lowers the Dice most). To keep examples by the volume itself, run
  ``apgd`` with ``loss="volume"`` on its own.

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

from ..params import Bool, Constant, Int, InvalidParameterError, Names, Optional, Options, Real, _did_you_mean
from ..runtime import forward_tensor
from ..tasks import Task, registered_task_classes
from ..threats import Threat
from .apgd import APGD
from .base import Attack, AttackDetails, register
from .engine import StepContext
from .square import Square

__all__ = ["AutoEvaluation", "AutoDetails", "COMPONENTS", "VERSIONS", "auto_components"]

def _kinds() -> dict[str, type[Task]]:
    return {cls.name: cls for cls in registered_task_classes() if cls.auto_members}


#: per registered task kind, the members ``auto`` can use, in the standard order (``attacks`` of
#: ``version="custom"`` picks among them); declared by each kind (``Task.auto_members``)
COMPONENTS: dict[str, tuple[str, ...]] = {k: tuple(c.auto_members) for k, c in _kinds().items()}

#: per registered task kind: the members of ``standard`` and ``fast``, and their defaults (APGD steps, targets,
#: Square queries); declared by each kind (``Task.auto_versions``)
VERSIONS: dict[str, dict[str, dict[str, Any]]] = {
    k: {v: dict(spec) for v, spec in c.auto_versions.items()} for k, c in _kinds().items()}

#: every member name of any task (which ones a task accepts is checked with the task)
MEMBER_NAMES = tuple(dict.fromkeys(n for names in COMPONENTS.values() for n in names))

#: the metrics ``auto`` can keep the worst case by (``metric``): those some registered kind declares
#: (``Task.selection_metrics``), and ``worst-of``
SELECTION_METRICS = (*dict.fromkeys(m for c in _kinds().values() for m in c.selection_metrics), "worst-of")

#: SEA's progressive radius: (radius in units of ε, fraction of the steps), then ε for the rest
RADIUS_SCHEDULE = ((2.0, 0.3), (1.5, 0.3))


def _task_spec(task: Task) -> type[Task]:
    cls = type(task)
    if not cls.auto_members or not cls.auto_versions:
        kinds = ", ".join(_kinds())
        raise TypeError(f"`auto` has no members for {task!r} (its task kind declares no `auto_members` / "
                        f"`auto_versions`); kinds with members: {kinds}")
    return cls


def auto_components(task: Task, version: str = "standard") -> tuple[str, ...]:
    """The members ``auto`` runs for ``task`` with ``version`` (``"standard"`` or ``"fast"``), in order."""
    return tuple(_task_spec(task).auto_versions[version]["attacks"])


class _ComponentAPGD(APGD):
    """APGD as a member of ``auto``: stops a sample and keeps its iterate by the task's robust metric.

    With ``radius`` (SEA's progressive radius reduction), the run is split into phases: APGD in the ball of
    radius 2ε, then 1.5ε, each phase starting from the previous one's result projected onto its ball, with
    a fresh step-size schedule; the last phase is an ordinary APGD run in the ε-ball, so the result is
    always feasible. Only the last phase stops samples at the floor.
    """

    radius: tuple[tuple[float, float], ...] = ()
    #: the per-sample metric the worst iterate is kept by (``auto``'s ``metric``); None: the task's robust metric
    score: Callable[[Tensor, Tensor], Tensor] | None = None
    #: a sample stops once its metric is at or below this (``auto``'s ``stop_below``); None: the task's floor
    floor: float | None = None

    def _metric(self, logits: Tensor, y: Tensor) -> Tensor:
        return (self.score or self.task.robust_metric)(logits, y)

    def _floor(self) -> float:
        return self.task.metric_floor if self.floor is None else self.floor

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
                                 check_every=max(1, min(self.check_every, steps)),
                                 volume_class=self.volume_class, volume_goal=self.volume_goal,
                                 volume_target=self.volume_target, volume_fraction=self.volume_fraction,
                                 voxel_volume_ml=self.voxel_volume_ml)
            sub.score, sub.floor = self.score, self.floor
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
        return self._metric(logits.detach(), ctx.y) <= self._floor()

    def assess(self, model: nn.Module, v: Tensor, logits: Tensor, objective: Tensor,
               ctx: StepContext) -> tuple[Tensor, Tensor]:
        if not self.task.robust_metric_binary:  # a graded metric (Dice): the worst case by it, not by the loss
            metric = self._metric(logits.detach(), ctx.y)
            return metric <= self._floor(), -metric.to(torch.float64)
        return super().assess(model, v, logits, objective, ctx)


class _ComponentSquare(Square):
    """Square as a member of ``auto``: a sample is done at the floor of the task's robust metric
    (segmentation: Dice 0, not the task's ``fooled`` threshold)."""

    score: Callable[[Tensor, Tensor], Tensor] | None = None
    floor: float | None = None

    def finished(self, logits: Tensor, y: Tensor) -> Tensor:
        metric = (self.score or self.task.robust_metric)(logits, y)
        return metric <= (self.task.metric_floor if self.floor is None else self.floor)


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
        masking: ids of the gradient-masking checks that fired on this batch (:mod:`medadv.attacks.masking`).
        masking_messages: their explanations.
        worst_of: ``(N, M)`` for kinds with several selection metrics (segmentation): each metric's own worst case
            over the clean output and every member's output — possibly from different members — in the order of
            ``worst_of_columns`` (``mean_dice``, ``pixel_accuracy``, ``miou``); ``None`` for other kinds.
        worst_of_columns: the result columns of ``worst_of``.
    """

    columns: ClassVar[tuple[str, ...]] = ("metric_after", "attacked", "seconds", "components", "metric",
                                          "masking", "masking_messages", "worst_of", "worst_of_columns")
    sample_fields: ClassVar[tuple[str, ...]] = ("source",)
    metric_after: Tensor
    attacked: Tensor
    seconds: Tensor
    source: Tensor
    components: list[str] = field(default_factory=list)
    metric: str = ""
    masking: list[str] = field(default_factory=list)
    masking_messages: list[str] = field(default_factory=list)
    worst_of: Tensor | None = None
    worst_of_columns: list[str] = field(default_factory=list)


@register("auto")
class AutoEvaluation(Attack):
    """Worst-case robustness of a multi-class, multi-label or segmentation model: an ensemble of attacks.

    Runs a fixed sequence of members (see :data:`VERSIONS` and the module docstring), each only on the
    samples whose robust metric is not yet at its floor, and keeps per sample the worst case by the task's
    metric (:meth:`~medadv.tasks.Task.robust_metric`). ``details`` (:class:`AutoDetails`) record the metric
    after each member, which samples each attacked and its time; with ``checks``, the gradient-masking
    checks of :mod:`medadv.attacks.masking` run on the batch and their flags are recorded (never raised).

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
        targets: multi-class: target classes of APGD-T and FAB-T (capped at K − 1: one on a binary model, whose
            APGD-T ascends the targeted CE, two on 3 classes); multi-label: the
            least-confident labels APGD-flip tries to flip, one run each (default: the version's).
        queries: Square's query budget per sample (default: the version's).
        progressive_radius: SEA's progressive radius reduction for the APGD members: 30 % of the steps in a
            ball of 2ε, 30 % at 1.5ε (each phase starting from the previous result, with a fresh step-size
            schedule), then ε. Default: the version's (off: on the UNets of ``benchmarks/auto.md`` it left the
            ensemble's Dice equal or higher). Not available for multi-class (pyautoattack's members).
        metric: the per-sample metric the worst case is kept by, for kinds that declare several
            (``Task.selection_metrics``; segmentation: ``"dice"`` (mean Dice, the default), ``"accuracy"``
            (pixel accuracy, SEA's choice), ``"miou"``), or ``"worst-of"``: kept by the default metric, with each
            metric's own worst case over the members recorded (``details.worst_of``). Every member keeps its
            iterate, and the ensemble its example, by this metric; ``details.worst_of`` is recorded whatever the
            choice, and result rows carry Dice, pixel accuracy and mIoU of the example kept.
        stop_below: early stop (off by default): a sample leaves the ensemble once its metric is at or below this
            value (metric units, e.g. 0.1 Dice), instead of only at the floor. Saves work; the result is then an
            upper bound that stops improving below the threshold.
        stop_on_no_gain: early stop (off by default): a sample leaves once a member fails to lower its metric.
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
        "progressive_radius": Optional(Bool()),
        "metric": Optional(Options(*SELECTION_METRICS)),
        "stop_below": Optional(Real(low=0.0)),
        "stop_on_no_gain": Bool(),
        "checks": Bool(),
        "targeted": Constant(False, "auto is an untargeted worst-case evaluation"),
    }
    tasks = tuple(c.__name__ for c in _kinds().values())  # every registered kind that declares members
    version: str
    attacks: list[str] | None
    steps: int | None
    restarts: int
    targets: int | None
    queries: int | None
    progressive_radius: bool | None
    metric: str | None
    stop_below: float | None
    stop_on_no_gain: bool
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
        progressive_radius: bool | None = None,
        metric: str | None = None,
        stop_below: float | None = None,
        stop_on_no_gain: bool = False,
        checks: bool = True,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        spec = _task_spec(task)
        members = tuple(spec.auto_members)
        if (self.attacks is None) == (self.version == "custom"):
            raise InvalidParameterError("`attacks` of auto is required with version='custom' and not allowed with "
                                        f"version={self.version!r}")
        if self.attacks is not None:
            for name in self.attacks:
                if name not in members:
                    raise InvalidParameterError(
                        f"`attacks` of auto: unknown member {name!r} for {type(task).__name__}"
                        f"{_did_you_mean(name, members)}; available: {', '.join(members)}")
        if spec.auto_runner == "pyautoattack":
            if self.progressive_radius:
                raise InvalidParameterError("`progressive_radius` of auto applies to the APGD members of multi-label "
                                            "and segmentation tasks; multi-class runs pyautoattack's members")
            if threat.bounds is None or any(isinstance(b, Tensor) for b in threat.bounds):
                raise InvalidParameterError("auto on a multi-class model runs pyautoattack, which needs finite scalar "
                                            f"`bounds` (lo, hi) on the threat; got {threat.describe_bounds()}")
        defaults = spec.auto_versions["standard" if self.version == "custom" else self.version]
        self._runner_kind = spec.auto_runner
        self._square_loss = str(defaults.get("square_loss", "margin"))
        self._members = tuple(self.attacks if self.attacks is not None else defaults["attacks"])
        self._steps = self.steps if self.steps is not None else int(defaults["steps"])
        self._targets = self.targets if self.targets is not None else int(defaults["targets"])
        self._queries = self.queries if self.queries is not None else int(defaults["queries"])
        # the version's choice unless given (segmentation's standard: on, see benchmarks/auto.md)
        self._radius = bool(defaults.get("progressive_radius", False)) if self.progressive_radius is None \
            else self.progressive_radius
        if self.metric is None and spec.selection_metrics:  # the version's choice (segmentation: worst-of)
            self._metric_choice: str | None = defaults.get("metric")
        else:
            self._metric_choice = self.metric
        self._score, self._selection = self._selection_metric(spec)
        self._floor = task.metric_floor if self.stop_below is None else max(self.stop_below, task.metric_floor)
        self._runners = [self._runner(i, name) for i, name in enumerate(self._members)]

    def _selection_metric(self, spec: type[Task]) -> tuple[Callable[[Tensor, Tensor], Tensor], tuple[str, ...]]:
        """The per-sample metric the worst case is kept by, and the result columns whose per-metric worst case
        over the members ``details`` record (``worst_<column>``)."""
        declared = dict(spec.selection_metrics)
        if self.metric is not None and not declared:
            raise InvalidParameterError(f"`metric` of auto chooses among the metrics of a kind that declares several "
                                        f"(segmentation: {', '.join(SELECTION_METRICS)}); {type(self.task).__name__} "
                                        f"has one, its robust metric ({self.task.robust_metric_name}): leave it unset")
        if self.metric is not None and self.metric != "worst-of" and self.metric not in declared:
            raise InvalidParameterError(f"`metric` of auto must be one of {', '.join([*declared, 'worst-of'])} for "
                                        f"{type(self.task).__name__}; got {self.metric!r}")
        columns = tuple(declared.values())
        task, choice = self.task, self._metric_choice
        if choice is None:
            return task.robust_metric, columns
        if choice == "worst-of":  # low on every metric at once: their mean, each metric's worst recorded

            def mean_score(logits: Tensor, y: Tensor) -> Tensor:
                cols = task.outcome(logits, y).columns
                return torch.stack([cols[c].to(torch.float32) for c in columns]).mean(dim=0)

            return mean_score, columns
        column = declared[choice]

        def score(logits: Tensor, y: Tensor) -> Tensor:
            return task.outcome(logits, y).columns[column].to(torch.float32)

        return score, columns

    # --- members ---------------------------------------------------------------------------------------------
    @property
    def components(self) -> tuple[str, ...]:
        """The members this instance runs, in order."""
        return self._members

    def _seed(self, i: int) -> int | None:
        return None if self.seed is None else self.seed + i

    def _apgd(self, i: int, loss: str, **volume: Any) -> _ComponentAPGD:
        assert self.threat is not None
        atk = _ComponentAPGD(self.task, self.threat, steps=self._steps, restarts=self.restarts, loss=loss,
                             seed=self._seed(i), active_set=True, check_every=max(1, self._steps // 10), **volume)
        atk.radius = RADIUS_SCHEDULE if self._radius else ()
        atk.score, atk.floor = self._score, self._floor
        return atk

    def _runner(self, i: int, name: str) -> Runner:
        if self._runner_kind == "pyautoattack":
            return self._pyautoattack_runner(i, name)
        if name == "square":
            return self._square_runner(i)
        if name == "apgd-flip":
            return self._flip_runner(self._apgd(i, "margin"))
        if name == "apgd-signed":
            return self._signed_runner(self._apgd(i, "signed-up"), self._apgd(i, "signed-down"))
        if name.startswith("apgd-volume-"):  # the clinical endpoint: class 1's soft volume shrunk or grown
            atk = self._apgd(i, "volume", volume_goal=name.removeprefix("apgd-volume-"))
        else:
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

    def _signed_runner(self, up: _ComponentAPGD, down: _ComponentAPGD) -> Runner:
        """APGD on the signed error (``task.signed_error``, regression), towards the larger deviation: one run
        driving every output up, one down, then for each of the ``targets`` outputs (elements) with the largest
        clean error per sample, one run up and one down on that output alone (the robust metric reads the largest
        error, which a run on the mean spreads over every output); per sample the worst result by the task's
        robust metric (then its margin)."""
        task = self.task
        targets = self._targets

        def run(model: nn.Module, x: Tensor, y: Tensor, logits: Tensor, skip: Tensor) -> Tensor:
            rows = (-1,) + (1,) * (x.ndim - 1)
            best, best_m, best_g = x, None, None
            order = task.signed_error(logits, y).abs().reshape(y.shape[0], -1).argsort(dim=1, descending=True)  # type: ignore[attr-defined]
            weights: list[Tensor | None] = [None]
            for j in range(min(targets, order.shape[1]) if order.shape[1] > 1 else 0):
                w = torch.zeros(y.shape[0], order.shape[1], dtype=x.dtype, device=x.device)
                weights.append(w.scatter_(1, order[:, j:j + 1], 1.0).reshape(y.shape))
            for weight in weights:
                for atk in (up, down):
                    kw = {} if weight is None else {"weight": weight}
                    x_adv = atk.run(model, x, y, logits, skip=skip, **kw).x_adv
                    with torch.no_grad():
                        out = forward_tensor(model, x_adv)
                    m, g = task.robust_metric(out, y), task.margin(out, y)
                    if best_m is None or best_g is None:
                        best, best_m, best_g = x_adv, m, g
                        continue
                    worse = (m < best_m) | ((m == best_m) & (g < best_g))
                    best = torch.where(worse.reshape(rows), x_adv, best)
                    best_m, best_g = torch.where(worse, m, best_m), torch.where(worse, g, best_g)
            return best

        return run

    def _square_runner(self, i: int) -> Runner:
        assert self.threat is not None
        loss = self._square_loss
        atk = _ComponentSquare(self.task, self.threat, queries=self._queries, loss=loss, seed=self._seed(i))
        atk.score, atk.floor = self._score, self._floor

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
        task, floor, score = self.task, self._floor, self._score
        n, k = x.shape[0], len(self._members)
        best_x = x.clone()
        best_metric = score(logits, y)
        best_margin = task.margin(logits, y)
        # per-metric worst case over the members' outputs (``metric="worst-of"`` reports them; recorded always)
        worst = self._columns(logits, y)
        metric_after = torch.empty(n, k, device=x.device)
        attacked = torch.zeros(n, k, dtype=torch.bool, device=x.device)
        seconds = torch.zeros(n, k, device=x.device)
        source = torch.full((n,), -1, dtype=torch.long, device=x.device)
        stale = torch.zeros(n, dtype=torch.bool, device=x.device)  # stop_on_no_gain: a member did not lower it
        flags: list[Any] = []
        white = None
        for j, (name, run) in enumerate(zip(self._members, self._runners, strict=True)):
            skip = (best_metric <= floor) | stale
            todo = int((~skip).sum())
            if name == "square" and white is None:
                white = best_metric.clone()
            if todo:
                start = _now(x)
                x_adv = self.threat.finalize(x, run(model, x, y, logits, skip))
                with torch.no_grad():
                    adv_logits = forward_tensor(model, x_adv)
                metric, margin = score(adv_logits, y), task.margin(adv_logits, y)
                # a member output holding NaN/Inf is never a worst case (NaN logits score Dice 0 / wrong)
                finite = torch.isfinite(x_adv.reshape(n, -1)).all(dim=1)
                lower = metric < best_metric
                worse = ~skip & finite & (lower | ((metric == best_metric) & (margin < best_margin)))
                rows = worse.reshape((-1,) + (1,) * (x.ndim - 1))
                best_x = torch.where(rows, x_adv, best_x)
                best_metric = torch.where(worse, metric, best_metric)
                best_margin = torch.where(worse, margin, best_margin)
                source = torch.where(worse, torch.full_like(source, j), source)
                if worst is not None:
                    cols = self._columns(adv_logits, y)
                    assert cols is not None
                    use = (~skip & finite).unsqueeze(1)
                    worst = torch.where(use, torch.minimum(worst, cols), worst)
                if self.stop_on_no_gain:
                    stale = stale | (~skip & ~(finite & lower))
                elapsed = _now(x) - start
                attacked[:, j] = ~skip
                seconds[:, j] = torch.where(~skip, elapsed / todo, 0.0)
            metric_after[:, j] = best_metric
        if self.checks:
            flags = self._masking(model, x, y, logits, white, best_metric)
        choice = self._metric_choice
        name = task.robust_metric_name if choice is None else "worst-of" if choice == "worst-of" else dict(
            type(task).selection_metrics)[choice]
        details = AutoDetails(metric_after=metric_after, attacked=attacked, seconds=seconds, source=source,
                              components=list(self._members), metric=name,
                              masking=[f.check for f in flags], masking_messages=[f.message for f in flags],
                              worst_of=worst, worst_of_columns=list(self._selection))
        return best_x, details, None

    def _columns(self, logits: Tensor, y: Tensor) -> Tensor | None:
        """``(N, M)`` the selection metrics' columns of one output (None when the kind declares none)."""
        if not self._selection:
            return None
        cols = self.task.outcome(logits, y).columns
        return torch.stack([cols[c].to(torch.float32) for c in self._selection], dim=1)

    def _masking(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor, white: Tensor | None,
                 final: Tensor) -> list[Any]:
        from .masking import check_black_box, run_checks

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
