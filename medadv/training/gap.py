"""GAPTrainer: fit a :class:`~medadv.attacks.gap.GAP` generator against a frozen model, on the shared loop.

Its public home. The class is defined in :mod:`medadv.attacks.gap`, next to the attack it trains (the training
package sits above the attacks: ``tests/test_layout.py``), and re-exported here.
"""

from __future__ import annotations

from ..attacks.gap import GAPTrainer

__all__ = ["GAPTrainer"]
