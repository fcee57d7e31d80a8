"""medadv.run: a Plan read once and kept typed, a Run that owns the output folder; the CLI and Python give the same
outputs and the same resume behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from medadv.cli import main
from medadv.config import load_config
from medadv.config_schema import Config, ConfigError, ModelSection
from medadv.run import Built, Outcome, Plan, Run


def _rows(out: Path) -> list[dict]:
    return sorted(json.loads((out / "results.json").read_text())["rows"], key=lambda r: (r["attack"], r["sample"]))


def test_the_plan_is_the_load_config_mapping_with_typed_sections(tmp_path, make_config):
    path = make_config(tmp_path, studies=["classwise", {"study": "noise_baseline", "match": "ssim"}])
    plan = Plan.from_yaml(path)
    assert isinstance(plan.config, Config) and isinstance(plan.config.model, ModelSection)
    assert plan.config.model.seed == 0  # the model's seed follows the config's
    assert [s.study for s in plan.studies] == ["classwise", "noise_baseline"]
    assert plan.base_dir == str(tmp_path.resolve()) and plan.output_dir == tmp_path.resolve() / "out"
    loaded = load_config(path)
    assert plan.to_dict() == loaded  # the same mapping as before: the same fingerprint, the same settings
    assert plan.config.budgets == [pytest.approx(8 / 255)]


def test_a_plan_built_in_python_is_checked_and_leaves_the_config_given_alone(tmp_path, make_config):
    path = make_config(tmp_path)
    raw = yaml.safe_load(path.read_text())
    conf = Config.model_validate(raw)
    plan = Plan(config=conf, base_dir=tmp_path)
    assert conf.model.seed is None and plan.config.model.seed == 0  # a copy was normalised
    assert plan.fingerprint() == Plan.from_dict(raw, base_dir=tmp_path).fingerprint() == Plan.from_yaml(path).fingerprint()
    with pytest.raises(TypeError, match="`config` must be a medadv.config_schema.Config"):
        Plan(config=raw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="add `models:"):
        Plan.from_dict({**raw, "studies": ["transfer"]}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"unknown key `bogus`"):  # each entry by its study's own schema
        Plan.from_dict({**raw, "studies": [{"study": "classwise", "bogus": 1}]}, base_dir=tmp_path)


def test_check_builds_nothing_and_lists_every_mistake(tmp_path, monkeypatch, make_config):
    plan = Plan.from_yaml(make_config(tmp_path))
    import medadv.config as config

    def no_build(*a, **k):
        raise AssertionError("check() built the model")

    monkeypatch.setattr(config, "build_model", no_build)
    assert plan.check() == ["fgsm@0.0313725", "pgd@0.0313725"]
    assert not (tmp_path / "out").exists()  # the writability check removes what it made
    bad = Plan.from_yaml(make_config(tmp_path, data={"source": "npz", "path": "missing.npz"}, target="nowhere"))
    with pytest.raises(ConfigError) as e:
        bad.check()
    text = str(e.value)
    assert "missing.npz" in text and "`target` must be one of" in text


def test_build_gives_typed_pieces(tmp_path, make_config):
    built = Plan.from_yaml(make_config(tmp_path)).build()
    assert isinstance(built, Built)
    assert set(built.attacks) == {"fgsm@0.0313725", "pgd@0.0313725"} and built.target_fn is None
    assert list(built.models) == ["model"] and built.models["model"] is built.model
    batches = list(built.data)
    assert len(batches) == 2 and batches[0][0].shape == (2, 1, 8, 8)
    assert built.model(batches[0][0]).shape == (2, 3)


def test_build_and_run_build_the_same_seeded_model_whatever_the_global_rng(tmp_path, make_config):
    """build() and Run share the stages (Plan.prepare, Plan.model): the model's random weights follow the config's
    seed, not whatever the caller drew before."""
    import torch

    plan = Plan.from_yaml(make_config(tmp_path))
    torch.manual_seed(123)
    first = plan.build().model.state_dict()
    torch.rand(1000)  # another global RNG state
    second = plan.model(plan.task()).state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    task, attacks, target_fn, names = plan.prepare()
    assert set(attacks) == {"fgsm@0.0313725", "pgd@0.0313725"} and target_fn is None and task.name == "multiclass"


def test_python_and_cli_write_the_same_folder_and_rows(tmp_path, make_config):
    path = make_config(tmp_path)
    assert main(["evaluate", str(path), "--no-progress", "--output", str(tmp_path / "cli")]) == 0
    outcome = Run.from_yaml(path, tmp_path / "py", progress=False).execute()
    assert isinstance(outcome, Outcome) and outcome.action == "new"
    cli, py = tmp_path / "cli", tmp_path / "py"
    assert sorted(p.name for p in cli.iterdir()) == sorted(p.name for p in py.iterdir())
    assert not (py / ".attack_cache").exists()  # the attack-once cache is removed at the end
    assert _rows(cli) == _rows(py) and len(_rows(py)) == 8
    assert {p.name for p in outcome.paths} == {"results.json", "results.csv", "report.md", "report.html"}
    cli_run, py_run = (json.loads((d / "run.json").read_text()) for d in (cli, py))
    assert cli_run["fingerprint"] == py_run["fingerprint"] == outcome.fingerprint
    assert cli_run["config"] == py_run["config"] == str(path.resolve())
    meta = json.loads((py / "results.json").read_text())["meta"]
    assert meta["config"] == str(path.resolve()) and meta["config_fingerprint"] == outcome.fingerprint


def test_a_second_execute_resumes_and_another_config_is_refused(tmp_path, monkeypatch, make_config):
    path = make_config(tmp_path, cases=0)  # no report cases: those attack again by design
    first = Run.from_yaml(path, progress=False).execute()
    rows = _rows(first.out)
    from medadv.attacks.base import Attack

    attacked: list[str] = []
    real = Attack.__call__
    monkeypatch.setattr(Attack, "__call__", lambda self, *a, **k: attacked.append(self.name) or real(self, *a, **k))
    second = Run(Plan.from_yaml(path), progress=False).execute()
    assert second.action == "resume" and _rows(second.out) == rows and attacked == []
    # the log holds each row once: resumed rows are read back, not appended again
    log = [json.loads(line) for line in (first.out / "log.jsonl").read_text().splitlines() if line.strip()]
    assert len([r for r in log if "attack" in r]) == len(rows)
    other = make_config(tmp_path, seed=3)
    with pytest.raises(FileExistsError, match="another config or other data"):
        Run.from_yaml(other, progress=False).execute()
    replaced = Run.from_yaml(other, overwrite=True, progress=False).execute()
    assert replaced.action == "replace"


def test_run_refuses_bad_arguments_in_one_line(tmp_path, make_config):
    plan = Plan.from_yaml(make_config(tmp_path))
    with pytest.raises(TypeError, match="`plan` must be a medadv.run.Plan"):
        Run("cfg.yaml")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`overwrite` must be True or False"):
        Run(plan, overwrite="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`out` must be a folder path"):
        Run(plan, out=3)  # type: ignore[arg-type]


def test_a_link_in_the_output_folder_is_refused_before_any_work(tmp_path, make_config):
    path = make_config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises((FileExistsError, ValueError, OSError)):
        Run.from_yaml(path, progress=False).execute()
    assert not (tmp_path / "elsewhere.json").exists()


def test_execute_attacks_once_under_a_cache_spilling_into_the_output_folder(tmp_path, monkeypatch, make_config):
    import medadv.evaluation as evaluation
    from medadv.attack_cache import AttackCache, active_cache

    seen: list[AttackCache | None] = []
    real = evaluation.evaluate

    def watched(*a, **k):
        seen.append(active_cache())
        return real(*a, **k)

    monkeypatch.setattr(evaluation, "evaluate", watched)
    outcome = Run.from_yaml(make_config(tmp_path), progress=False).execute()
    (cache,) = seen
    assert isinstance(cache, AttackCache) and cache.spill_dir == outcome.out / ".attack_cache"
    assert active_cache() is None and not (outcome.out / ".attack_cache").exists()


def test_a_link_at_the_attack_cache_folder_is_refused_in_one_line(tmp_path, make_config):
    path = make_config(tmp_path)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / ".attack_cache").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OSError, match=r"\.attack_cache is a symbolic link") as info:
        Run.from_yaml(path, progress=False).execute()
    assert "\n" not in str(info.value) and list(elsewhere.iterdir()) == [] and not (out / "run.json").exists()


def test_studies_in_a_run_reuse_evaluates_examples_of_global_rng_attacks(tmp_path, monkeypatch, make_config):
    """An attack without its own seed is keyed by evaluate's seed; the run's studies run under the same tag."""
    from medadv.attack_cache import active_cache, craft

    path = make_config(tmp_path, attacks=[{"name": "pgd", "steps": 2, "seed": None}], cases=0)
    counts: list[dict[str, int]] = []

    def studies(self, model, task, data, attacks, target_fn, paths):
        cache = active_cache()
        assert cache is not None
        before = dict(cache.stats)
        for batch in data:
            x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch[:2]
            for atk in attacks.values():
                craft(atk, model, x, y)
        counts.append({k: cache.stats[k] - before[k] for k in ("crafted", "reused")})
        return []

    monkeypatch.setattr(Run, "_studies", studies)
    Run.from_yaml(path, progress=False).execute()
    assert counts == [{"crafted": 0, "reused": 4}]
