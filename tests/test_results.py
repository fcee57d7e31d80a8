import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from medadv.attacks import FGSM, PGD
from medadv.attacks.base import Attack, AttackDetails
from medadv.evaluation import evaluate
from medadv.results import Results
from medadv.threats import Linf


def test_multilabel_evaluation_table_and_exports(trained_multilabel, tmp_path):
    t = trained_multilabel
    threat = Linf(0.15, bounds=(0.0, 1.0))
    res = evaluate(t.model, t.task, (t.x, t.y), {"fgsm": FGSM(t.task, threat), "pgd": PGD(t.task, threat, steps=5)})
    assert len(res) == 2 * t.x.shape[0]
    summary = {r["attack"]: r for r in res.summary()}
    assert summary["pgd"]["adv_label_accuracy"] < summary["pgd"]["clean_label_accuracy"]
    assert summary["pgd"]["adv_macro_auc"] < summary["pgd"]["clean_macro_auc"]
    assert summary["pgd"]["linf"] == pytest.approx(0.15, abs=1e-6)
    res.to_json(tmp_path / "r.json")
    res.to_csv(tmp_path / "r.csv")
    again = Results.from_json(tmp_path / "r.json")
    assert again.rows == res.rows
    assert (tmp_path / "r.csv").read_text().count("\n") == len(res) + 1
    assert "adv_label_accuracy" in res.format_summary()


def test_segmentation_evaluation_has_dice_and_hd95(trained_seg3d):
    t = trained_seg3d
    res = evaluate(t.model, t.task, (t.x, t.y), [PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=3)], hd95=True)
    row = res.rows[0]
    assert len(row["clean_dice"]) == 3 and len(row["adv_hd95"]) == 3
    s = res.summary()[0]
    assert s["adv_mean_dice"] < s["clean_mean_dice"]


def test_log_resume_does_not_duplicate_or_recompute(trained_multiclass, tmp_path):
    t = trained_multiclass
    log = tmp_path / "log.jsonl"
    atk = {"pgd": PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=2)}
    batches = [(t.x[:16], t.y[:16]), (t.x[16:], t.y[16:])]
    evaluate(t.model, t.task, batches[:1], atk, log=log)  # "crash" after the first batch
    with open(log, "a") as fh:  # and a torn last line
        fh.write('{"sample": 99, "attack": "pg')
    calls = []
    orig = atk["pgd"].perturb
    atk["pgd"].perturb = lambda *a: calls.append(a[1].shape[0]) or orig(*a)
    res = evaluate(t.model, t.task, batches, atk, log=log)
    assert calls == [16]  # only the second batch was attacked again
    assert sorted(r["sample"] for r in res) == list(range(32))
    lines = [json.loads(s) for s in log.read_text().splitlines() if s.startswith("{") and s.endswith("}")]
    assert len({r["sample"] for r in lines}) == 32


def test_resume_after_the_data_changed_recomputes_the_changed_samples(trained_multiclass, tmp_path):
    """The log's rows carry a hash of each sample's data: new data at the same positions is attacked again."""
    t = trained_multiclass
    log = tmp_path / "log.jsonl"
    atk = {"pgd": PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=2)}
    first = evaluate(t.model, t.task, (t.x[:16], t.y[:16]), atk, log=log)
    calls = []
    orig = atk["pgd"].perturb
    atk["pgd"].perturb = lambda *a: calls.append(a[1].shape[0]) or orig(*a)
    x = t.x[:16].clone()
    x[3] = 1.0 - x[3]  # one sample changed, same position
    res = evaluate(t.model, t.task, (x, t.y[:16]), atk, log=log)
    assert calls == [16]  # the batch had a changed sample: attacked again
    assert len(res) == 16 and {r["sample"] for r in res} == set(range(16))
    changed = next(r for r in res if r["sample"] == 3)
    assert changed["data"] != next(r for r in first if r["sample"] == 3)["data"]
    calls.clear()
    again = evaluate(t.model, t.task, (x, t.y[:16]), atk, log=log)  # now every row of this data is logged
    assert calls == [] and len(again) == 16
    assert [r["adv_pred"] for r in again] == [r["adv_pred"] for r in res]


def test_results_json_is_written_atomically(tmp_path):
    path = tmp_path / "results.json"
    Results([{"sample": 0, "attack": "a", "budget": None}]).to_json(path)
    assert Results.from_json(path).rows[0]["attack"] == "a"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary file left behind


def test_evaluate_rejects_bad_arguments(trained_multiclass):
    t = trained_multiclass
    atk = PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=1)
    with pytest.raises(TypeError, match="attacks"):
        evaluate(t.model, t.task, (t.x, t.y), "pgd")
    with pytest.raises(ValueError, match="distinct names"):
        evaluate(t.model, t.task, (t.x, t.y), [atk, atk])
    targeted = PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=1, targeted=True)
    with pytest.raises(ValueError, match="target_fn"):
        evaluate(t.model, t.task, (t.x, t.y), [targeted])
    with pytest.raises(ValueError, match="y"):
        evaluate(t.model, t.task, (t.x, t.y[:3]), [atk])
    assert torch.isfinite(t.x).all()


def test_targeted_evaluation_uses_target_fn(trained_multiclass):
    t = trained_multiclass
    atk = PGD(t.task, Linf(0.3, bounds=(0.0, 1.0)), steps=10, targeted=True)
    res = evaluate(t.model, t.task, (t.x, t.y), {"to-class-0": atk}, target_fn=lambda x, y, logits: torch.zeros_like(y))
    assert res.summary()[0]["fooled"] > 0.8  # most samples reach class 0


