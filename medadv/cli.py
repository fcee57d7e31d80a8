"""The ``medadv`` command line: ``demo``, ``evaluate CONFIG``, ``validate CONFIG``, ``attacks``.

``medadv evaluate`` never overwrites results silently: an output folder holding results of the same
config and data (the fingerprint of :func:`medadv.config.config_fingerprint`, kept in ``run.json``) is
resumed; one holding results of another config or other data stops the run with a message, unless
``--overwrite`` is given. Under ``torchrun`` every process evaluates its shard and rank 0 writes the outputs.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attacks.base import Attack

__all__ = ["main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, run_demo

    cfg = DemoConfig(epochs=args.epochs, steps=args.steps, n_test=args.n_test)
    out = run_demo(cfg, retrain=args.retrain, progress=not args.no_progress)
    if args.output:
        from .data.mni152 import TISSUE_CLASSES
        from .report import select_cases, write_html_report, write_report

        res = out["results"]
        title = "medadv demo: MNI152 tissue segmentation"
        Path(args.output).mkdir(parents=True, exist_ok=True)
        res.to_json(Path(args.output) / "results.json")
        res.to_csv(Path(args.output) / "results.csv")
        print(f"report: {write_report(res, args.output, title=title)}")
        strongest = list(out["attacks"].values())[-1]  # the largest budget of the last attack family
        cases = select_cases(out["model"], out["task"], out["x"], out["y"], strongest, k=2,
                             class_names=TISSUE_CLASSES, axis_names=("sagittal", "coronal", "axial"))
        html = write_html_report(res, args.output, title=title, class_names=TISSUE_CLASSES, cases=cases)
        print(f"report: {html}")
    return 0


#: what ``medadv evaluate`` writes into its output folder (``--overwrite`` removes exactly these)
OUTPUT_FILES = ("run.json", "results.json", "results.csv", "report.md", "report.html", "robustness.png", "log.jsonl")
OUTPUT_GLOBS = ("log.rank*.jsonl", "study_*.json")
ADVERSARIAL_DIR = "adversarial"


def _existing_outputs(out: Path) -> list[Path]:
    found = [out / f for f in OUTPUT_FILES if (out / f).exists()]
    found += sorted(p for g in OUTPUT_GLOBS for p in out.glob(g))
    if (out / ADVERSARIAL_DIR).is_dir():
        found.append(out / ADVERSARIAL_DIR)
    return found


def _check_output(out: Path, fingerprint: str, overwrite: bool) -> str:
    """What to do with the output folder: ``"new"``, ``"resume"`` (results of the same fingerprint are
    there) or ``"replace"`` (``--overwrite``); results of another config or data stop the run."""
    import json

    found = _existing_outputs(out)
    if not found:
        return "new"
    if overwrite:
        return "replace"
    try:
        before = json.loads((out / "run.json").read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        before = None
    if before == fingerprint:
        return "resume"
    what = f"another config or other data (fingerprint {before}, this run {fingerprint})" if before else \
        "an unknown run (no run.json)"
    raise FileExistsError(f"output folder {out} holds results of {what}: pass --overwrite to replace them, or "
                          "give another `output` (or --output)")


def _prepare_output(out: Path, action: str, record: dict) -> None:
    """Rank 0 only: empty the folder of medadv's outputs (``replace``), then write ``run.json`` atomically."""
    import json
    import os
    import shutil

    if action == "replace":
        for p in _existing_outputs(out):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".run.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, out / "run.json")


