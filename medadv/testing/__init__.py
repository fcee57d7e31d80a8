"""pytest plugin: robustness regression tests against a stored baseline.

Installed with medadv (entry point ``pytest11``), it adds the ``robustness`` fixture and the
``--medadv-update-baselines`` option::

    def test_unet_robustness(robustness):
        robustness.check("unet-pgd-2/255", model, task, (x, y),
                         PGD(task, Linf(2 / 255, bounds=(0, 1)), steps=10),
                         min_value=0.6, max_drop=0.02)

``check`` evaluates the attack, reads the task's headline metric under attack (mean Dice, label
accuracy or accuracy), asserts it is at least ``min_value`` and not more than ``max_drop`` below the
baseline stored in ``robustness_baselines.json`` next to the test file. Record or refresh baselines
with ``pytest --medadv-update-baselines``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

__all__ = ["RobustnessCheck", "check_attack", "check_task", "ConformanceError"]

_LAZY = {"check_attack": ".attack_checks", "check_task": ".task_checks", "ConformanceError": "._common"}

if TYPE_CHECKING:
    from ._common import ConformanceError
    from .attack_checks import check_attack
    from .task_checks import check_task


def __getattr__(name: str) -> Any:
    """The conformance checks, imported on first use (the pytest plugin itself needs no torch)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

BASELINE_FILE = "robustness_baselines.json"


class RobustnessCheck:
    """Runs an attack and compares its headline metric with a minimum and a stored baseline."""

    def __init__(self, baseline_path: Path, update: bool) -> None:
        self.baseline_path = baseline_path
        self.update = update

    def _load(self) -> dict[str, float]:
        if self.baseline_path.is_file():
            return json.loads(self.baseline_path.read_text())
        return {}

    def measure(self, model, task, data, attack, metric: str | None = None, target_fn=None) -> float:
        """The ``metric`` column's mean under ``attack`` (default: the task's headline metric).

        ``target_fn(x, y, clean_logits) -> target`` is required for targeted attacks (DAG, for one).
        """
        from ..evaluation import evaluate
        from ..report.plots import headline_metric

        results = evaluate(model, task, data, {"attack": attack}, target_fn=target_fn)
        metric = metric or headline_metric(results)
        return float(results.summary()[0][metric])

    def check(self, name: str, model, task, data, attack, *, min_value: float | None = None,
              max_drop: float = 0.0, metric: str | None = None, target_fn=None) -> float:
        """Assert the metric under ``attack``; returns the measured value.

        ``metric`` may be any summary column, e.g. an attack's own ``attack_*`` output.
        """
        value = self.measure(model, task, data, attack, metric, target_fn)
        if math.isnan(value):
            pytest.fail(f"robustness '{name}': the metric is NaN (empty data or undefined metric)")
        if min_value is not None and value < min_value:
            pytest.fail(f"robustness '{name}': {value:.4f} is below the required minimum {min_value:.4f}")
        baselines = self._load()
        if self.update:
            baselines[name] = value
            self.baseline_path.write_text(json.dumps(baselines, indent=1, sort_keys=True) + "\n")
            return value
        if name not in baselines:
            pytest.fail(f"robustness '{name}': no baseline in {self.baseline_path}; "
                        "record one with `pytest --medadv-update-baselines`")
        if value < baselines[name] - max_drop:
            pytest.fail(f"robustness '{name}' regressed: {value:.4f} < baseline {baselines[name]:.4f} "
                        f"- max_drop {max_drop:.4f}")
        return value


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("medadv")
    group.addoption("--medadv-update-baselines", action="store_true", default=False,
                    help="record the measured robustness values as the new baselines")


@pytest.fixture
def robustness(request: Any) -> RobustnessCheck:
    """A :class:`RobustnessCheck` whose baselines live next to the requesting test file."""
    path = Path(str(request.node.path)).parent / BASELINE_FILE
    return RobustnessCheck(path, bool(request.config.getoption("--medadv-update-baselines")))
