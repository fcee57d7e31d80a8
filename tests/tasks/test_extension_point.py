"""The task kind is the one extension point: nothing outside ``medadv/tasks`` branches on task classes, and the
registry is what every other part reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import medadv
from medadv.params import InvalidParameterError
from medadv.tasks import available_tasks, get_task, registered_task_classes, task_class, task_family

ROOT = Path(medadv.__file__).resolve().parent
ADAPTERS = ROOT.parent / "adapters"


def _task_class_names() -> set[str]:
    return {cls.__name__ for cls in registered_task_classes()}


def _isinstance_task_classes(tree: ast.AST, names: set[str]) -> set[str]:
    """The task class names tested with ``isinstance``/``issubclass`` anywhere in a module."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass") \
                and len(node.args) == 2:
            for sub in ast.walk(node.args[1]):
                if isinstance(sub, ast.Name) and sub.id in names:
                    found.add(sub.id)
    return found


def _modules() -> list[Path]:
    out = [p for p in ROOT.rglob("*.py") if "tasks" not in p.relative_to(ROOT).parts[:1]]
    return sorted(out + sorted(ADAPTERS.rglob("*.py")))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_no_isinstance_ladder_over_task_classes(path: Path) -> None:
    """A module outside ``medadv/tasks`` may guard on one task class (an attack that needs label maps), never
    branch over several: what differs between kinds is declared by the kind (``Task`` attributes and hooks)."""
    tested = _isinstance_task_classes(ast.parse(path.read_text()), _task_class_names())
    assert len(tested) <= 1, (f"{path.relative_to(ROOT.parent)} branches on task classes {sorted(tested)}: declare "
                              "the difference on the task kind (medadv/tasks) and read it there")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_no_hand_kept_list_of_task_kinds(path: Path) -> None:
    """No tuple or list literal enumerating the built-in kind names outside ``medadv/tasks`` (read the registry)."""
    kinds = {"multiclass", "multilabel", "segmentation"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            values = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            assert not kinds <= values, (f"{path.relative_to(ROOT.parent)}:{node.lineno} lists the task kinds "
                                         f"{sorted(values & kinds)}: use medadv.tasks.available_tasks()")


def test_registry_lists_builtin_kinds_first() -> None:
    assert available_tasks()[:3] == ["multiclass", "multilabel", "segmentation"]
    for name in available_tasks():
        cls = task_class(name)
        assert cls.name == name and task_family(cls.example().task) == name


def test_get_task_builds_and_refuses_with_did_you_mean() -> None:
    t = get_task("segmentation", num_classes=4)
    assert task_family(t) == "segmentation" and t.num_classes == 4
    with pytest.raises(InvalidParameterError, match=re.escape("did you mean 'segmentation'")):
        get_task("segmentaton", num_classes=4)
    with pytest.raises(InvalidParameterError, match="did you mean `num_classes`"):
        get_task("segmentation", num_clases=4)


@pytest.mark.parametrize("name", available_tasks())
def test_every_kind_declares_what_the_library_reads(name: str) -> None:
    """The declarations evaluation, data, report, studies and ``auto`` read are consistent for each kind."""
    cls = task_class(name)
    ex = cls.example()
    assert cls.title and cls.shapes, "a kind says what it is (medadv tasks)"
    with __import__("torch").no_grad():
        logits = ex.model(ex.x)
    ex.task.validate(logits, ex.y)
    out = ex.task.outcome(logits, ex.y)
    if cls.headline is not None:
        assert cls.headline in out.columns, f"headline {cls.headline!r} is not a metric column of {name}"
    if cls.robust_metric_column is not None:
        assert cls.robust_metric_column in out.columns
    if cls.auto_members:
        for version, spec in cls.auto_versions.items():
            assert set(spec["attacks"]) <= set(cls.auto_members), version
    schema = cls.config_schema()
    assert "type" in schema.model_fields and "class_names" in schema.model_fields


def test_tasks_command_lists_every_kind_first_and_their_keys(capsys):
    from medadv.cli import main

    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert [ln.split()[0] for ln in lines[: len(available_tasks())]] == available_tasks()
    assert main(["tasks", "--params", "segmentation", "regression"]) == 0
    out = capsys.readouterr().out
    assert "task: {type: segmentation, num_classes, include_background=False" in out
    assert "regression: " in out and "auto:" in out and "attacks declared for it:" in out
    assert main(["tasks", "--params", "segmentaton"]) == 2
    assert "did you mean 'segmentation'" in capsys.readouterr().err
