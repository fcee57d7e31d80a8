"""Without ``--allow-code`` a config runs no code: only what builds a network (issue 28, item 9).

medadv, MONAI and torchvision are allow-listed packages, but not every function in them builds a network:
``monai.utils.module:optional_import`` imports any module, ``torchvision.datasets.utils:extract_archive`` and
``monai.networks.utils:save_state`` write anywhere. The generated test walks the public callables of a large
sample of the allow-listed packages' modules and names each as ``model.builder``: every one that is neither an
``nn.Module`` class nor a declared network factory must be refused (:class:`CodeNotAllowedError`) before it is
called, and every network class and factory must pass that gate. The side-effect tests point such functions at a
temporary folder, through the command line, and check that nothing happened there.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from medadv.cli import main
from medadv.config import CODE_TRANSFORM_ARGS, CodeNotAllowedError, check_data, check_model, check_target
from medadv.models.loading import MEDADV_FACTORIES, MONAI_FACTORIES
from medadv.tasks import MultiClass

#: modules of the allow-listed packages whose public callables are named as builders
MODULES = ("monai.networks.utils", "monai.utils.module", "monai.utils", "monai.data", "monai.networks.nets",
           "monai.transforms", "torchvision.datasets.utils", "torchvision.utils", "torchvision.io", "torchvision.models",
           "medadv.models", "medadv.models.io", "medadv.data.save", "medadv.safe_io", "medadv.config", "medadv.config.data",
           "medadv.config.targets", "medadv.run", "medadv.run.output")


def _declared() -> set[Any]:
    """The factories a config may name, from the declarations themselves (not from medadv's gate)."""
    import monai.networks.nets as nets
    import torchvision.models

    out: set[Any] = {torchvision.models.get_model_builder(n) for n in torchvision.models.list_models()}
    out |= {getattr(nets, n) for n in MONAI_FACTORIES}
    out |= {getattr(importlib.import_module(s.partition(":")[0]), s.partition(":")[2]) for s in MEDADV_FACTORIES}
    for name in dir(nets):  # MONAI functions annotated to return a network (resnet18 -> ResNet)
        fn = getattr(nets, name)
        if inspect.isfunction(fn):
            ret = inspect.signature(fn).return_annotation
            ret = getattr(nets, ret, None) if isinstance(ret, str) else ret
            if inspect.isclass(ret) and issubclass(ret, nn.Module):
                out.add(fn)
    return out


def _callables() -> tuple[list[str], list[str]]:
    """(``module:name`` of every public non-network callable, ``module:name`` of every network class/factory)."""
    declared = _declared()
    code, networks = [], []
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for name in sorted(dir(mod)):
            if name.startswith("_"):
                continue
            try:
                obj = getattr(mod, name)
            except Exception:  # noqa: BLE001 - a lazy attribute that cannot load is not a candidate
                continue
            if not callable(obj) or inspect.ismodule(obj):
                continue
            is_net = (inspect.isclass(obj) and issubclass(obj, nn.Module)) or obj in declared
            (networks if is_net else code).append(f"{mod_name}:{name}")
    return code, networks


CODE, NETWORKS = _callables()


@pytest.mark.parametrize("spec", CODE)
def test_every_non_network_callable_of_the_allow_listed_packages_is_refused(spec):
    with pytest.raises(CodeNotAllowedError, match=r"--allow-code"):
        check_model({"builder": spec, "kwargs": {}}, allow_code=False)


def test_network_classes_and_declared_factories_pass_the_gate():
    refused = []
    for spec in NETWORKS:
        try:
            check_model({"builder": spec}, allow_code=False)
        except CodeNotAllowedError as e:
            refused.append(f"{spec}: {e}")
        except (ValueError, TypeError):  # required arguments missing and the like: past the gate
            pass
    assert not refused, refused[:5]
    assert len(NETWORKS) > 100 and len(CODE) > 500, (len(NETWORKS), len(CODE))


def test_task_type_names_only_task_classes_and_calls_nothing():
    from medadv.config import build_task
    from medadv.tasks import Task

    wrong = []
    for spec in CODE:
        mod, _, name = spec.partition(":")
        obj = getattr(importlib.import_module(mod), name)
        if isinstance(obj, type) and issubclass(obj, Task):
            continue  # a task class (medadv.config re-exports Task): what task.type may name
        try:
            build_task({"type": spec}, allow_code=False)
            wrong.append(f"{spec}: accepted")
        except ValueError as e:  # refused, before anything it names is called
            if "not a medadv Task subclass" not in str(e):
                wrong.append(f"{spec}: {e}")
    assert not wrong, wrong[:5]


def test_allow_code_lets_the_user_name_any_function():
    with pytest.raises(ValueError) as err:  # past the gate: the function is looked at as a builder
        check_model({"builder": "monai.networks.utils:save_state"}, allow_code=True)
    assert not isinstance(err.value, CodeNotAllowedError)


# --- side effects, through the command line -------------------------------------------------------------------
BASE: dict[str, Any] = {
    "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 3, "width": 4}},
    "task": {"type": "multiclass"},
    "data": {"source": "npz", "path": "data.npz"},
    "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
    "budgets": [0.05],
    "attacks": [{"name": "fgsm"}],
    "batch_size": 2,
    "output": "out",
}


@pytest.fixture
def folder(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x=rng.random((2, 1, 8, 8), dtype=np.float32), y=rng.integers(0, 3, 2))
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        z.writestr("inside.txt", "x")
    return tmp_path


def _side_effects(tmp: Path) -> list[tuple[str, dict[str, Any], Path]]:
    """(builder, kwargs, the file it would write) for functions of allow-listed packages that write files."""
    return [("monai.networks.utils:save_state", {"src": {"a": 1}, "path": str(tmp / "state.pt")}, tmp / "state.pt"),
            ("torchvision.datasets.utils:extract_archive", {"from_path": str(tmp / "a.zip"),
                                                            "to_path": str(tmp / "unzipped")}, tmp / "unzipped"),
            ("medadv.safe_io:write_text", {"path": str(tmp / "written.txt"), "text": "pwned"}, tmp / "written.txt"),
            ("medadv.models.io:save_checkpoint", {"path": str(tmp / "ckpt.pt")}, tmp / "ckpt.pt")]


@pytest.mark.parametrize("command", ["validate", "evaluate"])
@pytest.mark.parametrize("index", range(4))
def test_a_builder_that_writes_files_is_refused_before_it_is_called(index, command, folder, capsys):
    builder, kwargs, written = _side_effects(folder)[index]
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "model": {"builder": builder, "kwargs": kwargs}}))
    capsys.readouterr()
    assert main([command, str(path), "--no-progress"] if command == "evaluate" else [command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("medadv: error: ") == 1 and "--allow-code" in err and "Traceback" not in err, err
    assert not written.exists(), f"{builder} ran: {written} was written"
    assert not (folder / "out").exists()


def test_a_builder_that_imports_a_module_is_refused_before_it_is_called(folder, capsys):
    assert "this" not in sys.modules  # `import this` prints the Zen of Python: a module nobody imports
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "model": {"builder": "monai.utils.module:optional_import",
                                                      "kwargs": {"module": "this"}}}))
    capsys.readouterr()
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert "not a declared network factory" in captured.err and "Zen of Python" not in captured.out
    assert "this" not in sys.modules


