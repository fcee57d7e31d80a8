import json

import torch
import yaml

from medadv.cli import main
from medadv.demo import DemoConfig, run_demo
from medadv.models import save_checkpoint, small_cnn


def test_attacks_command_lists_the_registry(capsys):
    assert main(["attacks"]) == 0
    out = capsys.readouterr().out
    for name in ("fgsm", "bim", "pgd", "cospgd", "segpgd"):
        assert name in out


def test_evaluate_command_runs_a_yaml_config(trained_multilabel, tmp_path, capsys):
    save_checkpoint(tmp_path / "cnn.pt", trained_multilabel.model)
    torch.save({"x": trained_multilabel.x}, tmp_path / "unused.pt")
    import numpy as np

    np.savez(tmp_path / "data.npz", x=trained_multilabel.x.numpy(), y=trained_multilabel.y.numpy())
    cfg = {
        "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 4, "width": 8},
                  "checkpoint": "cnn.pt"},
        "task": {"type": "multilabel", "threshold": 0.5},
        "data": {"source": "npz", "path": "data.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": [0.05, 0.2],
        "attacks": [{"name": "fgsm"}, {"name": "pgd", "steps": 5}],
        "batch_size": 16,
        "output": "out",
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 0
    out_dir = tmp_path / "out"
    res = json.loads((out_dir / "results.json").read_text())
    assert {r["attack"] for r in res["rows"]} == {"fgsm@0.05", "fgsm@0.2", "pgd@0.05", "pgd@0.2"}
    acc = {r["attack"]: [] for r in res["rows"]}
    for r in res["rows"]:
        acc[r["attack"]].append(r["adv_label_accuracy"])
    assert sum(acc["pgd@0.2"]) < sum(acc["pgd@0.05"])  # a bigger budget hurts more
    assert (out_dir / "report.md").is_file() and (out_dir / "robustness.png").stat().st_size > 1000
    assert "pgd@0.2" in capsys.readouterr().out
    _ = small_cnn  # the builder named in the config


def test_demo_runs_end_to_end_on_real_mni152_and_caches(tmp_path):
    cfg = DemoConfig(patch=16, spacing_mm=4, n_train=4, n_test=2, epochs=2, batch_size=2, channels=(4, 8),
                     budgets=(8 / 255,), steps=2)
    said = []
    out = run_demo(cfg, cache=tmp_path, progress=False, echo=said.append)
    assert any("trained here because no pretrained" in s for s in said)
    summary = out["results"].summary()
    assert [r["attack"] for r in summary] == ["fgsm@8/255", "pgd@8/255", "cospgd@8/255", "segpgd@8/255"]
    assert all(len(r["adv_dice"]) == 4 for r in summary)
    said.clear()
    run_demo(cfg, cache=tmp_path, progress=False, echo=said.append)
    assert any(s.startswith("loaded cached model") for s in said)


def test_config_errors_name_the_problem():
    import pytest

    from medadv.config import build_attacks
    from medadv.tasks import MultiClass

    base = {"threat": {"norm": "linf", "bounds": [0.0, 1.0]}, "budgets": [0.1]}
    with pytest.raises(ValueError, match="distinct `label`"):
        build_attacks({**base, "attacks": [{"name": "pgd", "steps": 2}, {"name": "pgd", "steps": 5}]}, MultiClass())
    two = build_attacks({**base, "attacks": [{"name": "pgd", "steps": 2}, {"name": "pgd", "label": "pgd5", "steps": 5}]},
                        MultiClass())
    assert two["pgd@0.1"].steps == 2 and two["pgd5@0.1"].steps == 5
    with pytest.raises(ValueError, match="budgets"):
        build_attacks({**base, "budgets": 0.1, "attacks": [{"name": "pgd"}]}, MultiClass())
    with pytest.raises(ValueError, match="bounds"):
        build_attacks({"threat": {"bounds": [0.0]}, "budgets": [0.1], "attacks": [{"name": "pgd"}]}, MultiClass())
