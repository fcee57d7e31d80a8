"""The output folder of a run: what medadv writes there, and when it may write (new, resume, adopt or replace).

A folder holding results of the same config and data (the fingerprint of :func:`medadv.config.config_fingerprint`,
kept in ``run.json``) is resumed; row logs without ``run.json`` (a run killed before its record was written) are
adopted when every row came from this config's settings; results of another config or data stop the run unless
``overwrite`` is given. Links where medadv writes are refused before any work (issue 28), every file is written
atomically and never through a link (:mod:`medadv.safe_io`), and an operating-system error becomes one line naming
the path (:func:`output_error`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ..config_schema import ConfigError

__all__ = ["OUTPUT_FILES", "OUTPUT_GLOBS", "ADVERSARIAL_DIR", "ATTACK_CACHE_DIR", "Action", "existing_outputs",
           "check_no_links", "check_output", "read_logs", "row_fingerprints", "adopt", "prepare_output",
           "check_adversarial_links", "output_error", "check_output_writable"]

#: what a run writes into its output folder (``overwrite`` removes exactly these)
OUTPUT_FILES = ("run.json", "results.json", "results.csv", "report.md", "report.html", "robustness.png", "log.jsonl")
OUTPUT_GLOBS = ("log.rank*.jsonl", "study_*.json")
ADVERSARIAL_DIR = "adversarial"
#: the attack-once cache's spill folder inside the output folder, removed when the run ends
ATTACK_CACHE_DIR = ".attack_cache"

#: what to do with an output folder (:func:`check_output`)
Action = Literal["new", "resume", "replace", "adopt"]


def existing_outputs(out: Path) -> list[Path]:
    """medadv's outputs in ``out``, links among them included (a dangling link is there too: ``lexists``)."""
    found = [out / f for f in OUTPUT_FILES if os.path.lexists(out / f)]
    found += sorted(p for g in OUTPUT_GLOBS for p in out.glob(g))
    if os.path.lexists(out / ADVERSARIAL_DIR):
        found.append(out / ADVERSARIAL_DIR)
    if os.path.lexists(out / ATTACK_CACHE_DIR):  # a killed run's spill folder, or a link planted there
        found.append(out / ATTACK_CACHE_DIR)
    return found


def check_no_links(out: Path) -> None:
    """Refuse, before any work, an output folder where a file medadv writes is a link (symbolic, dangling or
    not, or a second hard link): a link planted there would make the write land outside the folder (issue 28).
    ``overwrite`` removes such links instead (:func:`prepare_output`); the writers refuse links anyway
    (:mod:`medadv.safe_io`), this says so before the model is built."""
    from ..safe_io import check_not_linked

    for p in existing_outputs(out):
        if p.name == ADVERSARIAL_DIR and not p.is_symlink():
            check_adversarial_links(out)  # folders linked within the output folder are fine (save.check_inside)
            for folder, _, files in os.walk(p):  # a file is written only as a regular file: no link of any kind
                for name in files:
                    check_not_linked(Path(folder) / name, hard_links=False)
            continue
        if p.name == ATTACK_CACHE_DIR:  # the cache's spill folder: a link there would send its files elsewhere
            check_not_linked(p, hard_links=False)
            continue
        # a hard link matters where medadv appends (the logs); a file written whole replaces its own name only
        check_not_linked(p, hard_links=p.suffix == ".jsonl")


def _occupied(out: Path, before: str | None, fingerprint: str) -> FileExistsError:
    what = f"another config or other data (fingerprint {before}, this run {fingerprint})" if before else \
        "an unknown run (no run.json)"
    return FileExistsError(f"output folder {out} holds results of {what}: pass --overwrite to replace them, or "
                           "give another `output` (or --output)")


