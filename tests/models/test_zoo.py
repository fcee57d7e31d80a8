"""medadv.models.zoo: published models by name, offline, with did-you-mean lookups and one-line refusals."""

from __future__ import annotations

import warnings

import pytest
import torch

from medadv.models import zoo
from medadv.models.deepbet import Deepbet, DeepbetBBox, deepbet_weights
from medadv.offline import no_network


def test_registry_lists_models_with_their_provenance():
    assert zoo.available_models() == ["deepbet", "deepbet-bbox", "robustbench"]
    for row in zoo.describe_models():
        for key in ("source", "licence", "paper", "input", "output", "requires"):
            assert row[key], (row["name"], key)
    entry = zoo.zoo_entry("DeepBET")  # case-insensitive, as the other registries
    assert entry.outputs == "probabilities" and "grey levels" in entry.input and "2024" in entry.paper
    assert entry.licence == "MIT"
    assert zoo.zoo_task("deepbet-bbox").outputs == "probabilities"
    assert zoo.zoo_entry("robustbench").outputs == "logits"


def test_unknown_name_and_parameter_get_did_you_mean():
    with pytest.raises(ValueError, match=r"unknown zoo model 'deepbett'; did you mean 'deepbet'\?"):
        zoo.load_model("deepbett")
    with pytest.raises(ValueError, match=r"unknown parameter `sise` for zoo model 'deepbet-bbox'; did you mean `size`"):
        zoo.load_model("deepbet-bbox", sise=64)
    with pytest.raises(ValueError, match=r"'robustbench' needs `name`, `model_dir`"):
        zoo.load_model("robustbench")


def test_load_model_reads_the_published_weights_offline():
    with no_network("while the zoo loaded"), warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation or random-weights warning reaches the user
        bbox = zoo.load_model("deepbet-bbox", size=64)
        full = zoo.load_model("deepbet", bbox_size=64, size=64)
    assert isinstance(bbox, DeepbetBBox) and isinstance(full, Deepbet)
    assert not bbox.training and not full.training and bbox.size == (64, 64, 64)
    files = deepbet_weights()
    for net, stage in ((bbox.net, "bbox"), (full.bbox.net, "bbox"), (full.net, "fine")):
        with warnings.catch_warnings():  # torch marks torch.jit.load deprecated
            warnings.simplefilter("ignore", FutureWarning)
            direct = torch.jit.load(str(files[stage]), map_location="cpu")
        assert sum(p.numel() for p in net.parameters()) == 2_126_258
        assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), direct.state_dict().values(),
                                                     strict=True))
    # the two stages are different networks
    assert not torch.equal(next(iter(full.net.parameters())), next(iter(full.bbox.net.parameters())))


def test_missing_deepbet_is_one_line_naming_the_install():
    for name in ("deepbet", "deepbet-bbox"):
        with pytest.raises(FileNotFoundError) as err:
            zoo.load_model(name, distribution="medadv-missing-deepbet")
        msg = str(err.value)
        assert "pip install deepbet==1.0.2" in msg and "\n" not in msg


def test_config_names_a_zoo_model_without_allow_code():
    from medadv.config import ConfigError, build_model, check_model, model_name

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # published weights: no "random weights" warning
        model = build_model({"zoo": "deepbet-bbox", "kwargs": {"size": [64, 64, 96]}}, allow_code=False)
    assert isinstance(model, DeepbetBBox) and model.size == (64, 64, 96)
    assert model_name({"zoo": "deepbet"}) == "zoo:deepbet"
    with pytest.raises(ConfigError, match=r"`model.zoo`: unknown zoo model 'deepbet_bbox'; did you mean 'deepbet-bbox'"):
        check_model({"zoo": "deepbet_bbox"}, allow_code=False)
    with pytest.raises(ConfigError, match=r"did you mean `bbox_size`"):
        check_model({"zoo": "deepbet", "kwargs": {"bbox_sise": 64}}, allow_code=False)
    with pytest.raises(ConfigError, match=r"exactly one of .*`zoo`"):
        check_model({"zoo": "deepbet", "monai": "UNet"})


def test_robustbench_is_reachable_through_the_zoo(tmp_path):
    # the adapter's loader, unchanged: a missing checkpoint names the file it expects
    with pytest.raises(FileNotFoundError, match=r"cifar10/Linf/Standard\.pt"):
        zoo.load_model("robustbench", name="Standard", model_dir=str(tmp_path))


def test_describe_model_says_what_it_is_and_whether_it_loads_here():
    text = zoo.describe_model("deepbet")
    assert "status:     ready (offline)" in text and "Computers in Biology and Medicine" in text
    assert "parameters: bbox_size, size, margin, distribution" in text
    assert zoo.missing("deepbet-bbox") is None


def test_validate_refuses_a_zoo_model_whose_package_is_missing(monkeypatch):
    import medadv.models.deepbet as deepbet_module
    from medadv.config import ConfigError, check_model

    real = deepbet_module.deepbet_weights
    monkeypatch.setattr(deepbet_module, "deepbet_weights", lambda distribution="": real("medadv-missing-deepbet"))
    assert "pip install deepbet==1.0.2" in (zoo.missing("deepbet") or "")
    with pytest.raises(ConfigError, match=r"`model.zoo` 'deepbet': .*pip install deepbet==1.0.2"):
        check_model({"zoo": "deepbet"}, allow_code=False)


def test_cli_lists_the_zoo_and_refuses_unknown_names_in_one_line(capsys):
    from medadv.cli import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in ("deepbet ", "deepbet-bbox", "robustbench")) and "licence: MIT" in out
    assert main(["models", "deepbet"]) == 0
    assert "status:     ready (offline)" in capsys.readouterr().out
    assert main(["models", "debpet"]) == 2
    err = capsys.readouterr().err
    assert err == ("medadv: error: unknown zoo model 'debpet'; did you mean 'deepbet'? "
                   "(available: deepbet, deepbet-bbox, robustbench)\n")
