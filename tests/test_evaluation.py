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
from medadv.tasks import MultiClass, MultiLabel, Segmentation
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
    attack.perturb = lambda *a, **k: calls.append(a[1].shape[0]) or orig(*a, **k)  # type: ignore[method-assign,func-returns-value]
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


# --- issue 11, section 7: dictionary batches, case ids, header spacing, outcome columns, progress, seeds ----------
class _Still(Attack):
    """A test attack that changes nothing (its `fooled` is the clean error)."""

    threat_kind = "box"

    def perturb(self, model, x, y, logits):
        return x.clone()


def test_fooled_changed_and_flipped_answer_different_questions():
    """Regression: `fooled` read 0.64 where 7.5 % of predictions changed, because clean errors count as fooled.
    `changed` (prediction moved) and `flipped` (right before, wrong after) say what the attack did."""
    model, x, y = _clf()
    task = MultiClass()
    y = torch.tensor([0, 0, 0, 0])
    res = evaluate(model, task, (x, y), {"still": _Still(task, Box(0.0, 1.0)),
                                          "pgd": PGD(task, Linf(0.5, bounds=(0.0, 1.0)), steps=5)})
    still = [r for r in res if r["attack"] == "still"]
    clean_errors = [not r["clean_correct"] for r in still]
    assert any(clean_errors) and [r["fooled"] for r in still] == clean_errors
    assert not any(r["changed"] or r["flipped"] for r in still)
    for r in res:
        assert r["changed"] == (r["clean_pred"] != r["adv_pred"])
        assert r["flipped"] == (r["clean_correct"] and not r["adv_correct"])
        assert r["fooled"] == (not r["adv_correct"])
    summary = {s["attack"]: s for s in res.summary()}
    assert summary["still"]["fooled"] == pytest.approx(sum(clean_errors) / 4) and summary["still"]["changed"] == 0
    # the first metric columns, beside each other
    assert [c for c in summary["pgd"] if c not in ("attack", "budget", "n")][:3] == ["fooled", "changed", "flipped"]
    text = res.format_summary()
    assert "right before the attack and wrong after" in text and "differs from the clean prediction" in text
    assert "already wrong before the attack count" in text


def test_flipped_for_multilabel_and_segmentation():
    model, x, y = _seg3d()
    task = Segmentation(3, dice_threshold=0.4)
    res = evaluate(model, task, (x, y), {"pgd": PGD(task, Linf(0.3, bounds=(0.0, 1.0)), steps=3)})
    for r in res:
        assert r["flipped"] == (r["clean_mean_dice"] >= 0.4 and r["adv_mean_dice"] < 0.4)
        # changed: the segmentation moved in substance (Dice to the clean prediction below the threshold)
        assert r["changed"] == (r["dice_to_clean"] < 0.4)
        assert (r["changed_fraction"] == 0) == (r["dice_to_clean"] == 1.0)
    torch.manual_seed(0)
    ml = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.rand(6, 1, 4, 4, generator=g), (torch.rand(6, 3, generator=g) > 0.5).double()  # float multi-hot
    task_ml = MultiLabel()
    res = evaluate(ml, task_ml, [{"image": xs, "label": ys}], {"pgd": PGD(task_ml, Linf(0.3, bounds=(0.0, 1.0)), steps=3)})
    assert [r["label"] for r in res] == ys.tolist()
    for r in res:
        assert r["flipped"] == (r["clean_exact_match"] and not r["adv_exact_match"])
        assert r["changed"] == (r["clean_pred"] != r["adv_pred"]) == (r["flip_rate"] > 0)


def _nifti_batches(tmp_path, spacings):
    import nibabel as nib
    import numpy as np
    from monai.data import DataLoader, Dataset
    from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged

    g = np.random.default_rng(0)
    items = []
    for i, sp in enumerate(spacings):
        aff = np.diag([*sp, 1.0])
        vol = np.zeros((8, 8, 8), np.float32)
        vol[2:6, 2:6, 2:6] = 1.0
        lab = np.zeros((8, 8, 8), np.uint8)
        lab[1:5, 3:7, 2:6], lab[5:7, 1:3, 1:7] = 1, 2
        nib.save(nib.Nifti1Image(vol + g.random((8, 8, 8)).astype(np.float32) * 0.1, aff), tmp_path / f"c{i}.nii.gz")
        nib.save(nib.Nifti1Image(lab, aff), tmp_path / f"l{i}.nii.gz")
        items.append({"img": str(tmp_path / f"c{i}.nii.gz"), "seg": str(tmp_path / f"l{i}.nii.gz"),
                      "case_id": f"c{i}.nii.gz"})
    keys = ["img", "seg"]
    return DataLoader(Dataset(items, Compose([LoadImaged(keys), EnsureChannelFirstd(keys)])), batch_size=2)


