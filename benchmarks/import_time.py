"""Import cost: ``python -c "import medadv"`` against ``python -c "import torch"``, as a ratio in one run.

``import medadv`` itself is lazy (PEP 562: names load on first use) and does not even import torch, so
the script also times what a user of one attack pays, ``from medadv import PGD, Linf, MultiClass``
(torch + the attacks package with every attack registered), and the whole core library (attacks,
defenses, explanations, evaluation, data, metrics, models, report, CLI) without any toolkit.

Each repeat starts a fresh interpreter for each of the two commands, in alternating order (so a cold
file cache, a busy core or a CPU frequency change hits both alike); the ratio is the median medadv time
over the median torch time. The whole interpreter is timed (start-up included), as a user sees it.
The script also lists which optional heavy stacks ``import medadv`` pulled in (there should be none).

    python benchmarks/import_time.py --repeats 15
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

HEAVY = ("captum", "matplotlib", "art", "foolbox", "torchattacks", "robustbench", "autoattack",
         "pyautoattack", "nilearn", "pydicom", "skimage", "pandas", "monai", "scipy", "nibabel", "yaml")


def _time(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()

    cmds = {
        "torch": "import torch",
        "medadv": "import medadv",
        "pgd": "from medadv import PGD, Linf, MultiClass",
        "core": "import medadv.attacks, medadv.defenses, medadv.explain, medadv.evaluation, medadv.data, "
                "medadv.metrics, medadv.models, medadv.report, medadv.cli",
    }
    for code in cmds.values():  # warm the file cache once for both
        _time(code)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for i in range(args.repeats):
        order = list(cmds) if i % 2 == 0 else list(reversed(cmds))
        for k in order:
            times[k].append(_time(cmds[k]))
    med = {k: statistics.median(v) for k, v in times.items()}
    probe = f"import sys, medadv; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout.strip()
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {args.repeats} interleaved repeats")
    print("| command | median s | min s | median / torch |")
    print("|---|---|---|---|")
    for k in cmds:
        print(f"| `{cmds[k]}` | {med[k]:.3f} | {min(times[k]):.3f} | {med[k] / med['torch']:.3f} |")
    print()
    for k in ("medadv", "pgd", "core"):
        print(f"ratio {k} / torch (medians): {med[k] / med['torch']:.3f}")
    print(f"optional stacks loaded by `import medadv`: {loaded or 'none'}")


if __name__ == "__main__":
    main()
