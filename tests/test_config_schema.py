"""The `medadv evaluate` config schema: types, ranges, unknown keys with the closest valid one, budgets."""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import medadv  # noqa: F401  (registers every attack)
from medadv import config as config_mod
from medadv.config import build_attacks, build_data, build_task, check_data, check_model, load_config
from medadv.config_schema import (
    ConfigError,
    MultiLabelTask,
    SegmentationTask,
    parse_budget,
    validate_config,
)
from medadv.tasks import MultiClass, MultiLabel, Segmentation, available_tasks

BASE = {"model": {"builder": "small_cnn"}, "task": {"type": "multiclass"}, "data": {"source": "mni152"},
        "threat": {"norm": "linf", "bounds": [0, 1]}, "budgets": [0.1], "attacks": ["fgsm"]}


def _errors(**over):
    with pytest.raises(ConfigError) as e:
        validate_config(yaml.safe_load(yaml.safe_dump({**BASE, **over})))
    assert str(e.value) == "\n".join(e.value.messages)
    return e.value.messages


def test_documented_configs_stay_valid():
    # the example in medadv.config's docstring and the config block of the guide (docs/evaluate.md)
    doc = config_mod.__doc__ or ""
    block = doc.split("Example::", 1)[1].split("\n\n")[1]
    cfg = validate_config(yaml.safe_load(inspect.cleandoc("\n" + block)))
    assert cfg.budget_list() == [0.0157, 0.0627] and cfg.batch_size == 4 and cfg.target == "background"
    assert [a.name for a in cfg.attacks] == ["fgsm", "pgd", "pgd", "vafa", "dag"]
    assert cfg.attacks[2].id == "pgd-50" and cfg.attacks[2].params() == {"steps": 50}
    guide = (Path(__file__).parents[1] / "docs" / "evaluate.md").read_text(encoding="utf-8")
    m = re.search(r"## Evaluation from a config\s+```yaml\n(.*?)```", guide, re.S)
    assert m, "docs/evaluate.md's config block moved"
    cfg = validate_config(yaml.safe_load(m.group(1)))
    assert cfg.hd95 is False and cfg.seed == 0 and cfg.output == "results/"


@pytest.mark.parametrize(("over", "message"), [
    ({"bacth_size": 1}, "unknown key `bacth_size` in the config; did you mean `batch_size`?"),
    ({"attack": ["fgsm"], "attacks": None}, "unknown key `attack` in the config; did you mean `attacks`?"),
    ({"model": {"builder": "small_cnn", "kwarg": {}}}, "unknown key `kwarg` in `model`; did you mean `kwargs`?"),
    ({"task": {"type": "segmentation", "num_classes": 3, "include_backgroud": True}},
     "unknown key `include_backgroud` in `task`; did you mean `include_background`?"),
    ({"data": {"source": "mni152", "nn": 2}}, "unknown key `nn` in `data`; did you mean `n`?"),
    ({"threat": {"bound": [0, 1]}}, "unknown key `bound` in `threat`; did you mean `bounds`?"),
    ({"threat": {"norm": "L-inf", "bounds": [0, 1]}}, "`threat.norm` must be one of 'linf', 'l2'; got 'L-inf' (str); "
                                                      "did you mean 'linf'?"),
    ({"task": {"type": "segmentatio", "num_classes": 3}},  # every registered kind, built-in ones first
     f"`task.type` must be one of {', '.join(map(repr, available_tasks()))}; got 'segmentatio' (str); did you mean "
     "'segmentation'?"),
    ({"data": {"source": "nifti", "path": "x"}}, "`data.source` must be one of 'mni152', 'synthetic', 'npz', 'files', "
                                                 "'datalist', 'csv'; got 'nifti' (str)"),
    ({"data": {"source": "datalist", "path": "d.json", "keys": "test"}},
     "unknown key `keys` in `data`; did you mean `key`?"),
    ({"data": {"source": "files", "image": "*.nii.gz"}}, "unknown key `image` in `data`; did you mean `images`?"),
    ({"inference": {"roi_size": 96, "overlapp": 0.5}}, "unknown key `overlapp` in `inference`; did you mean `overlap`?"),
])
def test_unknown_keys_and_options_name_the_closest_valid_one(over, message):
    over = {k: v for k, v in over.items() if v is not None}
    cfg = {**BASE, **over}
    if "attack" in over:
        cfg.pop("attacks")
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert e.value.messages[0].startswith(message), e.value.messages
    assert len(e.value.messages) == 1 or "attack" in over  # `attack` also leaves `attacks` missing


def test_every_mistake_is_reported_once():
    msgs = _errors(bacth_size=1, batch_size=0, hd95="false", data={"source": "npz", "path": "a.npz", "n": 0},
                   budgets=[0.1, "x"])
    assert [m.split(";")[0] for m in msgs] == [
        "unknown key `bacth_size` in the config", "`data.n` must be >= 1", "`budgets[1]` must be a number or a "
        "fraction such as 8/255", "`batch_size` must be >= 1", "`hd95` must be true or false (a YAML boolean, not text)"]


