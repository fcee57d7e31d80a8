"""Typed builders validate once; the data and target builders have their own homes, re-exported by medadv.config;
medadv.config imports neither the studies nor medadv.run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

import medadv.config as config
import medadv.config.data as data_build
import medadv.config.targets as targets
from medadv.config_schema import ConfigError, ModelSection, NpzData
from medadv.run import Plan


def test_moved_builders_are_the_same_objects_from_medadv_config():
    for name in ("build_loader", "build_data", "check_data", "data_identity", "CODE_TRANSFORM_ARGS"):
        assert getattr(config, name) is getattr(data_build, name), name
    for name in ("build_target_fn", "build_target_fns", "check_target", "check_targets", "TARGET_KINDS"):
        assert getattr(config, name) is getattr(targets, name), name


def test_config_imports_neither_the_studies_nor_the_run():
    code = ("import sys, medadv.config, medadv.config.data, medadv.config.targets\n"
            "print('medadv.studies' in sys.modules, 'medadv.run' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False", "False"]


def test_a_plan_builds_without_validating_a_section_again(tmp_path, monkeypatch, make_config):
    plan = Plan.from_yaml(make_config(tmp_path))
    calls: list[object] = []

    def counted(real):
        def validate(tp, data, where=()):
            calls.append(tp)
            return real(tp, data, where)
        return validate

    for module in (config, data_build, targets):
        monkeypatch.setattr(module, "validate_section", counted(module.validate_section))
    plan.check()
    plan.build()
    assert calls == []  # every builder took the plan's typed section
    # a mapping is still accepted, validated once at the boundary
    spec = yaml.safe_load((tmp_path / "cfg.yaml").read_text())["model"]
    assert config.model_name(spec) == "builder:small_cnn" and calls == [ModelSection]


def test_builders_take_typed_sections_and_mappings_alike(tmp_path, make_config):
    make_config(tmp_path)
    typed = NpzData(source="npz", path="data.npz")
    a = config.build_data(typed, str(tmp_path))
    b = config.build_data({"source": "npz", "path": "data.npz"}, str(tmp_path))
    assert all((u == v).all() for u, v in zip(a, b, strict=True))
    assert data_build.data_identity(typed, str(tmp_path)) == data_build.data_identity({"source": "npz", "path": "data.npz"},
                                                                                       str(tmp_path))
    with pytest.raises(ConfigError, match="`data` must be a mapping or a data section"):
        data_build.build_loader(3, str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`model` must be a mapping or a ModelSection"):
        config.build_model("small_cnn")  # type: ignore[arg-type]
