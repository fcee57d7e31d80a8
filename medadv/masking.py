"""Gradient-masking checks: signs that a robustness evaluation cannot be trusted.

The public home of the checks of :mod:`medadv.attacks.masking` (where they live: ``auto`` runs them on every batch
and the unbounded check runs APGD, so they sit with the attacks, below this room and the results that read their
flags). Every check returns a :class:`MaskingFlag` or ``None``; :func:`run_checks` runs the checks that need the
model on one batch; :func:`check_black_box`, :func:`check_monotone` and :func:`monotone_flags` read the results of
an evaluation; :data:`CHECKS` describes every check for reports. See :mod:`medadv.attacks.masking` for the
thresholds.
"""

from __future__ import annotations

from .attacks.masking import (
    CHECKS,
    MaskingFlag,
    check_black_box,
    check_monotone,
    check_probability_outputs,
    check_randomised,
    check_unbounded,
    check_zero_gradients,
    headline_columns,
    monotone_flags,
    run_checks,
)

__all__ = [
    "CHECKS",
    "MaskingFlag",
    "check_randomised",
    "check_probability_outputs",
    "check_zero_gradients",
    "check_black_box",
    "check_monotone",
    "monotone_flags",
    "check_unbounded",
    "run_checks",
    "headline_columns",
]
