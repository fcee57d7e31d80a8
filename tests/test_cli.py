import json
import re

import pytest
import torch
import yaml

from medadv.cli import main
from medadv.demo import DemoConfig, run_demo
from medadv.models import load_checkpoint, save_checkpoint, small_cnn


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
    # (the column is as wide as the longest parameter name)
    assert re.search(r"\n  steps +an integer >= 1; default 10\n", pgd)
    assert re.search(r"\n  step_size +None or a finite number >= 0; default None\n", pgd)
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
    with pytest.raises(ValueError, match="distinct `id`"):
        build_attacks({**base, "attacks": [{"name": "pgd", "steps": 2}, {"name": "pgd", "steps": 5}]}, MultiClass())
    two = build_attacks({**base, "attacks": [{"name": "pgd", "steps": 2}, {"name": "pgd", "label": "pgd5", "steps": 5}]},
                        MultiClass())
    assert two["pgd@0.1"].steps == 2 and two["pgd5@0.1"].steps == 5
    with pytest.raises(ValueError, match="budgets"):
        build_attacks({**base, "budgets": 0.1, "attacks": [{"name": "pgd"}]}, MultiClass())
    with pytest.raises(ValueError, match="bounds"):
        build_attacks({"threat": {"bounds": [0.0]}, "budgets": [0.1], "attacks": [{"name": "pgd"}]}, MultiClass())


