"""The exact binomial statistics: Clopper–Pearson coverage, p-values, Holm and Bonferroni."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from medadv.certify import RandomizedSmoothing, clopper_pearson, lower_confidence_bound
from medadv.certify.stats import (
    binomial_pvalue,
    bonferroni_reject,
    holm_reject,
    lcb_table,
    pvalue_table,
    two_sided_pvalue,
)
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass


def test_lower_bound_covers_the_true_probability_at_its_level():
    # 200 simulated estimation runs per true p (counts drawn from the binomial): the one-sided 95% bound is
    # below p in >= 95% of the 800 runs together, and in each p's 200 runs up to Monte-Carlo error (3 SE = 4.6%)
    rng = np.random.default_rng(0)
    covered = 0
    for p in (0.55, 0.8, 0.95, 0.99):
        k = torch.from_numpy(rng.binomial(100, p, size=200))
        low = lower_confidence_bound(k, 100, 0.05)
        covered += int((low <= p).sum())
        assert int((low <= p).sum()) >= 186, p
        # not trivially low: the bound is within a few standard errors of p
        assert float(low.mean()) > p - 4 * math.sqrt(p * (1 - p) / 100) - 0.02
    assert covered >= 0.95 * 800


def test_exact_coverage_is_at_least_the_level_and_not_wasteful():
    # the coverage P(p_lower <= p) summed exactly over the binomial distribution of the count
    from scipy.stats import binom

    for n in (20, 100, 1000):
        low = lower_confidence_bound(torch.arange(n + 1), n, 0.05).numpy()
        cover = [binom.pmf(np.arange(n + 1), n, p)[low <= p].sum() for p in np.linspace(0.02, 0.98, 49)]
        assert min(cover) >= 0.95 - 1e-12, n
        assert np.mean(cover) < 0.985, n  # a bound at a much smaller alpha would cover ~always


def test_clopper_pearson_matches_scipys_exact_interval():
    for k, n in ((0, 10), (3, 10), (10, 10), (517, 1000), (999, 1000)):
        lo, hi = clopper_pearson(k, n, 0.05)
        ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert float(lo) == pytest.approx(ref.low, abs=1e-10) and float(hi) == pytest.approx(ref.high, abs=1e-10)
        # the one-sided bound at alpha is the two-sided lower end at 2 alpha
        assert float(lower_confidence_bound(k, n, 0.025)) == pytest.approx(ref.low, abs=1e-10)
    assert float(lower_confidence_bound(0, 10, 0.05)) == 0.0
    assert float(lower_confidence_bound(1000, 1000, 0.001)) == pytest.approx(0.001 ** (1 / 1000))


def test_tables_match_the_functions_and_tensors_keep_their_device_and_shape():
    k = torch.tensor([[0, 5], [9, 10]])
    low = lower_confidence_bound(k, 10, 0.01)
    assert low.shape == (2, 2) and low.dtype == torch.float64
    assert torch.allclose(lcb_table(10, 0.01, torch.device("cpu"))[k], low)
    pv = binomial_pvalue(k, 10, 0.75)
    assert torch.allclose(pvalue_table(10, 0.75, torch.device("cpu"))[k], pv)
    assert float(pv[0, 0]) == 1.0 and float(pv[1, 1]) == pytest.approx(0.75 ** 10)


def test_two_sided_pvalue_is_scipys_binomial_test():
    a, b = torch.tensor([60, 50, 90]), torch.tensor([40, 50, 0])
    got = two_sided_pvalue(a, b)
    for i in range(3):
        assert float(got[i]) == pytest.approx(binomtest(int(a[i]), int(a[i] + b[i]), 0.5).pvalue, rel=1e-9)


def test_holm_rejects_a_superset_of_bonferroni_and_controls_each_row():
    p = torch.tensor([[0.001, 0.012, 0.02, 0.5], [0.2, 0.001, 0.3, 0.4]], dtype=torch.float64)
    holm, bonf = holm_reject(p, 0.05), bonferroni_reject(p, 0.05)
    # row 0: 0.001 <= .0125, 0.012 <= .0167, 0.02 <= .025, 0.5 > .05; Bonferroni (.0125) keeps only the first two
    assert holm[0].tolist() == [True, True, True, False]
    assert bonf[0].tolist() == [True, True, False, False]
    assert holm[1].tolist() == [False, True, False, False]  # the step-down stops at 0.2 > 0.05/3
    assert not (bonf & ~holm).any()


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(InvalidParameterError, match="`alpha` of lower_confidence_bound"):
        lower_confidence_bound(3, 10, 1.5)
    with pytest.raises(InvalidParameterError, match="`n` of clopper_pearson"):
        clopper_pearson(3, 0, 0.05)
    with pytest.raises(ValueError, match=r"`k` of lower_confidence_bound must be counts in \[0, n=10\]"):
        lower_confidence_bound(torch.tensor([11]), 10, 0.05)
    with pytest.raises(TypeError, match="`k` of clopper_pearson must hold integer counts"):
        clopper_pearson(torch.tensor([0.5]), 10, 0.05)


class _HalfSpace(torch.nn.Module):
    """Class 0 where the first input value exceeds ``t``, else class 1: under N(0, σ²) noise around x,
    P(class 0) = Φ((x₀ − t) / σ) exactly."""

    def __init__(self, t: float) -> None:
        super().__init__()
        self.t = t

    def forward(self, x):
        z = x.flatten(1)[:, :1] - self.t
        return torch.cat([z, -z], dim=1)


def test_end_to_end_bounds_cover_the_known_probability():
    # 200 samples certified in one batch; p = Φ(1) ≈ 0.841 for every one; alpha = 0.05
    p = 0.5 * (1 + math.erf(1 / math.sqrt(2)))
    x = torch.zeros(200, 1, 3)
    res = RandomizedSmoothing(MultiClass(), 0.5, n0=20, n=100, alpha=0.05, batch_size=4000, seed=1).certify(
        _HalfSpace(-0.5), x)
    assert (res.top == 0).all()
    assert int((res.p_lower <= p).sum()) >= 186  # 95% of 200 runs up to Monte-Carlo error (3 SE)
    assert float(res.p_lower.mean()) > p - 0.1  # and not vacuous
