import json

import torch
import yaml

from medadv.cli import main
from medadv.demo import DemoConfig, run_demo
from medadv.models import save_checkpoint, small_cnn


def test_attacks_command_lists_the_registry(capsys):
    from medadv.attacks.base import available_attacks

    assert main(["attacks"]) == 0
    out = capsys.readouterr().out
    for name in ("fgsm", "bim", "pgd", "cospgd", "segpgd", *available_attacks()):
        assert name in out


def test_attacks_params_lists_each_declared_parameter(capsys):
    assert main(["attacks", "--params", "pgd", "vafa"]) == 0
    out = capsys.readouterr().out
    pgd, vafa = out.split("\n\nvafa: ")
    assert "threat: Linf or L2 ball (one run per budget)" in pgd
    assert "  steps         an integer >= 1; default 10" in pgd
    assert "step_size     None or a finite number >= 0; default None" in pgd
    assert "the data box (no ε: one run, budget None)" in vafa and "block" in vafa
    # every parameter of every attack, from the declarations
    from medadv.attacks.base import attack_class, available_attacks

    assert main(["attacks", "--params"]) == 0
    out = capsys.readouterr().out
    for name in available_attacks():
        assert f"{name}: " in out
        for p in attack_class(name).param_names():
            assert f"  {p} " in out, (name, p)
    assert main(["attacks", "--params", "pgdd"]) == 2
    assert "did you mean 'pgd'" in capsys.readouterr().err


def test_evaluate_runs_box_and_targeted_attacks_once_with_their_outputs(tmp_path, capsys):
    import numpy as np

    g = torch.Generator().manual_seed(0)
    np.savez(tmp_path / "vol.npz", x=torch.rand(2, 1, 8, 8, 8, generator=g).numpy(),
             y=torch.randint(0, 3, (2, 8, 8, 8), generator=g).numpy())
    cfg = {
        "model": {"builder": "small_unet", "kwargs": {"in_channels": 1, "num_classes": 3, "ndim": 3,
                                                      "channels": [4, 8]}},
        "task": {"type": "segmentation", "num_classes": 3},
        "data": {"source": "npz", "path": "vol.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": [0.02, 0.05],
        "attacks": [{"name": "vafa", "steps": 1, "block": 8}, {"name": "dag", "steps": 2}, "fgsm"],
        "output": "out",
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    # DAG is targeted by nature: without `target` the command says what to add
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 2
    assert "`target: background | least_likely" in capsys.readouterr().err
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({**cfg, "target": "background"}))
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    per = {}
    for r in rows:
        per.setdefault((r["attack"], r["budget"]), []).append(r)
    # VAFA has no ε: one run with budget None, not one per budget
    assert sorted(per, key=str) == sorted([("vafa", None), ("dag@0.02", 0.02), ("dag@0.05", 0.05),
                                           ("fgsm@0.02", 0.02), ("fgsm@0.05", 0.05)], key=str)
    assert all(len(v) == 2 for v in per.values())
    assert all("attack_iterations" in r for r in per[("dag@0.05", 0.05)])
    main_table, details = out.split("attack-specific outputs (means):")
    assert "vafa" in main_table and "attack_iterations" in details and "fgsm" not in details.split("wrote")[0]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Attack-specific outputs" in report and "attack_fooled_fraction" in report


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
