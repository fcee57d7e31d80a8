"""How many samples a run attacks, against how many ``evaluate()`` attacks (issue 30, "attack once").

Runs each paper recipe (``examples/papers/*.yaml``) through ``medadv evaluate`` at the recipe smoke test's size
(``tests/test_paper_recipes.shrink``, or ``--full``), counting the samples every ``Attack.__call__`` receives: all
of them, and those received while ``evaluate()`` runs. The ratio is the run's attack work over the work the
evaluation table needs; what is above 1 is studies and report cases crafting (on other models, other inputs,
training copies, or again). Each recipe runs twice: with the run's attack cache switched off (every call crafts,
as before the cache) and as ``medadv evaluate`` runs it; the table gives both counts, both wall times, and whether
the two runs wrote the same rows (``results.json`` and every ``study_*.json``). Writes ``attack_once.json``
(``--out``) and prints a Markdown table.

    python benchmarks/attack_once.py [--recipes xu2021 malik2024] [--out benchmarks/attack_once.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _counting() -> tuple[dict[str, int], Any]:
    """Wrap ``Attack.__call__`` and ``evaluate`` so every attacked sample is counted (total and in evaluate)."""
    import medadv.evaluation as evaluation
    from medadv.attacks.base import Attack

    counts = {"total": 0, "evaluate": 0, "calls": 0}
    inside = [0]
    original_call = Attack.__call__
    original_evaluate = evaluation.evaluate

    def call(self: Any, model: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        n = int(x.shape[0]) if hasattr(x, "shape") and x.dim() > 0 else 1
        counts["total"] += n
        counts["calls"] += 1
        if inside[0]:
            counts["evaluate"] += n
        return original_call(self, model, x, *args, **kwargs)

    def evaluate(*args: Any, **kwargs: Any) -> Any:
        inside[0] += 1
        try:
            return original_evaluate(*args, **kwargs)
        finally:
            inside[0] -= 1

    Attack.__call__ = call  # type: ignore[method-assign,misc]
    evaluation.evaluate = evaluate  # type: ignore[assignment]
    import medadv

    medadv.evaluate = evaluate  # type: ignore[attr-defined]

    def restore() -> None:
        Attack.__call__ = original_call  # type: ignore[method-assign,misc]
        evaluation.evaluate = original_evaluate  # type: ignore[assignment]
        medadv.evaluate = original_evaluate  # type: ignore[attr-defined]

    return counts, restore


@contextlib.contextmanager
def _cache_off() -> Any:
    """Every ``craft`` call crafts (the run's cache is still opened, and never serves anything)."""
    from medadv.attack_cache import AttackCache

    original = AttackCache.craft

    def craft(self: Any, attack: Any, model: Any, x: Any, y_or_target: Any = None, **kw: Any) -> Any:
        return attack(model, x, y_or_target, **kw)

    AttackCache.craft = craft  # type: ignore[method-assign]
    try:
        yield
    finally:
        AttackCache.craft = original  # type: ignore[method-assign]


def _rows(out: Path) -> dict[str, Any]:
    """The rows a run wrote: the evaluation's and every study's, by file name."""
    files = [out / "results.json", *sorted(out.glob("study_*.json"))]
    return {f.name: json.loads(f.read_text())["rows"] for f in files if f.exists()}


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The files whose rows differ between two runs (with the largest numeric difference)."""
    out = []
    for name in sorted(set(a) | set(b)):
        ra, rb = a.get(name), b.get(name)
        if ra == rb:
            continue
        worst = 0.0
        for x, y in zip(ra or [], rb or [], strict=False):
            for k in set(x) & set(y):
                if isinstance(x[k], int | float) and isinstance(y[k], int | float) and not isinstance(x[k], bool):
                    worst = max(worst, abs(float(x[k]) - float(y[k])))
        out.append(f"{name} (max |diff| {worst:.3g})" if ra and rb and len(ra) == len(rb) else f"{name} (rows)")
    return out


def run_recipe(recipe: Path, work: Path, full: bool) -> dict[str, Any]:
    """One recipe through ``medadv evaluate``; returns the counts, the wall time and the output folder."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_paper_recipes import shrink  # the smoke test's size, one definition

    from medadv.cli import main

    work.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(recipe.read_text())
    cfg = raw if full else shrink(raw)
    out = work / recipe.stem
    cfg["output"] = str(out)
    if not full:
        cfg["cases"] = min(cfg.get("cases", 0), 1)
    path = work / recipe.name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    counts, restore = _counting()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            rc = main(["evaluate", str(path), "--no-progress"])
    finally:
        restore()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"{recipe.stem}: medadv evaluate returned {rc}")
    return {"recipe": recipe.stem, **counts, "ratio": counts["total"] / max(counts["evaluate"], 1),
            "wall_s": round(wall, 1), "output": str(out)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="*", help="recipe stems (default: all of examples/papers)")
    parser.add_argument("--full", action="store_true", help="the recipes at their full size (hours on CPU)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "attack_once.json"))
    parser.add_argument("--single", action="store_true",
                        help="one run with the cache, on a cold model cache (the full recipes: hours otherwise)")
    parser.add_argument("--keep", help="copy each run's output folder under this folder (results to compare)")
    args = parser.parse_args(argv)
    recipes = sorted((ROOT / "examples" / "papers").glob("*.yaml"))
    if args.recipes:
        recipes = [r for r in recipes if r.stem in args.recipes]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in recipes:
            if args.single:
                row = run_recipe(recipe, Path(tmp), args.full)
                row.pop("output")
                rows.append(row)
                print(f"{row['recipe']}: {row['total']} attacked / {row['evaluate']} in evaluate = "
                      f"{row['ratio']:.2f}x, {row['wall_s']} s", file=sys.stderr)
                continue
            # a first run trains and caches the recipe's models (its wall time includes that training), so that
            # the two timed runs below compare attacking only
            first = run_recipe(recipe, Path(tmp) / "first", args.full)
            with _cache_off():
                off = run_recipe(recipe, Path(tmp) / "off", args.full)
            row = run_recipe(recipe, Path(tmp), args.full)
            differ = _differences(_rows(Path(off["output"])), _rows(Path(row["output"])))
            row.update(first_wall_s=first["wall_s"], before_total=off["total"], before_ratio=off["ratio"], before_wall_s=off["wall_s"],
                       same_rows=not differ, differ=differ)
            if args.keep:
                dest = Path(args.keep) / recipe.stem
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(row["output"], dest)
            row.pop("output")
            rows.append(row)
            print(f"{row['recipe']}: {row['before_total']} -> {row['total']} attacked / {row['evaluate']} in "
                  f"evaluate = {row['before_ratio']:.2f}x -> {row['ratio']:.2f}x, {row['before_wall_s']} -> "
                  f"{row['wall_s']} s, same rows: {row['same_rows']} {row['differ']}", file=sys.stderr)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    if args.single:
        print("| recipe | in evaluate() | attacked | ratio | wall, cold model cache (s) |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['recipe']} | {r['evaluate']} | {r['total']} | {r['ratio']:.2f} | {r['wall_s']} |")
        return 0
    print("| recipe | in evaluate() | attacked, cache off | attacked, cache on | ratio off → on | wall off → on (s) | "
          "same rows |\n|---|---|---|---|---|---|---|")
    for r in rows:
        same = "yes" if r["same_rows"] else "no: " + ", ".join(r["differ"])
        print(f"| {r['recipe']} | {r['evaluate']} | {r['before_total']} | {r['total']} | {r['before_ratio']:.2f} → "
              f"{r['ratio']:.2f} | {r['before_wall_s']} → {r['wall_s']} | {same} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
