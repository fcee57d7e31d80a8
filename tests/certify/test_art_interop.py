"""medadv's certified radii agree with ART's PyTorchRandomizedSmoothing.certify (Cohen et al.'s CERTIFY) on a
trained multi-class CNN at the same σ, n0 (ART's ``sample_size``), n and α — statistically: the two draw
different noise, so radii agree up to Monte-Carlo error and abstentions at the same rate.

ART trap (toolkits_api.md; verified here): ART's ``_lower_confidence_bound`` imports statsmodels, which medadv does
not install; where it is missing the test substitutes SciPy's exact binomial interval (an implementation
independent of medadv's), at ART's own level (two-sided ``2α``, i.e. one-sided ``α``). ART draws its noise from
numpy's global RNG (seeded and restored here) and certifies one sample at a time.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

from medadv.certify import RandomizedSmoothing

art_rs = pytest.importorskip("art.estimators.certification.randomized_smoothing")

SIGMA, N0, N, ALPHA = 0.25, 50, 400, 0.001


def _art_certify(model, x: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    est = art_rs.PyTorchRandomizedSmoothing(model, torch.nn.CrossEntropyLoss(), tuple(x.shape[1:]), num_classes,
                                            device_type="cpu", sample_size=N0, scale=SIGMA, alpha=ALPHA)
    if importlib.util.find_spec("statsmodels") is None:
        from scipy.stats import binomtest

        def lower(k, n):  # ART's proportion_confint(k, n, alpha=2 * alpha, method="beta")[0]
            return binomtest(int(k), int(n)).proportion_ci(confidence_level=1 - 2 * ALPHA, method="exact").low

        est._lower_confidence_bound = lower
    state = np.random.get_state()
    np.random.seed(0)
    try:
        pred, radius = est.certify(x.numpy(), n=N, batch_size=N)
    finally:
        np.random.set_state(state)
    return pred, radius


def test_radii_and_abstentions_agree_with_art(trained_multiclass):
    t = trained_multiclass
    x = t.x[:24]
    ours = RandomizedSmoothing(t.task, SIGMA, n0=N0, n=N, alpha=ALPHA, batch_size=2048, seed=0).certify(t.model, x)
    art_pred, art_radius = _art_certify(t.model, x, 4)
    r_ours, r_art = ours.radius.double().numpy(), art_radius.astype(np.float64)
    abst_ours, abst_art = ours.abstain.numpy(), art_pred == -1
    # the class: the same wherever both certify
    both = ~abst_ours & ~abst_art
    assert both.sum() >= 12
    assert (ours.prediction.numpy()[both] == art_pred[both]).all()
    # Monte-Carlo error of a radius: sigma * sqrt(p(1-p)/n) / phi(Phi^-1(p)), p from the pooled counts
    p = np.clip(ours.count.double().numpy() / N, 0.5 + 1e-3, 1 - 0.5 / N)
    z = np.array([math.sqrt(2) * _erfinv(2 * q - 1) for q in p])
    se = SIGMA * np.sqrt(p * (1 - p) / N) / (np.exp(-z * z / 2) / math.sqrt(2 * math.pi))
    assert (np.abs(r_ours - r_art)[both] <= 4 * np.sqrt(2) * se[both] + 1e-6).all()
    assert abs(r_ours.mean() - r_art.mean()) <= 0.05 * SIGMA + 2 * se.mean()
    # abstentions: the same rate (up to the few samples near p = 1/2)
    assert abs(int(abst_ours.sum()) - int(abst_art.sum())) <= 2
    # where the top class is certain (all n votes), both give exactly sigma * Phi^-1(alpha^(1/n))
    sure = (ours.count.numpy() == N) & (r_art >= r_ours - 1e-9) & both
    assert np.allclose(r_ours[sure], r_art[sure], atol=1e-5)


def _erfinv(v: float) -> float:
    return float(torch.special.erfinv(torch.tensor(v, dtype=torch.float64)))
