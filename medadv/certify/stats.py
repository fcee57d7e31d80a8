"""Exact binomial statistics of randomized smoothing: Clopper–Pearson bounds, binomial p-values and family-wise
error control over elements (labels, voxels).

The counts of randomized smoothing are integers in ``[0, n]``, so every per-element statistic is a look-up in a
table of ``n + 1`` values computed once in float64 with SciPy (``scipy.stats.beta`` / ``binom``) and gathered on
the device: no host round trip per element, one small table per ``(n, level)``.

References: Clopper & Pearson, Biometrika 1934 (the exact interval); Holm, Scand. J. Statist. 1979 (the
step-down procedure); Cohen, Rosenfeld & Kolter, ICML 2019 (one-sided lower bound at level ``1 − α``);
Fischer, Baader & Vechev, ICML 2021 (SegCertify: per-voxel binomial tests against ``τ`` with Holm or Bonferroni).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

from ..params import Int, Real

__all__ = ["clopper_pearson", "lower_confidence_bound", "binomial_pvalue", "lcb_table", "pvalue_table",
           "holm_reject", "bonferroni_reject", "two_sided_pvalue"]

_ALPHA = Real(low=0.0, high=1.0, low_open=True, high_open=True)
_N = Int(low=1)


def _counts(k: int | Tensor, n: int, owner: str) -> tuple[np.ndarray, torch.device | None]:
    if isinstance(k, Tensor):
        if k.dtype == torch.bool or (k.is_floating_point() and not bool((k == k.round()).all())):
            raise TypeError(f"`k` of {owner} must hold integer counts, got dtype {k.dtype}")
        arr, dev = k.detach().cpu().to(torch.int64).numpy(), k.device
    else:
        if isinstance(k, bool) or not isinstance(k, int | np.integer):
            raise TypeError(f"`k` of {owner} must be an int or an integer tensor, got {type(k).__name__}")
        arr, dev = np.asarray(int(k), dtype=np.int64), None
    if arr.size and (arr.min() < 0 or arr.max() > n):
        raise ValueError(f"`k` of {owner} must be counts in [0, n={n}], got values in [{arr.min()}, {arr.max()}]")
    return arr, dev


def _out(v: np.ndarray, dev: torch.device | None) -> Tensor:
    t = torch.from_numpy(np.asarray(v, dtype=np.float64))
    return t if dev is None else t.to(dev)


def _lower(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    from scipy.stats import beta

    with np.errstate(invalid="ignore"):
        lo = beta.ppf(alpha, k, n - k + 1)
    return np.where(k == 0, 0.0, lo)


def _upper(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    from scipy.stats import beta

    with np.errstate(invalid="ignore"):
        hi = beta.ppf(1.0 - alpha, k + 1, n - k)
    return np.where(k == n, 1.0, hi)


def lower_confidence_bound(k: int | Tensor, n: int, alpha: float) -> Tensor:
    """One-sided Clopper–Pearson lower bound at level ``1 − alpha`` on a binomial proportion.

    ``p̲`` such that ``P(p ≥ p̲) ≥ 1 − alpha`` over the draw of ``k ~ Binomial(n, p)``: the ``alpha`` quantile of
    ``Beta(k, n − k + 1)`` (0 when ``k = 0``). This is Cohen et al.'s ``LowerConfBound(k, n, 1 − α)`` (ICML 2019,
    Algorithm 1).

    Args:
        k: successes, an int or an integer tensor of any shape (values in ``[0, n]``).
        n: trials (``>= 1``).
        alpha: the error level, in (0, 1).

    Returns:
        float64 tensor shaped like ``k``, on ``k``'s device (CPU for an int).
    """
    n = _N.check(n, "n", "lower_confidence_bound")
    alpha = _ALPHA.check(alpha, "alpha", "lower_confidence_bound")
    arr, dev = _counts(k, n, "lower_confidence_bound")
    return _out(_lower(arr, n, alpha), dev)


def clopper_pearson(k: int | Tensor, n: int, alpha: float) -> tuple[Tensor, Tensor]:
    """Two-sided exact (Clopper–Pearson) confidence interval at level ``1 − alpha`` (``alpha / 2`` in each tail).

    Returns ``(lower, upper)`` float64 tensors shaped like ``k`` (``lower = 0`` at ``k = 0``, ``upper = 1`` at
    ``k = n``). Same values as ``statsmodels``' ``proportion_confint(k, n, alpha, method="beta")``. For the
    one-sided bound of randomized smoothing use :func:`lower_confidence_bound`.
    """
    n = _N.check(n, "n", "clopper_pearson")
    alpha = _ALPHA.check(alpha, "alpha", "clopper_pearson")
    arr, dev = _counts(k, n, "clopper_pearson")
    return _out(_lower(arr, n, alpha / 2), dev), _out(_upper(arr, n, alpha / 2), dev)


def binomial_pvalue(k: int | Tensor, n: int, p: float) -> Tensor:
    """One-sided binomial test p-value of ``H0: q ≤ p`` against ``q > p``: ``P(Binomial(n, p) ≥ k)``.

    SegCertify's per-voxel test (``BinPValue(n_i, n, τ, ≥)``, Fischer et al. 2021, Algorithm 1).
    """
    n = _N.check(n, "n", "binomial_pvalue")
    p = _ALPHA.check(p, "p", "binomial_pvalue")
    arr, dev = _counts(k, n, "binomial_pvalue")
    return _out(_sf(arr, n, p), dev)


def _sf(k: np.ndarray, n: int, p: float) -> np.ndarray:
    from scipy.stats import binom

    return np.asarray(binom.sf(k - 1, n, p), dtype=np.float64)


@functools.lru_cache(maxsize=64)
def _lcb_np(n: int, alpha: float) -> np.ndarray:
    return _lower(np.arange(n + 1), n, alpha)


@functools.lru_cache(maxsize=64)
def _pvalue_np(n: int, p: float) -> np.ndarray:
    return _sf(np.arange(n + 1), n, p)


def lcb_table(n: int, alpha: float, device: torch.device) -> Tensor:
    """``(n + 1,)`` float64: :func:`lower_confidence_bound` of every count ``0 … n`` (gather it with the counts)."""
    return torch.from_numpy(_lcb_np(int(n), float(alpha)).copy()).to(device)


def pvalue_table(n: int, p: float, device: torch.device) -> Tensor:
    """``(n + 1,)`` float64: :func:`binomial_pvalue` of every count ``0 … n``."""
    return torch.from_numpy(_pvalue_np(int(n), float(p)).copy()).to(device)


def two_sided_pvalue(k_top: Tensor, k_second: Tensor) -> Tensor:
    """Two-sided binomial test of ``H0: q = 1/2`` for the top count among ``k_top + k_second`` trials.

    Cohen et al.'s PREDICT (``BinomPValue(n_A, n_A + n_B, 0.5)``); ``k_top ≥ k_second``. Computed on the host
    (the trial count varies per element); float64 tensor on ``k_top``'s device.
    """
    from scipy.stats import binom

    a = k_top.detach().cpu().to(torch.int64).numpy()
    b = k_second.detach().cpu().to(torch.int64).numpy()
    total = a + b
    p = np.minimum(1.0, 2.0 * binom.sf(a - 1, total, 0.5))
    return torch.from_numpy(np.asarray(p, dtype=np.float64)).to(k_top.device)


def bonferroni_reject(pvalues: Tensor, alpha: float) -> Tensor:
    """Bonferroni over each row of ``pvalues`` ``(N, m)``: reject where ``p ≤ alpha / m`` (FWER ≤ alpha per row)."""
    return pvalues <= alpha / pvalues.shape[1]


def holm_reject(pvalues: Tensor, alpha: float) -> Tensor:
    """Holm's step-down procedure over each row of ``pvalues`` ``(N, m)`` (FWER ≤ alpha per row).

    Sorted ascending, ``p_(j)`` (1-based) is rejected while every ``p_(i) ≤ alpha / (m − i + 1)`` for ``i ≤ j``;
    it rejects a superset of Bonferroni's. Sorting and the cumulative test run on the device.
    """
    m = pvalues.shape[1]
    srt, order = pvalues.sort(dim=1, stable=True)
    thr = alpha / torch.arange(m, 0, -1, device=pvalues.device, dtype=pvalues.dtype)
    ok = (srt <= thr).to(torch.int32).cumprod(dim=1).bool()
    return torch.zeros_like(ok).scatter_(1, order, ok)
