"""Release hygiene (issue 31, item 3): LICENSE, CHANGELOG, CITATION, one version, and a wheel that installs and
runs in a fresh virtual environment without the source tree."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser under its older name (a dependency of pytest there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _version() -> str:
    return str(_pyproject()["project"]["version"])


# --- LICENSE, CHANGELOG, CITATION -----------------------------------------------------------------------------------
def test_license_is_the_mit_text_pyproject_declares():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert _pyproject()["project"]["license"] == {"text": "MIT"}
    assert text.startswith("MIT License")
    assert "Copyright (c) 2026 medadv contributors" in text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in text


def test_changelog_follows_keep_a_changelog_with_unreleased_and_this_version():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog")
    assert "keepachangelog.com" in text
    heads = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, flags=re.M)
    assert heads[0] == ("Unreleased", "")
    versions = [v for v, _ in heads[1:]]
    assert _version() in versions
    assert all(date for _, date in heads[1:])  # every release has its date
    # every section under a heading is one of Keep a Changelog's kinds
    kinds = set(re.findall(r"^### (\w+)$", text, flags=re.M))
    assert kinds and kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_citation_cff_is_valid_cff_1_2_0_of_this_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    # the keys CFF 1.2.0 requires, with the types its schema gives them
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title"):
        assert isinstance(cff[key], str) and cff[key].strip()
    assert isinstance(cff["authors"], list) and cff["authors"]
    assert all(isinstance(a, dict) and (a.get("name") or a.get("family-names")) for a in cff["authors"])
    assert cff["type"] == "software"
    assert cff["license"] == "MIT"
    assert str(cff["version"]) == _version()  # CFF needs its own copy; this keeps it from drifting
    known = {"cff-version", "message", "title", "abstract", "type", "authors", "version", "license", "keywords",
             "repository-code", "url", "date-released", "doi", "identifiers", "preferred-citation", "references"}
    assert set(cff) <= known, f"keys CFF 1.2.0 does not define: {set(cff) - known}"


# --- one version ------------------------------------------------------------------------------------------------
def test_version_is_written_once_in_the_tree():
    version = _version()
    allowed = {ROOT / "pyproject.toml", ROOT / "CITATION.cff", ROOT / "CHANGELOG.md"}
    skip = {".venv", ".git", "__pycache__", "build", "dist", ".hypothesis", ".pytest_cache", ".ruff_cache",
            ".mypy_cache", "site"}
    pattern = re.compile(r"(?<![\d.])" + re.escape(version) + r"(?![\d.])")
    hits = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if any(p in skip or p.endswith(".egg-info") for p in rel) or not path.is_file() or path in allowed:
            continue
        if path.suffix not in {".py", ".toml", ".cfg", ".md", ".yaml", ".yml", ".txt", ".j2", ".html", ".json"}:
            continue
        if pattern.search(path.read_text(encoding="utf-8", errors="replace")):
            hits.append(str(path.relative_to(ROOT)))
    assert not hits, f"the version {version} is written outside pyproject.toml (read it through importlib.metadata): {hits}"


def test_version_reads_the_installed_metadata(capsys):
    import medadv
    from medadv.cli import main

    assert medadv.__version__ == importlib.metadata.version("medadv") == _version()
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"medadv {importlib.metadata.version('medadv')}"


# --- the wheel in a fresh virtual environment -------------------------------------------------------------------
def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_wheel_installs_and_runs_in_a_fresh_venv_outside_the_source_tree(tmp_path):
    import numpy as np

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["OMP_NUM_THREADS"] = "1"
    # build from a copy of what the wheel is made of: setuptools writes build/ and *.egg-info next to the
    # sources, and other work in the tree must not see them
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("medadv", "adapters"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    # no build isolation: the build backend (setuptools) is already installed and CI is offline
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
         tmp_path, env)
    (wheel,) = dist.glob("medadv-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for member in ("medadv/py.typed", "medadv/report/templates/report.html.j2", "medadv/report/templates/style.css",
                   "medadv/adapters/__init__.py", "medadv/adapters/art.py"):
        assert member in names, f"{member} is not in the wheel"
    meta = zipfile.ZipFile(wheel).read(f"medadv-{_version()}.dist-info/METADATA").decode()
    assert f"Version: {_version()}" in meta and "License: MIT" in meta and "medadv contributors" in meta
    assert f"medadv-{_version()}.dist-info/licenses/LICENSE" in names
    # every package of the source tree is in the wheel (pyproject lists them by hand)
    for init in [*ROOT.joinpath("medadv").rglob("__init__.py")]:
        assert f"medadv/{init.relative_to(ROOT / 'medadv').as_posix()}" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    py = venv / "bin" / "python"
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        tmp_path, env).strip())
    # the dependencies (torch, MONAI, the toolkits: gigabytes, minutes to install, and CI is offline) are shared
    # from the test's environment through a path entry placed *after* the fresh venv's own site-packages; a plain
    # path line does not run that environment's .pth files, so its editable medadv stays invisible. medadv itself
    # comes from the wheel only.
    shared = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))  # lib64 on some systems
    (purelib / "zz_shared_dependencies.pth").write_text("".join(f"{p}\n" for p in shared), encoding="utf-8")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "--force-reinstall",
          "-q", str(wheel)], tmp_path, env)

    work = tmp_path / "work"  # outside the source tree: nothing there to import medadv from
    work.mkdir()
    info = _run([str(py), "-c", "import importlib.resources as r, medadv, medadv.adapters; "
                 "print(medadv.__file__); print(medadv.adapters.__file__); print(medadv.__version__); "
                 "print(r.files('medadv.report').joinpath('templates/report.html.j2').is_file())"],
                work, env).split("\n")
    assert Path(info[0]).resolve().is_relative_to(venv.resolve()), info[0]
    assert not Path(info[0]).resolve().is_relative_to(ROOT)
    assert Path(info[1]).resolve().is_relative_to(venv.resolve()), info[1]
    assert info[2] == _version() and info[3] == "True"

    version = _run([str(venv / "bin" / "medadv"), "--version"], work, env).strip()
    assert version == f"medadv {importlib.metadata.version('medadv')}"

    # a 2-step evaluate of a tiny classifier on NPZ data written here
    g = np.random.default_rng(0)
    np.savez(work / "data.npz", x=g.random((4, 1, 8, 8), dtype=np.float32), y=g.integers(0, 3, 4))
    cfg = {
        "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 3, "width": 4}},
        "task": {"type": "multiclass"},
        "data": {"source": "npz", "path": "data.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": [0.05],
        "attacks": [{"name": "pgd", "steps": 2}],
        "batch_size": 2,
        "cases": 1,
        "output": "out",
    }
    (work / "cfg.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    _run([str(venv / "bin" / "medadv"), "evaluate", "cfg.yaml", "--no-progress"], work, env, timeout=240)
    rows = json.loads((work / "out" / "results.json").read_text(encoding="utf-8"))["rows"]
    assert len(rows) == 4 and {r["attack"] for r in rows} == {"pgd@0.05"}
    report = (work / "out" / "report.html").read_text(encoding="utf-8")
    assert f'<meta name="generator" content="medadv {_version()}">' in report  # the template came from the wheel