@pytest.mark.parametrize(("value", "expected"), [
    ("8/255", 8 / 255), ("4 / 255", 4 / 255), (0.03, 0.03), (1, 1.0), ("0.5", 0.5), ("1e-3", 1e-3), (0, 0.0)])
def test_budgets_accept_numbers_and_fractions(value, expected):
    assert parse_budget(value) == expected
    wide = {"norm": "linf", "bounds": [0, 255]}  # 1 is more than half of [0, 1]: see the large-budget test
    assert validate_config({**BASE, "budgets": [value], "threat": wide}).budgets == [expected]


@pytest.mark.parametrize("value", ["8/0", "abc", True, -0.1, "-1/255", math.nan, math.inf, None, [1]])
def test_budgets_refuse_what_is_not_a_finite_number_at_least_zero(value):
    (msg,) = _errors(budgets=[value])
    assert msg.startswith("`budgets[0]` must be a ")


def test_fraction_budgets_from_yaml_text_and_threat_eps():
    text = yaml.safe_dump({**BASE, "budgets": None}).replace("budgets: null", "budgets: [8/255, '4/255', 0.1]")
    assert validate_config(yaml.safe_load(text)).budgets == [8 / 255, 4 / 255, 0.1]
    # no `budgets`: the ball attacks use threat.eps, also given as a fraction
    cfg = {"threat": {"bounds": [0, 1], "eps": "2/255"}, "attacks": ["pgd"]}
    built = build_attacks(cfg, MultiClass())
    assert list(built) == ["pgd@0.00784314"] and built["pgd@0.00784314"].threat.eps == 2 / 255
    assert _errors(budgets=[])[0] == "`budgets` must be a non-empty list; got []"


@pytest.mark.parametrize(("key", "value", "message"), [
    ("hd95", "false", "`hd95` must be true or false (a YAML boolean, not text); got 'false' (str)"),
    ("hd95", 1, "`hd95` must be true or false (a YAML boolean, not text); got 1 (int)"),
    ("batch_size", "4", "`batch_size` must be an integer; got '4' (str)"),
    ("batch_size", 4.0, "`batch_size` must be an integer; got 4.0 (float)"),
    ("batch_size", True, "`batch_size` must be an integer; got True (bool)"),
    ("seed", 1.5, "`seed` must be an integer; got 1.5 (float)"),
    ("attacks", "fgsm", "`attacks` must be a list; got 'fgsm' (str)"),
    ("threat", {"bounds": [0]}, "`threat.bounds` must have at least 2 entries; got [0]"),
    ("threat", {"bounds": [1, 0]}, "`threat.bounds` must be [lo, hi] with finite lo < hi, or null; got [1.0, 0.0]"),
    ("threat", {"norm": "l2"}, "`threat.bounds` is required"),
    ("task", {"type": "multilabel", "threshold": 1.5}, "`task.threshold` must be < 1.0; got 1.5 (float)"),
    ("task", {"type": "segmentation", "num_classes": 1}, "`task.num_classes` must be >= 2; got 1 (int)"),
    ("task", {"type": "segmentation"}, "`task.num_classes` is required"),
    ("task", {"num_classes": 3}, "`task` needs `type`"),
    ("model", "small_cnn", "`model` must be a mapping; got 'small_cnn' (str)"),
    ("data", {"source": "npz"}, "`data.path` is required"),
    ("attacks", [{"steps": 3}], "each entry of `attacks` needs a `name`, got {'steps': 3} (in `attacks[0]`)"),
])
def test_types_and_ranges(key, value, message):
    assert _errors(**{key: value}) == [message]


def test_valid_values_and_defaults():
    cfg = validate_config({**BASE, "hd95": True, "spacing": [1, 1, 2.5], "threat": {"bounds": None},
                           "task": {"type": "Multi_Label"}, "data": {"source": "NPZ", "path": "d.npz"}})
    assert cfg.hd95 is True and cfg.spacing == [1.0, 1.0, 2.5] and cfg.threat.bounds is None
    assert isinstance(cfg.task, MultiLabelTask) and cfg.task.type == "multilabel" and cfg.data.source == "npz"
    d = validate_config(BASE).model_dump()
    assert (d["batch_size"], d["seed"], d["hd95"], d["target"], d["output"]) == (8, 0, False, None, "medadv-results")
    assert d["data"] == {"source": "mni152", "n": 8, "kwargs": {}}


