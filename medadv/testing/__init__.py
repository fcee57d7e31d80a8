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

Each baseline is stored with the settings it was measured under (attack and its parameters, budget, norm,
data bounds, target, task, metric: :func:`baseline_settings`) and a test whose settings differ fails before
the attack runs, naming what differs, e.g. a lowered ε (the old number would otherwise pass a weaker test).
Baselines of the first format, a bare number per name, are refused with the same advice: their settings are
unknown, so accepting one even once could pass a regressed model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

__all__ = ["RobustnessCheck", "baseline_settings", "check_attack", "check_task", "check_study", "ConformanceError"]

_LAZY = {"check_attack": ".attack_checks", "check_task": ".task_checks", "check_study": ".study_checks",
         "ConformanceError": "._common"}

if TYPE_CHECKING:
    from ._common import ConformanceError
    from .attack_checks import check_attack
    from .study_checks import check_study
    from .task_checks import check_task


def __getattr__(name: str) -> Any:
    """The conformance checks, imported on first use (the pytest plugin itself needs no torch)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

BASELINE_FILE = "robustness_baselines.json"
#: the version of the baseline file's entries: ``{name: {"value", "metric", "settings", "fingerprint"}}``
BASELINE_FORMAT = 2
_RERECORD = "re-record it with `pytest --medadv-update-baselines`"


def _json(value: Any) -> str:
    """A setting as text: JSON of its canonical form (tensors and modules by content hash), compared whole."""
    return json.dumps(value, sort_keys=True)


def _short(value: Any) -> str:
    """A setting shortened for a one-line message."""
    text = value if isinstance(value, str) else _json(value)
    return text if len(text) <= 80 else text[:77] + "..."


def baseline_settings(task: Any, attack: Any, metric: str, target_fn: Any = None) -> dict[str, str]:
    """What a baseline value depends on besides the model: the attack (class, every declared parameter),
    its budget and norm (or that its threat is not an Lp ball), whether it is targeted and by which target
    function, the task (kind and every setting) and the metric. Each as canonical text, compared field by
    field when a baseline is read, so a changed ε or a changed metric is named instead of passing."""
    from ..params import _canonical, object_settings

    threat = getattr(attack, "threat", None)
    fn = "" if target_fn is None else (f"{getattr(target_fn, '__module__', '')}."
                                       f"{getattr(target_fn, '__qualname__', type(target_fn).__name__)}")
    params = attack.get_params() if hasattr(attack, "get_params") else {}
    return {
        "attack": f"{type(attack).__module__}.{type(attack).__qualname__}",
        "parameters": _json(_canonical({k: v for k, v in params.items() if k != "targeted"})),
        "budget": "none (not an Lp attack)" if threat is None else repr(float(threat.eps)),
        "norm": "none (data box only)" if threat is None else type(threat).__name__,
        "bounds": _json(_canonical(getattr(attack, "bounds", None))),
        "target": ("targeted" if getattr(attack, "targeted", False) else "untargeted") + (f" by {fn}" if fn else ""),
        "task": _json(_canonical(object_settings(task))),
        "metric": metric,
    }


def _fingerprint(settings: dict[str, str]) -> str:
    from ..params import stable_hash

    return stable_hash(settings)


class RobustnessCheck:
    """Runs an attack and compares its metric with a minimum and a stored baseline.

    A baseline is stored with the settings it was measured under (:func:`baseline_settings`: attack,
    parameters, budget, norm, target, task, metric) and refused when the test's settings differ: lowering
    ε would otherwise compare a weaker attack against the old number and pass a regressed model. Baselines
    of the first format (a bare number, no settings) are refused too, with the command that re-records
    them: their settings are unknown, so no comparison with them can be trusted.
    """

    def __init__(self, baseline_path: Path, update: bool) -> None:
        self.baseline_path = baseline_path
        self.update = update

    def _load(self) -> dict[str, Any]:
        if not self.baseline_path.is_file():
            return {}
        try:
            data = json.loads(self.baseline_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            pytest.fail(f"robustness baselines: {self.baseline_path} is not valid JSON ({e}); fix or delete it and "
                        "record again with `pytest --medadv-update-baselines`", pytrace=False)
        if not isinstance(data, dict):
            pytest.fail(f"robustness baselines: {self.baseline_path} must hold a JSON object of named baselines, "
                        f"got {type(data).__name__}; delete it and record again with "
                        "`pytest --medadv-update-baselines`", pytrace=False)
        return data

    def measure(self, model, task, data, attack, metric: str | None = None, target_fn=None) -> float:
        """The ``metric`` column's mean under ``attack`` (default: the task's headline metric).

        ``target_fn(x, y, clean_logits) -> target`` is required for targeted attacks (DAG, for one).
        """
        return self._measure(model, task, data, attack, metric, target_fn)[0]

    @staticmethod
    def _measure(model, task, data, attack, metric: str | None, target_fn) -> tuple[float, str]:
        from ..evaluation import evaluate
        from ..report.plots import headline_metric

        results = evaluate(model, task, data, {"attack": attack}, target_fn=target_fn)
        metric = metric or headline_metric(results)
        summary = results.summary()[0]
        if metric not in summary:
            shown = ", ".join(k for k, v in summary.items() if isinstance(v, int | float) and k != "n")
            raise ValueError(f"`metric` {metric!r} is not a column of the results; summary columns: {shown}")
        return float(summary[metric]), metric

    @staticmethod
    def _default_metric(task: Any) -> str | None:
        headline = getattr(task, "headline", None)
        return None if headline is None else f"adv_{headline}"

    def check(self, name: str, model, task, data, attack, *, min_value: float | None = None,
              max_drop: float = 0.0, metric: str | None = None, target_fn=None) -> float:
        """Assert the metric under ``attack``; returns the measured value.

        ``metric`` may be any summary column, e.g. an attack's own ``attack_*`` output (default: the task's
        headline column under attack, ``adv_<headline>``). The stored baseline's settings are compared with
        this call's before the attack runs; a baseline of other settings fails the test with the settings
        that differ.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"`name` must be a non-empty string naming the baseline, got {name!r}")
        if metric is not None and (not isinstance(metric, str) or not metric):
            raise TypeError(f"`metric` must be a column name (a non-empty string) or None, got {metric!r}")
        for arg, v in (("min_value", min_value), ("max_drop", max_drop)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)):
                raise TypeError(f"`{arg}` must be a finite number, got {v!r}")
        if max_drop < 0:
            raise ValueError(f"`max_drop` must be >= 0, got {max_drop}")
        metric = metric or self._default_metric(task)
        baselines = self._load()
        settings = None if metric is None else baseline_settings(task, attack, metric, target_fn)
        if not self.update and settings is not None:  # a baseline of other settings costs no attack
            self._stored(name, baselines, settings)
        # a task without a declared headline: the report's headline column, known once measured
        value, metric = self._measure(model, task, data, attack, metric, target_fn)
        label = f"robustness '{name}' ({metric})"
        if math.isnan(value):
            pytest.fail(f"{label}: the metric is NaN (empty data or undefined metric)")
        if min_value is not None and value < min_value:
            pytest.fail(f"{label}: {value:.4f} is below the required minimum {min_value:.4f}")
        settings = baseline_settings(task, attack, metric, target_fn)
        if self.update:
            baselines[name] = {"value": value, "metric": metric, "settings": settings,
                               "fingerprint": _fingerprint(settings), "format": BASELINE_FORMAT}
            self.baseline_path.write_text(json.dumps(baselines, indent=1, sort_keys=True) + "\n")
            return value
        base = self._stored(name, baselines, settings)
        if value < base - max_drop:
            pytest.fail(f"{label} regressed: {metric} {value:.4f} < baseline {base:.4f} - max_drop {max_drop:.4f}")
        return value

    def _stored(self, name: str, baselines: dict[str, Any], settings: dict[str, str]) -> float:
        """The stored value of ``name``, failing the test when there is none, it is of the old bare-number
        format, or it was recorded under other settings (each said in one line)."""
        where = self.baseline_path
        if name not in baselines:
            pytest.fail(f"robustness '{name}': no baseline in {where}; record one with "
                        "`pytest --medadv-update-baselines`", pytrace=False)
        entry = baselines[name]
        if not isinstance(entry, dict):
            pytest.fail(f"robustness '{name}': the baseline in {where} is a bare number ({entry!r}) without the "
                        "attack, budget, task and metric it was measured with, so it cannot be compared; "
                        f"{_RERECORD}", pytrace=False)
        stored = entry.get("settings")
        value = entry.get("value")
        if not isinstance(stored, dict) or isinstance(value, bool) or not isinstance(value, int | float):
            pytest.fail(f"robustness '{name}': the baseline in {where} has no `value` and `settings`; {_RERECORD}",
                        pytrace=False)
        differ = [f"{k} {_short(stored.get(k, '(not recorded)'))} (now {_short(v)})"
                  for k, v in settings.items() if stored.get(k) != v]
        if differ:
            pytest.fail(f"robustness '{name}': the baseline in {where} was recorded under other settings: "
                        f"{'; '.join(differ)}; {_RERECORD}", pytrace=False)
        return float(value)


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("medadv")
    group.addoption("--medadv-update-baselines", action="store_true", default=False,
                    help="record the measured robustness values as the new baselines")


@pytest.fixture
def robustness(request: Any) -> RobustnessCheck:
    """A :class:`RobustnessCheck` whose baselines live next to the requesting test file."""
    path = Path(str(request.node.path)).parent / BASELINE_FILE
    return RobustnessCheck(path, bool(request.config.getoption("--medadv-update-baselines")))
