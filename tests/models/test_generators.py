"""GAP generators: shapes for any spatial size and rank, channels, seeding, validation."""

from __future__ import annotations

import pytest
import torch

from medadv.models.generators import ResnetGenerator, UnetGenerator, build_generator


@pytest.mark.parametrize("cls", [UnetGenerator, ResnetGenerator])
@pytest.mark.parametrize("shape", [(2, 3, 30, 17), (2, 1, 9, 12, 10)])
def test_output_shape_and_range_any_size(cls, shape):
    g = cls(shape[1], ngf=4, ndim=len(shape) - 2).eval()
    out = g(torch.rand(shape))
    assert out.shape == shape  # padded to a multiple of 2**depth internally, cropped back
    assert out.abs().max() < 1.0  # tanh output


@pytest.mark.parametrize("cls", [UnetGenerator, ResnetGenerator])
def test_channels_width_and_seed(cls):
    g = cls(2, 4, ngf=4, ndim=2)
    assert g(torch.rand(1, 2, 16, 16)).shape == (1, 4, 16, 16)
    small, big = cls(1, ngf=4), cls(1, ngf=8)
    assert sum(p.numel() for p in big.parameters()) > 2 * sum(p.numel() for p in small.parameters())
    a, b, c = cls(1, ngf=4, seed=1), cls(1, ngf=4, seed=1), cls(1, ngf=4, seed=2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))


def test_build_from_config_round_trip():
    g = ResnetGenerator(1, ngf=4, n_blocks=1, ndim=3, norm="instance")
    h = build_generator(**g.config)
    h.load_state_dict(g.state_dict())
    x = torch.rand(2, 1, 8, 8, 8)
    assert torch.equal(g.eval()(x), h.eval()(x))


def test_generator_learns_gradients_flow():
    g = UnetGenerator(1, ngf=4, depth=2)
    g(torch.rand(2, 1, 8, 8)).sum().backward()
    assert all(p.grad is not None for p in g.parameters())


@pytest.mark.parametrize("kwargs, match", [
    (dict(ndim=4), "ndim"), (dict(ngf=0), "ngf"), (dict(norm="group"), "norm"), (dict(in_channels=0), "in_channels"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        UnetGenerator(**kwargs)
    with pytest.raises(ValueError, match="kind"):
        build_generator("vae")
