"""The ``medadv`` command line: ``demo``, ``evaluate CONFIG``, ``attacks``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

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

    from .config import build_attacks, build_data, build_model, build_task, load_config
    from .evaluation import evaluate
    from .report import write_report

    cfg = load_config(args.config)
    base = cfg["_dir"]
    model = build_model(cfg["model"], base)
    task = build_task(cfg["task"])
    x, y = build_data(cfg["data"], base)
    attacks = build_attacks(cfg, task)
    bs = int(cfg.get("batch_size", 8))
    batches = [(x[i : i + bs], y[i : i + bs]) for i in range(0, x.shape[0], bs)]
    out = Path(args.output or cfg.get("output", "medadv-results"))
    if not out.is_absolute() and not args.output:
        out = Path(base) / out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(int(cfg.get("seed", 0)))
    res = evaluate(model, task, batches, attacks, log=out / "log.jsonl", progress=not args.no_progress,
                   hd95=bool(cfg.get("hd95", False)), spacing=cfg.get("spacing"),
                   meta={"config": str(Path(args.config).resolve()), "model": cfg["model"].get("builder")})
    res.to_json(out / "results.json")
    res.to_csv(out / "results.csv")
    report = write_report(res, out)
    print(res.format_summary())
    print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, {report}")
    return 0


def _cmd_attacks(args: argparse.Namespace) -> int:
    import medadv  # noqa: F401  (imports register every attack)

    from .attacks.base import _REGISTRY

    for name in sorted(_REGISTRY):
        doc = (_REGISTRY[name].__doc__ or "").strip().splitlines()
        print(f"{name:<22} {doc[0] if doc else ''}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="medadv", description="Adversarial robustness of medical imaging models.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="train (or load) a UNet on the real MNI152 template and attack it")
    d.add_argument("--retrain", action="store_true", help="ignore the cached checkpoint")
    d.add_argument("--epochs", type=int, default=25, help="training epochs (default 25)")
    d.add_argument("--steps", type=int, default=10, help="attack iterations (default 10)")
    d.add_argument("--n-test", type=int, default=8, help="number of held-out crops attacked (default 8)")
    d.add_argument("--output", help="also write results.json/csv and a Markdown report here")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    d.set_defaults(func=_cmd_demo)
    e = sub.add_parser("evaluate", help="run models x attacks x budgets from a YAML config")
    e.add_argument("config", help="YAML config (see medadv.config)")
    e.add_argument("--output", help="output directory (default: the config's `output`)")
    e.add_argument("--no-progress", action="store_true")
    e.set_defaults(func=_cmd_evaluate)
    a = sub.add_parser("attacks", help="list the registered attacks")
    a.set_defaults(func=_cmd_attacks)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
