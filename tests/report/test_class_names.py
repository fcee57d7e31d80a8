"""Class names for the report: `task.class_names` in the config (checked against the classes), the label columns
of a multi-label CSV, the tissues of the built-in MNI152 source; they do not change the results' fingerprint."""

from __future__ import annotations

import pytest
import yaml

from medadv.config import build_task, class_names, config_fingerprint, load_config
from medadv.config_schema import ConfigError, validate_config
from medadv.data.mni152 import TISSUE_CLASSES

BASE = {"model": {"builder": "small_cnn"}, "data": {"source": "mni152"},
        "threat": {"norm": "linf", "bounds": [0, 1]}, "budgets": [0.1], "attacks": ["fgsm"]}
SEG = {"type": "segmentation", "num_classes": 3}


def _messages(task):
    with pytest.raises(ConfigError) as e:
        validate_config({**BASE, "task": task})
    return e.value.messages


def test_class_names_are_checked_against_the_task():
    assert _messages({**SEG, "class_names": ["background", "liver"]}) == [
        "`task` lists 2 `class_names` for num_classes = 3 (one name per class, background first)"]
    assert _messages({**SEG, "class_names": ["background", "liver", "liver"]}) == [
        "`task.class_names` names a class twice: 'liver'"]
    assert _messages({**SEG, "class_names": ["background", "liver", 3]}) == [
        "`task.class_names[2]` must be text; got 3 (int)"]
    assert _messages({"type": "multilabel", "class_names": []}) == ["`task.class_names` must be a non-empty list; got []"]
    # valid: the names are for the report, the task is built without them
    cfg = validate_config({**BASE, "task": {**SEG, "class_names": ["background", "liver", "tumour"]}})
    assert cfg.task.class_names == ["background", "liver", "tumour"]
    assert build_task(cfg.task.model_dump()).num_classes == 3


def _config(tmp_path, task, data=None, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**BASE, "task": task, **({"data": data} if data else {}), "output": "out"}))
    return load_config(path)


def test_class_names_default_to_the_csv_columns_and_the_mni152_tissues(tmp_path):
    (tmp_path / "labels.csv").write_text("image,effusion,edema,nodule\na.png,1,0,0\n")
    csv = {"source": "csv", "path": "labels.csv"}
    assert class_names(_config(tmp_path, {"type": "multilabel"}, csv)) == ["effusion", "edema", "nodule"]
    picked = {**csv, "label_columns": ["edema", "nodule"]}
    assert class_names(_config(tmp_path, {"type": "multilabel"}, picked)) == ["edema", "nodule"]
    given = {"type": "multilabel", "class_names": ["Effusion", "Edema", "Nodule"]}
    assert class_names(_config(tmp_path, given, csv)) == ["Effusion", "Edema", "Nodule"]
    with pytest.raises(ConfigError, match="lists 2 names for the 3 label columns of `data` \\(effusion, edema, nodule\\)"):
        class_names(_config(tmp_path, {"type": "multilabel", "class_names": ["a", "b"]}, csv))
    assert class_names(_config(tmp_path, {**SEG, "num_classes": 4})) == list(TISSUE_CLASSES)
    assert class_names(_config(tmp_path, {"type": "multiclass"})) is None


def test_class_names_and_cases_leave_the_fingerprint_unchanged(tmp_path):
    plain = _config(tmp_path, SEG, name="a.yaml")
    named = _config(tmp_path, {**SEG, "class_names": ["bg", "a", "b"]}, name="b.yaml")
    named["cases"] = 5
    assert config_fingerprint(plain) == config_fingerprint(named)
    other = _config(tmp_path, {**SEG, "num_classes": 4}, name="c.yaml")
    assert config_fingerprint(other) != config_fingerprint(plain)
