"""Every attack class Foolbox exports, on every task kind: it works (proved here) or is refused before any work.

The attack classes are discovered from ``foolbox.attacks`` at test time, so a Foolbox release that adds one
fails ``test_every_exported_attack_is_classified`` until it has a row in ``SUPPORT`` (or ``EXCLUDED``). Each
cell then runs Foolbox's own class as a Foolbox user would (``attack(fmodel, x, criterion, epsilons=...)`` on
a :class:`~medadv.adapters.foolbox.TaskModel`, with the medadv criterion of the task):

* ``ok``: the result stays in the data box (and in the ε-ball for fixed-budget attacks) and lowers the task
  metric against the clean input (accuracy, multi-label label accuracy, mean Dice), or reaches the target;
* ``refused``: ``UnsupportedAttackError`` names the attack and what to use instead, and the model is never
  called by the attack.

3-D segmentation runs on CT-like data in Hounsfield units (bounds (-1024, 3071)).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import foolbox as fb
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from medadv.adapters import foolbox as mfb
from medadv.adapters.foolbox_support import GRADIENT
from medadv.adapters.support import TASK_KINDS, UnsupportedAttackError
from medadv.tasks import MultiClass, MultiLabel, Segmentation


def exported_attacks() -> dict[str, type]:
    """Every concrete attack class ``foolbox.attacks`` exports, by class name (aliases collapse onto it)."""
    out: dict[str, type] = {}
    for name in dir(fb.attacks):
        obj = getattr(fb.attacks, name)
        if inspect.isclass(obj) and issubclass(obj, fb.attacks.base.Attack) and not inspect.isabstract(obj):
            out[obj.__name__] = obj
    return out


ATTACKS = exported_attacks()
CELLS = [(name, kind) for name in sorted(ATTACKS) if name not in mfb.EXCLUDED for kind in TASK_KINDS]


def test_every_exported_attack_is_classified():
    assert len(ATTACKS) == 58  # Foolbox 3.3.4: 69 exported names, 11 of them aliases
    unclassified = set(ATTACKS) - set(mfb.SUPPORT) - set(mfb.EXCLUDED)
    assert not unclassified, f"classify these Foolbox attacks in adapters/foolbox_support.py: {sorted(unclassified)}"
    assert not set(mfb.SUPPORT) & set(mfb.EXCLUDED)
    assert set(mfb.SUPPORT) <= set(ATTACKS) | set(mfb.EXCLUDED)  # no stale rows
    for name, row in mfb.SUPPORT.items():
        assert tuple(row) == TASK_KINDS, name
        for cell in row.values():
            assert cell.status == "ok" or " use " in cell.reason, (name, cell.reason)  # says what to use instead


# --- the four task kinds ------------------------------------------------------------------------------------
@dataclass
class Case:
    kind: str
    task: Any
    model: nn.Module  # what the TaskModel wraps (the HU wrapper for 3-D)
    x: Tensor
    y: Tensor
    lo: float
    hi: float

    @property
    def fmodel(self) -> mfb.TaskModel:
        return mfb.TaskModel(self.model, self.task, bounds=(self.lo, self.hi))

    @property
    def criterion(self) -> Any:
        return self.y if isinstance(self.task, MultiClass) else mfb.criterion(self.task, self.y)

    @property
    def size(self) -> int:
        return self.x[0].numel()

    @property
    def span(self) -> float:
        return self.hi - self.lo

    def metric(self, x: Tensor, model: nn.Module | None = None, seg_metric: str = "mean_dice") -> float:
        """Accuracy, multi-label label accuracy or mean Dice (or pixel accuracy) over the batch."""
        with torch.no_grad():
            logits = (model or self.model)(x)
        if isinstance(self.task, MultiClass):
            return float((logits.argmax(1) == self.y).float().mean())
        if isinstance(self.task, MultiLabel):
            return float(self.task.metrics(logits, self.y)["label_accuracy"].mean())
        return float(self.task.metrics(logits, self.y)[seg_metric].mean())

    def head(self, n: int) -> Case:
        """The first ``n`` samples only."""
        return Case(self.kind, self.task, self.model, self.x[:n], self.y[:n], self.lo, self.hi)

    def fooled(self, x: Tensor, model: nn.Module | None = None) -> Tensor:
        """The task's own success test on ``x`` (what the medadv criterion must report)."""
        with torch.no_grad():
            logits = (model or self.model)(x)
        if isinstance(self.task, MultiClass):
            return logits.argmax(1) != self.y
        return self.task.fooled(logits, self.y)


