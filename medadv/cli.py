"""The ``medadv`` command line: ``demo`` (deepbet on Colin27; ``--unet``: the trained-UNet demo), ``evaluate CONFIG``, ``validate CONFIG``, ``attacks``, ``tasks``, ``models``.

``medadv evaluate`` never overwrites results silently: an output folder holding results of the same
config and data (the fingerprint of :func:`medadv.config.config_fingerprint`, kept in ``run.json``) is
resumed; one holding results of another config or other data stops the run with a message, unless
``--overwrite`` is given. Under ``torchrun`` every process evaluates its shard and rank 0 writes the outputs.
"""

from __future__ import annotations

import argparse
import functools
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attacks.base import Attack

__all__ = ["main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.unet:  # the earlier demo: a UNet trained here on MNI152 crops
        from .demo import DemoConfig, run_demo, write_demo_outputs

        cfg = DemoConfig(epochs=args.epochs, steps=args.steps, n_test=args.n_test)
        out = run_demo(cfg, retrain=args.retrain, progress=not args.no_progress)
        if args.output:
            for path in write_demo_outputs(out, args.output)[2:]:
                print(f"report: {path}")
        return 0
    from .demo_deepbet import DeepbetDemoConfig, run_deepbet_demo, write_deepbet_outputs

    # checked before any work: a wrong size or step count is one line, not a failure minutes in
    dcfg = DeepbetDemoConfig(size=args.size, full=True if args.full else None, steps=args.steps)
    dout = run_deepbet_demo(dcfg, progress=not args.no_progress)
    if args.output:
        for path in write_deepbet_outputs(dout, args.output)[2:]:
            print(f"report: {path}")
    return 0


#: what ``medadv evaluate`` writes into its output folder (``--overwrite`` removes exactly these)
OUTPUT_FILES = ("run.json", "results.json", "results.csv", "report.md", "report.html", "robustness.png", "log.jsonl")
OUTPUT_GLOBS = ("log.rank*.jsonl", "study_*.json")
ADVERSARIAL_DIR = "adversarial"


def _existing_outputs(out: Path) -> list[Path]:
    """medadv's outputs in ``out``, links among them included (a dangling link is there too: ``lexists``)."""
    import os

    found = [out / f for f in OUTPUT_FILES if os.path.lexists(out / f)]
    found += sorted(p for g in OUTPUT_GLOBS for p in out.glob(g))
    if os.path.lexists(out / ADVERSARIAL_DIR):
        found.append(out / ADVERSARIAL_DIR)
    return found


def _check_no_links(out: Path) -> None:
    """Refuse, before any work, an output folder where a file medadv writes is a link (symbolic, dangling or
    not, or a second hard link): a link planted there would make the write land outside the folder (issue 28).
    ``--overwrite`` removes such links instead (:func:`_prepare_output`); the writers refuse links anyway
    (:mod:`medadv.safe_io`), this says so before the model is built."""
    import os

    from .safe_io import check_not_linked

    for p in _existing_outputs(out):
        if p.name == ADVERSARIAL_DIR and not p.is_symlink():
            _check_adversarial_links(out)  # folders linked within the output folder are fine (save.check_inside)
            for folder, _, files in os.walk(p):  # a file is written only as a regular file: no link of any kind
                for name in files:
                    check_not_linked(Path(folder) / name, hard_links=False)
            continue
        # a hard link matters where medadv appends (the logs); a file written whole replaces its own name only
        check_not_linked(p, hard_links=p.suffix == ".jsonl")


def _occupied(out: Path, before: str | None, fingerprint: str) -> FileExistsError:
    what = f"another config or other data (fingerprint {before}, this run {fingerprint})" if before else \
        "an unknown run (no run.json)"
    return FileExistsError(f"output folder {out} holds results of {what}: pass --overwrite to replace them, or "
                           "give another `output` (or --output)")


def _check_output(out: Path, fingerprint: str, overwrite: bool) -> str:
    """What to do with the output folder: ``"new"``, ``"resume"`` (results of the same fingerprint are
    there), ``"replace"`` (``--overwrite``) or ``"adopt"`` (row logs and no ``run.json``, as a run killed
    before its record was there leaves them: :func:`_adopt` decides from the rows once the model is built);
    results of another config or data stop the run."""
    import json

    found = _existing_outputs(out)
    if not found:
        return "new"
    if overwrite:
        return "replace"
    _check_no_links(out)
    try:
        before = json.loads((out / "run.json").read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        before = None
    if before is None and (out / "run.json").exists():
        raise FileExistsError(f"output folder {out} holds a run.json that is not one medadv wrote (unreadable, or "
                              "no fingerprint): pass --overwrite to replace the folder's results, or give another "
                              "`output` (or --output)")
    if before == fingerprint:
        _read_logs(out)  # a line that is not medadv's is refused now, before any work (not after the model is built)
        return "resume"
    logs_only = all(p.name == "log.jsonl" or p.match("log.rank*.jsonl") or p.name == ADVERSARIAL_DIR for p in found)
    if before is None and not (out / "run.json").exists() and logs_only:
        return "adopt"
    raise _occupied(out, before, fingerprint)


def _read_logs(out: Path) -> list[Any]:
    """Every row of the folder's logs (``log.jsonl`` and the per-rank logs); a line that is not a row of medadv's
    log is a ``ValueError`` naming the file and line (:meth:`medadv.results.Results.read_log`)."""
    from . import distributed
    from .results import Results

    return [r for p in distributed.log_files(out / "log.jsonl") for r in Results.read_log(p).rows]


def _row_fingerprints(model: Any, task: Any, attacks: Any, cfg: dict[str, Any], target_fn: Any) -> dict[str, str]:
    """The settings fingerprint ``evaluate`` gives the rows of each attack of this config (the ``config``
    column of the logs).

    Uses evaluation's private helpers, with evaluate's own arguments, so that the two cannot drift apart."""
    from .evaluation import _fingerprint, _weights_hash

    weights = _weights_hash(model)
    return {name: _fingerprint(weights, task, atk, cfg["hd95"], cfg["spacing"], target_fn, seed=cfg["seed"],
                               save=bool(cfg["save_adversarial"]))
            for name, atk in attacks.items()}


def _adopt(out: Path, fingerprint: str, expected: dict[str, str]) -> str:
    """``"adopt"`` when every row of the folder's logs came from this config's settings (a run of this config
    killed before ``run.json`` was there: its rows are resumed, not thrown away), else the "unknown run" error."""
    rows = _read_logs(out)
    ours = all(isinstance(r, dict) and r.get("config") is not None and expected.get(str(r.get("attack"))) == r["config"]
               for r in rows)
    if ours and (rows or not (out / ADVERSARIAL_DIR).exists()):
        return "adopt"
    raise _occupied(out, None, fingerprint)


def _write_atomic(path: Path, text: str) -> None:
    """``path`` holds ``text`` in full or is as it was: a temporary file beside it, flushed to disk, renamed;
    never written through a link (:mod:`medadv.safe_io`)."""
    from .safe_io import write_text

    write_text(path, text)


def _prepare_output(out: Path, action: str, record: dict) -> None:
    """Rank 0 only: empty the folder of medadv's outputs (``replace``), then write ``run.json`` atomically.

    ``run.json`` identifies the run: it is written before any rank logs a row, and replaced last (a run killed
    while the folder is emptied leaves the old record beside what is left of the old results)."""
    import json
    import shutil

    if action == "replace":
        for p in _existing_outputs(out):
            if p.name == "run.json" and not p.is_symlink():
                continue  # overwritten atomically below (a link there is removed first: never written through)
            if p.is_symlink() or not p.is_dir():
                p.unlink()  # a link is removed, never followed (a hard link: only this name goes)
            else:
                shutil.rmtree(p)
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / "run.json", json.dumps(record, indent=1))


def _check_adversarial_links(out: Path) -> None:
    """Refuse symbolic links under ``out/adversarial`` that lead outside ``out``: saving would write through
    them (before anything is computed; :func:`medadv.data.save.save_example` checks each file as well)."""
    import os

    from .data.save import check_inside

    adv = out / ADVERSARIAL_DIR
    if adv.is_symlink():
        check_inside(adv, out)
    if not adv.is_dir():
        return
    for folder, dirs, files in os.walk(adv):  # links are not followed, only checked
        for name in [*dirs, *files]:
            if (p := Path(folder) / name).is_symlink():
                check_inside(p, out)


def _output_error(e: OSError, out: Path) -> OSError:
    """One line for an operating-system error while the results are written: the path (the output folder when
    the OS does not name one, as for a full disk) and the reason. medadv's own messages pass unchanged."""
    import os

    if e.errno is None:
        return e
    reason = e.strerror or str(e)
    if e.filename is None:
        return OSError(f"cannot write into the output folder {out}: {reason}")
    path = Path(os.fsdecode(e.filename))
    inside = path == out or out in path.parents
    return OSError(f"cannot write {path}: {reason}" if inside else f"{path}: {reason}")


def _check_output_writable(out: Path) -> None:
    """``medadv validate``: the output folder can be created and written. What it creates to find out (the
    folder and its missing parents, a temporary file) is removed again."""
    import tempfile

    from .config_schema import ConfigError

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


def _run_studies(cfg: dict[str, Any], model: Any, task: Any, data: Any, attacks: Any, target_fn: Any,
                 out: Path, allow_code: bool) -> list[Any]:
    """The config's ``studies:`` (rank 0 only), each saved as ``study_<i>_<name>.json`` beside the results."""
    if not cfg.get("studies"):
        return []
    from .config import study_models
    from .studies import run_study

    models = study_models(cfg, model, cfg["_dir"], allow_code=allow_code, task=task)

    done = []
    for i, spec in enumerate(cfg["studies"]):
        name = spec["study"]
        print(f"study {name} ...", file=sys.stderr)
        options = {k: v for k, v in spec.items() if k != "study"}
        result = run_study(name, options, models, task, data, attacks, target_fn=target_fn, base_dir=cfg["_dir"])
        result.to_json(out / f"study_{i}_{name}.json")
        done.append(result)
    return done


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import datetime

    import torch

    from . import distributed
    from .config import (
        build_attacks,
        build_loader,
        build_model,
        build_target_fns,
        build_task,
        check_data,
        check_model,
        check_targets,
        class_names,
        config_fingerprint,
        load_config,
        model_name,
        wrap_inference,
    )
    from .evaluation import evaluate
    from .report import worst_cases, write_html_report, write_report

    cfg = load_config(args.config)
    base = cfg["_dir"]
    allow_code = bool(args.allow_code or cfg["allow_code"])
    task = build_task(cfg["task"], allow_code=allow_code)
    attacks = build_attacks(cfg, task)
    # config mistakes cost nothing: the target, the model's name and code, the data files and transforms are
    # checked before any user code runs, any model is built or any image read
    target_fn = build_target_fns(cfg, task, attacks, allow_code=allow_code)
    check_targets(attacks, cfg["target"], target_fn if isinstance(target_fn, dict) else None)
    for spec in [cfg["model"], *(cfg["models"] or {}).values()]:
        check_model(spec, base, allow_code=allow_code)
    check_data(cfg["data"], base, task, allow_code=allow_code)
    names = class_names(cfg)
    out = Path(args.output or cfg["output"])
    if not out.is_absolute() and not args.output:
        out = Path(base) / out
    fingerprint = config_fingerprint(cfg)
    distributed.init_from_env()  # torchrun: join the process group; alone: nothing
    data: Any = None
    try:
        action = _check_output(out, fingerprint, args.overwrite)  # every rank decides before rank 0 acts
        torch.manual_seed(cfg["seed"])  # before the model is built: its random parts follow the config's seed
        model = wrap_inference(build_model(cfg["model"], base, allow_code=allow_code, task=task), cfg["inference"])
        model = task.logits_model(model.to(distributed.device()))  # `outputs: probabilities`: logits for all below
        data = build_loader(cfg["data"], base, batch_size=cfg["batch_size"], task=task, seed=cfg["seed"],
                            allow_code=allow_code)
        if action == "adopt":  # logs without run.json: resumed if every row is this config's (every rank decides)
            action = _adopt(out, fingerprint, _row_fingerprints(model, task, attacks, cfg, target_fn))
        if cfg["save_adversarial"] and action != "replace":  # --overwrite removes the folder, links and all
            _check_adversarial_links(out)
        # the output folder is touched only once the model and the data are ready: a failed start leaves it as is
        distributed.barrier()
        if distributed.is_main():
            _prepare_output(out, action, {
                "fingerprint": fingerprint, "config": str(Path(args.config).resolve()),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
            if action == "resume":
                print(f"resuming into {out} (results of the same config and data are there)", file=sys.stderr)
            elif action == "adopt":
                print(f"resuming into {out}: it has no run.json (a killed run?), and every row of its logs comes from "
                      "this config", file=sys.stderr)
        distributed.barrier()  # the folder is ready before any rank logs into it
        settings = {k: v for k, v in cfg.items() if k != "_dir"}
        res = evaluate(model, task, data, attacks, log=out / "log.jsonl", progress=not args.no_progress,
                       target_fn=target_fn, hd95=cfg["hd95"], spacing=cfg["spacing"], seed=cfg["seed"],
                       save_adversarial=out / ADVERSARIAL_DIR if cfg["save_adversarial"] else None,
                       meta={"config": str(Path(args.config).resolve()), "model": model_name(cfg["model"]),
                             "config_fingerprint": fingerprint, "settings": settings,
                             **({"classes": names} if names else {})})
        if distributed.is_main():
            res.to_json(out / "results.json")
            res.to_csv(out / "results.csv")
            report = write_report(res, out)
            studies = _run_studies(cfg, model, task, data, attacks, target_fn, out, allow_code)
            # the most-damaged samples of each attack, attacked again under evaluate's per-batch seed to draw them
            report_cfg = cfg.get("report") or {}
            cases = worst_cases(model, task, data, attacks, res, k=cfg["cases"], seed=cfg["seed"],
                                target_fn=target_fn, class_names=names, spacing=cfg["spacing"],
                                window=report_cfg.get("window")) if cfg["cases"] else []
            html = write_html_report(res, out, studies=studies, cases=cases, class_names=names,
                                     title=report_cfg.get("title") or f"medadv: {Path(args.config).name}",
                                     results_title=report_cfg.get("results"))
            print(res.format_summary())
            print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, {report}, {html}")
        distributed.barrier()
    except OSError as e:  # a full disk, a read-only folder: one line naming the path, not two tracebacks
        err = _output_error(e, out)
        if err is e:
            raise
        raise err from e
    finally:
        distributed.destroy()
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    """The schema, then the task, attacks, target, model builder and data files: no model built, no data
    loaded, nothing run. Every mistake found is printed, one line each."""
    from .config import (
        ConfigError,
        build_attacks,
        build_target_fns,
        build_task,
        check_data,
        check_model,
        check_target,
        check_targets,
        class_names,
        load_config,
    )

    cfg = load_config(args.config)  # schema errors: all of them at once, then stop
    allow_code = bool(args.allow_code or cfg["allow_code"])
    errors: list[str] = []

    def attempt(check: Callable[[], Any]) -> Any:
        try:
            return check()
        except (ValueError, TypeError, FileNotFoundError, FileExistsError) as e:
            errors.extend(str(e).splitlines())
            return None

    task = attempt(lambda: build_task(cfg["task"], allow_code=allow_code))
    attacks: Any = None
    if task is not None:
        attacks = attempt(lambda: build_attacks(cfg, task))
        attempt(lambda: check_target(cfg["target"], task, allow_code=allow_code))
        own = [e["target"] for e in cfg["attacks"] if isinstance(e, dict) and e.get("target")]
        for spec in own:
            attempt(functools.partial(check_target, spec, task, allow_code=allow_code))
        if attacks is not None:
            fns = attempt(lambda: build_target_fns(cfg, task, attacks, allow_code=allow_code)) if own else None
            attempt(lambda: check_targets(attacks, cfg["target"], fns if isinstance(fns, dict) else None))
    for spec in [cfg["model"], *(cfg["models"] or {}).values()]:
        attempt(functools.partial(check_model, spec, cfg["_dir"], allow_code=allow_code))
    attempt(lambda: check_data(cfg["data"], cfg["_dir"], task, allow_code=allow_code))
    attempt(lambda: class_names(cfg))
    out = Path(cfg["output"]) if Path(cfg["output"]).is_absolute() else Path(cfg["_dir"]) / cfg["output"]
    attempt(lambda: _check_output_writable(out))  # created and removed again if it is not there
    if errors:
        raise ConfigError(errors)
    print(f"OK: {args.config}: {len(attacks)} attack runs ({', '.join(attacks)})")
    return 0


def _threat_text(cls: type[Attack]) -> str:
    norms = " or ".join(cls.norms)
    texts = {"ball": f"{norms} ball (one run per budget)",
             "box": "the data box (no ε: one run, budget None)",
             "ball_or_box": f"{norms} ball (one run per budget) or the data box"}
    return texts.get(cls.threat_kind, cls.threat_kind)


def describe_attack(name: str) -> str:
    """An attack's summary line, threat, tasks and every parameter (name, what it accepts, default)."""
    import inspect

    from .attacks.base import attack_class

    cls = attack_class(name)
    doc = (cls.__doc__ or "").strip().splitlines()
    lines = [f"{cls.name}: {doc[0] if doc else cls.__name__}",
             f"  threat: {_threat_text(cls)}",
             f"  tasks:  {', '.join(cls.tasks) or 'any'}"
             + (f" ({' or '.join(f'{d}-D' for d in cls.spatial_dims)} inputs)" if cls.spatial_dims else "")
             + ("; targeted by nature (needs `target`)" if cls.always_targeted else "")]
    declared, defaults = cls.declared_params(), cls.param_defaults()
    rows = []
    for p in cls.param_names():
        what = declared[p].describe() if p in declared else "(undeclared)"
        d = defaults.get(p, inspect.Parameter.empty)
        default = "required" if d is inspect.Parameter.empty else f"default {d!r}"
        rows.append((p, what, default))
    if rows:
        w = max(len(r[0]) for r in rows)
        lines += [f"  {p:<{w}}  {what}; {default}" for p, what, default in rows]
    return "\n".join(lines)


def _cmd_attacks(args: argparse.Namespace) -> int:
    import medadv  # noqa: F401  (imports register every attack)

    from .attacks.base import attack_class, available_attacks

    if args.params is not None:
        names = args.params or available_attacks()
        print("\n\n".join(describe_attack(n) for n in names))
        return 0
    for name in available_attacks():
        cls = attack_class(name)
        doc = (cls.__doc__ or "").strip().splitlines()
        print(f"{name:<22} {doc[0] if doc else ''}")
    print("\n`medadv attacks --params NAME` lists an attack's parameters")
    return 0


def describe_task(name: str) -> str:
    """A task kind's title, shapes, config keys (with defaults), ``auto`` members and the attacks that apply."""
    import inspect

    from .attacks.base import attack_class, available_attacks
    from .tasks import task_class

    cls = task_class(name)
    lines = [f"{cls.name}: {cls.title}", f"  shapes: {cls.shapes}" if cls.shapes else ""]
    params = [p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    keys = ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in params)
    lines.append(f"  config: task: {{type: {cls.name}{', ' if keys else ''}{keys}}}")
    if cls.auto_members:
        lines.append(f"  auto:   {', '.join(cls.auto_versions['standard']['attacks'])} (standard)"
                     + (f"; {note}" if (note := getattr(cls, "auto_note", "")) else ""))
    mro = {c.__name__ for c in cls.__mro__}
    apply = [a for a in available_attacks() if not attack_class(a).tasks or set(attack_class(a).tasks) & mro]
    lines.append(f"  attacks declared for it: {len(apply)} of {len(available_attacks())} ({', '.join(apply)})")
    return "\n".join(line for line in lines if line)


def _cmd_tasks(args: argparse.Namespace) -> int:
    import medadv  # noqa: F401  (imports register every attack and task kind)

    from .tasks import available_tasks, task_class

    if args.params is not None:
        print("\n\n".join(describe_task(n) for n in (args.params or available_tasks())))
        return 0
    for name in available_tasks():
        cls = task_class(name)
        print(f"{name:<26} {cls.title}" + (f" — {cls.shapes}" if cls.shapes else ""))
    print("\n`medadv tasks --params NAME` lists a kind's config keys, auto members and attacks; a config may also "
          "name a Task class by dotted path (task: {type: package.module:Class}, with --allow-code)")
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from .models import zoo

    if args.names:  # unknown names are refused with the closest one (a ValueError: one line, exit 2)
        print("\n\n".join(zoo.describe_model(n) for n in args.names))
        return 0
    for row in zoo.describe_models():
        print(f"{row['name']:<14} {row['summary']}\n{'':<14} output: {row['output']}; licence: {row['licence']}")
    print("\n`medadv models NAME` shows a model's source, paper, input, parameters and whether it loads here; a config "
          "names one as `model: {zoo: NAME, kwargs: {...}}`")
    return 0


_ALLOW_CODE_HELP = ("let the config run code: model builders that are not network classes or declared network "
                    "factories, `target` functions, MONAI transforms that run code or write files, code outside "
                    "medadv, MONAI and torchvision, and Python files outside the config's folder (same as "
                    "`allow_code: true`)")


def _installed_version() -> str:
    from . import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="medadv", description="Adversarial robustness of medical imaging models.")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    # the installed distribution's version (pyproject.toml is its one source, read through importlib.metadata)
    p.add_argument("--version", action="version", version=f"medadv {_installed_version()}")
    # `--debug` after the command too; SUPPRESS keeps the main parser's value when it is not repeated there
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of an error")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", parents=[common],
                       help="attack deepbet (a published, pretrained brain-extraction net) on the real Colin27 head; "
                            "--unet: the earlier demo (a UNet trained here on MNI152)")
    d.add_argument("--full", action="store_true",
                   help="attack deepbet's two-stage pipeline (bbox 128^3 -> fine 256^3; the default on a GPU); "
                        "default on a CPU: the bbox stage alone at --size")
    d.add_argument("--size", type=int, default=96,
                   help="grid of the bbox stage on a CPU, voxels per side, a multiple of 32 (default 96)")
    d.add_argument("--steps", type=int, default=10, help="attack iterations (default 10)")
    d.add_argument("--output", help="also write results.json/csv and the Markdown and HTML reports here")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    d.add_argument("--unet", action="store_true",
                   help="the earlier demo: train (or load) a small UNet on MNI152 crops and attack it")
    d.add_argument("--retrain", action="store_true", help="--unet: ignore the cached checkpoint")
    d.add_argument("--epochs", type=int, default=25, help="--unet: training epochs (default 25)")
    d.add_argument("--n-test", type=int, default=8, help="--unet: number of held-out crops attacked (default 8)")
    d.set_defaults(func=_cmd_demo)
    e = sub.add_parser("evaluate", parents=[common], help="run models x attacks x budgets from a YAML config")
    e.add_argument("config", help="YAML config (see medadv.config)")
    e.add_argument("--output", help="output directory (default: the config's `output`)")
    e.add_argument("--no-progress", action="store_true")
    e.add_argument("--overwrite", action="store_true",
                   help="replace results of another config or data in the output directory (default: stop; "
                        "results of the same config and data are resumed)")
    e.add_argument("--allow-code", action="store_true", help=_ALLOW_CODE_HELP)
    e.set_defaults(func=_cmd_evaluate)
    v = sub.add_parser("validate", parents=[common],
                       help="check a YAML config (schema, attacks, files) without running it")
    v.add_argument("config", help="YAML config (see medadv.config)")
    v.add_argument("--allow-code", action="store_true", help=_ALLOW_CODE_HELP)
    v.set_defaults(func=_cmd_validate)
    a = sub.add_parser("attacks", parents=[common], help="list the registered attacks (and their parameters)")
    a.add_argument("--params", nargs="*", metavar="NAME",
                   help="show the parameters (what each accepts, default) of these attacks (none given: all)")
    a.set_defaults(func=_cmd_attacks)
    t = sub.add_parser("tasks", parents=[common], help="list the registered task kinds (and their config keys)")
    t.add_argument("--params", nargs="*", metavar="NAME",
                   help="show the config keys, auto members and attacks of these task kinds (none given: all)")
    t.set_defaults(func=_cmd_tasks)
    m = sub.add_parser("models", parents=[common],
                       help="list the zoo of published pretrained models (source, licence, input, output)")
    m.add_argument("names", nargs="*", metavar="NAME", help="show these models in full (and whether they load here)")
    m.set_defaults(func=_cmd_models)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a user's mistake prints ``medadv: error: <message>`` (one line each) and returns 2.

    ``--debug`` prints the traceback too.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, OSError) as e:
        # a mistake in the config or the command line (InvalidParameterError and ConfigError are ValueErrors;
        # TypeError: an attack refusing a task or threat it does not apply to), or a file that cannot be read or
        # written (OSError: the path and the reason): the message, not a traceback, unless asked for
        if args.debug:
            traceback.print_exc()
        text = str(e) if not isinstance(e, OSError) or e.errno is None else \
            f"{e.filename}: {e.strerror}" if e.filename is not None else e.strerror or str(e)
        lines = [_clip_line(line) for line in text.splitlines() if line.strip()] or [type(e).__name__]
        for line in lines:
            print(f"medadv: error: {line}", file=sys.stderr)
        return 2


def _clip_line(line: str, word: int = 500, total: int = 4000) -> str:
    """An error line of bounded length: a config value of megabytes is not echoed back whole. Any run of
    ``word`` or more non-blank characters (longer than any sane path) keeps its first 80 and says how long it
    was; then a line still longer than ``total`` keeps its first ``total // 2`` characters."""
    import re

    line = re.sub(rf"\S{{{word},}}", lambda m: f"{m[0][:80]}…({len(m[0])} chars)", line)
    return line if len(line) <= total else f"{line[: total // 2]}…({len(line)} chars)"


if __name__ == "__main__":
    sys.exit(main())
