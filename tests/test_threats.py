"""Threat models: projection, steepest-ascent directions, random starts, bounds in data units."""

from __future__ import annotations

import math

import pytest
import torch

from medadv.threats import L2, Linf, per_sample_norm


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_per_sample_norm():
    t = torch.tensor([[[3.0, -4.0]], [[0.0, 0.0]]])
    torch.testing.assert_close(per_sample_norm(t, 2.0), torch.tensor([5.0, 0.0]))
    torch.testing.assert_close(per_sample_norm(t, math.inf), torch.tensor([4.0, 0.0]))
    torch.testing.assert_close(per_sample_norm(t, 1.0), torch.tensor([7.0, 0.0]))
    assert per_sample_norm(torch.zeros(3, 0), math.inf).shape == (3,)


def test_linf_project_direction_and_random_start():
    th = Linf(0.1, bounds=(0, 1))
    d = torch.randn(4, 2, 3, 3, generator=_gen())
    p = th.project(d)
    assert float(p.abs().max()) <= 0.1 + 1e-7  # float32(0.1) is a hair above the double 0.1
    torch.testing.assert_close(p, d.clamp(-0.1, 0.1))
    # per-sample radius
    eps = torch.tensor([0.0, 0.05, 0.1, 1.0])
    pe = th.project(d, eps)
    assert bool((per_sample_norm(pe, math.inf) <= eps + 1e-7).all())
    torch.testing.assert_close(th.ascent_direction(d), d.sign())
    x = torch.rand(4, 2, 3, 3, generator=_gen(1))
    r1, r2 = th.random_delta(x, _gen(5)), th.random_delta(x, _gen(5))
    assert torch.equal(r1, r2) and float(r1.abs().max()) <= 0.1 + 1e-7 and float(r1.abs().max()) > 0.05
    assert r1.shape == x.shape and r1.dtype == x.dtype
    assert th.norm(d).shape == (4,)


def test_l2_project_direction_and_random_start():
    th = L2(0.5, bounds=None)
    d = torch.randn(4, 1, 5, 5, generator=_gen())
    d[0] *= 1e-3  # already inside: left alone
    p = th.project(d)
    n = per_sample_norm(p, 2.0)
    assert bool((n <= 0.5 * (1 + 1e-6)).all())
    torch.testing.assert_close(p[0], d[0])
    torch.testing.assert_close(n[1:], torch.full((3,), 0.5))
    # projection keeps the direction
    torch.testing.assert_close(p[1] / n[1], d[1] / per_sample_norm(d, 2.0)[1])
    a = th.ascent_direction(d)
    torch.testing.assert_close(per_sample_norm(a, 2.0), torch.ones(4))
    assert torch.equal(th.ascent_direction(torch.zeros(2, 3)), torch.zeros(2, 3))  # no NaN at zero gradient
    r = th.random_delta(torch.zeros(64, 1, 4, 4), _gen(3))
    rn = per_sample_norm(r, 2.0)
    assert bool((rn <= 0.5 * (1 + 1e-6)).all()) and float(rn.std()) > 0.05  # uniform radius, not the sphere


def test_bounds_in_data_units_and_per_channel():
    hu = Linf(20.0, bounds=(-1024.0, 3071.0))
    x = torch.tensor([[[-1024.0, 0.0, 3071.0]]])
    out = hu.finalize(x, x + torch.tensor([[[-50.0, 50.0, 50.0]]]))
    torch.testing.assert_close(out, torch.tensor([[[-1024.0, 20.0, 3071.0]]]))
    hu.check_inside(x)
    lo = torch.tensor([0.0, -2.0]).reshape(2, 1, 1)
    hi = torch.tensor([1.0, 2.0]).reshape(2, 1, 1)
    from medadv.threats import LargeBudgetWarning

    with pytest.warns(LargeBudgetWarning):  # a ball wider than the box: clipping to each channel's range shows
        th = Linf(10.0, bounds=(lo, hi))
    x = torch.zeros(3, 2, 4, 4)
    c = th.clip(x + 5.0)
    assert c.shape == x.shape
    assert float(c[:, 0].max()) == 1.0 and float(c[:, 1].max()) == 2.0
    assert float(th.clip(x - 5.0)[:, 1].min()) == -2.0
    with pytest.raises(ValueError, match=r"outside the declared bounds"):
        th.check_inside(torch.full((1, 2, 4, 4), 1.5))  # fine for channel 1, not for channel 0
    # bounds are copied: changing the caller's tensor later does not move them
    lo[0] = -100.0
    assert float(th.bounds[0][0]) == 0.0
    # unbounded data
    free = L2(1.0, bounds=None)
    big = torch.full((1, 3), 1e6)
    assert torch.equal(free.clip(big), big)
    free.check_inside(big)
    assert "None" in repr(free) and "Linf(eps=10" in repr(th)


def test_tensor_bounds_must_fit_the_input():
    th = Linf(0.1, bounds=(torch.zeros(3, 1, 1), torch.ones(3, 1, 1)))
    th.check_inside(torch.rand(2, 3, 4, 4))
    with pytest.raises(ValueError, match=r"`bounds` tensors of shape \(3, 1, 1\) do not broadcast to `x`"):
        th.check_inside(torch.rand(2, 1, 4, 4))  # would silently broadcast a 1-channel batch to 3 channels
    with pytest.raises(ValueError, match=r"\(C, 1, 1, 1\) for 3-D"):
        th.check_inside(torch.rand(2, 3, 4, 4, 4))


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"`eps` must be a finite number >= 0"):
        L2(-1.0, bounds=None)
    with pytest.raises(ValueError, match=r"`bounds` lo must be finite"):
        Linf(0.1, bounds=(torch.tensor([float("nan")]), torch.tensor([1.0])))
    with pytest.raises(TypeError, match=r"`bounds` hi must be a number or a tensor"):
        Linf(0.1, bounds=(0.0, "one"))
    with pytest.raises(ValueError, match=r"lo < hi"):
        Linf(0.1, bounds=(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0])))


def test_an_linf_budget_above_half_the_data_range_warns_loudly():
    """8 on [0, 1] data is a units mistake for 8/255 (the ball would cover the box): the Python API says so."""
    import warnings

    from medadv.threats import LargeBudgetWarning

    with pytest.warns(LargeBudgetWarning, match=r"^Linf eps=8 is more than half the data range \[0, 1\]: budgets "
                                                r"are in data units, e.g. 8/255 for 8 on a 0-255 scale"):
        Linf(8.0, bounds=(0.0, 1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Linf(0.1, bounds=(0.0, 1.0)).with_eps(0.9)  # radii derived inside attacks (AutoAttack's 2ε phase): silent
        Linf(0.5, bounds=(0.0, 1.0))
        Linf(8.0, bounds=(0.0, 255.0))
        Linf(8.0, bounds=None)
        Linf(20.0, bounds=(torch.tensor([0.0, -1000.0]).view(2, 1, 1), torch.tensor([1.0, 1000.0]).view(2, 1, 1)))
        L2(8.0, bounds=(0.0, 1.0))  # an L2 norm sums over elements: not comparable with one element's range


@pytest.mark.parametrize("threat", ["Linf", "L2"])
def test_a_budget_beyond_float32_is_refused_in_one_line(threat):
    # 1e308 is finite in Python but overflows every step of an attack on float32 data (issue 28)
    import medadv.threats as th

    with pytest.raises(ValueError, match=r"`eps` must be at most 3\.403e\+38"):
        getattr(th, threat)(1e308, bounds=None)
    assert getattr(th, threat)(1e30, bounds=None).eps == 1e30
