"""The task kind is the one extension point: nothing outside ``medadv/tasks`` branches on task classes, and the
registry is what every other part reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

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
    t: Any = get_task("segmentation", num_classes=4)  # a Segmentation: num_classes is its own attribute
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
    schema: Any = cls.config_schema()  # a pydantic model class
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


# --- a new kind is one file + one line: nothing outside medadv/tasks names a task class ---------------------------------
#: modules allowed to name the registered classes: the package root, whose lazy attribute table re-exports them
NAMING_ALLOWED = {"medadv/__init__.py"}


def _named_task_classes(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of every place a module names one of ``names``: a name or attribute read (``Segmentation``,
    ``tasks.MultiLabel``, an annotation), an import (``from medadv.tasks import MultiClass``). Strings and comments
    are not names (docstrings may mention a class)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in names:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            found += [(node.lineno, a.name.rsplit(".", 1)[-1]) for a in node.names
                      if a.name.rsplit(".", 1)[-1] in names]
    return sorted(set(found))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT.parent).as_posix()


@pytest.mark.parametrize("path", [p for p in _modules() if _rel(p) not in NAMING_ALLOWED], ids=_rel)
def test_no_module_outside_the_tasks_names_a_task_class(path: Path) -> None:
    """What a module outside ``medadv/tasks`` needs from a kind is a declaration (``task.traits.<group>.<field>``,
    a hook) or the registry (``get_task(name)``), never a task class: then a new kind is one file in
    ``medadv/tasks`` plus one import line, and every consumer picks it up."""
    named = _named_task_classes(ast.parse(path.read_text()), _task_class_names())
    assert not named, (f"{_rel(path)} names task classes "
                       f"{', '.join(f'{n} (line {ln})' for ln, n in named)}: read a declaration of the kind "
                       "(Task.traits) or build it by name (medadv.tasks.get_task)")


def test_the_naming_scan_sees_every_form_of_naming() -> None:
    """The scan above catches imports, reads, attributes and annotations, and ignores strings (so a module
    cannot pass it by importing a class under a dotted path or as an annotation)."""
    src = ("from medadv.tasks import MultiClass\nimport medadv.tasks.segmentation\n"
           "def f(task: 'x', t: medadv.tasks.Segmentation) -> None:\n    return isinstance(task, MultiLabel)\n"
           "DOC = 'Regression'\n")
    got = {n for _, n in _named_task_classes(ast.parse(src), _task_class_names())}
    assert got == {"MultiClass", "Segmentation", "MultiLabel"}


# --- the trait groups: every consumer reads the kind's declarations -----------------------------------------------------
def test_trait_groups_and_flat_names_agree() -> None:
    """Every flat name of before reads its field of the groups, on the class and on an instance."""
    from medadv.tasks.base import FLAT_TRAITS, Task

    classes: list[Any] = [Task, *registered_task_classes()]  # the base class and every registered kind
    for cls in classes:
        for flat, (group, field) in FLAT_TRAITS.items():
            assert getattr(cls, flat) == getattr(getattr(cls.traits, group), field), (cls, flat)
    seg = get_task("segmentation", num_classes=3)
    assert seg.headline == "mean_dice" == seg.traits.metrics.headline
    assert seg.traits.certify.family == "segmentation" and seg.traits.metrics.class_dice


def test_flat_declarations_of_a_custom_kind_fold_into_its_groups() -> None:
    """A kind written the way of before (flat class attributes) gets them in its groups, and a subclass that
    declares ``traits`` is not shadowed by a parent's flat names."""
    from medadv.tasks import MultiClass

    class Flat(MultiClass):
        headline = "my_metric"
        case_view = None
        label_source = "vector"

    assert Flat.traits.metrics.headline == "my_metric" and Flat.headline == "my_metric"
    assert Flat.traits.report.case_view is None and Flat.traits.labels.label_source == "vector"
    assert Flat.traits.certify.family == "multiclass"  # the rest inherited
    assert "headline" not in vars(Flat)  # the flat name reads the group again

    class Grouped(Flat):
        traits = Flat.traits.but(metrics={"headline": "other"})

    assert Grouped.headline == "other" and Flat.headline == "my_metric" and MultiClass.headline == "correct"


def test_but_refuses_unknown_groups_and_fields() -> None:
    from medadv.tasks import Task

    with pytest.raises(TypeError, match="unknown trait group `metric` — did you mean `metrics`"):
        Task.traits.but(metric={"headline": "x"})
    with pytest.raises(TypeError, match="unknown trait `metrics.headlin` — did you mean `headline`"):
        Task.traits.but(metrics={"headlin": "x"})