def _pick(t, n: int, distinct: bool) -> tuple[Tensor, Tensor]:
    """``n`` samples the model gets right (classifiers: with distinct labels, so DatasetAttack can swap them)."""
    with torch.no_grad():
        logits = t.model(t.x)
    if isinstance(t.task, Segmentation):
        good = t.task.metrics(logits, t.y)["mean_dice"] > 0.7
    elif isinstance(t.task, MultiLabel):
        good = t.task.metrics(logits, t.y)["exact_match"] > 0
    else:
        good = logits.argmax(1) == t.y
    idx: list[int] = []
    for i in torch.nonzero(good).flatten().tolist():
        if distinct and any(torch.equal(t.y[i], t.y[j]) for j in idx):
            continue
        idx.append(i)
        if len(idx) == n:
            break
    assert len(idx) == n
    return t.x[idx].clone(), t.y[idx].clone()


_CASES: dict[int, dict[str, Case]] = {}


@pytest.fixture
def cases(trained_multiclass, trained_multilabel, trained_seg2d, trained_seg3d, hu) -> dict[str, Case]:
    key = id(trained_seg3d)  # built once per session (the trained models are session fixtures)
    if key not in _CASES:
        _CASES[key] = make_cases(trained_multiclass, trained_multilabel, trained_seg2d, trained_seg3d, hu)
    return _CASES[key]


def make_cases(mc, ml, s2, s3, hu) -> dict[str, Case]:
    wrap, to_hu, bounds = hu
    out = {}
    for kind, t, n in (("multiclass", mc, 4), ("multilabel", ml, 4), ("seg2d", s2, 2)):
        x, y = _pick(t, n, distinct=kind != "seg2d")
        out[kind] = Case(kind, t.task, t.model, x, y, 0.0, 1.0)
    x, y = _pick(s3, 2, distinct=False)
    out["seg3d"] = Case("seg3d", s3.task, wrap(s3.model), to_hu(x), y, *bounds)
    return out


# --- how each attack is called (tiny budgets that still do the job) ----------------------------------------
@dataclass
class Run:
    attack: Any
    epsilons: float | None = None  # the fixed budget in data units (None: a minimisation attack)
    norm: float | None = None  # the norm of ``epsilons``
    kwargs: dict[str, Any] | None = None  # call arguments beyond epsilons (starting_points, ...)
    criterion: Any = None  # default: the task's medadv criterion
    fmodel: Any = None  # default: the case's TaskModel
    x: Tensor | None = None  # default: the case's inputs (other units for [0, 1]-only attacks)
    model: nn.Module | None = None  # the model the metric is measured on (default: the case's)
    targeted: bool = False
    metric: str = "mean_dice"  # segmentation metric that must drop
    drop: float = 0.1  # by at least this much
    case: Case | None = None  # a smaller case than the default one


INF = float("inf")


def _budgets(c: Case) -> tuple[float, float, float]:
    """(L∞, L2, L1) budgets in data units: an L∞ step of ~0.2 of the range spread over the whole input."""
    linf = 0.2 * c.span
    return linf, 0.5 * linf * c.size ** 0.5, 0.3 * linf * c.size


def _gradient(cls: type, c: Case) -> Run:
    linf, l2, l1 = _budgets(c)
    name = cls.__name__
    norm, eps = ((1.0, l1) if name.startswith("L1") or name == "SparseL1DescentAttack"
                 else (2.0, l2) if name.startswith("L2") else (INF, linf))
    if "FastGradient" in name:
        return Run(cls(), eps, norm)
    if name == "SparseL1DescentAttack":
        return Run(cls(steps=6, rel_stepsize=0.5, quantile=0.9), eps, norm)
    return Run(cls(steps=5, rel_stepsize=0.4), eps, norm)


