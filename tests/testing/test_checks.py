"""The public conformance checks (:func:`medadv.testing.check_attack`, :func:`medadv.testing.check_task`) catch what
they claim to, naming the failed property, and a task kind defined outside medadv (here, in this file) runs through
``evaluate()``, a config by dotted path, the HTML report and both checks without any edit to ``medadv/``."""

from __future__ import annotations

import json
import sys
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn

from medadv.attacks.base import Attack
from medadv.attacks.pgd import PGD
from medadv.tasks import MultiClass, Outcome, Task, TaskExample, task_family
from medadv.tasks.base import tiny_net
from medadv.testing import ConformanceError, check_attack, check_task
from medadv.threats import Linf


# --- a task kind of our own: ordinal grading (e.g. a 0..3 severity score) with cumulative logits -------------------
class Ordinal(Task):
    """Ordinal grading with ``num_levels`` ordered grades: logits ``(N, K-1)``, one per threshold "grade > k";
    ``y`` ``(N,)`` grades in ``[0, K-1]``. The predicted grade is the number of thresholds passed."""

    title = "ordinal grading"
    shapes = "logits (N, K-1); y (N,) grades"
    headline = "abs_error"
    higher_is_better = False
    robust_metric_column = "exact"
    robust_metric_binary = True
    label_source = "index"
    robust_metric_name = "exact_grade"

    def __init__(self, num_levels: int = 4) -> None:
        if int(num_levels) < 2:
            raise ValueError(f"`num_levels` must be >= 2, got {num_levels}")
        self.num_levels = int(num_levels)

    def validate_logits(self, logits: Tensor) -> None:
        if logits.ndim != 2 or logits.shape[1] != self.num_levels - 1:
            raise ValueError(f"model output must be (N, {self.num_levels - 1}) threshold logits, "
                             f"got {tuple(logits.shape)}")

    def validate_labels(self, logits: Tensor, y: Tensor, name: str = "y") -> None:
        if y.is_floating_point() or tuple(y.shape) != (logits.shape[0],):
            raise ValueError(f"`{name}` must be ({logits.shape[0]},) integer grades, got {tuple(y.shape)} {y.dtype}")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_levels):
            raise ValueError(f"`{name}` has grades out of range [0, {self.num_levels - 1}]")

    def _steps(self, y: Tensor, like: Tensor) -> Tensor:
        k = torch.arange(self.num_levels - 1, device=y.device)
        return (y.unsqueeze(1) > k).to(like.dtype)

    def element_loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits, self._steps(y, logits), reduction="none")

    def element_margin(self, logits: Tensor, y: Tensor) -> Tensor:
        return (2 * self._steps(y, logits) - 1) * logits

    def predict(self, logits: Tensor) -> Tensor:
        return (logits > 0).sum(dim=1)

    def distributions(self, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        p, t = logits.sigmoid(), self._steps(y, logits)
        return torch.stack((p, 1 - p), dim=1), torch.stack((t, 1 - t), dim=1)

    def log_probs(self, logits: Tensor) -> Tensor:
        return torch.stack((F.logsigmoid(logits), F.logsigmoid(-logits)), dim=1)

    def least_likely(self, logits: Tensor) -> Tensor:
        return (self.num_levels - 1) - self.predict(logits)

    def element_correct(self, logits: Tensor, y: Tensor) -> Tensor:
        return (logits > 0) == self._steps(y, logits).bool()

    def fooled(self, logits: Tensor, y: Tensor, targeted: bool = False) -> Tensor:
        hit = self.predict(logits) == y
        return hit if targeted else ~hit

    def metrics(self, logits: Tensor, y: Tensor) -> dict[str, Tensor]:
        return dict(self.outcome(logits, y).columns)

    def outcome(self, logits: Tensor, y: Tensor, pred: Tensor | None = None) -> Outcome:
        pred = self.predict(logits) if pred is None else pred
        return self.outcome_of_pred(pred, y)

    def outcome_of_pred(self, pred: Tensor, y: Tensor) -> Outcome:
        exact = pred == y
        return Outcome(pred, ~exact, {"exact": exact, "abs_error": (pred - y).abs().float()})

    def robust_metric(self, logits: Tensor, y: Tensor) -> Tensor:
        return (self.predict(logits) == y).float()

    def case_scores(self, logits: Tensor) -> Tensor | None:
        return logits.sigmoid()

    @classmethod
    def examples(cls, seed: int = 0) -> list[TaskExample]:
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(3, 1, 8, 8, generator=g)
        return [TaskExample("ordinal", cls(4), ordinal_net(seed=seed), x, torch.tensor([0, 2, 3]),
                            target=torch.zeros(3, dtype=torch.long))]

    def __repr__(self) -> str:
        return f"Ordinal(num_levels={self.num_levels})"


def ordinal_net(num_levels: int = 4, seed: int = 0) -> nn.Module:
    """A tiny 2-D grader: ``num_levels - 1`` threshold logits (a config names it as the model builder)."""
    return tiny_net(1, num_levels - 1, 2, dense=False, seed=seed)


def _dotted(obj: Any) -> str:
    assert obj.__module__ in sys.modules, "pytest imports test modules under their names (importlib mode)"
    return f"{obj.__module__}:{obj.__qualname__}"


def test_a_task_kind_defined_outside_medadv_passes_check_task():
    assert task_family(Ordinal()) is None  # not registered: medadv knows nothing about it
    report = check_task(Ordinal)
    assert "ordinal: collation" in report.passed and "ordinal: report case" in report.passed
    check_task(Ordinal(4))  # an instance: checked on the examples it fits


def test_attacks_check_on_an_outside_task_kind():
    report = check_attack("pgd", [Ordinal], properties=["result shapes", "box and ball", "determinism"])
    assert report.passed and not report.refused
    # an attack declared for label maps refuses the grades before any work, and that counts as a pass
    assert "ordinal" in check_attack("dag", [Ordinal], properties=["result shapes"]).refused


def test_an_outside_task_kind_runs_through_evaluate_the_html_report(tmp_path):
    from medadv import evaluate
    from medadv.report import write_html_report
    from medadv.report.cases import make_cases

    ex = Ordinal.example()
    attack = PGD(ex.task, Linf(0.3, bounds=(0.0, 1.0)), steps=3)
    res = evaluate(ex.model, ex.task, (ex.x, ex.y), {"pgd": attack})
    assert len(res.rows) == 3 and all("adv_abs_error" in r and "clean_exact" in r for r in res.rows)
    out = attack(ex.model, ex.x, ex.y)
    with torch.no_grad():
        clean = ex.model(ex.x)
    cases = make_cases(ex.task, ex.x, out.x_adv, clean, out.logits, ex.y, k=2)
    html = write_html_report(res, tmp_path, cases=cases, title="ordinal")
    text = html.read_text()
    assert "abs_error" in text or "abs error" in text


@pytest.mark.filterwarnings("ignore:model builder .* has no `checkpoint`")
def test_an_outside_task_kind_runs_from_a_config_by_dotted_path(tmp_path, capsys):
    import numpy as np

    from medadv.cli import main

    ex = Ordinal.example()
    np.savez(tmp_path / "grades.npz", x=ex.x.numpy(), y=ex.y.numpy())
    cfg = {
        "model": {"builder": _dotted(ordinal_net), "kwargs": {"num_levels": 4}},
        "task": {"type": _dotted(Ordinal), "num_levels": 4},
        "data": {"source": "npz", "path": "grades.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": [0.1],
        "attacks": [{"name": "pgd", "steps": 2}],
        "output": "out",
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    # code outside medadv runs only when the user opts in
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 2
    assert "--allow-code" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress", "--allow-code"]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert len(rows) == 3 and {"clean_abs_error", "adv_exact"} <= set(rows[0])
    assert (tmp_path / "out" / "report.html").is_file()


# --- broken tasks: each failure names its property --------------------------------------------------------------
class _Broken(MultiClass):
    """A multi-class task with one property broken (``broken``), for the checks to catch."""

    broken: ClassVar[str] = ""

    def robust_metric(self, logits: Tensor, y: Tensor) -> Tensor:
        m = super().robust_metric(logits, y)
        return m - 1.0 if self.broken == "floor" else m

    def outcome(self, logits: Tensor, y: Tensor, pred: Tensor | None = None) -> Outcome:
        out = super().outcome(logits, y, pred)
        if self.broken == "collation":  # a column normalised over the batch: rows depend on their neighbours
            conf = logits.softmax(dim=1).amax(dim=1)
            return Outcome(out.pred, out.wrong, {**out.columns, "confidence": conf / conf.sum()})
        if self.broken == "headline":
            return Outcome(out.pred, out.wrong, {k: v for k, v in out.columns.items() if k != "correct"})
        return out

    def decide(self, logits: Tensor, y: Tensor, targeted: bool = False) -> tuple[Tensor, Tensor]:
        pred, fooled = super().decide(logits, y, targeted)
        return (pred, ~fooled) if self.broken == "decide" else (pred, fooled)

    @classmethod
    def examples(cls, seed: int = 0) -> list[TaskExample]:
        ex = MultiClass.examples(seed)[0]
        ex.task = cls()
        return [ex]

    def __repr__(self) -> str:
        return f"_Broken({self.broken})"


@pytest.mark.parametrize(("broken", "prop"), [("floor", "robust metric"), ("collation", "collation"),
                                              ("headline", "outcome"), ("decide", "decide")])
def test_check_task_names_the_broken_property(broken: str, prop: str):
    cls = type(f"Broken_{broken}", (_Broken,), {"broken": broken})
    with pytest.raises(ConformanceError, match=rf"check_task\(.*\): multiclass: {prop}: "):
        check_task(cls, properties=["outcome", "robust metric", "decide", "collation"])


def test_check_task_refuses_a_kind_without_examples():
    class NoExamples(Ordinal):
        @classmethod
        def examples(cls, seed: int = 0) -> list[TaskExample]:
            return super().examples(seed) if False else Task.examples.__func__(cls, seed)  # type: ignore[attr-defined]

    with pytest.raises(ConformanceError, match="examples: NoExamples defines no examples"):
        check_task(NoExamples)


def test_check_task_config_round_trip_catches_an_unreadable_parameter():
    class Hidden(Ordinal):
        def __init__(self, levels: int = 4) -> None:  # stored under another name: a config cannot be rebuilt
            super().__init__(levels)

        @classmethod
        def examples(cls, seed: int = 0) -> list[TaskExample]:
            ex = Ordinal.examples(seed)[0]
            ex.task = cls(4)
            return [ex]

    with pytest.raises(ConformanceError, match="config round trip: parameter `levels`"):
        check_task(Hidden, properties=["config round trip"])


# --- broken attacks ----------------------------------------------------------------------------------------------
class _Sloppy(Attack):
    """Breaks the rule named by ``broken``."""

    broken: ClassVar[str] = ""

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None) -> Tensor:
        eps = self.threat.eps if self.threat is not None else 0.1
        if self.broken == "box":
            return x + 3 * eps  # out of the ball and the box
        if self.broken == "state":
            model.train()
            model(x)  # BatchNorm statistics move
        if self.broken == "rng":
            return (x + eps * torch.rand_like(x).sign()).clamp(0, 1)  # torch's global RNG
        if self.broken == "determinism":
            self.calls = getattr(self, "calls", 0) + 1
        if self.broken == "inplace":
            x.mul_(1.0)
            return x  # aliases the input
        return (x + eps * torch.sign(torch.ones_like(x))).clamp(0, 1)


@pytest.mark.parametrize(("broken", "prop", "what"), [
    ("box", "box and ball", "leaves the box"),
    ("state", "model state", "BatchNorm"),
    ("rng", "global RNG", "global RNG"),
    ("inplace", "caller tensors", "aliases x"),
])
def test_check_attack_names_the_broken_property(broken: str, prop: str, what: str):
    cls = type(f"Sloppy_{broken}", (_Sloppy,), {"broken": broken, "__doc__": "sloppy"})
    with pytest.raises(ConformanceError, match=rf"check_attack\(Sloppy_{broken}\): multiclass: {prop}: .*{what}"):
        check_attack(cls, ["multiclass"], properties=[prop])


def test_check_attack_requires_a_refusal_where_the_declarations_exclude_a_setting():
    class Narrow(_Sloppy):
        """Declares 3-D inputs only, yet runs on 2-D ones."""

        spatial_dims = (3,)

        def _check_call(self, model: Any, x: Any, y: Any) -> None:  # forgets the rank check
            pass

    with pytest.raises(ConformanceError, match=r"multiclass: refusal: .*exclude this setting, but the attack ran"):
        check_attack(Narrow, ["multiclass"], properties=["result shapes"])


def test_check_attack_passes_a_conforming_attack_and_reports_refusals():
    report = check_attack("vafa", ["segmentation"], properties=["result shapes", "model state"])
    assert report.passed == ["seg3d: result shapes", "seg3d: model state"]
    assert "3-D" in report.refused["seg2d"]
    assert "refused seg2d (a pass)" in str(report)


def test_check_attack_checks_an_instance_with_its_own_parameters():
    from medadv.tasks import MultiClass as MC

    report = check_attack(PGD(MC(), Linf(0.1, bounds=(0, 1)), steps=1), ["multiclass"],
                          properties=["determinism", "config round trip"])
    assert report.passed == ["multiclass: determinism", "config round trip"]

