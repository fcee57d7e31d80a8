"""One run pipeline for the library and the CLI: a :class:`Plan` (a config read and checked once, typed) and a
:class:`Run` (the plan evaluated into an output folder, with resume, studies and reports).

``medadv evaluate config.yaml`` is ``Run.from_yaml("config.yaml").execute()``; ``medadv validate`` is
``Plan.from_yaml(path).check()``. Nothing below :mod:`medadv.run` imports it.
"""

from __future__ import annotations

from .plan import Built, Plan
from .runner import Outcome, Run

__all__ = ["Plan", "Built", "Run", "Outcome"]
