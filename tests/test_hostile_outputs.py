"""Links planted in the output folder (issue 28, item 11): no write of a run lands outside the output folder.

The files are not listed by hand: a real small run (a tiny CNN on two 8x8 images, FGSM, a study, the saved
adversarial examples) writes its folder once, the folder is listed recursively, and each entry it holds, and the
fixed temporary name each file was once written through (``.results.json.tmp``), becomes a case: a symbolic link
to a file (a folder, for folders) outside the output folder is planted under that name, and ``medadv evaluate``
runs again as a new run (only the link in the folder), a resume (the whole first run beside it) and with
``--overwrite``. Each run must either succeed or stop with one ``medadv: error:`` line and no traceback, and the
file (or folder) the link points at must be exactly as it was. Hard links to an outside file, planted in place of
each regular file, get the same treatment on resume (an append through a hard link lands in the other file).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from medadv.cli import main
from medadv.safe_io import LinkedOutputError, open_output, write_text

CONFIG = {
    "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 3, "width": 4}},
    "task": {"type": "multiclass"},
    "data": {"source": "npz", "path": "data.npz"},
    "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
    "budgets": [0.05],
    "attacks": [{"name": "fgsm"}],
    "batch_size": 2,
    "cases": 0,
    "save_adversarial": True,
    "studies": [{"study": "frequency"}],
    "output": "out",
}
PRECIOUS = "precious: not medadv's to write\n"


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(argv)
    return rc, err.getvalue()


@contextlib.contextmanager
def _threads(n: int = 1):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_REF = tempfile.TemporaryDirectory(prefix="medadv-hostile-outputs-")  # removed when the interpreter exits


def _reference() -> tuple[Path, list[str]]:
    """The config folder (config, data, and the first run's output ``out``) and every entry of ``out``."""
    base = Path(_REF.name)
    out = base / "out"
    if not out.is_dir():
        rng = np.random.default_rng(0)
        np.savez(base / "data.npz", x=rng.random((2, 1, 8, 8), dtype=np.float32), y=rng.integers(0, 3, 2))
        (base / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        with _threads():
            rc, err = _run(["evaluate", str(base / "config.yaml"), "--no-progress"])
        assert rc == 0, err
    listed = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    return base, listed


def _entries() -> list[tuple[str, str]]:
    """(relative path, kind) of every entry of the first run's folder, and the fixed temporary name of each
    of its files (kind ``tmp``: a name the run does not leave behind)."""
    base, listed = _reference()
    out = base / "out"
    found = [(rel, "dir" if (out / rel).is_dir() else "file") for rel in listed]
    found += [(str(Path(rel).with_name(f".{Path(rel).name}.tmp")), "tmp") for rel, kind in found if kind == "file"]
    return found


ENTRIES = _entries()
MODES = ("new", "resume", "overwrite")


def _classify(rc: int, err: str) -> str:
    if rc == 0:
        return "OK"
    errors = [line for line in err.splitlines() if line.startswith("medadv: error: ")]
    if rc == 2 and "Traceback" not in err and len(errors) == 1:
        return "CLEAR"
    return f"BAD(rc={rc})"


def _victim(tmp_path: Path, kind: str) -> Path:
    victim = tmp_path / "outside" / "victim"
    if kind == "dir":
        victim.mkdir(parents=True)
    else:
        victim.parent.mkdir(parents=True)
        victim.write_text(PRECIOUS)
    return victim


def _untouched(victim: Path, kind: str) -> None:
    if kind == "dir":
        assert victim.is_dir() and not victim.is_symlink() and list(victim.iterdir()) == [], \
            f"the run wrote into {victim}, outside the output folder: {list(victim.iterdir())}"
    else:
        assert victim.is_file() and victim.read_text() == PRECIOUS, f"the run wrote through the link into {victim}"
    assert [p.name for p in victim.parent.iterdir()] == ["victim"], "the run created files outside the output folder"


def _output_folder(tmp_path: Path, mode: str, rel: str) -> Path:
    base, _ = _reference()
    out = tmp_path / "run" / "out"
    if mode == "new":
        out.mkdir(parents=True)
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
    else:
        shutil.copytree(base / "out", out, symlinks=True)
    return out


def _plant(path: Path, to: Path, hard: bool = False) -> None:
    if os.path.lexists(path):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if hard:
        os.link(to, path)
    else:
        path.symlink_to(to, target_is_directory=to.is_dir())


def _evaluate(out: Path, mode: str) -> tuple[int, str]:
    base, _ = _reference()
    argv = ["evaluate", str(base / "config.yaml"), "--no-progress", "--output", str(out)]
    with _threads():
        return _run(argv + (["--overwrite"] if mode == "overwrite" else []))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("rel", "kind"), ENTRIES, ids=[f"{k}:{r}" for r, k in ENTRIES])
def test_a_symlink_planted_in_the_output_folder_is_never_written_through(rel, kind, mode, tmp_path):
    out = _output_folder(tmp_path, mode, rel)
    victim = _victim(tmp_path, "dir" if kind == "dir" else "file")
    _plant(out / rel, victim)
    rc, err = _evaluate(out, mode)
    got = _classify(rc, err)
    assert got in ("OK", "CLEAR"), f"{mode} with {rel} -> {victim}: {got}: {err[-3000:]}"
    _untouched(victim, kind)
    if got == "CLEAR":  # refused before any work, naming the link
        assert Path(rel).name in err or "link" in err, err
    if mode == "overwrite" and kind != "tmp":
        assert got == "OK", err[-2000:]  # --overwrite removes the link (never follows it) and writes the file
        assert not (out / rel).is_symlink() and (out / rel).exists()


@pytest.mark.parametrize("rel", [r for r, k in ENTRIES if k == "file"])
def test_a_hard_link_planted_in_the_output_folder_is_never_written_through(rel, tmp_path):
    out = _output_folder(tmp_path, "resume", rel)
    victim = _victim(tmp_path, "file")
    _plant(out / rel, victim, hard=True)
    rc, err = _evaluate(out, "resume")
    assert _classify(rc, err) in ("OK", "CLEAR"), err[-3000:]
    assert victim.read_text() == PRECIOUS, f"the run wrote into {victim} through the hard link {rel}"


def test_the_listing_holds_every_kind_of_output_the_issue_names():
    _, listed = _reference()
    names = {Path(r).name for r in listed}
    assert {"run.json", "log.jsonl", "results.json", "results.csv", "report.md", "report.html",
            "robustness.png"} <= names, names
    assert any(n.startswith("study_") and n.endswith(".json") for n in names), names
    assert any(r.startswith("adversarial/") and r.endswith(".png") for r in listed), listed
    assert len(ENTRIES) * len(MODES) >= 35


# --- the helper itself ------------------------------------------------------------------------------------------
def test_safe_io_refuses_links_and_replaces_atomically(tmp_path):
    root = tmp_path / "out"
    victim = tmp_path / "victim.txt"
    victim.write_text(PRECIOUS)
    root.mkdir()
    (root / "a.txt").symlink_to(victim)
    with pytest.raises(LinkedOutputError, match="a.txt is a symbolic link"):
        write_text(root / "a.txt", "x")
    with pytest.raises(LinkedOutputError, match="a.txt is a symbolic link"):
        with open_output(root / "a.txt", "a") as fh:
            fh.write("x")
    os.link(victim, root / "h.txt")
    with pytest.raises(LinkedOutputError, match="hard links"):
        with open_output(root / "h.txt", "a") as fh:
            fh.write("x")
    write_text(root / "h.txt", "new")  # a whole file replaces the name: the other name keeps its content
    assert (root / "h.txt").read_text() == "new" and victim.read_text() == PRECIOUS
    (root / "sub").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(LinkedOutputError, match="sub is a symbolic link"):
        write_text(root / "sub" / "b.txt", "x", root=root)
    assert not (tmp_path / "b.txt").exists()
    with pytest.raises(RuntimeError):  # an error while writing leaves the old file and no temporary file
        with open_output(root / "c.txt", "w") as fh:
            fh.write("half")
            raise RuntimeError
    assert sorted(p.name for p in root.iterdir()) == ["a.txt", "h.txt", "sub"]
    assert victim.read_text() == PRECIOUS
    os.mkfifo(root / "fifo")  # a FIFO planted as the log fails at once instead of blocking the run
    with pytest.raises(LinkedOutputError, match="not a regular file"):
        with open_output(root / "fifo", "a") as fh:
            fh.write("x")