def check_output(out: Path, fingerprint: str, overwrite: bool) -> Action:
    """What to do with the output folder: ``"new"``, ``"resume"`` (results of the same fingerprint are
    there), ``"replace"`` (``overwrite``) or ``"adopt"`` (row logs and no ``run.json``, as a run killed
    before its record was there leaves them: :func:`adopt` decides from the rows once the model is built);
    results of another config or data stop the run."""
    found = existing_outputs(out)
    if not found:
        return "new"
    if overwrite:
        return "replace"
    check_no_links(out)
    try:
        before = json.loads((out / "run.json").read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        before = None
    if before is None and (out / "run.json").exists():
        raise FileExistsError(f"output folder {out} holds a run.json that is not one medadv wrote (unreadable, or "
                              "no fingerprint): pass --overwrite to replace the folder's results, or give another "
                              "`output` (or --output)")
    if before == fingerprint:
        read_logs(out)  # a line that is not medadv's is refused now, before any work (not after the model is built)
        return "resume"
    logs_only = all(p.name == "log.jsonl" or p.match("log.rank*.jsonl") or p.name in (ADVERSARIAL_DIR, ATTACK_CACHE_DIR)
                    for p in found)
    if before is None and not (out / "run.json").exists() and logs_only:
        return "adopt"
    raise _occupied(out, before, fingerprint)


def read_logs(out: Path) -> list[Any]:
    """Every row of the folder's logs (``log.jsonl`` and the per-rank logs); a line that is not a row of medadv's
    log is a ``ValueError`` naming the file and line (:meth:`medadv.results.Results.read_log`)."""
    from .. import distributed
    from ..results import Results

    return [r for p in distributed.log_files(out / "log.jsonl") for r in Results.read_log(p).rows]


def row_fingerprints(model: Any, task: Any, attacks: Mapping[str, Any], target_fn: Any, *, hd95: bool,
                     spacing: Any, seed: int, save: bool) -> dict[str, str]:
    """The settings fingerprint ``evaluate`` gives the rows of each attack (the ``config`` column of the logs).

    Uses the fingerprints evaluate itself uses, with evaluate's own arguments, so that the two cannot drift apart."""
    from ..fingerprints import row_fingerprint, weights_hash

    weights = weights_hash(model)
    return {name: row_fingerprint(weights, task, atk, hd95, spacing, target_fn, seed=seed, save=save)
            for name, atk in attacks.items()}


def adopt(out: Path, fingerprint: str, expected: Mapping[str, str]) -> Action:
    """``"adopt"`` when every row of the folder's logs came from this config's settings (a run of this config
    killed before ``run.json`` was there: its rows are resumed, not thrown away), else the "unknown run" error."""
    rows = read_logs(out)
    ours = all(isinstance(r, dict) and r.get("config") is not None and expected.get(str(r.get("attack"))) == r["config"]
               for r in rows)
    if ours and (rows or not (out / ADVERSARIAL_DIR).exists()):
        return "adopt"
    raise _occupied(out, None, fingerprint)


def prepare_output(out: Path, action: Action, record: Mapping[str, Any]) -> None:
    """Rank 0 only: empty the folder of medadv's outputs (``replace``), then write ``run.json`` atomically.

    ``run.json`` identifies the run: it is written before any rank logs a row, and replaced last (a run killed
    while the folder is emptied leaves the old record beside what is left of the old results)."""
    from ..safe_io import write_text

    if action == "replace":
        for p in existing_outputs(out):
            if p.name == "run.json" and not p.is_symlink():
                continue  # overwritten atomically below (a link there is removed first: never written through)
            if p.is_symlink() or not p.is_dir():
                p.unlink()  # a link is removed, never followed (a hard link: only this name goes)
            else:
                shutil.rmtree(p)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "run.json", json.dumps(dict(record), indent=1))


def check_adversarial_links(out: Path) -> None:
    """Refuse symbolic links under ``out/adversarial`` that lead outside ``out``: saving would write through
    them (before anything is computed; :func:`medadv.data.save.save_example` checks each file as well)."""
    from ..data.save import check_inside

    adv = out / ADVERSARIAL_DIR
    if adv.is_symlink():
        check_inside(adv, out)
    if not adv.is_dir():
        return
    for folder, dirs, files in os.walk(adv):  # links are not followed, only checked
        for name in [*dirs, *files]:
            if (p := Path(folder) / name).is_symlink():
                check_inside(p, out)


def output_error(e: OSError, out: Path) -> OSError:
    """One line for an operating-system error while the results are written: the path (the output folder when
    the OS does not name one, as for a full disk) and the reason. medadv's own messages pass unchanged."""
    if e.errno is None:
        return e
    reason = e.strerror or str(e)
    if e.filename is None:
        return OSError(f"cannot write into the output folder {out}: {reason}")
    path = Path(os.fsdecode(e.filename))
    inside = path == out or out in path.parents
    return OSError(f"cannot write {path}: {reason}" if inside else f"{path}: {reason}")


def check_output_writable(out: Path) -> None:
    """The output folder can be created and written (``medadv validate``, :meth:`medadv.run.Plan.check`). What it
    creates to find out (the folder and its missing parents, a temporary file) is removed again."""
    if out.exists() and not out.is_dir():
        raise ConfigError([f"`output` {out} is a file, not a folder"])
    if out.is_dir():
        try:
            with tempfile.TemporaryFile(dir=out):
                pass
        except OSError as e:
            raise ConfigError([f"`output` {out} is not writable: {e.strerror or e}"]) from None
        return
    existing = out.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError([f"`output` {out} cannot be created: {existing} is a file, not a folder"])
    created = [p for p in (out, *out.parents) if p != existing and existing in p.parents]
    try:
        out.mkdir(parents=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise ConfigError([f"`output` {out} cannot be created: {e.strerror or e}"]) from None
    finally:
        for p in created:  # deepest first; only what this check made
            if p.is_dir() and not p.is_symlink():
                try:
                    p.rmdir()
                except OSError:
                    break
