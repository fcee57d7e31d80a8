"""2AFC reader study: randomised pairs, export for readers, exact binomial scoring."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest
import torch

from medadv.attacks.fgsm import FGSM
from medadv.data.chest_xray import load_chest_xray
from medadv.models import small_cnn
from medadv.studies import run_study, validate_study
from medadv.studies.reader import export_reader_study, reader_study, score_reader_study
from medadv.tasks import MultiLabel
from medadv.threats import Linf


@pytest.fixture(scope="module")
def study_data():
    torch.manual_seed(0)
    model = small_cnn(1, 2, width=4).eval()
    img = load_chest_xray(32)
    x = torch.stack([img, img.flip(-1), img.flip(-2), img.flip(-1).flip(-2)] * 2)
    y = torch.zeros(8, 2)
    return model, MultiLabel(), (x, y), {"fgsm": FGSM(MultiLabel(), Linf(8 / 255, bounds=(0.0, 1.0)))}


def _decode(b64: str) -> np.ndarray:
    import base64

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


def test_pairs_are_randomised_by_seed_and_hold_clean_and_adversarial(study_data, tmp_path):
    model, task, data, attacks = study_data
    res = reader_study(model, task, data, attacks, pairs=6, seed=0)
    assert len(res.rows) == 6 and {r["adversarial"] for r in res.rows} == {"left", "right"}
    x = data[0]
    for r in res.rows:
        pair = res.meta["images"][r["pair_id"]]
        adv_side = r["adversarial"]
        clean_side = "right" if adv_side == "left" else "left"
        clean = _decode(pair[clean_side])
        assert clean.dtype == np.uint8 and clean.shape == (32, 32)
        # the clean side is the sample itself in 8 bits; the adversarial side differs by about ε = 8/255
        expected = (x[r["sample"], 0] * 255).round().numpy().astype(np.uint8)
        assert np.abs(clean.astype(int) - expected.astype(int)).max() <= 1
        diff = np.abs(_decode(pair[adv_side]).astype(int) - clean.astype(int))
        assert 6 <= diff.max() <= 9
    again = reader_study(model, task, data, attacks, pairs=6, seed=0)
    other = reader_study(model, task, data, attacks, pairs=6, seed=1)
    assert again.rows == res.rows and other.rows != res.rows
    maps = reader_study(model, task, data, attacks, pairs=2, show="map", explanation="gradient")
    assert _decode(maps.meta["images"]["pair_001"]["left"]).max() == 255  # min-max scaled maps


def test_export_fill_score(study_data, tmp_path):
    model, task, data, attacks = study_data
    res = reader_study(model, task, data, attacks, pairs=8, seed=3)
    res.to_json(tmp_path / "study.json")
    answers, key = export_reader_study(tmp_path / "study.json", tmp_path / "readers")
    assert key.parent != answers.parent and not (answers.parent / "key.csv").exists()
    assert len(list(answers.parent.glob("*.png"))) == 16
    with answers.open() as f:
        sheet = list(csv.DictReader(f))
    assert [r["answer"] for r in sheet] == [""] * 8 and sheet[0]["left"] == "pair_001_left.png"
    truth = {r["pair_id"]: r["adversarial"] for r in res.rows}
    # a reader right on 6 of 8
    for i, r in enumerate(sheet):
        wrong = "right" if truth[r["pair_id"]] == "left" else "left"
        r["answer"] = truth[r["pair_id"]] if i < 6 else wrong
    filled = tmp_path / "filled.csv"
    with filled.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(sheet[0]))
        w.writeheader()
        w.writerows(sheet)
    s = score_reader_study(filled, key)
    assert (s["correct"], s["n"]) == (6, 8)
    assert s["p_value"] == pytest.approx(sum(math.comb(8, k) for k in range(6, 9)) / 2**8)  # 0.1445
    assert s["by_attack"]["fgsm"]["correct"] == 6
    assert score_reader_study(filled, res)["p_value"] == s["p_value"]  # the key as the study result


def test_binomial_numbers_against_chance():
    key = {f"p{i}": "left" for i in range(20)}
    answers = [{"pair_id": f"p{i}", "answer": "left" if i < 15 else "R"} for i in range(20)]
    s = score_reader_study(answers, key)
    assert (s["correct"], s["n"]) == (15, 20)
    assert s["p_value"] == pytest.approx(21700 / 2**20, rel=1e-9)  # 0.0207
    assert s["ci_low"] == pytest.approx(0.5090, abs=1e-4) and s["ci_high"] == pytest.approx(0.9134, abs=1e-4)
    # the paper's reader at 63/270: far below chance, not above it
    key = {f"p{i}": "left" for i in range(270)}
    low = score_reader_study([{"pair_id": p, "answer": "left" if i < 63 else "right"} for i, p in enumerate(key)], key)
    assert low["p_value"] > 0.999 and low["p_value_below_chance"] < 1e-15


def test_malformed_answer_sheets_are_refused():
    key = {"a": "left", "b": "right"}
    with pytest.raises(ValueError, match="pair 'b'.*'left' or 'right'"):
        score_reader_study([{"pair_id": "a", "answer": "left"}, {"pair_id": "b", "answer": ""}], key)
    with pytest.raises(ValueError, match="unanswered: b"):
        score_reader_study([{"pair_id": "a", "answer": "left"}], key)
    with pytest.raises(ValueError, match="'c', which is not in the key"):
        score_reader_study([{"pair_id": "c", "answer": "left"}], key)
    with pytest.raises(ValueError, match="twice"):
        score_reader_study([{"pair_id": "a", "answer": "l"}, {"pair_id": "a", "answer": "r"}], key)
    with pytest.raises(ValueError, match="columns pair_id and answer"):
        score_reader_study([{"id": "a", "choice": "left"}], key)
    with pytest.raises(ValueError, match="adversarial 'left' or 'right'"):
        score_reader_study([{"pair_id": "a", "answer": "left"}], {"a": "up"})
    with pytest.raises(FileNotFoundError, match="answers"):
        score_reader_study("/nonexistent/answers.csv", key)


def test_config_entry_and_bad_options(study_data):
    model, task, data, attacks = study_data
    spec = validate_study({"study": "reader_study", "pairs": 3, "seed": 2})
    res = run_study("reader_study", spec, model, task, data, attacks)
    assert res.study == "reader_study" and len(res.rows) == 3
    with pytest.raises(ValueError, match="pairs"):
        validate_study({"study": "reader_study", "pairs": 0})
    with pytest.raises(ValueError, match="fewer than `pairs`"):
        reader_study(model, task, data, attacks, pairs=9)
    with pytest.raises(ValueError, match="at least one attack"):
        reader_study(model, task, data, {}, pairs=2)
    with pytest.raises(ValueError, match="show"):
        reader_study(model, task, data, attacks, show="both")
