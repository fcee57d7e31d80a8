"""evaluate(): the resume fingerprint follows every declared setting, typed attack details become columns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import Tensor, nn

from medadv.attacks import DAG, PGD, VAFA
from medadv.attacks.base import Attack, AttackDetails
from medadv.evaluation import detail_rows, evaluate
from medadv.report import write_report
from medadv.results import Results
from medadv.tasks import MultiClass, Segmentation
from medadv.threats import Box, Linf


def _seg3d() -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.Softplus(), nn.Conv3d(4, 3, 1)).eval()
    g = torch.Generator().manual_seed(0)
    return model, torch.rand(2, 1, 8, 8, 8, generator=g), torch.randint(0, 3, (2, 8, 8, 8), generator=g)


def _configs(res: Results) -> set[str]:
    return {r["config"] for r in res}


def _count_calls(attack: Attack) -> list[int]:
    calls: list[int] = []
    orig = attack.perturb
    attack.perturb = lambda *a, **k: calls.append(a[1].shape[0]) or orig(*a, **k)  # type: ignore[method-assign]
    return calls


def test_vafa_block_sizes_get_their_own_rows_on_resume(tmp_path):
    """Regression: VAFA block=8 and block=32 had one fingerprint, so a resumed run reused the other's rows."""
    model, x, y = _seg3d()
    task, log = Segmentation(3), tmp_path / "log.jsonl"
    first = evaluate(model, task, (x, y), {"vafa": VAFA(task, Box(0.0, 1.0), steps=1, block=8)}, log=log)
    other = VAFA(task, Box(0.0, 1.0), steps=1, block=32)
    calls = _count_calls(other)
    second = evaluate(model, task, (x, y), {"vafa": other}, log=log)
    assert calls == [2], "the rows of block=8 were reused for block=32"
    assert _configs(first).isdisjoint(_configs(second))
    # the same settings again: every row comes from the log
    again = VAFA(task, Box(0.0, 1.0), steps=1, block=32)
    calls = _count_calls(again)
    evaluate(model, task, (x, y), {"vafa": again}, log=log)
    assert calls == []


def test_bounds_steps_and_budget_change_the_fingerprint():
    """Regression: VAFA/DAG with different bounds shared a fingerprint."""
    model, x, y = _seg3d()
    task = Segmentation(3)

    def config(attack: Attack, target_fn=None) -> str:
        (c,) = _configs(evaluate(model, task, (x[:1], y[:1]), {"a": attack}, target_fn=target_fn))
        return c

    assert config(VAFA(task, Box(0.0, 1.0), steps=1, block=8)) != config(VAFA(task, Box(-1.0, 1.0), steps=1, block=8))
    bg = lambda x, y, logits: torch.zeros_like(y)  # noqa: E731
    assert config(DAG(task, Box(0.0, 1.0), steps=1), bg) != config(DAG(task, Box(0.0, 2.0), steps=1), bg)
    assert config(DAG(task, Box(0.0, 1.0), steps=1), bg) != config(DAG(task, Box(0.0, 1.0), steps=2), bg)
    pgd = {"pgd": PGD(task, Linf(0.1, bounds=(0.0, 1.0)), steps=1)}
    base = _configs(evaluate(model, task, (x[:1], y[:1]), pgd))
    assert base != _configs(evaluate(model, task, (x[:1], y[:1]), {"pgd": PGD(task, Linf(0.2, bounds=(0.0, 1.0)),
                                                                                     steps=1)}))
    # HD95 options and the model's weights are part of it too
    assert base != _configs(evaluate(model, task, (x[:1], y[:1]), pgd, hd95=True, spacing=(1.0, 1.0, 2.0)))
    with torch.no_grad():
        model[0].bias.add_(0.1)
    assert base != _configs(evaluate(model, task, (x[:1], y[:1]), pgd))


@dataclass
class _Details(AttackDetails):
    columns: ClassVar[tuple[str, ...]] = ("moves", "score", "per_class")
    moves: Tensor
    score: Tensor
    per_class: Tensor
    table: Tensor  # not a declared column: stays out of the rows


