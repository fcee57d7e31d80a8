"""The random-noise control (Malik et al. 2024 §3.6: x′ = clip(x + σ·𝒩(0, I)), σ tied to ε)."""

from __future__ import annotations

import math

import pytest
import torch

from medadv.attacks.base import get_attack
from medadv.attacks.noise import Noise
from medadv.attacks.pgd import PGD
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass
from medadv.threats import L2, Box, Linf


class _Const(torch.nn.Module):
    """A model whose output does not depend on the input (the noise never reads it)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return torch.stack([x.flatten(1).sum(1) * 0 + 1.0, x.flatten(1).sum(1) * 0], dim=1) + self.w


@pytest.mark.parametrize("distribution", ["gaussian", "uniform"])
def test_std_is_sigma_before_any_clipping(distribution):
    x = torch.zeros(4, 1, 64, 64)
    sigma = 0.03
    res = Noise(MultiClass(), Box.unbounded(), sigma=sigma, distribution=distribution)(_Const(), x)
    delta = res.x_adv - x
    assert abs(float(delta.std()) / sigma - 1) < 0.02
    assert abs(float(delta.mean())) < 0.05 * sigma
    if distribution == "uniform":
        assert float(delta.abs().max()) <= math.sqrt(3) * sigma * (1 + 1e-6)


def test_seeded_deterministic_and_the_box_clip_is_the_only_change():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 2, 16, 16, generator=g)
    atk = Noise(MultiClass(), Box(0.0, 1.0), sigma=0.2, seed=7)
    a, b = atk(_Const(), x), atk(_Const(), x)
    assert torch.equal(a.x_adv, b.x_adv)
    assert not torch.equal(a.x_adv, atk.set_params(seed=8)(_Const(), x).x_adv)
    torch.testing.assert_close(a.x_adv, (x + atk.draw(x)).clamp(0, 1), rtol=0, atol=0)
    assert bool((a.x_adv == 0).any()) and bool((a.x_adv == 1).any())  # the clip did act


def test_a_ball_sets_sigma_from_eps_and_projects():
    x = torch.full((4, 1, 32, 32), 0.5)
    eps = 0.02
    linf = Noise(MultiClass(), Linf(eps, bounds=(0, 1)), seed=3)
    assert linf.std(x) == eps
    raw = Noise(MultiClass(), Box(0, 1), sigma=eps, seed=3).draw(x)  # the same stream
    res = linf(_Const(), x)
    torch.testing.assert_close(res.x_adv - x, raw.clamp(-eps, eps), rtol=0, atol=1e-7)
    frac = float(((res.x_adv - x).abs() >= eps * (1 - 1e-5)).float().mean())
    assert 0.28 < frac < 0.36  # P(|z| > 1) = 0.317 of the elements sit on the ball's surface
    l2 = Noise(MultiClass(), L2(eps, bounds=(0, 1)), seed=3)
    assert l2.std(x) == pytest.approx(eps / 32)
    r2 = l2(_Const(), x)
    assert (r2.l2 <= eps * (1 + 1e-5)).all() and float(r2.l2.min()) > 0.9 * eps  # ‖σ·n‖₂ ≈ ε


def test_noise_does_less_damage_than_pgd_at_the_same_eps(trained_multiclass):
    t = trained_multiclass
    eps = 0.1
    threat = Linf(eps, bounds=(0, 1))
    clean_acc = float((t.model(t.x).argmax(1) == t.y).float().mean())
    pgd = PGD(t.task, threat, steps=10, random_start=False)(t.model, t.x, t.y)
    ball = Noise(t.task, threat)(t.model, t.x, t.y)
    free = get_attack("noise", t.task, Box(0, 1), sigma=eps)(t.model, t.x, t.y)
    acc = {k: float((r.logits.argmax(1) == t.y).float().mean()) for k, r in
           (("pgd", pgd), ("ball", ball), ("free", free))}
    assert acc["pgd"] <= clean_acc - 0.5, acc  # the attack works ...
    assert acc["ball"] >= clean_acc - 0.1 and acc["free"] >= clean_acc - 0.15, acc  # ... the noise hardly does
    assert (ball.linf <= eps + 1e-6).all() and float(free.linf.max()) > 2 * eps  # unprojected with a Box


def test_refusals():
    with pytest.raises(TypeError, match="sigma"):
        Noise(MultiClass(), Box(0, 1))
    with pytest.raises(InvalidParameterError, match="sigma"):
        Noise(MultiClass(), Box(0, 1), sigma=-1.0)
    with pytest.raises(InvalidParameterError, match="distribution.*did you mean 'uniform'"):
        Noise(MultiClass(), Linf(0.1, bounds=(0, 1)), distribution="unifrom")
