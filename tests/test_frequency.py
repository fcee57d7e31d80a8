"""Frequency analysis: mask semantics of Malik et al., exact filtering, and evaluation of filtered attacks."""

from __future__ import annotations

import math

import pytest
import torch

from medadv.attacks.vafa import VAFA
from medadv.frequency import (
    filter_perturbation,
    filtered_attack,
    frequency_analysis,
    highpass_mask,
    keep_cube,
    lowpass_mask,
)
from medadv.threats import Box


def test_mask_semantics_match_the_paper():
    assert int(keep_cube((96, 96, 96), 16, 96).sum()) == 80**3  # "(16-96)" is a cube, not a complement
    assert int(lowpass_mask((96, 96, 96), 8).sum()) == 8**3
    assert int(keep_cube(96, 16, 48, ndim=3).sum()) == 32**3
    assert int(highpass_mask((96, 96, 96), 16).sum()) == 96**3 - 16**3
    assert int(lowpass_mask((10, 12), 4).sum()) == 16
    with pytest.raises(ValueError, match="lo < hi"):
        keep_cube((8, 8), 4, 2)


def test_filtering_is_exact_and_linear():
    g = torch.Generator().manual_seed(0)
    delta = torch.randn(2, 1, 16, 16, 16, generator=g)
    full = torch.ones(16, 16, 16, dtype=torch.bool)
    assert torch.allclose(filter_perturbation(delta, full), delta, atol=1e-5)
    low, high = lowpass_mask((16, 16, 16), 4), highpass_mask((16, 16, 16), 4)
    parts = filter_perturbation(delta, low) + filter_perturbation(delta, high)
    assert torch.allclose(parts, delta, atol=1e-5)
    # per-tile filtering (Malik et al. use 96^3 tiles) on a volume that is not a tile multiple
    vol = torch.randn(1, 1, 20, 12, 9, generator=g)
    assert torch.allclose(filter_perturbation(vol, torch.ones(8, 8, 8, dtype=torch.bool), tile=8), vol, atol=1e-5)


def test_lowpass_keeps_smooth_and_drops_noise():
    ax = torch.arange(16, dtype=torch.float32)
    smooth = torch.cos(math.pi * (2 * ax + 1) * 1 / 32)  # DCT basis function k = 1
    smooth = (smooth[:, None, None] * torch.ones(16, 16)).reshape(1, 1, 16, 16, 16)
    low, high = lowpass_mask((16, 16, 16), 2), keep_cube((16, 16, 16), 8)
    assert torch.allclose(filter_perturbation(smooth, low), smooth, atol=1e-5)
    assert filter_perturbation(smooth, high).abs().max() < 1e-5
    x = torch.full((1, 1, 16, 16, 16), 0.5)
    out = filtered_attack(x, x + 0.9 * smooth, low, bounds=(0, 1))
    assert out.min() >= 0 and out.max() <= 1


def test_frequency_analysis_on_a_vafa_attack(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    x_adv = VAFA(task, Box(0.0, 1.0), block=8, steps=10)(m, x, y).x_adv
    s = x.shape[2:]
    masks = {"full": torch.ones(s, dtype=torch.bool), "low_4": lowpass_mask(s, 4),
             "high_4_16": keep_cube(s, 4), "none": torch.zeros(s, dtype=torch.bool)}
    out = frequency_analysis(m, task, x, x_adv, y, masks, bounds=(0.0, 1.0))
    assert torch.allclose(out["full"], out["adversarial"], atol=1e-6)
    assert torch.allclose(out["none"], out["clean"])
    assert float((out["clean"] - out["adversarial"]).mean()) > 0
    # as Malik et al. report for VAFA: the low band carries more of the damage than the high cube
    assert float(out["low_4"].mean()) < float(out["high_4_16"].mean())
    assert m.training is False
