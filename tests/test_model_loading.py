"""Models named in a config: MONAI / torchvision by name, a class in a file beside the config, TorchScript,
builders; checkpoints (layouts, prefixes, strict loading with short errors, corrupt files); seeded weights."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import medadv  # noqa: F401  (registers every attack)
from medadv.cli import main
from medadv.config import RandomWeightsWarning, build_model, check_model, load_config, model_name
from medadv.config_schema import ConfigError, validate_config
from medadv.models import save_checkpoint, small_cnn
from medadv.models.io import CheckpointError, load_checkpoint

UNET = {"monai": "UNet", "kwargs": {"spatial_dims": 3, "in_channels": 1, "out_channels": 3, "channels": [4, 8],
                                    "strides": [2], "num_res_units": 1}}
MYNET = '''
from pathlib import Path

import torch
from torch import nn

# a file named in a config runs when the model is built: this marker shows when
(Path(__file__).parent / "ran.marker").write_text("ran")


class TinyNet(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 3, width: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


def make_net(width: int = 4) -> nn.Module:
    return TinyNet(width=width)


def count() -> int:
    (Path(__file__).parent / "called.marker").write_text("called")
    return 3
'''


def _config(tmp_path, model, *, task=None, x=None, y=None, attacks=None, name="cfg.yaml", **over):
    """A config file in ``tmp_path`` with an .npz of ``x``/``y`` (4 random 2-D 3-class cases by default)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 1, 8, 8, generator=g) if x is None else x
    y = torch.randint(0, 3, (x.shape[0],), generator=g) if y is None else y
    np.savez(tmp_path / "data.npz", x=x.numpy(), y=y.numpy())
    cfg = {"model": model, "task": task or {"type": "multiclass"}, "data": {"source": "npz", "path": "data.npz"},
           "threat": {"norm": "linf", "bounds": [0.0, 1.0]}, "budgets": [0.05],
           "attacks": attacks or [{"name": "pgd", "steps": 2}], "batch_size": 2, "output": "out", **over}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def _evaluate(path, capsys):
    rc = main(["evaluate", str(path), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads((path.parent / "out" / "results.json").read_text())["rows"]


def _error(argv, capsys):
    """``main(argv)`` fails with exit 2; its ``medadv: error:`` lines, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("medadv: error: ")]
    assert lines, err
    return [line.removeprefix("medadv: error: ") for line in lines]


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- (a) MONAI by name, DataParallel prefixes ---------------------------------------------------------------------
def test_monai_network_by_name_with_a_module_prefixed_checkpoint(tmp_path, capsys):
    from monai.networks.nets import UNet

    torch.manual_seed(1)
    trained = UNet(spatial_dims=3, in_channels=1, out_channels=3, channels=(4, 8), strides=(2,), num_res_units=1)
    # nn.DataParallel saves every key under `module.`; a training script's dict holds it under `model`
    torch.save({"model": {f"module.{k}": v for k, v in trained.state_dict().items()}, "epoch": 3}, tmp_path / "dp.pt")
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(2, 1, 8, 8, 8, generator=g), torch.randint(0, 3, (2, 8, 8, 8), generator=g)
    seg = {"type": "segmentation", "num_classes": 3}
    path = _config(tmp_path, {**UNET, "checkpoint": "dp.pt"}, task=seg, x=x, y=y)
    # without strip_prefix: every key is listed as missing/unexpected (shortened) with the prefix to strip
    err = _error(["evaluate", str(path), "--no-progress"], capsys)
    text = "\n".join(err)
    assert err[0] == f"`model.checkpoint`: {tmp_path / 'dp.pt'} does not fit the model (UNet, strict loading):"
    n = len(trained.state_dict())
    assert f"{n} key(s) of the model missing in the checkpoint: model.0.conv.unit0.conv.weight" in text
    assert f"{n} unexpected key(s) in the checkpoint: module.model.0.conv.unit0.conv.weight" in text
    assert f"and {n - 10} more" in text and err[-1] == ("hint: the checkpoint's keys start with 'module.': give "
                                                        "`strip_prefix: module.`")
    assert len(text) < 1500 and not (tmp_path / "out").exists()
    # with it: the checkpoint's weights, and the volumes are evaluated
    path = _config(tmp_path, {**UNET, "checkpoint": "dp.pt", "strip_prefix": "module."}, task=seg, x=x, y=y)
    assert _same(_weights(build_model(load_config(path)["model"], str(tmp_path))), _weights(trained))
    rows = _evaluate(path, capsys)
    assert {r["attack"] for r in rows} == {"pgd@0.05"} and len(rows) == 2 and "adv_dice" in rows[0]
    assert model_name(load_config(path)["model"]) == "monai:UNet"


def test_monai_names_and_arguments_are_checked_without_building(monkeypatch):
    from medadv.models import loading

    def no_build(*a, **k):
        raise AssertionError("built")

    monkeypatch.setattr(loading, "call_builder", no_build)
    check_model(UNET)  # resolves, arguments fit: nothing built
    with pytest.raises(ConfigError, match=r"^`model.monai`: monai.networks.nets has no network 'UNett'; did you "
                                          r"mean 'UNet'\?"):
        check_model({**UNET, "monai": "UNett"})
    with pytest.raises(ConfigError, match=r"unknown key `chanels` in `model.kwargs`; did you mean `channels`\?"):
        check_model({"monai": "UNet", "kwargs": {**UNET["kwargs"], "chanels": [4]}})
    with pytest.raises(ConfigError, match=r"^`model.kwargs` lacks `in_channels`, `out_channels`, `channels`, "
                                          r"`strides` \(required; it takes spatial_dims, in_channels"):
        check_model({"monai": "UNet", "kwargs": {"spatial_dims": 3}})
    with pytest.raises(ConfigError, match=r"`model.kwargs.pretrained`: True would download weights"):
        check_model({"monai": "DenseNet121", "kwargs": {"spatial_dims": 2, "in_channels": 1, "out_channels": 2,
                                                        "pretrained": True}})


# --- (b) torchvision by name: nothing downloads ----------------------------------------------------------------
def test_torchvision_network_by_name_evaluates_and_never_downloads(tmp_path, capsys, monkeypatch):
    import torch.hub

    def no_download(*a, **k):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    g = torch.Generator().manual_seed(0)
    path = _config(tmp_path, {"torchvision": "resnet18", "kwargs": {"num_classes": 3}},
                   x=torch.rand(2, 3, 32, 32, generator=g), attacks=["fgsm"])
    with pytest.warns(RandomWeightsWarning, match="torchvision 'resnet18' has no `checkpoint`"):
        rows = _evaluate(path, capsys)
    assert len(rows) == 2 and rows[0]["attack"] == "fgsm@0.05"
    # LR-ASPP's backbone weights default to ImageNet's: the default is replaced, nothing is fetched
    with pytest.warns(RandomWeightsWarning):
        model = build_model({"torchvision": "segmentation.lraspp_mobilenet_v3_large", "kwargs": {"num_classes": 2}})
    assert type(model).__name__ == "LRASPP"
    for kwargs, key in (({"weights": "DEFAULT"}, "weights"), ({"weights_backbone": "IMAGENET1K_V1"}, "weights_backbone"),
                        ({"pretrained": True}, "pretrained")):
        with pytest.raises(ConfigError, match=rf"^`model.kwargs.{key}`: .* would download weights, and medadv "
                                              rf"downloads nothing: give `{key}: (null|false)`.* `model.checkpoint`"):
            check_model({"torchvision": "resnet18", "kwargs": kwargs})
    with pytest.raises(ConfigError, match=r"torchvision has no model 'resnet181'; did you mean 'resnet18'\?"):
        check_model({"torchvision": "resnet181"})


# --- (c) a class or function in a file beside the config ---------------------------------------------------------
def test_python_file_beside_the_config(tmp_path, capsys, monkeypatch):
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "mynet.py").write_text(MYNET)
    marker = tmp_path / "nets" / "ran.marker"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative to the config's folder, not the working directory
    path_before = list(sys.path)
    # validate reads the file, never runs it
    bad = _config(tmp_path, {"builder": "nets/mynet.py:TinyNett"}, name="bad.yaml")
    assert _error(["validate", str(bad)], capsys) == [
        "`model.builder` 'nets/mynet.py:TinyNett': mynet.py defines no 'TinyNett'; did you mean 'TinyNet'? "
        "(it defines Path, torch, nn, TinyNet, make_net, count)"]
    missing = _config(tmp_path, {"builder": "net/mynet.py:TinyNet"}, name="missing.yaml")
    assert _error(["validate", str(missing)], capsys) == [
        f"`model.builder`: file not found: {tmp_path / 'net' / 'mynet.py'} ('net/mynet.py' is relative to the "
        "config's folder) (expected a Python file)"]
    good = _config(tmp_path, {"builder": "nets/mynet.py:TinyNet", "kwargs": {"width": 6}})
    assert main(["validate", str(good)]) == 0
    with pytest.raises(FileNotFoundError, match="`model.checkpoint`: file not found"):  # found before the file runs
        build_model({"builder": "nets/mynet.py:TinyNet", "checkpoint": "nope.pt"}, str(tmp_path))
    with pytest.raises(ConfigError, match=r"name the class or function after a colon, 'nets/mynet.py:Name'"):
        check_model({"builder": "nets/mynet.py"}, str(tmp_path))
    assert not marker.exists()
    # evaluate imports it by path: a class ...
    with pytest.warns(RandomWeightsWarning):
        rows = _evaluate(good, capsys)
    assert len(rows) == 4 and marker.exists()
    assert sys.path == path_before and "mynet" not in sys.modules
    # ... or a function returning a module, with its keyword arguments checked
    with pytest.warns(RandomWeightsWarning):
        model = build_model({"builder": "nets/mynet.py:make_net", "kwargs": {"width": 5}}, str(tmp_path))
    assert type(model).__name__ == "TinyNet" and model.conv.out_channels == 5
    with pytest.raises(ConfigError, match=r"unknown key `widht` in `model.kwargs`; did you mean `width`\?"):
        build_model({"builder": "nets/mynet.py:make_net", "kwargs": {"widht": 5}}, str(tmp_path))
    # a function annotated to return something else is refused before it is called
    with pytest.raises(ConfigError, match=r"'nets/mynet.py:count' is a function annotated to return int, not an "
                                          r"nn.Module"):
        build_model({"builder": "nets/mynet.py:count"}, str(tmp_path))
    assert not (tmp_path / "nets" / "called.marker").exists()


def test_a_failing_file_is_one_line_naming_the_file_and_line(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("import torch\n\nimport no_such_module_xyz\n\nclass Net: ...\n")
    path = _config(tmp_path, {"builder": "broken.py:Net"})
    (msg,) = _error(["evaluate", str(path), "--no-progress"], capsys)
    assert msg == (f"`model.builder` 'broken.py:Net': running {tmp_path / 'broken.py'} at line 3 failed: "
                   "ModuleNotFoundError: No module named 'no_such_module_xyz'")


# --- builders: a config is code ---------------------------------------------------------------------------------
def test_builders_that_are_not_model_builders_are_refused():
    # refused before any call (a call without `command` would fail otherwise, with another message)
    for spec in ({"builder": "os:system"}, {"builder": "os:system", "kwargs": {"command": "true"}}):
        with pytest.raises(ConfigError, match=r"^`model.builder` 'os:system' is a built-in function, not an nn.Module "
                                              r"class or a Python function returning an nn.Module"):
            build_model(spec)
    with pytest.raises(ConfigError, match="is a built-in function"):
        check_model({"builder": "os:system"})  # already imported: looked at without importing anything
    with pytest.raises(ConfigError, match=r"'json:JSONDecoder' is the class JSONDecoder, which is not an nn.Module"):
        build_model({"builder": "json:JSONDecoder"})
    with pytest.raises(ConfigError, match=r"'json:dumps' returned a str, not an nn.Module"):
        build_model({"builder": "json:dumps", "kwargs": {"obj": 1}})
    with pytest.raises(ConfigError, match=r"'medadv.models.nets:small_cnn': building the model failed: "
                                          r"RuntimeError: Trying to create tensor with negative dimension -1"):
        build_model({"builder": "medadv.models.nets:small_cnn", "kwargs": {"width": -1}})
    # a builder from an importable module still works
    with pytest.warns(RandomWeightsWarning):
        model = build_model({"builder": "medadv.models.nets:small_cnn", "kwargs": {"width": 2}})
    assert isinstance(model, nn.Sequential) and not model.training


# --- (d) TorchScript -----------------------------------------------------------------------------------------------
def test_torchscript_model_runs_an_attack_like_the_eager_model(tmp_path, capsys):
    torch.manual_seed(0)
    eager_model = nn.Linear(16, 4).eval()
    x = torch.rand(8, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = eager_model(x).argmax(1)  # every clean prediction is right: what the attack changes shows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch marks torch.jit deprecated
        torch.jit.save(torch.jit.script(eager_model), str(tmp_path / "model.pt"))
    save_checkpoint(tmp_path / "cnn.pt", eager_model)
    attacks = [{"name": "pgd", "steps": 5}]
    scripted = _config(tmp_path, {"torchscript": "model.pt"}, x=x, y=y, attacks=attacks, budgets=[0.1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no random-weights warning, no deprecation noise
        model = build_model(load_config(scripted)["model"], str(tmp_path))
    assert isinstance(model, torch.jit.ScriptModule) and not model.training
    assert torch.allclose(model(x), eager_model(x), atol=1e-5)
    rows = _evaluate(scripted, capsys)
    eager = _config(tmp_path, {"builder": "torch.nn:Linear", "kwargs": {"in_features": 16, "out_features": 4},
                               "checkpoint": "cnn.pt"}, x=x, y=y, attacks=attacks, budgets=[0.1], output="out2",
                    name="eager.yaml", allow_code=True)
    assert main(["evaluate", str(eager), "--no-progress"]) == 0
    capsys.readouterr()
    eager_rows = json.loads((tmp_path / "out2" / "results.json").read_text())["rows"]
    assert all(r["clean_correct"] for r in rows)
    assert sum(r["adv_correct"] for r in rows) < len(rows)  # the attack works through the scripted model
    assert [(r["clean_correct"], r["adv_correct"]) for r in rows] == \
        [(r["clean_correct"], r["adv_correct"]) for r in eager_rows]
    # a state dict given as TorchScript, and arguments a TorchScript file cannot take
    path = _config(tmp_path, {"torchscript": "cnn.pt"}, name="wrong.yaml", output="out3")
    assert _error(["evaluate", str(path), "--no-progress"], capsys) == [
        f"`model.torchscript`: cannot load {tmp_path / 'cnn.pt'} as TorchScript (a state dict or other torch.save "
        "file): write one with torch.jit.save(torch.jit.script(model), path); a state dict goes in `checkpoint:` "
        "beside the network that reads it"]
    with pytest.raises(ConfigError, match=r"^`model` `kwargs` does not go with `torchscript`"):
        validate_config(yaml.safe_load(path.read_text()) | {"model": {"torchscript": "m.pt", "kwargs": {"a": 1}}})


# --- checkpoints ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["plain", "state_dict", "model", "model_state_dict"])
def test_checkpoint_layouts(tmp_path, layout):
    torch.manual_seed(3)
    src = small_cnn(1, 3, width=4)
    state = src.state_dict()
    torch.save(state if layout == "plain" else {layout: state, "optimizer": {"lr": 0.1}, "epoch": 7}, tmp_path / "c.pt")
    model = build_model({"builder": "small_cnn", "kwargs": {"num_outputs": 3, "width": 4}, "checkpoint": "c.pt"},
                        str(tmp_path))
    assert _same(_weights(model), _weights(src))


def test_wrong_architecture_error_is_short_and_names_the_keys(tmp_path):
    import torchvision

    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), tmp_path / "resnet.pt")
    spec = {"monai": "UNet", "kwargs": {**UNET["kwargs"], "channels": [4, 8, 16], "strides": [2, 2]},
            "checkpoint": "resnet.pt"}
    with pytest.raises(CheckpointError) as e:
        build_model(spec, str(tmp_path))
    msg = str(e.value)
    assert len(msg) < 1500, len(msg)
    lines = msg.splitlines()
    assert lines[0] == f"`model.checkpoint`: {tmp_path / 'resnet.pt'} does not fit the model (UNet, strict loading):"
    assert lines[1].startswith("26 key(s) of the model missing in the checkpoint: model.0.conv.unit0.conv.weight, ")
    assert lines[2].startswith("122 unexpected key(s) in the checkpoint: conv1.weight, bn1.weight, bn1.bias, ")
    assert lines[1].endswith("... and 16 more") and lines[2].endswith("... and 112 more") and len(lines) == 3
    # torch's own message names every key
    from monai.networks.nets import UNet

    with pytest.raises(RuntimeError) as torch_err:
        UNet(3, 1, 3, (4, 8, 16), (2, 2), num_res_units=1).load_state_dict(torch.load(tmp_path / "resnet.pt"))
    assert len(str(torch_err.value)) > 3 * len(msg)
    # same keys, other shapes: the mismatches with both shapes
    torch.save(small_cnn(1, 3, width=4).state_dict(), tmp_path / "w4.pt")
    with pytest.raises(CheckpointError) as e:
        build_model({"builder": "small_cnn", "kwargs": {"num_outputs": 3, "width": 8}, "checkpoint": "w4.pt"},
                    str(tmp_path))
    assert str(e.value).splitlines()[1].startswith(
        "7 shape mismatch(es): 0.weight (checkpoint (4, 1, 3, 3), model (8, 1, 3, 3)), 0.bias (checkpoint (4,), "
        "model (8,))")


def test_corrupt_missing_and_pickled_checkpoints_are_one_line(tmp_path, capsys):
    torch.save(small_cnn(1, 3, width=4).state_dict(), tmp_path / "good.pt")
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.pt").write_text("not a checkpoint\n")
    torch.save(small_cnn(1, 3, width=4), tmp_path / "whole.pt")  # a pickled module: code, refused
    model = {"builder": "small_cnn", "kwargs": {"num_outputs": 3, "width": 4}}
    for name in ("trunc.pt", "text.pt"):
        path = _config(tmp_path, {**model, "checkpoint": name})
        (msg,) = _error(["evaluate", str(path), "--no-progress"], capsys)
        assert msg.startswith(f"`model.checkpoint`: cannot read {tmp_path / name}: the file is corrupt or truncated, "
                              "or was not written by torch.save (")
        assert "weights_only" not in msg
    path = _config(tmp_path, {**model, "checkpoint": "whole.pt"})
    assert _error(["evaluate", str(path), "--no-progress"], capsys) == [
        f"`model.checkpoint`: {tmp_path / 'whole.pt'} holds a pickled Python object (torch.nn.modules.container."
        "Sequential), which medadv does not load (weights_only=True: a pickle can run code); save the weights "
        "instead: torch.save(model.state_dict(), path)"]
    path = _config(tmp_path, {**model, "checkpoint": "weights/best.pt"})
    expected = (f"`model.checkpoint`: file not found: {tmp_path / 'weights' / 'best.pt'} ('weights/best.pt' is "
                "relative to the config's folder)")
    assert _error(["validate", str(path)], capsys) == [expected]
    assert _error(["evaluate", str(path), "--no-progress"], capsys) == [expected]
    torch.save({"epoch": 3, "optimizer": {"lr": 0.1}}, tmp_path / "nostate.pt")
    with pytest.raises(CheckpointError, match=r"nostate.pt holds no state dict: .* it has keys 'epoch', 'optimizer'"):
        load_checkpoint(tmp_path / "nostate.pt", small_cnn(1, 3, width=4))
    with pytest.raises(FileNotFoundError, match=r"^checkpoint: file not found: expected checkpoint at /"):
        load_checkpoint(tmp_path / "nope.pt")


# --- random weights: seeded, said ----------------------------------------------------------------------------------
def test_random_weights_are_seeded_and_said(tmp_path):
    spec = {"builder": "small_cnn", "kwargs": {"num_outputs": 3, "width": 4}}
    rng = torch.get_rng_state()
    with pytest.warns(RandomWeightsWarning, match=r"no `checkpoint`: its weights are random, drawn with seed 0 "
                                                  r"\(the same every run\)"):
        a = _weights(build_model(spec))
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's random state is untouched
    with pytest.warns(RandomWeightsWarning):
        b = _weights(build_model(spec))
        c = _weights(build_model({**spec, "seed": 5}))
    assert _same(a, b) and not _same(a, c)
    # from a config file, the model's seed is the config's
    path = _config(tmp_path, spec, seed=5)
    assert load_config(path)["model"]["seed"] == 5
    with pytest.warns(RandomWeightsWarning, match="seed 5"):
        assert _same(_weights(build_model(load_config(path)["model"])), c)


def test_the_model_section_names_exactly_one_network():
    base = {"task": {"type": "multiclass"}, "data": {"source": "mni152"}, "threat": {"bounds": [0, 1]},
            "budgets": [0.1], "attacks": ["fgsm"]}

    def errors(model):
        with pytest.raises(ConfigError) as e:
            validate_config({**base, "model": model})
        return e.value.messages

    listed = "`builder`, `monai`, `torchvision`, `torchscript`, `zoo`"
    assert errors({"kwargs": {"a": 1}}) == [f"`model` needs exactly one of {listed} naming the network"]
    assert errors({"monai": "UNet", "torchvision": "resnet18"}) == [
        f"`model` needs exactly one of {listed} naming the network; got `monai` and `torchvision`"]
    (msg,) = errors({"bulder": "small_cnn"})  # one mistake, one line
    assert msg.startswith("unknown key `bulder` in `model`; did you mean `builder`?")
    (msg,) = errors({"monai": "UNet", "strip_prefx": "module."})
    assert msg.startswith("unknown key `strip_prefx` in `model`; did you mean `strip_prefix`?")
    assert errors({"builder": "small_cnn", "strip_prefix": "module."}) == [
        "`model` `strip_prefix` applies to the keys of a `checkpoint`, and none is given"]


# --- nothing downloads: pretrained arguments refused by name, any connection while building is an error --------------
def test_pretrained_arguments_are_refused_for_any_builder():
    for spec, key in (({"builder": "torchvision.models:resnet18", "kwargs": {"weights": "DEFAULT"}}, "weights"),
                      ({"builder": "torchvision.models.segmentation:fcn_resnet50",
                        "kwargs": {"weights_backbone": "IMAGENET1K_V1"}}, "weights_backbone"),
                      ({"builder": "monai.networks.nets:DenseNet121",
                        "kwargs": {"spatial_dims": 2, "in_channels": 1, "out_channels": 2, "pretrained": True}},
                       "pretrained")):
        for check in (check_model, build_model):
            with pytest.raises(ConfigError, match=rf"^`model.kwargs.{key}`: .* would download weights, and medadv "
                                                  "downloads nothing"):
                check(spec)
    # MONAI's EfficientNet defaults to pretrained=True: built from its module path too, the default is switched off
    with pytest.warns(RandomWeightsWarning):
        model = build_model({"builder": "monai.networks.nets:EfficientNetBN",
                             "kwargs": {"model_name": "efficientnet-b0", "spatial_dims": 2, "in_channels": 1,
                                        "num_classes": 2}})
    assert type(model).__name__ == "EfficientNetBN"


DOWNLOADER = '''
import urllib.request

from torch import nn


def Net() -> nn.Module:
    urllib.request.urlopen("http://203.0.113.7/weights.pt", timeout=5)  # a builder that fetches its weights
    return nn.Identity()
'''


def test_a_connection_while_the_model_is_built_is_a_clear_error(tmp_path):
    (tmp_path / "net.py").write_text(DOWNLOADER)
    with pytest.raises(ConfigError, match=r"^`model.builder` 'net.py:Net' tried to connect to 203.0.113.7:80 while "
                                          r"the model was built: medadv downloads nothing"):
        build_model({"builder": "net.py:Net"}, str(tmp_path))


def test_the_test_suite_itself_has_no_network():
    import socket

    with pytest.raises(RuntimeError, match="the test suite has no network"):
        socket.create_connection(("203.0.113.7", 80), timeout=5)
    with pytest.raises(RuntimeError, match="the test suite has no network"):
        socket.getaddrinfo("example.com", 443)
    # the local machine stays reachable (gloo on localhost, the browser test's Chromium)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(2)
        port = server.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            with socket.create_connection((host, port), timeout=5):
                pass