def test_monai_dictionary_batches_case_ids_and_hd95_in_header_millimetres(tmp_path):
    from medadv.metrics.segmentation import hd95_per_class

    spacings = [(2.0, 1.0, 3.0), (1.0, 1.0, 1.0), (0.5, 0.5, 4.0)]
    loader = _nifti_batches(tmp_path, spacings)
    model, _, _ = _seg3d()
    model[0] = nn.Conv3d(1, 4, 3, padding=1)
    task = Segmentation(3)
    pgd = {"pgd": PGD(task, Linf(0.05, bounds=(0.0, 1.2)), steps=1)}
    res = evaluate(model.eval(), task, loader, pgd, hd95=True, image_key="img", label_key="seg", seed=0)
    assert [r["case_id"] for r in res] == ["c0.nii.gz", "c1.nii.gz", "c2.nii.gz"]
    assert [r["sample"] for r in res] == [0, 1, 2]
    batch = next(iter(loader))
    x, y = batch["img"].as_tensor(), batch["seg"].as_tensor()[:, 0].long()  # (N, 1, ...) float maps accepted
    with torch.no_grad():
        pred = task.predict(model(x))
    for i in range(2):  # each case in millimetres of its own header
        expect = hd95_per_class(pred[i: i + 1], y[i: i + 1], 3, spacings[i])[0]
        voxels = hd95_per_class(pred[i: i + 1], y[i: i + 1], 3, None)[0]
        got = torch.tensor([float("nan") if v is None else v for v in res.rows[i]["clean_hd95"]])
        assert torch.allclose(got, expect.float(), equal_nan=True)
        if i == 0:
            assert not torch.allclose(got, voxels.float(), equal_nan=True)
    # an explicit `spacing` wins over the headers
    fixed = evaluate(model, task, loader, pgd, hd95=True, spacing=1.0, image_key="img", label_key="seg", seed=0)
    assert fixed.rows[1]["clean_hd95"] == res.rows[1]["clean_hd95"] and fixed.rows[0]["clean_hd95"] != \
        res.rows[0]["clean_hd95"]
    # the header is part of a sample's identity: a resumed run redoes a case whose spacing changed
    log = tmp_path / "log.jsonl"
    evaluate(model, task, loader, pgd, hd95=True, image_key="img", label_key="seg", seed=0, log=log)
    calls = _count_calls(pgd["pgd"])
    evaluate(model, task, _nifti_batches(tmp_path, [spacings[0], spacings[1], (1.0, 1.0, 1.0)]), pgd, hd95=True,
             image_key="img", label_key="seg", seed=0, log=log)
    assert calls == [1]  # only the second batch (the last case) again


def test_dictionary_batch_errors_and_label_forms():
    model, x, y = _clf()
    task = MultiClass()
    atk = {"still": _Still(task, Box(0.0, 1.0))}
    res = evaluate(model, task, [{"image": x, "label": y.double()[:, None], "case_id": ["a", "b", "c", "d"]}], atk)
    assert [r["label"] for r in res] == y.tolist() and [r["case_id"] for r in res] == ["a", "b", "c", "d"]
    with pytest.raises(TypeError, match="no label 'label'.*label_key"):
        evaluate(model, task, [{"image": x, "target": y}], atk)
    with pytest.raises(TypeError, match="no 'image'"):
        evaluate(model, task, [{"x": x, "label": y}], atk)
    with pytest.raises(ValueError, match="class indices"):
        evaluate(model, task, [{"image": x, "label": y.double() + 0.5}], atk)
    with pytest.raises(ValueError, match="one identifier per sample"):
        evaluate(model, task, [{"image": x, "label": y, "case_id": ["a"]}], atk)
    assert [r["case_id"] for r in evaluate(model, task, [(x[:2], y[:2]), (x[2:], y[2:])], atk)] == ["0", "1", "2", "3"]


def test_progress_bar_has_a_total_and_an_eta(capsys, tmp_path):
    model, x, y = _clf()
    task = MultiClass()
    atk = {"still": _Still(task, Box(0.0, 1.0)), "pgd": PGD(task, Linf(0.1, bounds=(0.0, 1.0)), steps=1)}
    batches = [(x[:2], y[:2]), (x[2:], y[2:])]
    log = tmp_path / "log.jsonl"
    evaluate(model, task, batches[:1], atk, progress=True, log=log)
    capsys.readouterr()
    evaluate(model, task, batches, atk, progress=True, log=log)
    err = capsys.readouterr().err
    assert "2/2" in err and "<00:00" in err  # resumed: only the second batch's 2 attack-batches are left
    evaluate(model, task, iter(batches), atk, progress=True)  # no len(): a count without a total
    err = capsys.readouterr().err
    assert "4attack-batch" in err.replace(" ", "") and "/4" not in err


def test_seed_makes_each_batch_independent_of_the_order_and_leaves_the_global_rng():
    model, x, y = _clf()
    task = MultiClass()
    batches = [(x[:2], y[:2]), (x[2:], y[2:])]

    def run(data, seed):
        # no seed of its own: the random start comes from the global RNG (and shows in l2)
        pgd = PGD(task, Linf(0.2, bounds=(0.0, 1.0)), steps=1, step_size=0.01, seed=None)
        return evaluate(model, task, data, {"pgd": pgd}, seed=seed)

    state = torch.get_rng_state()
    full = run(batches, 3)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is untouched
    torch.rand(5)  # the global RNG moves on: the seeded rows do not
    assert run(batches, 3).rows == full.rows
    assert run(batches, 4).rows != full.rows
    # without a seed the global RNG is used as before: two runs differ (PGD's random start)
    assert run(batches, None).rows != run(batches, None).rows
