"""The ``medadv`` command line: ``demo`` (deepbet on Colin27; ``--unet``: the trained-UNet demo), ``evaluate CONFIG``, ``validate CONFIG``, ``attacks``, ``tasks``, ``models``.

``medadv evaluate`` never overwrites results silently: an output folder holding results of the same
config and data (the fingerprint of :func:`medadv.config.config_fingerprint`, kept in ``run.json``) is
resumed; one holding results of another config or other data stops the run with a message, unless
``--overwrite`` is given. Under ``torchrun`` every process evaluates its shard and rank 0 writes the outputs.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attacks.base import Attack

__all__ = ["main"]

#: names of the output folder's policy that moved to :mod:`medadv.run.output`, still importable from here
_MOVED = ("OUTPUT_FILES", "OUTPUT_GLOBS", "ADVERSARIAL_DIR")


def __getattr__(name: str) -> Any:
    """The output-folder names that moved to :mod:`medadv.run.output`, imported on first use (``medadv --help``
    stays quick: :mod:`medadv.run` imports torch)."""
    if name in _MOVED:
        from .run import output

        return getattr(output, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def _cmd_evaluate(args: argparse.Namespace) -> int:
    """``medadv evaluate``: the config's :class:`~medadv.run.Run` (the output folder, resume, studies, reports)."""
    from .run import Run

    run = Run.from_yaml(args.config, args.output, allow_code=bool(args.allow_code), overwrite=args.overwrite,
                        progress=not args.no_progress)
    outcome = run.execute()
    if outcome.paths:  # rank 0 (alone: always) writes and says what it wrote
        print(outcome.results.format_summary())
        written = [p for p in outcome.paths if not p.name.startswith("study_")]  # results, the two reports
        print(f"\nwrote {', '.join(map(str, written))}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    """The schema, then the task, attacks, target, model builder and data files: no model built, no data
    loaded, nothing run (:meth:`medadv.run.Plan.check`). Every mistake found is printed, one line each."""
    from .run import Plan

    plan = Plan.from_yaml(args.config, allow_code=bool(args.allow_code))  # schema errors: all at once, then stop
    attacks = plan.check()
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
