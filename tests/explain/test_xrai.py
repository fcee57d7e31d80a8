"""XRAI (Kapishnikov et al. 2019): integrated gradients ranked over multi-scale Felzenszwalb regions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medadv.attacks.relevance import SaliencyRelevance
from medadv.attacks.resistance import SaliencyResistance
from medadv.data.chest_xray import load_chest_xray
from medadv.explain import XRAI, IntegratedGradients, get_explanation, xrai_rank, xrai_segments
from medadv.models import small_cnn
from medadv.params import InvalidParameterError
from medadv.tasks import MultiLabel
from medadv.threats import Linf


@pytest.fixture(scope="module")
def setup():
    """The real chest X-ray (and its mirror image) at 64², a small CNN with 3 label outputs."""
    torch.manual_seed(0)
    model = small_cnn(1, 3, width=8).eval()
    img = load_chest_xray(64)
    return model, torch.stack([img, img.flip(-1)])


def _signed_ig(model, x, target, n_steps):
    with torch.enable_grad():
        a = IntegratedGradients(n_steps=n_steps).attribute(model, x.clone().requires_grad_(True), target)
    return a.detach().sum(1)


def test_xrai_map_is_piecewise_constant_and_ranks_regions_by_attribution_density(setup):
    model, x = setup
    x0 = x.clone()
    m = XRAI(n_steps=5)(model, x, 0)
    assert m.shape == (2, 64, 64) and (m >= 0).all()
    torch.testing.assert_close(m.flatten(1).sum(1), torch.ones(2))
    assert torch.equal(x, x0)
    ig = _signed_ig(model, x, torch.zeros(2, dtype=torch.long), 5)
    assert len(torch.unique(ig[0])) > 3000  # the base attribution varies pixel by pixel ...
    for i in range(2):
        values = torch.unique(m[i])
        assert 3 <= len(values) < 200  # ... XRAI is constant on a few regions
        # each region's value is an increasing affine function of its mean IG (the gain density): the map
        # ranks regions by attribution per pixel, and the densest region is the top of the map
        dens = torch.stack([ig[i][m[i] == v].mean() for v in values]).double()
        v = values.double()
        slope = ((v - v.mean()) * (dens - dens.mean())).sum() / (v - v.mean()).pow(2).sum()
        assert slope > 0
        torch.testing.assert_close(dens, dens.mean() + slope * (v - v.mean()), rtol=0, atol=1e-6 * dens.abs().max())
        assert dens[-1] == dens.max() and dens[-1] > ig[i].mean()


def test_xrai_rank_by_hand():
    attr = np.zeros((6, 6))
    attr[:3, :3] = 2.0  # region A: 9 px, mass 18
    attr[3:, 3:] = 1.0  # region B: 9 px, mass 9
    a, b, whole = (np.zeros((6, 6), bool) for _ in range(3))
    a[:3, :3] = True
    b[3:, 3:] = True
    whole[:] = True
    out = xrai_rank(attr, np.stack([whole, b, a]), min_pixel_diff=1)
    assert out[0, 0] == 2.0 and out[5, 5] == 1.0 and out[0, 5] == 0.0  # A ranks above B above the rest
    # a region adding fewer than min_pixel_diff new pixels is skipped: B is then covered by the whole image
    out = xrai_rank(attr, np.stack([whole, b, a]), min_pixel_diff=10)
    assert out[0, 0] == out[5, 5] == out[0, 5] == pytest.approx(27 / 36)


def test_xrai_segments_are_dilated_multiscale_regions(setup):
    _, x = setup
    img = x[0, 0].numpy()
    plain = xrai_segments(img, scales=(100.0,), dilation_radius=0)
    assert plain.dtype == bool and plain.shape[1:] == (64, 64)
    assert (plain.sum(0) == 1).all()  # one scale without dilation: a partition of the image
    dilated = xrai_segments(img, scales=(100.0,), dilation_radius=2)
    assert (dilated >= plain).all() and dilated.sum() > plain.sum()
    both = xrai_segments(img, scales=(50.0, 1200.0))
    assert len(both) > len(xrai_segments(img, scales=(1200.0,)))


def test_xrai_is_deterministic_and_registered(setup):
    model, x = setup
    e = get_explanation({"name": "xrai", "n_steps": 4, "scales": [100, 500]})
    assert isinstance(e, XRAI) and e.scales == (100.0, 500.0) and not e.differentiable
    assert torch.equal(e(model, x[:1], 1), e(model, x[:1], 1))
    with pytest.raises(InvalidParameterError, match="scales"):
        XRAI(scales=[])
    with pytest.raises(InvalidParameterError, match="dilation_radius"):
        XRAI(dilation_radius=-1)


def test_saliency_attacks_refuse_xrai_and_name_integrated_gradients(setup):
    model, x = setup
    th = Linf(0.06, bounds=(0.0, 1.0))
    for attack in (SaliencyRelevance, SaliencyResistance):
        with pytest.raises(InvalidParameterError,
                           match=r"'xrai' is evaluation-only.*attack 'integrated_gradients' instead"):
            attack(MultiLabel(), th, "xrai")
    with pytest.raises(InvalidParameterError, match="evaluation-only"):
        XRAI().map(model, x[:1], torch.zeros(1, dtype=torch.long), create_graph=True)
    vol = small_cnn(1, 2, width=4, ndim=3).eval()
    with pytest.raises(ValueError, match="2-D images.*integrated_gradients"):
        XRAI()(vol, torch.rand(1, 1, 8, 8, 8), 0)