# --- strict configs: every user mistake is one line `medadv: error: ...` and exit code 2 ----------------------------
def _small_config(tmp_path, with_y=True, **over):
    """A cheap valid multi-class config (tiny CNN, 4 random 8x8 images in an .npz) with ``over`` applied;
    a key mapped to ``None`` in ``over`` is removed."""
    import numpy as np

    g = torch.Generator().manual_seed(0)
    arrays = {"x": torch.rand(4, 1, 8, 8, generator=g).numpy()}
    if with_y:
        arrays["y"] = torch.randint(0, 3, (4,), generator=g).numpy()
    np.savez(tmp_path / "data.npz", **arrays)
    cfg = {
        "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 3, "width": 4}},
        "task": {"type": "multiclass"},
        "data": {"source": "npz", "path": "data.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": [0.05],
        "attacks": [{"name": "fgsm"}],
        "batch_size": 2,
        "output": "out",
    }
    for k, v in over.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _fails(capsys, argv, message):
    """``main(argv)`` exits 2 printing exactly ``medadv: error: <message>``: one line, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"medadv: error: {message}"], err
    assert "Traceback" not in err


def _check_evaluate_fails(tmp_path, capsys, message, **over):
    path = _small_config(tmp_path, **over)
    _fails(capsys, ["evaluate", str(path), "--no-progress"], message)
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


TOP_KEYS = ("model, task, data, threat, budgets, attacks, target, batch_size, output, seed, hd95, spacing, inference, "
            "save_adversarial, cases, allow_code, allow_large_budgets, studies, models, report")


def test_misspelt_top_level_key_is_an_error_with_the_closest_key(tmp_path, capsys):
    _check_evaluate_fails(tmp_path, capsys, "unknown key `bacth_size` in the config; did you mean `batch_size`? "
                    f"(valid keys: {TOP_KEYS})", bacth_size=1)


def test_budget_instead_of_budgets_is_an_error(tmp_path, capsys):
    # it used to fall back silently on threat.eps
    _check_evaluate_fails(tmp_path, capsys, "unknown key `budget` in the config; did you mean `budgets`? "
                    f"(valid keys: {TOP_KEYS})", budget=[0.1], budgets=None, threat={"bounds": [0, 1], "eps": 0.01})


def test_negative_batch_size_is_an_error(tmp_path, capsys):
    _check_evaluate_fails(tmp_path, capsys, "`batch_size` must be >= 1; got -2 (int)", batch_size=-2)


def test_zero_batch_size_is_an_error(tmp_path, capsys):
    _check_evaluate_fails(tmp_path, capsys, "`batch_size` must be >= 1; got 0 (int)", batch_size=0)


def test_empty_attacks_is_an_error(tmp_path, capsys):
    _check_evaluate_fails(tmp_path, capsys, "`attacks` must be a non-empty list such as [{name: pgd, steps: 10}]; got []",
                    attacks=[])


def test_zero_cases_is_an_error(tmp_path, capsys):
    _check_evaluate_fails(tmp_path, capsys, "`data.n` must be >= 1; got 0 (int)",
                    data={"source": "mni152", "n": 0, "kwargs": {"size": 8}})


def test_hd95_as_text_is_an_error_not_true(tmp_path, capsys):
    _check_evaluate_fails(tmp_path, capsys, "`hd95` must be true or false (a YAML boolean, not text); got 'false' (str)",
                    hd95="false")


def test_misspelt_threat_norm_is_an_error_with_the_closest_option(tmp_path, capsys):
    _check_evaluate_fails(tmp_path, capsys, "`threat.norm` must be one of 'linf', 'l2'; got 'linff' (str); "
                    "did you mean 'linf'?", threat={"norm": "linff", "bounds": [0, 1]})


def test_npz_without_labels_is_an_error(tmp_path, capsys):
    _check_evaluate_fails(tmp_path, capsys, "`data.path`: data.npz has no array 'y' (it has 'x'); an .npz for medadv "
                    "holds x (inputs) and y (labels)", with_y=False)


def test_unknown_attack_parameter_is_one_line(tmp_path, capsys):
    # attack entries are checked by the attack's own declarations
    _check_evaluate_fails(tmp_path, capsys, "`attacks` entry 'pgd': unknown parameter `stepz` for attack 'pgd'; "
                    "did you mean 'steps'? valid parameters: " + ", ".join(
                        __import__("medadv").attacks.base.attack_class("pgd").param_names()),
                    attacks=[{"name": "pgd", "stepz": 3}])


def test_invalid_yaml_is_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {builder: small_cnn\ntask: [\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"medadv: error: {path}: not valid YAML at line ")


def test_fraction_budgets_run_and_equal_the_fraction(tmp_path, capsys):
    from medadv.config import load_config

    path = _small_config(tmp_path, budgets=["8/255"])
    text = path.read_text()
    assert "- 8/255" in text  # written unquoted: YAML reads it as the text '8/255'
    path.write_text(text + "\n")
    assert load_config(path)["budgets"] == [8 / 255]
    path.write_text(text.replace("- 8/255", "- '4/255'\n- 0.05\n- 0.5"))  # 1 is more than half of [0, 1]
    assert load_config(path)["budgets"] == [4 / 255, 0.05, 0.5]
    path.write_text(text)
    assert main(["evaluate", str(path), "--no-progress"]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert {r["budget"] for r in rows} == {8 / 255} and len(rows) == 4
    capsys.readouterr()
    _fails(capsys, ["validate", str(_small_config(tmp_path, budgets=["8/0"]))],
           "`budgets[0]` must be a number or a fraction such as 8/255; got '8/0' (str)")


def test_bare_attack_names_are_accepted(tmp_path, capsys):
    # `- fgsm` is `- {name: fgsm}`
    path = _small_config(tmp_path, attacks=["fgsm", {"name": "pgd", "steps": 2}], budgets=[0.05, 0.1])
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.strip() == (f"OK: {path}: 4 attack runs (fgsm@0.05, fgsm@0.1, pgd@0.05, "
                                               "pgd@0.1)")


def test_validate_reports_every_mistake_without_running(tmp_path, capsys):
    path = _small_config(tmp_path, with_y=False, attacks=[{"name": "pgd", "stepz": 3}, "dag"],
                         model={"builder": "small_cnnn", "checkpoint": "missing.pt"})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert all(line.startswith("medadv: error: ") for line in err)
    assert len(err) == 3, err
    assert "`attacks` entry 'pgd': unknown parameter `stepz` for attack 'pgd'; did you mean 'steps'?" in err[0]
    assert "`model.builder`: unknown model builder 'small_cnnn'; did you mean 'small_cnn'?" in err[1]
    assert "has no array 'y'" in err[2]
    assert not (tmp_path / "out").exists()
    # schema errors come all at once, one line each
    path = _small_config(tmp_path, bacth_size=1, hd95="yes", data={"source": "npz", "path": "data.npz", "n": 0})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [e.split(";")[0] for e in err] == ["medadv: error: unknown key `bacth_size` in the config",
                                              "medadv: error: `data.n` must be >= 1",
                                              "medadv: error: `hd95` must be true or false (a YAML boolean, not text)"]


def test_validate_checks_targets_and_model_files(tmp_path, capsys):
    path = _small_config(tmp_path, task={"type": "segmentation", "num_classes": 3}, attacks=["dag"],
                         model={"builder": "small_unet", "checkpoint": "nope.pt"})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("medadv: error: attack(s) dag@0.05 are targeted; give `target: background | least_likely | "
                      "package.module:function` in the config")
    assert err[1].startswith("medadv: error: `model.checkpoint`: file not found: ") and len(err) == 2
    path = _small_config(tmp_path, target="no_such_module_xyz:fn")
    # trust is decided first, from the text (finding a module imports its package); then the module is looked for
    _fails(capsys, ["validate", str(path)], "`target` 'no_such_module_xyz:fn' is code outside medadv, monai, "
           "torchvision: pass --allow-code (or set `allow_code: true` in the config) if you trust it: a config "
           "that names code runs it")
    _fails(capsys, ["validate", str(path), "--allow-code"], "`target` 'no_such_module_xyz:fn': no module "
           "'no_such_module_xyz' to import (give 'package.module:function' importable from here)")


def test_debug_shows_the_traceback(tmp_path, capsys):
    path = _small_config(tmp_path, batch_size=0)
    for argv in (["--debug", "evaluate", str(path)], ["evaluate", str(path), "--debug"], ["validate", str(path), "--debug"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and "ConfigError" in err
        assert err.splitlines()[-1] == "medadv: error: `batch_size` must be >= 1; got 0 (int)"
    assert main(["validate", str(path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_evaluate_runs_auto_from_a_yaml_config(trained_multilabel, tmp_path, capsys):
    """`auto` from a config: one row per sample and budget, the member table in the summary and the report."""
    import numpy as np

    save_checkpoint(tmp_path / "cnn.pt", trained_multilabel.model)
    np.savez(tmp_path / "data.npz", x=trained_multilabel.x[:8].numpy(), y=trained_multilabel.y[:8].numpy())
    cfg = {
        "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 4, "width": 8},
                  "checkpoint": "cnn.pt"},
        "task": {"type": "multilabel"},
        "data": {"source": "npz", "path": "data.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": ["2/255", "8/255"],
        "attacks": [{"name": "auto", "version": "fast", "steps": 3, "queries": 10}],
        "output": "out",
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "worst case after each member" in out and "apgd-flip" in out
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Worst case after each member" in report and "## Gradient-masking checks" in report
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert len({r["attack"] for r in rows}) == 2 and {r["budget"] for r in rows} == {2 / 255, 8 / 255}
    assert all(len(r["attack_metric_after"]) == 4 for r in rows)
    cfg["attacks"] = [{"name": "auto", "version": "fast", "atacks": ["apgd-ce"]}]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(tmp_path / "bad.yaml"), "--no-progress"]) == 2
    assert "did you mean 'attacks'" in capsys.readouterr().err


# --- your own data from files: NIfTI through MONAI, per-case rows, HD95 in millimetres -------------------------------
SPACING = (2.0, 2.0, 3.0)


def _nifti_config(tmp_path, n=3, size=12, **over):
    """A 3-D segmentation config on ``n`` NIfTI volumes (2 x 2 x 3 mm voxels) with a saved random small UNet."""
    import nibabel as nib
    import numpy as np

    from medadv.models import small_unet

    rng = np.random.default_rng(0)
    for sub in ("images", "labels"):
        (tmp_path / sub).mkdir(exist_ok=True)
    zz = np.indices((size,) * 3).sum(0)
    for i in range(n):
        img = (rng.random((size,) * 3) * 0.2 + (zz > size + i) * 0.6).astype(np.float32)
        lab = (zz > size + i).astype(np.uint8) + (zz > size + 8).astype(np.uint8)
        affine = np.diag([*SPACING, 1.0])
        nib.save(nib.Nifti1Image(img, affine), tmp_path / "images" / f"sub{i}.nii.gz")
        nib.save(nib.Nifti1Image(lab, affine), tmp_path / "labels" / f"sub{i}.nii.gz")
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "unet.pt", small_unet(1, 3, ndim=3, channels=(4, 8)))
    cfg = {
        "model": {"builder": "small_unet", "kwargs": {"in_channels": 1, "num_classes": 3, "ndim": 3,
                                                      "channels": [4, 8]}, "checkpoint": "unet.pt"},
        "task": {"type": "segmentation", "num_classes": 3},
        "data": {"source": "files", "images": "images/*.nii.gz", "labels": "labels/*.nii.gz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": ["4/255"],
        "attacks": [{"name": "pgd", "steps": 2}],
        "batch_size": 2,
        "hd95": True,
        "output": "out",
        **over,
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _rows(tmp_path, out="out"):
    return json.loads((tmp_path / out / "results.json").read_text())["rows"]


def test_evaluate_nifti_files_per_case_rows_with_hd95_in_mm(tmp_path, capsys):
    import nibabel as nib

    from medadv.metrics.segmentation import hd95_per_class
    from medadv.models import small_unet

    path = _nifti_config(tmp_path)
    assert main(["evaluate", str(path), "--no-progress"]) == 0
    rows = _rows(tmp_path)
    assert [r["case_id"] for r in rows] == ["sub0.nii.gz", "sub1.nii.gz", "sub2.nii.gz"]
    model = small_unet(1, 3, ndim=3, channels=(4, 8))
    load_checkpoint(tmp_path / "unet.pt", model)
    model.eval()
    for r in rows:
        x = torch.from_numpy(nib.load(tmp_path / "images" / r["case_id"]).get_fdata()).float()[None, None]
        y = torch.from_numpy(nib.load(tmp_path / "labels" / r["case_id"]).get_fdata()).long()[None]
        with torch.no_grad():
            pred = model(x).argmax(1)
        mm = hd95_per_class(pred, y, 3, SPACING)[0].tolist()
        voxels = hd95_per_class(pred, y, 3, None)[0].tolist()
        assert r["clean_hd95"] == pytest.approx([None if v != v else v for v in mm], nan_ok=True)
        assert any(a == a and b == b and abs(a - b) > 0.1 for a, b in zip(mm, voxels, strict=True)), "spacing made no difference"
    meta = json.loads((tmp_path / "out" / "results.json").read_text())["meta"]
    assert meta["config_fingerprint"] == json.loads((tmp_path / "out" / "run.json").read_text())["fingerprint"]
    assert meta["settings"]["data"]["source"] == "files"


def test_an_output_folder_is_resumed_or_protected_never_overwritten(tmp_path, capsys):
    path = _nifti_config(tmp_path, hd95=False)
    assert main(["evaluate", str(path), "--no-progress"]) == 0
    first = (tmp_path / "out" / "results.json").read_text()
    log_lines = (tmp_path / "out" / "log.jsonl").read_text().count("\n")
    capsys.readouterr()
    # the same config and data: resumed, every row reused from the log, nothing recomputed
    assert main(["evaluate", str(path), "--no-progress"]) == 0
    assert "resuming into" in capsys.readouterr().err
    assert (tmp_path / "out" / "log.jsonl").read_text().count("\n") == log_lines
    assert json.loads((tmp_path / "out" / "results.json").read_text())["rows"] == json.loads(first)["rows"]
    # another config: stopped with one line, the results untouched
    cfg = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**cfg, "budgets": ["8/255"]}))
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith(f"medadv: error: output folder {tmp_path / 'out'} holds results of another config or "
                          "other data (fingerprint ") and err.endswith("pass --overwrite to replace them, or give "
                                                                       "another `output` (or --output)")
    assert (tmp_path / "out" / "results.json").read_text() == first
    # other data (a label file changed): stopped too
    path.write_text(yaml.safe_dump(cfg))
    lab = tmp_path / "labels" / "sub1.nii.gz"
    lab.write_bytes(lab.read_bytes())
    import os

    os.utime(lab, ns=(lab.stat().st_atime_ns, lab.stat().st_mtime_ns + 10**9))
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    assert "holds results of another config or other data" in capsys.readouterr().err
    # --overwrite replaces them
    path.write_text(yaml.safe_dump({**cfg, "budgets": ["8/255"]}))
    assert main(["evaluate", str(path), "--no-progress", "--overwrite"]) == 0
    assert {r["budget"] for r in _rows(tmp_path)} == {8 / 255}
    assert "4/255" not in (tmp_path / "out" / "log.jsonl").read_text() and (tmp_path / "out" / "run.json").is_file()
    # a folder with results but no run.json (another tool, an older medadv): stopped
    (tmp_path / "out" / "run.json").unlink()
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    assert "holds results of an unknown run (no run.json)" in capsys.readouterr().err


def test_the_seed_is_set_before_the_model_is_built(tmp_path, capsys):
    # no checkpoint: the random weights follow the config's seed, the same in every run
    import warnings

    path = _small_config(tmp_path, attacks=[{"name": "pgd", "steps": 2}])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["evaluate", str(path), "--no-progress", "--output", str(tmp_path / "a")]) == 0
        assert main(["evaluate", str(path), "--no-progress", "--output", str(tmp_path / "b")]) == 0
        path.write_text(path.read_text() + "seed: 3\n")
        assert main(["evaluate", str(path), "--no-progress", "--output", str(tmp_path / "c")]) == 0

    def scores(out):
        return [(r["clean_pred"], r["adv_pred"], r["linf"]) for r in _rows(tmp_path, out)]

    assert scores("a") == scores("b") != scores("c")


def test_code_outside_medadv_monai_torchvision_runs_only_when_allowed(tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "net.py").write_text(
        "import torch\n\nclass Net(torch.nn.Sequential):\n    def __init__(self):\n"
        "        super().__init__(torch.nn.Flatten(), torch.nn.Linear(64, 3))\n")
    (tmp_path / "cfgdir").mkdir()
    path = _small_config(tmp_path / "cfgdir", model={"builder": "../elsewhere/net.py:Net"})
    message = (f"`model.builder` '../elsewhere/net.py:Net' is a Python file outside the config's folder "
               f"({tmp_path / 'elsewhere' / 'net.py'}): pass --allow-code (or set `allow_code: true` in the config) "
               "if you trust it: a config that names code runs it")
    _fails(capsys, ["evaluate", str(path), "--no-progress"], message)
    _fails(capsys, ["validate", str(path)], message)
    assert not (tmp_path / "cfgdir" / "out").exists()
    assert main(["validate", str(path), "--allow-code"]) == 0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["evaluate", str(path), "--no-progress", "--allow-code"]) == 0
        path.write_text(path.read_text() + "allow_code: true\n")  # the config's own flag
        assert main(["evaluate", str(path), "--no-progress", "--output", str(tmp_path / "o2")]) == 0
    capsys.readouterr()
    # an importable module outside medadv, MONAI and torchvision; `target` functions likewise
    _fails(capsys, ["validate", str(_small_config(tmp_path, model={"builder": "torch.nn:Identity"}))],
           "`model.builder` 'torch.nn:Identity' is code outside medadv, monai, torchvision: pass --allow-code (or set "
           "`allow_code: true` in the config) if you trust it: a config that names code runs it")
    _fails(capsys, ["validate", str(_small_config(tmp_path, model={"builder": "os:system"}))],
           "`model.builder` 'os:system' is code outside medadv, monai, torchvision: pass --allow-code (or set "
           "`allow_code: true` in the config) if you trust it: a config that names code runs it")
    path = _small_config(tmp_path, task={"type": "segmentation", "num_classes": 3}, target="json:dumps",
                         model={"builder": "medadv.models.nets:small_unet"})
    _fails(capsys, ["validate", str(path)], "`target` 'json:dumps' is code outside medadv, monai, torchvision: pass "
           "--allow-code (or set `allow_code: true` in the config) if you trust it: a config that names code runs it")


def test_missing_data_files_and_unknown_transforms_are_one_line(tmp_path, capsys):
    path = _nifti_config(tmp_path, data={"source": "files", "images": "imgs/*.nii.gz", "labels": "labels/*.nii.gz"})
    _fails(capsys, ["evaluate", str(path), "--no-progress"],
           f"`data.images`: no file matches 'imgs/*.nii.gz' (in {tmp_path / 'imgs'})")
    assert not (tmp_path / "out").exists()
    data = {"source": "files", "images": "images/*.nii.gz", "labels": "labels/*.nii.gz",
            "transforms": [{"name": "ScaleIntensityRanged", "a_min": 0, "a_max": 1, "b_min": 0, "b_max": 1},
                           {"name": "Orientationdd", "axcodes": "RAS"}]}
    path = _nifti_config(tmp_path, data=data)
    _fails(capsys, ["evaluate", str(path), "--no-progress"],
           "`data.transforms[1]`: unknown MONAI transform 'Orientationdd'; did you mean 'Orientationd'? "
           "(monai.transforms lists them; dictionary transforms end in 'd')")
    data["transforms"][1] = {"name": "Orientationd", "axcodes": "RAS", "keyz": ["image"]}
    path = _nifti_config(tmp_path, data=data)
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("medadv: error: unknown key `keyz` in `data.transforms[1]`; did you mean `keys`?")
    assert not (tmp_path / "out").exists()
    # a file that cannot be read: one line naming the case
    (tmp_path / "images" / "sub1.nii.gz").write_bytes(b"broken")
    path = _nifti_config(tmp_path, n=0)
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"medadv: error: case sub1.nii.gz ({tmp_path / 'images' / 'sub1.nii.gz'}): ")


def test_whole_volumes_through_sliding_window_inference(tmp_path, capsys):
    from medadv.models import small_unet
    from medadv.models.sliding import SlidingWindow

    path = _nifti_config(tmp_path, size=20, hd95=False,
                         inference={"roi_size": 12, "overlap": 0.25, "sw_batch_size": 2, "mode": "constant"})
    assert main(["evaluate", str(path), "--no-progress"]) == 0
    rows = _rows(tmp_path)
    assert len(rows) == 3 and all(r["linf"] <= 4 / 255 + 1e-6 for r in rows)
    # the clean Dice is the sliding-window model's, on the whole 20^3 volume
    import nibabel as nib

    from medadv.tasks import Segmentation

    model = small_unet(1, 3, ndim=3, channels=(4, 8))
    load_checkpoint(tmp_path / "unet.pt", model)
    sw = SlidingWindow(model.eval(), 12, overlap=0.25, sw_batch_size=2, mode="constant")
    x = torch.from_numpy(nib.load(tmp_path / "images" / "sub0.nii.gz").get_fdata()).float()[None, None]
    y = torch.from_numpy(nib.load(tmp_path / "labels" / "sub0.nii.gz").get_fdata()).long()[None]
    with torch.no_grad():
        dice = Segmentation(3).metrics(sw(x), y)["mean_dice"]
    assert rows[0]["clean_mean_dice"] == pytest.approx(float(dice), abs=1e-6)


def test_save_adversarial_writes_the_examples_beside_the_results(tmp_path, capsys):
    path = _nifti_config(tmp_path, n=2, hd95=False, save_adversarial=True)
    assert main(["evaluate", str(path), "--no-progress"]) == 0
    rows = _rows(tmp_path)
    saved = sorted(p.relative_to(tmp_path / "out" / "adversarial") for p in (tmp_path / "out" / "adversarial").rglob("*")
                   if p.is_file())
    assert len(saved) == 2 and all(str(p).endswith(".nii.gz") for p in saved)
    assert all("saved_file" in r for r in rows)


def test_torchrun_two_processes_equal_one_and_only_rank0_writes(tmp_path, capsys):
    """`torchrun --nproc_per_node 2 -m medadv.cli evaluate` (gloo on CPUs): each rank logs its shard, rank 0
    writes the results, which equal a 1-process run row for row and value for value."""
    import os
    import subprocess
    import sys
    import warnings

    path = _small_config(tmp_path, attacks=[{"name": "pgd", "steps": 2}], batch_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["evaluate", str(path), "--no-progress", "--output", str(tmp_path / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "medadv.cli", "evaluate", str(path), "--no-progress", "--output", str(tmp_path / "two")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote ") == 1  # rank 0 alone reports and writes
    one, two = _rows(tmp_path, "one"), _rows(tmp_path, "two")
    assert len(one) == 4 and one == two
    assert sorted(p.name for p in (tmp_path / "two").glob("log*.jsonl")) == ["log.rank0.jsonl", "log.rank1.jsonl"]


def test_evaluate_runs_the_config_studies_and_writes_report_html(trained_multilabel, tmp_path, capsys):
    import numpy as np

    from medadv.studies import StudyResult

    save_checkpoint(tmp_path / "cnn.pt", trained_multilabel.model)
    np.savez(tmp_path / "data.npz", x=trained_multilabel.x[:24].numpy(), y=trained_multilabel.y[:24].numpy())
    cfg = {
        "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 4, "width": 8},
                  "checkpoint": "cnn.pt"},
        "task": {"type": "multilabel", "threshold": 0.5},
        "data": {"source": "npz", "path": "data.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": [0.2],
        "attacks": [{"name": "pgd", "steps": 5}],
        "batch_size": 12,
        "output": "out",
        "studies": ["classwise", {"study": "noise_baseline", "match": "l2"}],
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 0
    out = tmp_path / "out"
    cw = StudyResult.from_json(out / "study_0_classwise.json")
    nb = StudyResult.from_json(out / "study_1_noise_baseline.json")
    assert cw.study == "classwise" and nb.study == "noise_baseline"
    # the attack hurts the labels more than L2-matched random noise does (Paschali et al.'s baseline)
    assert all(r["adv_metric"] < r["noise_metric"] for r in nb.rows)
    cfps = [r["cfps_adv"] for r in cw.rows if r["cfps_adv"] is not None]
    assert cfps and abs(sum(cfps) - 1.0) < 1e-6  # shares of all false positives over the labels
    html = (out / "report.html").read_text()
    assert "<img" in html and "classwise" in html.lower().replace("-", "").replace(" ", "")
    assert "report.html" in capsys.readouterr().out


def test_studies_mistakes_are_one_line(tmp_path, capsys):
    from medadv.studies import STUDY_SPECS

    names = ", ".join(repr(n) for n in STUDY_SPECS)
    _check_evaluate_fails(tmp_path, capsys, f"`studies[0].study` must be one of {names}; got 'classwize'; "
                          "did you mean 'classwise'?", studies=["classwize"])
    _check_evaluate_fails(tmp_path, capsys, "`studies`: 'transfer' compare several models, and the config names "
                          "one: add `models: {name: {monai: ..., ...}}` (more networks by name)", studies=["transfer"])


# --- issue 19: budgets in data units, output-folder errors, run records, code trust, symlinks -------------------------
def test_a_budget_in_the_wrong_units_is_one_line_unless_allowed(tmp_path, capsys):
    # 8 meant 8/255 on data in [0, 1]: the ball would be the whole box, and the results would mean nothing
    path = _small_config(tmp_path, budgets=[0.05, 8])
    message = ("`budgets[1]` is 8, more than half the data range [0, 1] (`threat.bounds`): budgets are in data "
               "units, e.g. use 8/255 for 8 on a 0-255 scale; set `allow_large_budgets: true` if you mean it")
    _fails(capsys, ["validate", str(path)], message)
    _fails(capsys, ["evaluate", str(path), "--no-progress"], message)
    assert not (tmp_path / "out").exists()
    path.write_text(path.read_text() + "allow_large_budgets: true\n")
    assert main(["validate", str(path)]) == 0


def test_an_os_error_writing_the_outputs_is_one_line_naming_the_path(tmp_path, capsys, monkeypatch):
    import errno

    from medadv.results import Results

    def full(path, rows):  # a full disk: write() fails without a file name
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Results, "append_log", staticmethod(full))
    path = _small_config(tmp_path)
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"medadv: error: cannot write into the output folder {tmp_path / 'out'}: No space "
                                "left on device"], err
    monkeypatch.undo()
    # a file that cannot be written names itself (read-only folder, permissions): one line too

    def read_only(path, rows):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(Results, "append_log", staticmethod(read_only))
    assert main(["evaluate", str(path), "--no-progress", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"medadv: error: cannot write {tmp_path / 'out' / 'log.jsonl'}: Permission denied"]


def test_validate_checks_the_output_folder_can_be_created(tmp_path, capsys):
    (tmp_path / "afile").write_text("not a folder")
    path = _small_config(tmp_path, output="afile/out")
    _fails(capsys, ["validate", str(path)], f"`output` {tmp_path / 'afile' / 'out'} cannot be created: "
           f"{tmp_path / 'afile'} is a file, not a folder")
    path = _small_config(tmp_path, output="afile")
    _fails(capsys, ["validate", str(path)], f"`output` {tmp_path / 'afile'} is a file, not a folder")
    # a folder that can be created is not left behind by validate
    path = _small_config(tmp_path, output="new/deeper/out")
    assert main(["validate", str(path)]) == 0
    assert not (tmp_path / "new").exists()


def test_validate_says_when_the_output_folder_is_not_writable(tmp_path, capsys, monkeypatch):
    import errno
    import tempfile

    (tmp_path / "out").mkdir()
    real = tempfile.TemporaryFile

    def refused(*a, **k):
        if str(k.get("dir", "")) == str(tmp_path / "out"):
            raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "out" / "tmpxyz"))
        return real(*a, **k)

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    _fails(capsys, ["validate", str(_small_config(tmp_path))],
           f"`output` {tmp_path / 'out'} is not writable: Read-only file system")


def test_long_config_values_are_clipped_in_errors(tmp_path, capsys):
    key, value = "k" * 10_000, "v" * 10_000
    path = _small_config(tmp_path, **{key: 1})
    assert main(["validate", str(path)]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert "…(10000 chars)" in err and len(err) < 400, err[:500]
    path = _small_config(tmp_path, target=value)
    assert main(["validate", str(path)]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert "…(10002 chars)" in err and len(err) < 400, err[:500]  # the repr's quotes count


def _finished_run(tmp_path, capsys):
    """A finished 1-process run into ``out`` (pgd, 4 samples, one per batch); returns the config path."""
    import warnings

    path = _small_config(tmp_path, attacks=[{"name": "pgd", "steps": 2}], batch_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["evaluate", str(path), "--no-progress"]) == 0
    capsys.readouterr()
    return path


def test_rank_logs_without_a_run_record_are_resumed_when_their_rows_match(tmp_path, capsys, monkeypatch):
    """A SIGKILLed torchrun can leave `log.rank1.jsonl` and no `run.json`: its rows of this config are resumed
    (not refused as an unknown run, not thrown away by --overwrite); rows of anything else still stop the run."""
    import warnings

    from medadv.results import Results

    path = _finished_run(tmp_path, capsys)
    out = tmp_path / "out"
    first = _rows(tmp_path)
    lines = (out / "log.jsonl").read_text().splitlines()
    for p in list(out.iterdir()):
        p.unlink()
    (out / "log.rank1.jsonl").write_text("\n".join(lines[:3]) + "\n")  # rank 1 had logged 3 of the 4 rows
    written = []
    monkeypatch.setattr(Results, "append_log", staticmethod(lambda p, rows: written.extend(rows)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["evaluate", str(path), "--no-progress"]) == 0
    assert "resuming into" in capsys.readouterr().err
    assert len(written) == 1  # only the missing row was computed
    assert _rows(tmp_path) == first
    assert (out / "run.json").is_file()
    # rows of other settings beside no run record: still an unknown run
    for p in list(out.iterdir()):
        p.unlink()
    other = [json.dumps({**json.loads(line), "config": "0123456789abcdef"}) for line in lines]
    (out / "log.rank1.jsonl").write_text("\n".join(other) + "\n")
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    assert "holds results of an unknown run (no run.json)" in capsys.readouterr().err


def test_the_run_record_is_written_before_any_row(tmp_path, capsys, monkeypatch):
    from medadv.results import Results

    real = Results.append_log
    seen = []

    def append(p, rows):
        record = json.loads((tmp_path / "out" / "run.json").read_text())  # there, complete, before the first row
        seen.append(record["fingerprint"])
        real(p, rows)

    monkeypatch.setattr(Results, "append_log", staticmethod(append))
    _finished_run(tmp_path, capsys)
    assert len(seen) == 4 and len(set(seen)) == 1
    assert not list((tmp_path / "out").glob(".run.json*"))  # no temporary file left


def test_a_builder_or_target_outside_the_allow_list_is_refused_before_it_is_imported(tmp_path, capsys, monkeypatch):
    pkg = tmp_path / "site" / "evilpkg"
    pkg.mkdir(parents=True)
    marker = tmp_path / "imported.marker"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    (pkg / "sub.py").write_text("import torch\n\ndef X():\n    return torch.nn.Identity()\n\ndef fn(x, y, l):\n"
                                "    return y\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    import sys

    try:
        for over in ({"model": {"builder": "evilpkg.sub:X"}},
                     {"target": "evilpkg.sub:fn", "attacks": [{"name": "pgd", "steps": 1, "targeted": True}]}):
            path = _small_config(tmp_path, **over)
            for cmd in (["validate", str(path)], ["evaluate", str(path), "--no-progress"]):
                assert main(cmd) == 2
                assert "is code outside medadv, monai, torchvision: pass --allow-code" in capsys.readouterr().err
                assert not marker.exists(), (over, cmd)
    finally:
        for name in [m for m in sys.modules if m == "evilpkg" or m.startswith("evilpkg.")]:
            del sys.modules[name]


def test_pretrained_weights_are_refused_whatever_names_the_builder(tmp_path, capsys):
    for model, key in (({"builder": "torchvision.models:resnet18", "kwargs": {"weights": "DEFAULT"}}, "weights"),
                       ({"builder": "monai.networks.nets:DenseNet121",
                         "kwargs": {"spatial_dims": 2, "in_channels": 1, "out_channels": 3, "pretrained": True}},
                        "pretrained")):
        path = _small_config(tmp_path, model=model)
        for cmd in (["validate", str(path)], ["evaluate", str(path), "--no-progress"]):
            assert main(cmd) == 2
            (err,) = capsys.readouterr().err.splitlines()
            assert err.startswith(f"medadv: error: `model.kwargs.{key}`: ") and "would download weights" in err
            assert "`model.checkpoint`" in err


def test_symlinks_in_the_output_folder_leading_outside_are_refused(tmp_path, capsys):
    path = _nifti_config(tmp_path, n=2, hd95=False, save_adversarial=True)
    assert main(["evaluate", str(path), "--no-progress"]) == 0
    capsys.readouterr()
    adv = tmp_path / "out" / "adversarial"
    (sub,) = [p for p in adv.iterdir() if p.is_dir()]
    import shutil

    shutil.rmtree(sub)
    outside = tmp_path / "outside"
    outside.mkdir()
    sub.symlink_to(outside, target_is_directory=True)
    (tmp_path / "out" / "log.jsonl").unlink()  # the rows are recomputed: their files are written again
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith(f"medadv: error: {sub} is a symbolic link to {outside}, outside the output folder")
    assert list(outside.iterdir()) == []


def test_a_nan_input_error_names_its_case(tmp_path, capsys):
    import nibabel as nib
    import numpy as np

    path = _nifti_config(tmp_path, hd95=False)
    img = tmp_path / "images" / "sub1.nii.gz"
    vol = nib.load(img)
    data = vol.get_fdata().astype(np.float32)
    data[3, 4, 5] = np.nan
    nib.save(nib.Nifti1Image(data, vol.affine), img)
    _fails(capsys, ["evaluate", str(path), "--no-progress"], "`x` contains NaN or Inf values in case sub1.nii.gz "
           "(check the file and the `transforms`)")
    # arrays without file names: the sample's number
    import numpy as np

    path = _small_config(tmp_path)
    with np.load(tmp_path / "data.npz") as arr:
        x, y = arr["x"].copy(), arr["y"]
    x[2, 0, 1, 1] = np.inf
    np.savez(tmp_path / "data.npz", x=x, y=y)
    _fails(capsys, ["evaluate", str(path), "--no-progress", "--output", str(tmp_path / "o2")],
           "`x` contains NaN or Inf values in case sample 2 (check the file and the `transforms`)")