def test_task_sections_mirror_the_task_constructors():
    # the schema's task fields are the constructors' arguments, with the same defaults (plus `class_names`, which
    # names the classes in the report and is not an argument of the task)
    for model, cls in ((SegmentationTask, Segmentation), (MultiLabelTask, MultiLabel)):
        sig = inspect.signature(cls.__init__).parameters
        fields = {k: f for k, f in model.model_fields.items() if k not in ("type", "class_names")}
        assert list(fields) == [p for p in sig if p != "self"], cls
        for name, f in fields.items():
            default = sig[name].default
            assert (f.is_required() and default is inspect.Parameter.empty) or f.default == default, (cls, name)
    seg = build_task({"type": "segmentation", "num_classes": 4, "loss": "DiceCE", "squared_pred": True})
    assert isinstance(seg, Segmentation) and "loss='dicece'" in repr(seg) and seg.squared_pred is True
    assert isinstance(build_task({"type": "multi_class"}), MultiClass)


def test_model_and_data_keyword_arguments_are_checked_without_building(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key `widht` in `model.kwargs`; did you mean `width`\?"):
        check_model({"builder": "small_cnn", "kwargs": {"widht": 4}})
    with pytest.raises(ConfigError, match=r"unknown model builder 'small_unett'; did you mean 'small_unet'\?"):
        check_model({"builder": "small_unett"})
    check_model({"builder": "small_cnn", "kwargs": {"width": 4}})
    with pytest.raises(ConfigError, match=r"unknown key `sise` in `data.kwargs`; did you mean `size`\?"):
        check_data({"source": "mni152", "n": 2, "kwargs": {"sise": 8}})
    with pytest.raises(ConfigError, match=r"`data.kwargs.kind` must be one of .*did you mean 'multiclass_blobs'\?"):
        check_data({"source": "synthetic", "kwargs": {"kind": "multiclas_blobs"}})
    with pytest.raises(FileNotFoundError, match="data file not found"):
        check_data({"source": "npz", "path": "nope.npz"}, str(tmp_path))
    np.savez(tmp_path / "d.npz", x=np.zeros((5, 1, 4, 4), np.float32), y=np.arange(5))
    check_data({"source": "npz", "path": "d.npz"}, str(tmp_path))
    x, y = build_data({"source": "npz", "path": "d.npz", "n": 3}, str(tmp_path))  # the first n cases
    assert x.shape == (3, 1, 4, 4) and x.dtype == torch.float32 and y.tolist() == [0, 1, 2]
    x, y = build_data({"source": "synthetic", "n": 2, "kwargs": {"kind": "multiclass_blobs", "size": 8}})
    assert x.shape[0] == 2


def test_load_config_fills_defaults_and_reports_yaml_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(BASE).replace("- 0.1", "- 8/255"))
    cfg = load_config(p)
    assert cfg["budgets"] == [8 / 255] and cfg["batch_size"] == 8 and cfg["_dir"] == str(tmp_path.resolve())
    assert cfg["attacks"] == [{"name": "fgsm", "id": None, "label": None, "budgets": None, "target": None}]
    p.write_text("- a list\n- not a mapping\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(p)
    p.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line 2, column 1"):
        load_config(p)


def test_documented_model_sections_stay_valid():
    # each `model:` line of medadv.config's docstring fits the schema; the library ones resolve
    from medadv.config_schema import ModelSection, validate_section

    doc = config_mod.__doc__ or ""
    block = doc.split("``model`` names the network", 1)[1].split("::", 1)[1].split("\n\n")[1]
    entries = re.split(r"\n(?=model:)", inspect.cleandoc("\n" + block))
    kinds = []
    for text in entries:
        spec = yaml.safe_load(text)["model"]
        kind, name = validate_section(ModelSection, spec).network()
        kinds.append(kind)
        if kind in ("monai", "torchvision") or ":" not in name and kind == "builder":
            check_model(spec)
    assert kinds == ["builder", "monai", "torchvision", "builder", "builder", "torchscript", "zoo"]


def test_file_sources_and_their_defaults():
    cfg = validate_config({**BASE, "data": {"source": "files", "images": "img/*.nii.gz", "labels": ["a.nii", "b.nii"]}})
    assert cfg.data.model_dump() == {"source": "files", "images": "img/*.nii.gz", "labels": ["a.nii", "b.nii"],
                                     "transforms": None, "n": None, "num_workers": 0,
                                     "pair": {"image": "{id}", "label": "{id}"}}  # by file name (issue 28)
    cfg = validate_config({**BASE, "data": {"source": "datalist", "path": "dataset.json", "transforms": [
        "EnsureChannelFirstd", {"name": "Spacingd", "pixdim": [1, 1, 1]}]}})
    assert cfg.data.key == "validation" and cfg.data.base_dir is None
    assert [t.name for t in cfg.data.transforms] == ["EnsureChannelFirstd", "Spacingd"]
    assert cfg.data.transforms[1].args() == {"pixdim": [1, 1, 1]}
    cfg = validate_config({**BASE, "data": {"source": "csv", "path": "labels.csv"}})
    assert (cfg.data.image_column, cfg.data.label_columns, cfg.data.label_column) == ("image", None, None)
    assert _errors(data={"source": "csv", "path": "l.csv", "label_columns": ["a"], "label_column": "b"}) == [
        "`data` give `label_columns` (multi-label, 0/1 each) or `label_column` (one class index), not both"]
    for bad in ([], "", 5, ["a.nii", 5]):
        assert _errors(data={"source": "files", "images": bad}) == [
            f"`data.images` must be a path or a glob, or a non-empty list of them; got {bad!r}"
            + (f" ({type(bad).__name__})" if not isinstance(bad, list) else "")]
    assert _errors(data={"source": "csv", "path": "l.csv", "num_workers": -1}) == [
        "`data.num_workers` must be >= 0; got -1 (int)"]


@pytest.mark.parametrize(("inference", "message"), [
    ({"roi_size": 0}, "`inference.roi_size` must be an integer >= 1 or a list of them, one per spatial axis (voxels); "
                      "got 0 (int)"),
    ({"roi_size": [96, 96, 96, 96]}, "`inference.roi_size` must be an integer >= 1 or a list of them, one per spatial "
                                     "axis (voxels); got [96, 96, 96, 96]"),
    ({"roi_size": "96"}, "`inference.roi_size` must be an integer >= 1 or a list of them, one per spatial axis "
                         "(voxels); got '96' (str)"),
    ({"roi_size": 96, "overlap": 1.0}, "`inference.overlap` must be < 1.0; got 1.0 (float)"),
    ({"roi_size": 96, "sw_batch_size": 0}, "`inference.sw_batch_size` must be >= 1; got 0 (int)"),
    ({"roi_size": 96, "mode": "gausian"}, "`inference.mode` must be one of 'gaussian', 'constant'; got 'gausian' (str); "
                                          "did you mean 'gaussian'?"),
    ({"overlap": 0.5}, "`inference.roi_size` is required"),
])
def test_inference_section_types_and_ranges(inference, message):
    assert _errors(inference=inference) == [message]


def test_inference_save_adversarial_and_allow_code_defaults():
    d = validate_config(BASE).model_dump()
    assert (d["inference"], d["save_adversarial"], d["allow_code"]) == (None, False, False)
    cfg = validate_config({**BASE, "inference": {"roi_size": [96, 96, 64]}, "save_adversarial": True,
                           "allow_code": True})
    assert cfg.inference.model_dump() == {"roi_size": [96, 96, 64], "overlap": 0.5, "sw_batch_size": 4,
                                          "mode": "gaussian", "checkpoint": True}
    assert _errors(allow_code="yes") == ["`allow_code` must be true or false (a YAML boolean, not text); got 'yes' (str)"]
    assert _errors(save_adversarial=1) == [
        "`save_adversarial` must be true or false (a YAML boolean, not text); got 1 (int)"]


def test_budgets_larger_than_half_the_data_range_are_refused_unless_allowed():
    """Budgets are in data units: 8 on [0, 1] data is a mistake for 8/255 (the ball would be the whole box)."""
    msgs = _errors(budgets=["8/255", 8])
    assert msgs == ["`budgets[1]` is 8, more than half the data range [0, 1] (`threat.bounds`): budgets are in data "
                    "units, e.g. use 8/255 for 8 on a 0-255 scale; set `allow_large_budgets: true` if you mean it"]
    (msg,) = _errors(budgets=None, threat={"bounds": [-1000, 1000], "eps": 1500})
    assert msg.startswith("`threat.eps` is 1500, more than half the data range [-1000, 1000] (`threat.bounds`)")
    assert validate_config({**BASE, "budgets": [8], "allow_large_budgets": True}).budgets == [8.0]
    assert validate_config({**BASE, "budgets": [8], "threat": {"bounds": [0, 255]}}).budgets == [8.0]
    assert validate_config({**BASE, "budgets": [0.5]}).budgets == [0.5]  # half the range: still a ball
    assert validate_config({**BASE, "budgets": [8], "threat": {"bounds": None}}).budgets == [8.0]  # no range
    # an L2 budget sums over every element: no per-element range to compare it with
    assert validate_config({**BASE, "budgets": [8], "threat": {"norm": "l2", "bounds": [0, 1]}}).budgets == [8.0]
    # build_attacks from a Python mapping checks the same, and the flag lets it through without a warning
    plan = {"threat": {"bounds": [0, 1]}, "budgets": [8], "attacks": ["fgsm"]}
    with pytest.raises(ConfigError, match=r"^`budgets\[0\]` is 8, more than half the data range"):
        build_attacks(plan, MultiClass())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(build_attacks({**plan, "allow_large_budgets": True}, MultiClass())) == ["fgsm@8"]
