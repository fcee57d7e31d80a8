"""The ``medadv`` command line: ``demo``, ``evaluate CONFIG``, ``attacks``."""

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
        from .report import write_report

        res = out["results"]
        Path(args.output).mkdir(parents=True, exist_ok=True)
        res.to_json(Path(args.output) / "results.json")
        res.to_csv(Path(args.output) / "results.csv")
        print(f"report: {write_report(res, args.output, title='medadv demo: MNI152 tissue segmentation')}")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    from .config import (
        build_attacks,
        build_data,
        build_model,
        build_target_fn,
        build_task,
        check_targets,
        load_config,
        model_name,
    )
    from .evaluation import evaluate
    from .report import write_report

    cfg = load_config(args.config)
    base = cfg["_dir"]
    task = build_task(cfg["task"])
    attacks = build_attacks(cfg, task)
    target_fn = build_target_fn(cfg["target"], task)
    check_targets(attacks, cfg["target"])  # before the model and the data: a config mistake costs nothing
    model = build_model(cfg["model"], base)
    x, y = build_data(cfg["data"], base)
    bs = cfg["batch_size"]
    batches = [(x[i : i + bs], y[i : i + bs]) for i in range(0, x.shape[0], bs)]
    out = Path(args.output or cfg["output"])
    if not out.is_absolute() and not args.output:
        out = Path(base) / out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg["seed"])
    res = evaluate(model, task, batches, attacks, log=out / "log.jsonl", progress=not args.no_progress,
                   target_fn=target_fn, hd95=cfg["hd95"], spacing=cfg["spacing"],
                   meta={"config": str(Path(args.config).resolve()), "model": model_name(cfg["model"])})
    res.to_json(out / "results.json")
    res.to_csv(out / "results.csv")
    report = write_report(res, out)
    print(res.format_summary())
    print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, {report}")
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
    errors: list[str] = []

    def attempt(check: Callable[[], Any]) -> Any:
        try:
            return check()
        except (ValueError, TypeError, FileNotFoundError) as e:
            errors.extend(str(e).splitlines())
            return None

    task = attempt(lambda: build_task(cfg["task"]))
    attacks: Any = None
    if task is not None:
        attacks = attempt(lambda: build_attacks(cfg, task))
        attempt(lambda: check_target(cfg["target"], task))
        if attacks is not None:
            attempt(lambda: check_targets(attacks, cfg["target"]))
    attempt(lambda: check_model(cfg["model"], cfg["_dir"]))
    attempt(lambda: check_data(cfg["data"], cfg["_dir"]))
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
    e.set_defaults(func=_cmd_evaluate)
    v = sub.add_parser("validate", parents=[common],
                       help="check a YAML config (schema, attacks, files) without running it")
    v.add_argument("config", help="YAML config (see medadv.config)")
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
    except (ValueError, TypeError, FileNotFoundError) as e:
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