def _unit(c: Case) -> tuple[Any, Tensor]:
    """The case's model seen in [0, 1] units (for Foolbox attacks that clip to [0, 1])."""
    return c.fmodel.transform_bounds((0, 1)), (c.x - c.lo) / c.span


class Binarised(nn.Module):
    """A model that binarises its input at the middle of the bounds (what BinarizationRefinement exploits)."""

    def __init__(self, model: nn.Module, lo: float, hi: float) -> None:
        super().__init__()
        self.model, self.lo, self.hi = model, lo, hi

    def forward(self, x: Tensor) -> Tensor:
        mid = (self.lo + self.hi) / 2
        return self.model(torch.where(x >= mid, torch.full_like(x, self.hi), torch.full_like(x, self.lo)))


def _binarization(c: Case) -> Run:
    model = Binarised(c.model, c.lo, c.hi).eval()
    fmodel = mfb.TaskModel(model, c.task, bounds=(c.lo, c.hi))
    is_adv = fb.attacks.base.get_is_adversarial(fb.attacks.base.get_criterion(c.criterion), fmodel)
    # starting points that fool the binarised model: the inverted image, else another sample of the batch
    inverted, other = c.lo + c.hi - c.x, c.x.roll(1, 0)
    start = torch.where(is_adv(inverted).reshape(-1, *[1] * (c.x.ndim - 1)), inverted, other)
    assert bool(is_adv(start).all())
    return Run(fb.attacks.BinarizationRefinementAttack(distance=fb.distances.l2), fmodel=fmodel, model=model,
               kwargs={"starting_points": start})


def _dataset(c: Case) -> Run:
    attack = fb.attacks.DatasetAttack(distance=fb.distances.l2)
    attack.feed(c.fmodel, c.x)  # the other samples of the batch are the candidates
    return Run(attack)


def _start(c: Case) -> dict[str, Any]:
    """Starting points for Boundary, HopSkipJump and Pointwise on the multi-class model: its prediction on
    uniform noise or salt-and-pepper (their default starts) is one class, so other-class samples serve."""
    return {"starting_points": c.x.roll(1, 0)} if c.kind == "multiclass" else {}


def _boundary(c: Case) -> Run:
    init = fb.attacks.LinearSearchBlendedUniformNoiseAttack(directions=20, steps=20)
    return Run(fb.attacks.BoundaryAttack(steps=10, init_attack=init), kwargs=_start(c))


def _hop_skip_jump(c: Case) -> Run:
    fmodel, x = _unit(c)
    init = fb.attacks.LinearSearchBlendedUniformNoiseAttack(directions=20, steps=20)
    attack = fb.attacks.HopSkipJumpAttack(steps=2, initial_gradient_eval_steps=10, max_gradient_eval_steps=20,
                                          init_attack=init)
    kwargs = {k: (v - c.lo) / c.span for k, v in _start(c).items()}
    return Run(attack, fmodel=fmodel, x=x, kwargs=kwargs)


def _gen_attack(c: Case) -> Run:
    fmodel, x = _unit(c)
    target = (c.y + 1) % 4
    return Run(fb.attacks.GenAttack(steps=30, population=8), 0.4, INF, fmodel=fmodel, x=x,
               criterion=fb.criteria.TargetedMisclassification(target), targeted=True)


def _noise(cls: type, c: Case) -> Run:
    """Noise as large as the data range: what it takes a random direction to fool these models. Such a budget is
    refused as a unit mistake unless the TaskModel allows it (``allow_large_budgets=True``), as here."""
    kw = {"repeats": 3} if "Repeated" in cls.__name__ else {}
    fmodel = mfb.TaskModel(c.model, c.task, bounds=(c.lo, c.hi), allow_large_budgets=True)
    if cls.__name__.startswith("Linf"):
        return Run(cls(**kw), c.span, INF, fmodel=fmodel)
    return Run(cls(**kw), c.span * c.size ** 0.5, 2.0, fmodel=fmodel)


