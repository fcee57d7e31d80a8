"""Plain supervised training (no attacks) on the shared loop: used by the demo, the examples and the tests.

Defined in :mod:`medadv.models.fitting` with the loop (``medadv.models.fit_supervised`` needs nothing above the
models) and re-exported here, its public home.
"""

from __future__ import annotations

from ..models.fitting import SupervisedFitter, fit_supervised

__all__ = ["SupervisedFitter", "fit_supervised"]