@pytest.mark.parametrize("spec", ["medadv.safe_io:write_text", "monai.networks.utils:save_state",
                                  "torchvision.utils:save_image"])
def test_a_target_function_of_an_allow_listed_package_needs_allow_code(spec):
    task = MultiClass()
    with pytest.raises(CodeNotAllowedError, match="names a function"):
        check_target(spec, task, allow_code=False)
    check_target(spec, task, allow_code=True)  # the user's opt-in


def _code_transforms() -> list[str]:
    """The MONAI dictionary transforms (what a config may name) taking an argument that runs code or writes files."""
    from monai.transforms import MapTransform

    from medadv.data.sources import monai_transforms

    return sorted(n for n, c in monai_transforms().items() if issubclass(c, MapTransform)
                  and any(a in inspect.signature(c).parameters for a in CODE_TRANSFORM_ARGS))


@pytest.mark.parametrize("name", _code_transforms())
def test_a_transform_that_runs_code_or_writes_files_needs_allow_code(name, tmp_path):
    spec = {"source": "files", "images": "img/*.npy", "transforms": [{"name": name, "output_dir": str(tmp_path / "w")}]}
    with pytest.raises(CodeNotAllowedError, match=name):
        check_data(spec, str(tmp_path), allow_code=False)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("reader", ["medadv.safe_io.write_text", "os.system", "write_nifti", "Dataset",
                                    "monai.data.NibabelReader", ["NumpyReader", "builtins.exec"]])