def _pointwise(c: Case) -> Run:
    """Pointwise tries the perturbed pixels one model call at a time; on segmentation, one image and a
    pixel-accuracy criterion 1 point below its clean accuracy keep the salt-and-pepper start (and the run) small."""
    if not isinstance(c.task, Segmentation):
        init = fb.attacks.SaltAndPepperNoiseAttack(steps=30)
        return Run(fb.attacks.PointwiseAttack(init_attack=init, l2_binary_search=False), kwargs=_start(c))
    c = c.head(1)
    init = fb.attacks.SaltAndPepperNoiseAttack(steps=60)
    with torch.no_grad():
        acc = float(c.task.metrics(c.model(c.x), c.y)["pixel_accuracy"].min())
    crit = mfb.SegmentationMisclassification(c.y, c.task, metric="pixel_accuracy", threshold=acc - 0.01)
    return Run(fb.attacks.PointwiseAttack(init_attack=init, l2_binary_search=False), criterion=crit,
               metric="pixel_accuracy", drop=0.009, case=c)


RECIPES: dict[str, Callable[[type, Case], Run]] = {
    **{name: _gradient for name in GRADIENT},
    **{name: _noise for name in ATTACKS if "AdditiveGaussian" in name or "AdditiveUniform" in name},
    "L2ContrastReductionAttack": lambda cls, c: Run(cls(), 0.45 * c.span * c.size ** 0.5, 2.0),
    "BinarySearchContrastReductionAttack": lambda cls, c: Run(cls(binary_search_steps=6, distance=fb.distances.l2)),
    "LinearSearchContrastReductionAttack": lambda cls, c: Run(cls(steps=20, distance=fb.distances.l2)),
    "LinearSearchBlendedUniformNoiseAttack": lambda cls, c: Run(cls(directions=5, steps=20,
                                                                    distance=fb.distances.l2)),
    "SaltAndPepperNoiseAttack": lambda cls, c: Run(cls(steps=30)),
    "InversionAttack": lambda cls, c: Run(cls(distance=fb.distances.l2)),
    "DatasetAttack": lambda cls, c: _dataset(c),
    "BinarizationRefinementAttack": lambda cls, c: _binarization(c),
    "BoundaryAttack": lambda cls, c: _boundary(c),
    "HopSkipJumpAttack": lambda cls, c: _hop_skip_jump(c),
    "PointwiseAttack": lambda cls, c: _pointwise(c),
    "GaussianBlurAttack": lambda cls, c: Run(cls(steps=10, distance=fb.distances.l2)),
    "SpatialAttack": lambda cls, c: Run(cls(max_translation=6, num_translations=3, num_rotations=3)),
    "L2DeepFoolAttack": lambda cls, c: Run(cls(steps=10)),
    "LinfDeepFoolAttack": lambda cls, c: Run(cls(steps=10)),
    "L2CarliniWagnerAttack": lambda cls, c: Run(cls(binary_search_steps=2, steps=20, stepsize=0.05,
                                                    initial_const=10.0)),
    "EADAttack": lambda cls, c: Run(cls(binary_search_steps=2, steps=20, initial_stepsize=0.05,
                                        initial_const=10.0)),
    "DDNAttack": lambda cls, c: Run(cls(steps=10)),
    "L0FMNAttack": lambda cls, c: Run(cls(steps=10)),
    "L1FMNAttack": lambda cls, c: Run(cls(steps=10)),
    "L2FMNAttack": lambda cls, c: Run(cls(steps=10)),
    "LInfFMNAttack": lambda cls, c: Run(cls(steps=10)),
    "NewtonFoolAttack": lambda cls, c: Run(cls(steps=20)),
    "VirtualAdversarialAttack": lambda cls, c: Run(cls(steps=2), _budgets(c)[1], 2.0),
    "GenAttack": lambda cls, c: _gen_attack(c),
    **{name: (lambda cls, c: Run(cls(steps=5))) for name in ATTACKS if "BrendelBethge" in name},
}