class _Nudge(Attack):
    """A test attack without an ε-ball: one step up on the box, with typed per-sample details."""

    threat_kind = "box"

    def perturb(self, model, x, y, logits):
        n = x.shape[0]
        score = torch.arange(n, dtype=torch.float32)
        score[0] = float("nan")  # undefined for one sample: None in the rows, left out of the mean
        det = _Details(moves=torch.arange(n) + 1, score=score, per_class=torch.ones(n, 2), table=torch.zeros(n, 9))
        return self.box.clip(x + 0.01), det, None


def _clf() -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()
    return model, torch.rand(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])


def test_declared_details_become_prefixed_columns_with_summary_means(tmp_path):
    model, x, y = _clf()
    task = MultiClass()
    res = evaluate(model, task, (x, y), {"nudge": _Nudge(task, Box(0.0, 1.0)),
                                          "pgd": PGD(task, Linf(0.1, bounds=(0.0, 1.0)), steps=1)})
    nudge = [r for r in res if r["attack"] == "nudge"]
    assert [r["attack_moves"] for r in nudge] == [1, 2, 3, 4]
    assert [r["attack_score"] for r in nudge] == [None, 1.0, 2.0, 3.0]
    assert nudge[0]["attack_per_class"] == [1.0, 1.0]
    assert all("attack_table" not in r and "table" not in r for r in nudge)
    assert all(not any(k.startswith("attack_") for k in r) for r in res if r["attack"] == "pgd")
    assert all(r["budget"] is None for r in nudge)
    summary = {r["attack"]: r for r in res.summary()}
    assert summary["nudge"]["attack_moves"] == pytest.approx(2.5)
    assert summary["nudge"]["attack_score"] == pytest.approx(2.0)  # the NaN sample is left out
    assert summary["nudge"]["attack_per_class"] == [1.0, 1.0]
    assert "attack_moves" not in summary["pgd"]
    text = res.format_summary()
    main, details = text.split("attack-specific outputs")
    assert "attack_" not in main and "adv_correct" in main
    assert "attack_moves" in details and "2.500" in details and "pgd" not in details
    report = write_report(res, tmp_path).read_text()
    assert "## Attack-specific outputs" in report and "attack_score" in report
    # the columns survive the JSON log and a resume
    log = tmp_path / "log.jsonl"
    evaluate(model, task, (x, y), {"nudge": _Nudge(task, Box(0.0, 1.0))}, log=log)
    rows = [json.loads(s) for s in log.read_text().splitlines()]
    assert [r["attack_moves"] for r in rows] == [1, 2, 3, 4]


def test_detail_rows_copy_each_column_once():
    det = _Details(moves=torch.tensor([3, 4]), score=torch.tensor([0.5, float("nan")]),
                   per_class=torch.tensor([[1.0, 2.0], [3.0, 4.0]]), table=torch.zeros(2))
    assert detail_rows(det, 2) == [{"attack_moves": 3, "attack_score": 0.5, "attack_per_class": [1.0, 2.0]},
                                   {"attack_moves": 4, "attack_score": None, "attack_per_class": [3.0, 4.0]}]
    assert detail_rows(None, 2) == [{}, {}]
    # the same values as AttackDetails.row (NaN aside)
    assert det.row(0) == {k.removeprefix("attack_"): v for k, v in detail_rows(det, 2)[0].items()}


def test_dag_details_reach_the_rows():
    """A real attack's typed details (DAG: target-region success, iterations) are in every row."""
    model, x, y = _seg3d()
    task = Segmentation(3)
    res = evaluate(model, task, (x, y), {"dag": DAG(task, Box(0.0, 1.0), steps=2)},
                   target_fn=lambda x, y, logits: torch.zeros_like(y))
    out = DAG(task, Box(0.0, 1.0), steps=2)(model, x, torch.zeros_like(y))
    assert out.details is not None
    assert {k for k in res.rows[0] if k.startswith("attack_")} == {f"attack_{c}" for c in out.details.columns}
    assert "attack_iterations" in res.rows[0] and "attack_fooled_fraction" in res.rows[0]
    assert all(0 <= r["attack_iterations"] <= 2 for r in res)
    assert "attack_fooled_fraction" in res.summary()[0]


def test_targeted_by_nature_needs_a_target_fn():
    model, x, y = _seg3d()
    task = Segmentation(3)
    with pytest.raises(ValueError, match=r"`target_fn` is required because attack\(s\) 'dag'"):
        evaluate(model, task, (x, y), {"dag": DAG(task, Box(0.0, 1.0), steps=1)})
