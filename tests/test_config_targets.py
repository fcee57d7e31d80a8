"""Per-entry ``target`` (DAG types A, B and C side by side) and the DAG target kinds of ``target``."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from medadv import DAG, Segmentation, evaluate
from medadv.attacks.dag import dag_target_b, dag_target_c
from medadv.cli import main
from medadv.config import build_attacks, build_target_fn, build_target_fns, load_config
from medadv.tasks import MultiClass
from medadv.threats import Box


def _config(tmp_path, attacks, target=None):
    cfg = {"model": {"builder": "small_unet", "kwargs": {"ndim": 2, "num_classes": 3}},
           "task": {"type": "segmentation", "num_classes": 3},
           "data": {"source": "synthetic", "n": 4, "kwargs": {"kind": "segmentation_blobs", "size": 16, "ndim": 2,
                                                              "num_classes": 3}},
           "threat": {"norm": "linf", "bounds": [0, 1], "eps": 0.1}, "attacks": attacks, "cases": 0,
           "output": str(tmp_path / "out")}
    if target:
        cfg["target"] = target
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_dag_target_kinds_are_paschalis_types():
    task = Segmentation(num_classes=3)
    y = torch.zeros(2, 16, 16, dtype=torch.long)
    y[:, 4:12, 4:12] = 2
    y[:, 6:10, 6:10] = 1
    x, logits = torch.rand(2, 1, 16, 16), torch.randn(2, 3, 16, 16)
    pred = logits.argmax(1)
    b = build_target_fn("dag_b", task)(x, y, logits)
    # built on the clean prediction (issue 32: on the label map DAG also "repaired" every clean mistake)
    assert torch.equal(b, dag_target_b(y, generator=torch.Generator().manual_seed(0), prediction=pred)[0])
    assert torch.equal(b, build_target_fn("dag_b", task)(x, y, logits))  # the same draw every call
    assert torch.equal(build_target_fn("dag_c", task)(x, y, logits), dag_target_c(y, cls=1, prediction=pred)[0])
    with pytest.raises(ValueError, match="needs a segmentation task"):
        build_target_fn("dag_c", MultiClass())
    with pytest.raises(ValueError, match="did you mean 'dag_b'"):
        build_target_fn("dag_bb", task)


def test_each_entry_runs_with_its_own_target(tmp_path, recwarn):
    attacks = [{"name": "dag", "id": "dag-a", "steps": 3, "target": "background"},
               {"name": "dag", "id": "dag-b", "steps": 3, "target": "dag_b"},
               {"name": "dag", "id": "dag-c", "steps": 3, "target": "dag_c"}]
    p = _config(tmp_path, attacks)
    cfg = load_config(p)
    task = Segmentation(num_classes=3)
    atks = build_attacks(cfg, task)
    fns = build_target_fns(cfg, task, atks)
    assert {k: fns[k].__name__ for k in fns} == {"dag-a@0.1": "target:background", "dag-b@0.1": "target:dag_b_pred",
                                                 "dag-c@0.1": "target:dag_c_pred"}
    assert main(["evaluate", str(p), "--no-progress"]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert {r["attack"] for r in rows} == set(fns)
    # the same as evaluate() with one target function per attack, and each its own target
    x = torch.rand(2, 1, 16, 16)
    y = torch.zeros(2, 16, 16, dtype=torch.long)
    y[:, 3:13, 3:13] = 2
    y[:, 6:10, 6:10] = 1
    net = torch.nn.Conv2d(1, 3, 3, padding=1)
    dag = DAG(task, Box(0.0, 1.0), steps=2)
    seen = []

    def spy(kind):
        def fn(x, y, logits):
            seen.append(kind)
            return build_target_fn(kind, task)(x, y, logits)
        return fn
    evaluate(net, task, (x, y), {"a": dag, "c": dag}, target_fn={"a": spy("background"), "c": spy("dag_c")})
    assert seen == ["background", "dag_c"]


def test_a_targeted_entry_without_any_target_is_refused(tmp_path):
    p = _config(tmp_path, [{"name": "dag", "steps": 2}, {"name": "dag", "id": "dag-b", "steps": 2,
                                                         "target": "dag_b"}])
    assert main(["evaluate", str(p), "--no-progress"]) == 2
    with pytest.raises(ValueError, match="'dag'"):
        evaluate(torch.nn.Conv2d(1, 3, 1), Segmentation(num_classes=3),
                 (torch.rand(1, 1, 8, 8), torch.zeros(1, 8, 8, dtype=torch.long)),
                 {"dag": DAG(Segmentation(num_classes=3), Box(0.0, 1.0))},
                 target_fn={"other": build_target_fn("background", Segmentation(num_classes=3))})