def _run_studies(cfg: dict[str, Any], model: Any, task: Any, data: Any, attacks: Any, target_fn: Any,
                 out: Path) -> list[Any]:
    """The config's ``studies:`` (rank 0 only), each saved as ``study_<i>_<name>.json`` beside the results."""
    if not cfg.get("studies"):
        return []
    from .studies import run_study

    done = []
    for i, spec in enumerate(cfg["studies"]):
        name = spec["study"]
        print(f"study {name} ...", file=sys.stderr)
        options = {k: v for k, v in spec.items() if k != "study"}
        result = run_study(name, options, model, task, data, attacks, target_fn=target_fn)
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
        build_target_fn,
        build_task,
        check_data,
        check_model,
        check_targets,
        config_fingerprint,
        load_config,
        model_name,
        wrap_inference,
    )
    from .evaluation import evaluate
    from .report import write_html_report, write_report

    cfg = load_config(args.config)
    base = cfg["_dir"]
    allow_code = bool(args.allow_code or cfg["allow_code"])
    task = build_task(cfg["task"])
    attacks = build_attacks(cfg, task)
    # config mistakes cost nothing: the target, the model's name and code, the data files and transforms are
    # checked before any user code runs, any model is built or any image read
    target_fn = build_target_fn(cfg["target"], task, allow_code=allow_code)
    check_targets(attacks, cfg["target"])
    check_model(cfg["model"], base, allow_code=allow_code)
    check_data(cfg["data"], base, task)
    out = Path(args.output or cfg["output"])
    if not out.is_absolute() and not args.output:
        out = Path(base) / out
    fingerprint = config_fingerprint(cfg)
    distributed.init_from_env()  # torchrun: join the process group; alone: nothing
    try:
        action = _check_output(out, fingerprint, args.overwrite)  # every rank decides before rank 0 acts
        torch.manual_seed(cfg["seed"])  # before the model is built: its random parts follow the config's seed
        model = wrap_inference(build_model(cfg["model"], base, allow_code=allow_code), cfg["inference"])
        model = model.to(distributed.device())
        data = build_loader(cfg["data"], base, batch_size=cfg["batch_size"], task=task, seed=cfg["seed"])
        # the output folder is touched only once the model and the data are ready: a failed start leaves it as is
        distributed.barrier()
        if distributed.is_main():
            _prepare_output(out, action, {
                "fingerprint": fingerprint, "config": str(Path(args.config).resolve()),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
            if action == "resume":
                print(f"resuming into {out} (results of the same config and data are there)", file=sys.stderr)
        distributed.barrier()  # the folder is ready before any rank logs into it
        settings = {k: v for k, v in cfg.items() if k != "_dir"}
        res = evaluate(model, task, data, attacks, log=out / "log.jsonl", progress=not args.no_progress,
                       target_fn=target_fn, hd95=cfg["hd95"], spacing=cfg["spacing"], seed=cfg["seed"],
                       save_adversarial=out / ADVERSARIAL_DIR if cfg["save_adversarial"] else None,
                       meta={"config": str(Path(args.config).resolve()), "model": model_name(cfg["model"]),
                             "config_fingerprint": fingerprint, "settings": settings})
        if distributed.is_main():
            res.to_json(out / "results.json")
            res.to_csv(out / "results.csv")
            report = write_report(res, out)
            studies = _run_studies(cfg, model, task, data, attacks, target_fn, out)
            html = write_html_report(res, out, studies=studies, title=f"medadv: {Path(args.config).name}")
            print(res.format_summary())
            print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, {report}, {html}")
        distributed.barrier()
    finally:
        distributed.destroy()
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    """The schema, then the task, attacks, target, model builder and data files: no model built, no data
    loaded, nothing run. Every mistake found is printed, one line each."""
    from .config import (
        ConfigError,
        build_attacks,
        build_task,
        check_data,
        check_model,
        check_target,
        check_targets,
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

    task = attempt(lambda: build_task(cfg["task"]))
    attacks: Any = None
    if task is not None:
        attacks = attempt(lambda: build_attacks(cfg, task))
        attempt(lambda: check_target(cfg["target"], task, allow_code=allow_code))
        if attacks is not None:
            attempt(lambda: check_targets(attacks, cfg["target"]))
    attempt(lambda: check_model(cfg["model"], cfg["_dir"], allow_code=allow_code))
    attempt(lambda: check_data(cfg["data"], cfg["_dir"], task))
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


_ALLOW_CODE_HELP = ("let the config run code: model builders and `target` functions outside medadv, MONAI and "
                    "torchvision, and Python files outside the config's folder (same as `allow_code: true`)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="medadv", description="Adversarial robustness of medical imaging models.")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    # `--debug` after the command too; SUPPRESS keeps the main parser's value when it is not repeated there
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of an error")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", parents=[common],
                       help="train (or load) a UNet on the real MNI152 template and attack it")
    d.add_argument("--retrain", action="store_true", help="ignore the cached checkpoint")
    d.add_argument("--epochs", type=int, default=25, help="training epochs (default 25)")
    d.add_argument("--steps", type=int, default=10, help="attack iterations (default 10)")
    d.add_argument("--n-test", type=int, default=8, help="number of held-out crops attacked (default 8)")
    d.add_argument("--output", help="also write results.json/csv and a Markdown report here")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a user's mistake prints ``medadv: error: <message>`` (one line each) and returns 2.

    ``--debug`` prints the traceback too.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError) as e:
        # a mistake in the config or the command line (InvalidParameterError and ConfigError are ValueErrors;
        # TypeError: an attack refusing a task or threat it does not apply to): the message, not a
        # traceback, unless asked for
        if args.debug:
            traceback.print_exc()
        lines = [line for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        for line in lines:
            print(f"medadv: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
