"""``model.train`` (fit a network to built-in data before it is evaluated, cached), ``models:`` (more networks for
the studies that compare models) and ``report:`` headings."""

from __future__ import annotations

import pytest
import torch
import yaml

from medadv.cli import main
from medadv.config import build_model, load_config
from medadv.config_schema import ConfigError
from medadv.tasks import MultiClass

NET = {"monai": "Classifier", "kwargs": {"in_shape": [1, 16, 16], "classes": 3, "channels": [4, 8], "strides": [2, 2]}}
TRAIN = {"data": {"source": "mni152", "n": 30, "kwargs": {"kind": "classes", "size": 16}}, "epochs": 6, "lr": 0.01}


def _config(tmp_path, **extra):
    cfg = {"model": {**NET, "name": "small", "train": TRAIN},
           "task": {"type": "multiclass", "class_names": ["grey matter", "white matter", "other brain"]},
           "data": {"source": "mni152", "n": 12, "kwargs": {"kind": "classes", "size": 16, "split": "test"}},
           "threat": {"norm": "linf", "bounds": [0, 1], "eps": 0.02}, "attacks": [{"name": "fgsm"}],
           "cases": 0, "output": "out", **extra}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _accuracy(model, split="test"):
    from medadv.data.mni152 import tissue_classes

    x, y = tissue_classes(60, size=16, split=split, seed=5)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def test_train_fits_the_network_and_caches_its_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDADV_CACHE", str(tmp_path / "cache"))
    spec = {**NET, "train": TRAIN, "seed": 0}
    with pytest.warns(UserWarning, match="weights are random"):
        untrained = build_model({**NET, "seed": 0}, task=MultiClass())
    model = build_model(spec, task=MultiClass())
    assert _accuracy(model) > max(_accuracy(untrained), 0.5)  # three classes: chance is 1/3
    files = list((tmp_path / "cache" / "trained").glob("*.pt"))
    assert len(files) == 1
    again = build_model(spec, task=MultiClass())  # loaded from the cache: the same weights
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    other = build_model({**spec, "train": {**TRAIN, "epochs": 1}}, task=MultiClass())  # another setting: trained anew
    assert len(list((tmp_path / "cache" / "trained").glob("*.pt"))) == 2
    assert not all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="needs the task"):
        build_model(spec)


def test_train_refuses_file_sources_and_bad_keys(tmp_path):
    p = _config(tmp_path)
    cfg = yaml.safe_load(p.read_text())
    cfg["model"]["train"]["data"] = {"source": "csv", "path": "x.csv"}
    cfg["model"]["train"]["epoch"] = 3
    p.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    text = str(e.value)
    assert "`model.train.data` must be a built-in source" in text and "did you mean `epochs`" in text


def test_models_feed_the_comparing_studies_and_titles_head_the_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEDADV_CACHE", str(tmp_path / "cache"))
    p = _config(tmp_path, models={"wide": {**NET, "kwargs": {**NET["kwargs"], "channels": [8, 8]}, "train": TRAIN}},
                studies=[{"study": "transfer", "title": "Table 2: black-box transfer"}],
                report={"title": "A paper in miniature", "results": "Table 1"})
    assert main(["evaluate", str(p), "--no-progress"]) == 0
    html = (tmp_path / "out" / "report.html").read_text()
    assert "A paper in miniature" in html and "Table 1 — Summary" in html
    assert "Table 2: black-box transfer — Transferability" in html
    import json

    rows = json.loads((tmp_path / "out" / "study_0_transfer.json").read_text())["rows"]
    assert {(r["surrogate"], r["target"]) for r in rows} == {(a, b) for a in ("small", "wide") for b in ("small", "wide")}


def test_a_comparing_study_without_models_and_a_name_clash_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="add `models:"):
        load_config(_config(tmp_path, studies=["transfer"]))
    with pytest.raises(ConfigError, match="the name of `model`"):
        load_config(_config(tmp_path, models={"small": NET}))


def test_an_attack_entry_can_have_its_own_budgets(tmp_path):
    from medadv.config import build_attacks

    p = _config(tmp_path, budgets=[0.01], attacks=[{"name": "pgd", "id": "pgd-1", "steps": 1, "budgets": ["2/255"]},
                                                   {"name": "pgd", "id": "pgd-4", "steps": 4, "budgets": ["4/255"]},
                                                   {"name": "fgsm"}])
    cfg = load_config(p)
    attacks = build_attacks(cfg, MultiClass())
    assert {k: (a.budget, getattr(a, "steps", None)) for k, a in attacks.items()} == {
        "pgd-1@0.00784314": (pytest.approx(2 / 255), 1), "pgd-4@0.0156863": (pytest.approx(4 / 255), 4),
        "fgsm@0.01": (0.01, 1)}  # FGSM is one step
    cfg_text = yaml.safe_load(p.read_text())
    cfg_text["attacks"][0]["budgets"] = [8]
    p.write_text(yaml.safe_dump(cfg_text))
    with pytest.raises(ConfigError, match="allow_large_budgets"):
        load_config(p)