def test_a_loader_reader_that_is_not_a_monai_reader_needs_allow_code(reader, tmp_path):
    (tmp_path / "img").mkdir()
    torch.save(torch.zeros(1), tmp_path / "img" / "a.pt")
    spec = {"source": "files", "images": "img/*",
            "transforms": [{"name": "LoadImaged", "keys": ["image"], "reader": reader,
                            "path": str(tmp_path / "written.txt"), "text": "pwned"}]}
    with pytest.raises(CodeNotAllowedError, match="reader"):
        check_data(spec, str(tmp_path), allow_code=False)
    assert not (tmp_path / "written.txt").exists()
    for ok in ("NumpyReader", "PILReader", "nibabelreader", None):
        spec["transforms"][0].update(reader=ok)
        try:
            check_data(spec, str(tmp_path), allow_code=False)
        except CodeNotAllowedError as e:  # pragma: no cover - the assertion below says which
            pytest.fail(f"MONAI's own reader {ok!r} refused: {e}")
        except (ValueError, TypeError, OSError):  # past the gate (the files themselves are not images)
            pass


@pytest.mark.parametrize("command", ["validate", "evaluate"])
def test_a_loader_reader_naming_any_function_is_not_called_even_by_validate(command, folder, capsys):
    """MONAI's LoadImage locates a ``reader`` given as a dotted path and calls it with the transform's other
    arguments: ``reader: os.mkdir`` with ``path: ...`` made a folder while the config was only validated."""
    import numpy as np

    (folder / "img").mkdir()
    for name in ("a", "b"):
        np.save(folder / "img" / f"{name}.npy", np.zeros((8, 8), np.float32))
    (folder / "labels.csv").write_text("image,label\nimg/a.npy,0\nimg/b.npy,1\n")
    made = folder / "made-by-the-config"
    data = {"source": "csv", "path": "labels.csv", "image_column": "image", "label_column": "label",
            "transforms": [{"name": "LoadImaged", "keys": ["image"], "reader": "os.mkdir", "path": str(made)}]}
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "data": data}))
    capsys.readouterr()
    assert main([command, str(path)] + (["--no-progress"] if command == "evaluate" else [])) == 2
    err = capsys.readouterr().err
    assert err.count("medadv: error: ") == 1 and "reader" in err and "--allow-code" in err, err
    assert not made.exists(), "the config's reader ran"


def test_a_function_in_a_python_file_beside_the_config_is_still_the_users_own(tmp_path):
    """The gate is for the allow-listed packages: a builder function in a file inside the config's folder is the
    user's code, trusted as the config is (a file elsewhere still needs --allow-code)."""
    import warnings

    from medadv.config import build_model

    (tmp_path / "net.py").write_text("import torch\n\n\ndef build(width=2):\n    return torch.nn.Conv2d(1, width, 1)\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model({"builder": "net.py:build"}, str(tmp_path), allow_code=False)
    assert isinstance(model, nn.Conv2d)
    with pytest.raises(CodeNotAllowedError, match="outside the config's folder"):
        check_model({"builder": str(tmp_path / "net.py") + ":build"}, str(tmp_path / "elsewhere"), allow_code=False)
