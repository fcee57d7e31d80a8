"""Property: every bounded gradient attack stays inside its ε-ball and the data bounds.

Over tasks (multi-class, multi-label, 2-D/3-D segmentation), spatial rank, channels, bounds (scalar
[0, 1], HU-like CT ranges, z-scores, per-channel tensors), budgets, norms, targeted or not, restarts and
the active set. Models are tiny random nets: the property must hold whatever the gradients are.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from medadv.attacks.base import attack_class, available_attacks
from medadv.attacks.bim import BIM
from medadv.attacks.fgsm import FGSM
from medadv.attacks.gradient import GradientAttack
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import L2, Linf

# every registered attack of the gradient family (a new one is covered without editing this file)
GRADIENT_FAMILY = [attack_class(n) for n in available_attacks() if issubclass(attack_class(n), GradientAttack)]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Net(nn.Module):
    """Tiny conv net for any rank; dense output for segmentation, pooled output for classification."""

    def __init__(self, ndim: int, channels: int, out: int, dense: bool, scale: float, shift: float):
        super().__init__()
        conv = nn.Conv2d if ndim == 2 else nn.Conv3d
        self.scale, self.shift, self.dense = scale, shift, dense
        self.body = nn.Sequential(conv(channels, 4, 3, padding=1), nn.Tanh(), conv(4, out, 1))

    def forward(self, x):
        z = self.body((x - self.shift) / self.scale)  # the net sees normalised data, the attack raw units
        return z if self.dense else z.flatten(2).mean(-1)


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(["multiclass", "multilabel", "segmentation"]))
    ndim = draw(st.sampled_from([2, 3]))
    channels = draw(st.integers(1, 3))
    n = draw(st.integers(1, 3))
    size = draw(st.integers(3, 6))
    bounds_kind = draw(st.sampled_from(["unit", "hu", "zscore", "per_channel", "none"]))
    if bounds_kind == "unit":
        lo, hi = 0.0, 1.0
    elif bounds_kind == "hu":
        lo, hi = -1024.0, 3071.0
    elif bounds_kind == "zscore":
        lo, hi = -3.0, 3.0
    elif bounds_kind == "per_channel":
        lo_v = torch.tensor(draw(st.lists(st.floats(-5, 0), min_size=channels, max_size=channels)))
        width = torch.tensor(draw(st.lists(st.floats(0.5, 10), min_size=channels, max_size=channels)))
        shape = (channels,) + (1,) * ndim
        lo, hi = lo_v.reshape(shape), (lo_v + width).reshape(shape)
    else:
        lo, hi = None, None
    span = 1.0 if lo is None else float(torch.as_tensor(hi - lo).min())
    eps_frac = draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.5]))  # 1.5: the ball exceeds the data range
    norm = draw(st.sampled_from(["linf", "l2"]))
    eps = eps_frac * span * (1.0 if norm == "linf" else 3.0)
    return {
        "kind": kind, "ndim": ndim, "channels": channels, "n": n, "size": size, "lo": lo, "hi": hi,
        "eps": eps, "norm": norm, "attack": draw(st.sampled_from(GRADIENT_FAMILY)), "targeted": draw(st.booleans()),
        "restarts": draw(st.integers(1, 2)), "active_set": draw(st.booleans()), "steps": draw(st.integers(1, 4)),
        "edge": draw(st.booleans()), "seed": draw(st.integers(0, 2**16)),
    }


def _data(c, gen):
    shape = (c["n"], c["channels"], *([c["size"]] * c["ndim"]))
    u = torch.rand(shape, generator=gen)
    if c["edge"]:  # pin a third of the values at the bounds, where clipping matters most
        u = torch.where(u < 0.33, (u > 0.16).float(), u)
    if c["lo"] is None:
        return (u - 0.5) * 20.0
    return c["lo"] + u * (c["hi"] - c["lo"])


def _labels(c, logits, gen):
    if c["kind"] == "multiclass":
        return torch.randint(0, logits.shape[1], (logits.shape[0],), generator=gen)
    if c["kind"] == "multilabel":
        return (torch.rand(logits.shape, generator=gen) < 0.5).float()
    return torch.randint(0, logits.shape[1], (logits.shape[0], *logits.shape[2:]), generator=gen)


@SETTINGS
@given(cases())
def test_attack_stays_in_ball_and_bounds(c):
    gen = torch.Generator().manual_seed(c["seed"])
    torch.manual_seed(c["seed"])
    out = {"multiclass": 3, "multilabel": 4, "segmentation": 3}[c["kind"]]
    x = _data(c, gen)
    scale = 1.0 if c["lo"] is None else float(torch.as_tensor(c["hi"] - c["lo"]).max())
    shift = 0.0 if c["lo"] is None else float(torch.as_tensor(c["lo"]).min())
    model = _Net(c["ndim"], c["channels"], out, c["kind"] == "segmentation", scale, shift).eval()
    # random nets' few logits may all fall in [0, 1]: declared logits, not refused as sigmoid outputs (issue 28)
    task = {"multiclass": MultiClass(), "multilabel": MultiLabel(outputs="logits"),
            "segmentation": Segmentation(3)}[c["kind"]]
    with torch.no_grad():
        y = _labels(c, model(x), gen)
    bounds = None if c["lo"] is None else (c["lo"], c["hi"])
    threat = (Linf if c["norm"] == "linf" else L2)(c["eps"], bounds=bounds)
    cls = c["attack"]
    kw = {"targeted": c["targeted"], "seed": c["seed"]}
    if cls is not FGSM:
        kw.update(steps=c["steps"], active_set=c["active_set"])
        if cls is not BIM:
            kw["restarts"] = c["restarts"]
    x_in = x.clone()
    res = cls(task, threat, **kw)(model, x, y)

    assert torch.equal(x, x_in)
    assert res.x_adv.shape == x.shape and res.x_adv.dtype == x.dtype
    assert torch.isfinite(res.x_adv).all()
    delta = res.x_adv - x
    # float32 rounding of x + δ in the data's own units (HU values are in the thousands)
    tol = 4 * torch.finfo(torch.float32).eps * max(1.0, float(x.abs().max()))
    if c["norm"] == "linf":
        assert float(delta.abs().max()) <= c["eps"] + tol
    else:
        assert float(delta.flatten(1).norm(dim=1).max()) <= c["eps"] * (1 + 1e-5) + tol * delta[0].numel() ** 0.5
    if bounds is not None:
        assert bool((res.x_adv >= c["lo"]).all()) and bool((res.x_adv <= c["hi"]).all())
    if c["eps"] == 0:
        assert torch.equal(res.x_adv, x)
    # the reported norms are the norms of the returned perturbation
    torch.testing.assert_close(res.linf, delta.flatten(1).abs().amax(1))
    torch.testing.assert_close(res.l2, delta.flatten(1).norm(dim=1))


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 4), ndim=st.sampled_from([2, 3]), channels=st.integers(1, 3),
    eps=st.floats(0.0, 2.0), norm=st.sampled_from(["linf", "l2"]), seed=st.integers(0, 2**16),
)
def test_finalize_is_a_projection(n, ndim, channels, eps, norm, seed):
    """finalize lands in the feasible set and leaves feasible points where they are."""
    gen = torch.Generator().manual_seed(seed)
    threat = (Linf if norm == "linf" else L2)(eps, bounds=(-1.0, 1.0))
    x = torch.rand(n, channels, *([4] * ndim), generator=gen) * 2 - 1
    wild = x + 3 * torch.randn(x.shape, generator=gen)
    p = threat.finalize(x, wild)
    assert bool((p >= -1).all() and (p <= 1).all())
    assert bool((threat.norm(p - x) <= eps * (1 + 1e-5) + 1e-6).all())
    torch.testing.assert_close(threat.finalize(x, p), p, atol=1e-6, rtol=0)
