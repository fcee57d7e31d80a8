"""``autoattack`` and multi-class ``auto`` (pyautoattack underneath) on inputs pyautoattack does not expect
(issue 19): float64 models, 3-D inputs, channels_last tensors and models, L2 on small images. Each either works
(finite, inside the ball and box, in the input's dtype) or is refused before any work with a clear error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv.attacks import autoattack
from medadv.attacks.auto import AutoEvaluation
from medadv.attacks.autoattack import AutoAttack, run_pyautoattack
from medadv.tasks import MultiClass
from medadv.threats import L2, Linf

K = 4  # classes


def _classifier(ndim: int = 2, channels: int = 1, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Conv2d if ndim == 2 else nn.Conv3d
    pool = nn.AdaptiveAvgPool2d(1) if ndim == 2 else nn.AdaptiveAvgPool3d(1)
    return nn.Sequential(conv(channels, 4, 3, padding=1), nn.Softplus(), pool, nn.Flatten(),
                         nn.Linear(4, K)).to(dtype).eval()


class _Counting(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x)


def _data(*spatial: int, channels: int = 1, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(1)
    return torch.rand(3, channels, *spatial, generator=g, dtype=dtype), torch.arange(3) % K


def _check(res, x, threat) -> None:
    x_adv = res if isinstance(res, torch.Tensor) else res.x_adv
    assert x_adv.dtype == x.dtype and x_adv.shape == x.shape
    assert torch.isfinite(x_adv).all()
    assert float(x_adv.min()) >= 0.0 and float(x_adv.max()) <= 1.0
    norms = threat.norm(x_adv - x)
    assert bool((norms <= threat.eps * (1 + 1e-5) + 1e-6).all()), norms


def _aa(model, x, y, threat, attacks):
    """``autoattack``'s pyautoattack run (shared with ``auto``), with 5 APGD steps and 20 Square queries: pyautoattack's own defaults
    (5 restarts of 100 steps for version='custom') take minutes on a busy CPU."""
    return run_pyautoattack(model, x, y, None, threat, version="standard", attacks=attacks, seed=0, steps=5,
                            queries=20)


def _auto(threat, attacks):
    return AutoEvaluation(MultiClass(), threat, version="custom", attacks=attacks, steps=5, queries=20,
                          checks=False)


def test_float64_model():
    model, (x, y) = _classifier(dtype=torch.float64), _data(8, 8, dtype=torch.float64)
    threat = Linf(0.05, bounds=(0.0, 1.0))
    _check(_aa(model, x, y, threat, ["apgd-ce", "apgd-t"]), x, threat)
    _check(_auto(threat, ["apgd-ce", "apgd-t"])(model, x, y), x, threat)
    assert next(model.parameters()).dtype == torch.float64  # the model is not converted


def test_3d_inputs_run_apgd_and_refuse_pyautoattacks_square_before_any_work():
    model, (x, y) = _classifier(ndim=3), _data(6, 6, 6)
    threat = Linf(0.05, bounds=(0.0, 1.0))
    _check(_aa(model, x, y, threat, ["apgd-ce", "apgd-t"]), x, threat)
    counting = _Counting(model)
    with pytest.raises(ValueError, match=r"2-D images .*attacks=\['apgd-ce', 'apgd-t', 'fab-t'\]"):
        AutoAttack(MultiClass(), threat)(counting, x, y)  # standard: APGD-CE, APGD-T, FAB-T, Square
    assert counting.calls == 0
    # auto's Square member is medadv's own on a volume
    _check(_auto(threat, ["apgd-ce", "square"])(model, x, y), x, threat)


def test_channels_last_l2():
    model = _classifier(channels=3).to(memory_format=torch.channels_last)
    x, y = _data(8, 8, channels=3)
    x = x.to(memory_format=torch.channels_last)
    threat = L2(0.5, bounds=(0.0, 1.0))
    _check(_aa(model, x, y, threat, ["apgd-ce", "apgd-t", "square"]), x, threat)
    _check(_auto(threat, ["apgd-ce", "apgd-t"])(model, x, y), x, threat)


def test_l2_on_images_of_fewer_than_5_rows():
    model, (x, y) = _classifier(), _data(4, 9)
    threat = L2(0.5, bounds=(0.0, 1.0))
    assert autoattack.square_refusal(tuple(x.shape), "L2") is not None
    assert autoattack.square_refusal(tuple(x.shape), "Linf") is None
    counting = _Counting(model)
    with pytest.raises(ValueError, match="at least 5 rows"):
        AutoAttack(MultiClass(), threat, version="custom", attacks=["apgd-ce", "square"])(counting, x, y)
    assert counting.calls == 0
    _check(_aa(model, x, y, threat, ["apgd-ce"]), x, threat)
    # auto's Square member falls back to medadv's Square
    _check(_auto(threat, ["apgd-ce", "square"])(model, x, y), x, threat)