def test_a_new_kind_is_picked_up_by_every_consumer_through_its_declarations() -> None:
    """Certification, the toolkit adapters, the config schema and the report cases read what a kind declares:
    an unregistered subclass of a built-in kind that declares no smoothing family is refused by
    certification, one that declares the family is certified; the case view of a kind's name is its declared
    view."""
    from medadv.certify import RandomizedSmoothing
    from medadv.params import InvalidParameterError as Invalid
    from medadv.report.cases import _view_alias
    from medadv.tasks import MultiClass

    class NoCert(MultiClass):
        traits = MultiClass.traits.but(certify={"family": None})

    with pytest.raises(Invalid, match="declares a randomized-smoothing family"):
        RandomizedSmoothing(NoCert(), sigma=0.1)
    assert RandomizedSmoothing(MultiClass(), sigma=0.1).family == "multiclass"  # the built-in kind declares it

    from medadv.adapters._common import check_task

    class NoToolkit(MultiClass):
        traits = MultiClass.traits.but(toolkits={"adapters": frozenset()})

    with pytest.raises(TypeError, match="a kind the torchattacks adapter takes"):
        check_task(NoToolkit(), "torchattacks")
    assert check_task(MultiClass(), "torchattacks") is not None
    with pytest.raises(TypeError, match="the art adapter takes"):  # label maps only
        check_task(MultiClass(), "art", ("map",))
    assert _view_alias("multiclass") == "classes" and _view_alias("regression") == "values"
    assert _view_alias("map") == "map"
    for cls in registered_task_classes():
        assert _view_alias(cls.name) == (cls.traits.report.case_view or "image")


def test_check_task_refuses_traits_their_consumers_would_not_accept() -> None:
    """``check_task``'s ``traits`` property: a kind declaring a case view, a smoothing family or an adapter no
    consumer knows, or per-class Dice without the attributes it needs, is refused naming the trait."""
    from medadv.tasks import MultiClass
    from medadv.testing import ConformanceError, check_task

    cases: list[tuple[dict[str, dict[str, Any]], str]] = [
             ({"report": {"case_view": "heatmap"}}, "traits.report.case_view is 'heatmap'"),
             ({"certify": {"family": "regression"}}, "traits.certify.family is 'regression'"),
             ({"toolkits": {"adapters": frozenset({"cleverhans"})}}, r"adapters names \['cleverhans'\]"),
             ({"metrics": {"class_dice": True}}, "class_dice is declared, but the task has no num_classes"),
             ({"attacks": {"auto_versions": {"fast": {"attacks": ("apgd-nope",)}}}}, "runs \\['apgd-nope'\\]")]
    for groups, message in cases:
        bad = type("Bad", (MultiClass,), {"traits": MultiClass.traits.but(**groups)})
        with pytest.raises(ConformanceError, match=message):
            check_task(bad, properties=["traits"])
    assert check_task("multiclass", properties=["traits"]).passed == ["multiclass: traits"]


def test_label_map_guards_read_the_declarations_not_the_class() -> None:
    """The attacks, VAFT and the frequency analysis that need label maps scored class by class read
    ``traits.metrics.class_dice`` (and ``traits.labels.spatial_labels``), not ``isinstance(task, Segmentation)``: a
    segmentation subclass declaring no per-class Dice is refused by each, the built-in kind is accepted."""
    import torch

    from medadv.attacks.apgd import APGD
    from medadv.attacks.losses import balanced_weights
    from medadv.attacks.square import Square
    from medadv.defenses.vaft import VAFT
    from medadv.frequency import frequency_analysis
    from medadv.threats import Linf

    seg_cls = task_class("segmentation")
    no_dice = type("NoDice", (seg_cls,), {"traits": seg_cls.traits.but(metrics={"class_dice": False})})(3)
    seg = get_task("segmentation", num_classes=3)
    ball = Linf(0.1, bounds=(0, 1))
    with pytest.raises(TypeError, match="works on the voxels of a label map"):
        APGD(no_dice, ball, loss="balanced-ce")
    assert APGD(seg, ball, loss="balanced-ce").loss == "balanced-ce"
    with pytest.raises(InvalidParameterError, match="min-margin.*one voxel"):
        Square(seg, ball, loss="min-margin")
    assert Square(no_dice, ball, loss="min-margin").loss == "min-margin"  # no per-class Dice: nothing to protect
    y = torch.tensor([[[0, 1], [2, 2]]])
    with pytest.raises(TypeError, match="`task` of balanced_weights"):
        balanced_weights(no_dice, y)
    assert torch.allclose(balanced_weights(seg, y), torch.tensor([[[4 / 3, 4 / 3], [2 / 3, 2 / 3]]]))
    x = torch.zeros(1, 1, 2, 2)
    model = torch.nn.Conv2d(1, 3, 1)
    with pytest.raises(TypeError, match="`task` must be a Segmentation task"):
        frequency_analysis(model, no_dice, x, x, y, {}, bounds=(0.0, 1.0))
    assert set(frequency_analysis(model, seg, x, x, y, {}, bounds=(0.0, 1.0))) == {"clean", "adversarial"}
    with pytest.raises(TypeError, match="VAFT needs a Segmentation task"):
        VAFT(box=(0.0, 1.0)).loss(model, x, y, no_dice, torch.Generator())
