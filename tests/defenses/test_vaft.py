"""VAFT: the three-term loss, its frequency term, and optimiser steps that lower it."""

from __future__ import annotations

import copy

import pytest
import torch

from medadv.attacks.vafa import VAFA, VAFA2D
from medadv.dct import dct
from medadv.defenses.base import TrainingStrategy
from medadv.defenses.vaft import VAFT, frequency_consistency
from medadv.tasks import MultiClass, Segmentation
from medadv.threats import Box


def test_frequency_consistency_formula():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 3, 8, 8, 8, generator=g)
    za = z + 0.1 * torch.randn(2, 3, 8, 8, 8, generator=g)
    expect = (dct(z) - dct(za)).abs().sum() / dct(z).abs().sum()
    assert torch.allclose(frequency_consistency(z, za), expect)
    assert float(frequency_consistency(z, z)) == 0.0
    with pytest.raises(ValueError, match="shapes"):
        frequency_consistency(z, z[:1])


def test_vaft_training_steps_lower_the_loss(trained_seg3d):
    model = copy.deepcopy(trained_seg3d.model).train()
    task = Segmentation(3, loss="dicece", include_background=True)  # the paper's DiceCE
    x, y = trained_seg3d.x, trained_seg3d.y
    strategy = VAFT(box=(0.0, 1.0), attack_kwargs={"block": 8, "steps": 3})
    assert isinstance(strategy, TrainingStrategy)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(4):
        loss = strategy.loss(model, x, y, task, gen)
        assert loss.ndim == 0 and model.training  # train mode on exit, as the loop requires
        assert set(strategy.last_terms) == {"clean", "adv", "freq"}
        assert float(strategy.last_terms["freq"]) > 0  # the attack changed the logits
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    assert isinstance(strategy.attack, VAFA)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_vaft_with_a_custom_attack_and_weights(trained_seg2d):
    model = copy.deepcopy(trained_seg2d.model).train()
    task = trained_seg2d.task
    attack = VAFA2D(task, Box(0.0, 1.0), block=8, steps=2)
    only_clean = VAFT(attack, adv_weight=0.0, freq_weight=0.0)
    x, y = trained_seg2d.x[:2], trained_seg2d.y[:2]
    loss = only_clean.loss(model, x, y, task, torch.Generator())
    torch.testing.assert_close(loss, task.loss(model(x), y).mean())
    assert only_clean.attack is attack


def test_vaft_bad_input(trained_seg3d):
    with pytest.raises(ValueError, match="freq_weight"):
        VAFT(box=(0.0, 1.0), freq_weight=-1)
    with pytest.raises(TypeError, match="Segmentation"):
        VAFT(box=(0.0, 1.0)).loss(trained_seg3d.model, trained_seg3d.x, trained_seg3d.y, MultiClass(), torch.Generator())


def test_vaft_declared_params_and_early_attack_kwargs_checks():
    s = VAFT(box=(0.0, 1.0), adv_weight=0.5, attack_kwargs={"block": 8})
    params = s.get_params()
    assert params["box"] == Box(0.0, 1.0) and params["adv_weight"] == 0.5 and params["attack"] is None
    with pytest.raises(ValueError, match="clean_weight"):
        VAFT(box=(0.0, 1.0), clean_weight="1")
    with pytest.raises(ValueError, match="did you mean 'steps'"):
        VAFT(box=(0.0, 1.0), attack_kwargs={"stepz": 3})  # misspelt: fails when built, not at batch 1
    with pytest.raises(ValueError, match="`box` .* is required"):
        VAFT()
    with pytest.warns(FutureWarning, match="q_step"):
        VAFT(box=Box(0.0, 1.0), attack_kwargs={"q_step": 2.0})


def test_bounds_is_a_deprecated_alias_of_box():
    with pytest.warns(FutureWarning, match="`bounds` of VAFT is deprecated; use `box`"):
        s = VAFT(bounds=(0.0, 1.0))
    assert s.box is not None and s.get_params()["box"].bounds == (0.0, 1.0)