def _call(run: Run, c: Case) -> tuple[Tensor, Tensor]:
    fmodel = run.fmodel if run.fmodel is not None else c.fmodel
    x = run.x if run.x is not None else c.x
    crit = run.criterion if run.criterion is not None else c.criterion
    if isinstance(run.attack, fb.attacks.SpatialAttack):
        _, x_adv, success = run.attack(fmodel, x, crit)  # no epsilons in SpatialAttack's signature
    else:
        _, x_adv, success = run.attack(fmodel, x, crit, epsilons=run.epsilons, **(run.kwargs or {}))
    if run.x is not None:  # back to data units
        x_adv = x_adv * c.span + c.lo
    return x_adv, success


def _construct(name: str, c: Case) -> Run:
    try:
        return RECIPES[name](ATTACKS[name], c)
    except ImportError:  # the Brendel-Bethge attacks without numba: refused before any use of numba anyway
        return Run(ATTACKS[name].__new__(ATTACKS[name]))


#: cells Foolbox itself refuses before the model is ever reached (SpatialAttack.__call__ checks the rank first)
FOOLBOX_REFUSES = {("SpatialAttack", "seg3d"): (NotImplementedError, "two spatial dimensions")}


def run_cell(name: str, kind: str, cases: dict[str, Case]) -> None:
    c = cases[kind]
    cell = mfb.SUPPORT[name][kind]
    torch.manual_seed(0)
    np.random.seed(0)  # Foolbox draws from the global generators
    if cell.status == "refused":
        run = _construct(name, c)
        calls = []
        handle = c.model.register_forward_hook(lambda *a: calls.append(1))
        try:
            if (name, kind) in FOOLBOX_REFUSES:
                error, text = FOOLBOX_REFUSES[name, kind]
                with pytest.raises(error, match=text):
                    _call(run, c)
                # the same attack entered through run() meets the adapter's refusal
                with pytest.raises(UnsupportedAttackError, match=name):
                    run.attack.run(c.fmodel, c.x, c.criterion)
            else:
                with pytest.raises(UnsupportedAttackError) as err:
                    _call(run, c)
                msg = str(err.value)
                assert name in msg and " use " in msg and cell.reason in msg
        finally:
            handle.remove()
        assert not calls, f"{name} ran the model {len(calls)} times before the refusal"
        return

    run = RECIPES[name](ATTACKS[name], c)
    c = run.case or c
    x_adv, success = _call(run, c)
    assert x_adv.shape == c.x.shape and x_adv.dtype == c.x.dtype
    tol = 1e-5 * c.span
    assert float(x_adv.min()) >= c.lo - tol and float(x_adv.max()) <= c.hi + tol, "left the data box"
    if run.epsilons is not None:
        eps = run.epsilons * (c.span if run.x is not None else 1.0)  # in data units
        dist = (x_adv - c.x).flatten(1).norm(p=run.norm, dim=1)
        assert float(dist.max()) <= eps * (1 + 1e-4) + tol, "left the ε-ball"
    if run.targeted:
        target = run.criterion.target_classes.raw
        with torch.no_grad():
            hit = (c.model(x_adv).argmax(1) == target).float().mean()
        assert float(hit) >= 0.5, f"{name} reached the target on {float(hit):.2f} of the samples"
        return
    clean, adv = c.metric(c.x, run.model, run.metric), c.metric(x_adv, run.model, run.metric)
    assert adv < clean - run.drop, f"{name} on {kind}: metric {clean:.3f} -> {adv:.3f}"
    if run.criterion is None:  # Foolbox's success flags are the task's own test
        assert torch.equal(success.cpu(), c.fooled(x_adv, run.model).cpu())


@pytest.mark.parametrize(("name", "kind"), CELLS)
def test_cell(name, kind, cases):
    run_cell(name, kind, cases)