def test_evaluate_restores_every_submodule_mode_and_recomputes_changed_settings(trained_multiclass, tmp_path):
    t = trained_multiclass
    t.model.train()
    t.model[0].eval()  # e.g. a frozen block during fine-tuning
    log = tmp_path / "log.jsonl"
    try:
        evaluate(t.model, t.task, (t.x, t.y), {"pgd": PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=1)}, log=log)
        assert t.model.training and not t.model[0].training and t.model[2].training
    finally:
        t.model.eval()
    # same name and budget, different settings: the logged rows must not be reused
    res = evaluate(t.model, t.task, (t.x, t.y), {"pgd": PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=8)}, log=log)
    strong = evaluate(t.model, t.task, (t.x, t.y), {"pgd": PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=8)})
    assert [r["adv_pred"] for r in res] == [r["adv_pred"] for r in strong]


def test_segmentation_hd95_with_ignore_index(trained_seg2d):
    from medadv.tasks import Segmentation

    t = trained_seg2d
    task = Segmentation(3, ignore_index=255)
    y = t.y.clone()
    y[:, :2] = 255
    res = evaluate(t.model, task, (t.x, y), [PGD(task, Linf(0.05, bounds=(0.0, 1.0)), steps=2)], hd95=True)
    assert len(res.rows[0]["adv_hd95"]) == 3


def test_background_only_sample_predicted_perfectly_is_not_fooled():
    from medadv.tasks import Segmentation

    task = Segmentation(3, include_background=False)
    y = torch.zeros(2, 4, 4, dtype=torch.long)
    logits = torch.nn.functional.one_hot(y, 3).movedim(-1, 1).float() * 10
    assert task.mean_dice(y, y).tolist() == [1.0, 1.0]
    assert not task.fooled(logits, y).any()


# --- issue 19: NaN / Inf are written as null (strict JSON) -------------------------------------------------------
def _strict(text: str):
    """``json.loads`` that refuses the non-JSON tokens ``NaN``, ``Infinity`` and ``-Infinity`` (as JavaScript's
    ``JSON.parse``, ``jq`` or Go do)."""

    def refuse(token: str):
        raise ValueError(f"non-JSON token {token}")

    return json.loads(text, parse_constant=refuse)


@dataclass
class _OddDetails(AttackDetails):
    columns: ClassVar[tuple[str, ...]] = ("score",)
    score: torch.Tensor


class _Odd(Attack):
    """Leaves ``x`` unchanged and reports a per-sample column that is NaN, +Inf, -Inf, then finite."""

    def perturb(self, model, x, y, logits, **call_args):
        odd = torch.tensor([float("nan"), float("inf"), float("-inf"), 1.0])
        return x.clone(), _OddDetails(score=odd.repeat(x.shape[0] // 4 + 1)[: x.shape[0]]), None


def test_every_file_of_a_run_with_nan_and_inf_is_strict_json(trained_multiclass, tmp_path):
    t = trained_multiclass
    log = tmp_path / "log.jsonl"
    res = evaluate(t.model, t.task, (t.x[:8], t.y[:8]), {"odd": _Odd(t.task, Linf(0.1, bounds=(0.0, 1.0)))}, log=log)
    res.meta["undefined"] = float("nan")
    res.to_json(tmp_path / "results.json")
    data = _strict((tmp_path / "results.json").read_text())
    assert data["meta"]["undefined"] is None
    assert [r["attack_score"] for r in data["rows"]][:4] == [None, None, None, 1.0]
    lines = [_strict(line) for line in log.read_text().splitlines()]
    assert len(lines) == len(res) and [r["attack_score"] for r in lines][:4] == [None, None, None, 1.0]
    # read back, the undefined values are None, which the summary leaves out of the mean as it does NaN
    for again in (Results.from_json(tmp_path / "results.json"), Results.read_log(log)):
        assert again.summary()[0]["attack_score"] == 1.0


def test_nan_and_inf_cells_are_null_in_json_jsonl_and_csv_lists(tmp_path):
    rows = [{"sample": 0, "attack": "a", "budget": 0.1, "x": float("nan"), "v": [1.0, float("inf"), float("-inf")],
             "nested": {"d": [float("nan")]}},
            {"sample": 1, "attack": "a", "budget": 0.1, "x": 2.0, "v": [3.0, 1.0, float("nan")], "nested": {}}]
    res = Results(rows, {"eps": float("inf")})
    res.to_json(tmp_path / "r.json")
    Results.append_log(tmp_path / "r.jsonl", rows)
    res.to_csv(tmp_path / "r.csv")
    data = _strict((tmp_path / "r.json").read_text())
    assert data["meta"] == {"eps": None} and data["rows"][0]["x"] is None
    assert data["rows"][0]["v"] == [1.0, None, None] and data["rows"][0]["nested"] == {"d": [None]}
    assert [_strict(line)["v"] for line in (tmp_path / "r.jsonl").read_text().splitlines()] == \
        [[1.0, None, None], [3.0, 1.0, None]]
    assert "NaN" not in (tmp_path / "r.csv").read_text() and "Infinity" not in (tmp_path / "r.csv").read_text()
    assert rows[0]["x"] != rows[0]["x"]  # the caller's rows are not modified
    s = Results.from_json(tmp_path / "r.json").summary()[0]
    assert s["x"] == 2.0 and s["v"][0] == 2.0 and s["v"][1] == 1.0 and s["v"][2] != s["v"][2]
