"""Map-similarity metrics against hand-computed values and reference implementations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from skimage.metrics import structural_similarity

from medadv.metrics.saliency import (
    center_of_mass,
    center_of_mass_shift,
    compare_maps,
    fisher_ci,
    jsd,
    map_jsd,
    map_mse,
    map_pearson,
    map_spearman,
    map_ssim,
    minmax,
    prediction_jsd,
    psc,
    topk_intersection,
)
from medadv.tasks import MultiClass, MultiLabel


def test_ssim_equals_skimage_on_minmax_0_255_maps():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 20, 17, generator=g, dtype=torch.float64)
    b = a + 0.3 * torch.rand(3, 20, 17, generator=g, dtype=torch.float64)
    ours = map_ssim(a, b)
    for i in range(3):
        an, bn = (minmax(a)[i].numpy() * 255), (minmax(b)[i].numpy() * 255)
        ref = structural_similarity(an, bn, data_range=255)
        assert ours[i].item() == pytest.approx(ref, abs=1e-10)
    assert map_ssim(a, a).allclose(torch.ones(3, dtype=torch.float64))


def test_ssim_3d_equals_skimage():
    g = torch.Generator().manual_seed(1)
    a = torch.rand(1, 9, 10, 11, generator=g, dtype=torch.float64)
    b = torch.rand(1, 9, 10, 11, generator=g, dtype=torch.float64)
    ref = structural_similarity(minmax(a)[0].numpy(), minmax(b)[0].numpy(), data_range=1.0)
    assert map_ssim(a, b).item() == pytest.approx(ref, abs=1e-10)


def test_pearson_mse_spearman_by_hand():
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    b = torch.tensor([[2.0, 4.0, 6.0, 9.0]])
    r = pearsonr(a[0].numpy(), b[0].numpy())[0]
    assert map_pearson(a, b).item() == pytest.approx(r, abs=1e-6)
    # min-max: a -> [0, 1/3, 2/3, 1]; b -> [0, 2/7, 4/7, 1]
    expected = ((1 / 3 - 2 / 7) ** 2 + (2 / 3 - 4 / 7) ** 2) / 4
    assert map_mse(a, b).item() == pytest.approx(expected, abs=1e-7)
    assert map_mse(a, b, normalize=False).item() == pytest.approx((1 + 4 + 9 + 25) / 4)
    c = torch.tensor([[0.0, 0.0, 1.0, 0.5, 0.5, 3.0]])
    d = torch.tensor([[1.0, 0.0, 2.0, 0.0, 5.0, 4.0]])
    assert map_spearman(c, d).item() == pytest.approx(spearmanr(c[0], d[0])[0], abs=1e-6)  # ties averaged
    assert math.isnan(map_pearson(torch.ones(1, 4), a).item())


def test_topk_intersection_by_hand():
    a = torch.tensor([[5.0, 4.0, 3.0, 0.0, 0.0, 0.0]])
    b = torch.tensor([[5.0, 0.0, 3.0, 4.0, 0.0, 0.0]])
    assert topk_intersection(a, b, 3).item() == pytest.approx(2 / 3)
    assert topk_intersection(a, a, 2).item() == 1.0
    with pytest.raises(ValueError, match="k"):
        topk_intersection(a, b, 0)


def test_center_of_mass_by_hand():
    m = torch.zeros(1, 4, 5)
    m[0, 1, 1] = 1.0
    m[0, 3, 4] = 3.0
    torch.testing.assert_close(center_of_mass(m), torch.tensor([[2.5, 3.25]]))
    n = torch.zeros(1, 4, 5)
    n[0, 0, 0] = 1.0
    assert center_of_mass_shift(m, n).item() == pytest.approx(math.hypot(2.5, 3.25))


def test_jsd_properties_and_values():
    p = torch.tensor([1.0, 0.0])
    q = torch.tensor([0.0, 1.0])
    assert jsd(p, q).item() == pytest.approx(math.log(2), abs=1e-6)
    assert jsd(p, p).item() == pytest.approx(0.0, abs=1e-9)
    a, b = torch.tensor([0.2, 0.8]), torch.tensor([0.6, 0.4])
    m = (a + b) / 2
    ref = 0.5 * float((a * (a / m).log()).sum()) + 0.5 * float((b * (b / m).log()).sum())
    assert jsd(a, b).item() == pytest.approx(ref, abs=1e-7)
    assert jsd(a, b).item() == pytest.approx(jsd(b, a).item())
    x = torch.rand(4, 6, 6)
    assert torch.all(map_jsd(x, x.flip(1)) <= math.log(2) + 1e-6)
    # maps that are not sum-to-1 are normalised first
    assert map_jsd(x, 3 * x).abs().max() < 1e-6


def test_prediction_jsd_multilabel_and_multiclass():
    la = torch.tensor([[0.0, 2.0]])
    lb = torch.tensor([[0.0, -2.0]])
    p, q = torch.sigmoid(la[0, 1]), torch.sigmoid(lb[0, 1])
    ref = jsd(torch.stack([p, 1 - p]), torch.stack([q, 1 - q]))
    assert prediction_jsd(MultiLabel(), la, lb, label=1).item() == pytest.approx(ref.item(), abs=1e-7)
    assert prediction_jsd(MultiLabel(), la, lb, label=0).item() == pytest.approx(0.0, abs=1e-9)
    per_sample = prediction_jsd(MultiLabel(), torch.cat([la, la]), torch.cat([lb, lb]), label=torch.tensor([1, 0]))
    torch.testing.assert_close(per_sample, torch.stack([ref, torch.tensor(0.0)]).float(), atol=1e-7, rtol=0)
    mc = prediction_jsd(MultiClass(), la, lb)
    assert mc.item() == pytest.approx(jsd(la.softmax(1), lb.softmax(1)).item(), abs=1e-7)


def test_psc_linear_constant_and_ci():
    x = torch.tensor([0.1, 0.2, 0.3, 0.5])
    assert psc(x, 2 * x + 1) == pytest.approx(1.0)
    assert psc(x, -x) == pytest.approx(-1.0)
    assert psc(x, torch.tensor([0.1, float("nan"), 0.3, 0.5])) == pytest.approx(
        float(np.corrcoef(x.numpy(), [0.1, 0.3, 0.3, 0.5])[0, 1]), abs=1e-6)
    with pytest.warns(UserWarning, match="undefined"):
        assert math.isnan(psc(torch.ones(4), x))
    lo, hi = fisher_ci(0.25, 202)  # Zhang et al.'s "0.25 (95% CI 0.12, 0.38)"
    assert (round(lo, 2), round(hi, 2)) == (0.12, 0.38)


def test_compare_maps_keys_and_identity():
    x = torch.rand(2, 12, 12)
    out = compare_maps(x, x)
    assert set(out) == {"ssim", "pearson", "spearman", "mse", "topk", "com_shift", "jsd"}
    assert torch.allclose(out["ssim"], torch.ones(2), atol=1e-5)
    assert torch.allclose(out["topk"], torch.ones(2))
    with pytest.raises(ValueError, match="same shape"):
        compare_maps(x, x[:, :6])
