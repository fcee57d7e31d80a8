"""JSMA (Papernot et al., EuroS&P 2016): pairwise mode against torchattacks, the single-feature mode, units.

torchattacks' ``JSMA`` is the pairwise attack on logits, one image at a time, θ in data units on [0, 1] data. medadv's
``pairs=True`` is the same algorithm batched; the conventions that differ, and how the test neutralises them:

* torchattacks' initial search domain is ``x < 0.99`` (θ > 0), medadv's is ``x < hi`` (features that can still move):
  the blob images stay below 0.83, so both domains are every feature;
* when no pair is admissible torchattacks' ``argmax`` of an all-zero map still picks the pair (0, 0) and keeps
  changing feature 0, medadv stops the sample; asserted: the same success mask, and the changed-feature counts equal
  on every sample torchattacks fooled (where the degenerate case cannot have happened before success);
* θ is a fraction of the box's range in medadv; on [0, 1] that is torchattacks' data unit.
"""

from __future__ import annotations

import math

import pytest
import torch

from medadv.attacks.base import get_attack
from medadv.attacks.jsma import JSMA, PAIR_LIMIT, JSMADetails
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, MultiLabel
from medadv.threats import Box, Linf

UNIT = Box(0.0, 1.0)


def _changed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a != b).flatten(1).sum(1)


def test_pairwise_matches_torchattacks_jsma(trained_multiclass):
    torchattacks = pytest.importorskip("torchattacks")
    t = trained_multiclass
    x = t.x[:12]
    assert float(x.max()) < 0.99
    with torch.no_grad():
        target = (t.model(x).argmax(1) + 1) % 4
    ours = JSMA(t.task, UNIT, theta=1.0, gamma=0.03, pairs=True, targeted=True)(t.model, x, target)
    atk = torchattacks.JSMA(t.model, theta=1.0, gamma=0.03)
    atk.set_mode_targeted_by_label(quiet=True)
    ref = atk(x, target)
    with torch.no_grad():
        ref_fooled = t.model(ref).argmax(1) == target
    assert torch.equal(ours.fooled, ref_fooled)
    assert 0 < int(ours.fooled.sum()) < 12, "a comparison needs successes and failures"
    n_ours, n_ref = _changed(ours.x_adv, x), _changed(ref, x)
    assert torch.equal(n_ours[ref_fooled], n_ref[ref_fooled])
    assert torch.equal(ours.x_adv[ref_fooled], ref[ref_fooled])  # the very same pairs, in the same order
    # here no sample ran out of admissible pairs, so the failures agree too (measured: identical x_adv)
    assert torch.equal(ours.x_adv, ref)
    # never more than the budget: ceil(gamma * features / 2) iterations of two features
    budget = 2 * math.ceil(0.03 * x[0].numel() / 2)
    assert (n_ours <= budget).all()
    assert (ours.details.iterations <= budget // 2).all()


def test_single_feature_mode_targeted_and_untargeted(trained_multiclass):
    t = trained_multiclass
    x, y = t.x[:16], t.y[:16]
    d = x[0].numel()
    with torch.no_grad():
        clean = t.model(x)
    target = (clean.argmax(1) + 2) % 4
    res = JSMA(t.task, UNIT, theta=1.0, gamma=0.1, targeted=True)(t.model, x, target)
    assert isinstance(res.details, JSMADetails)
    n = _changed(res.x_adv, x)
    assert (n <= math.ceil(0.1 * d)).all() and torch.equal(n, res.details.iterations)
    torch.testing.assert_close(res.details.changed_fraction, n.float() / d)
    moved = res.x_adv != x
    assert (res.x_adv[moved] == 1.0).all()  # θ = 1 of the range: a chosen feature goes to the top of the box
    assert float(res.fooled.float().mean()) >= 0.5
    # control: with a budget of one feature the same attack reaches far fewer targets
    tiny = JSMA(t.task, UNIT, theta=1.0, gamma=1 / d, targeted=True)(t.model, x, target)
    assert int(tiny.fooled.sum()) < int(res.fooled.sum())
    # untargeted: pushes to the clean runner-up, stops at any misclassification
    un = JSMA(t.task, UNIT, theta=1.0, gamma=0.1)(t.model, x, y)
    assert torch.equal(un.details.target, clean.scatter(1, y.unsqueeze(1), float("-inf")).argmax(1))
    assert float(un.fooled.float().mean()) >= 0.5
    assert torch.equal(un.fooled, un.logits.argmax(1) != y)


def test_negative_theta_decreases_features(trained_multiclass):
    t = trained_multiclass
    x = t.x[:8]
    res = JSMA(t.task, UNIT, theta=-0.5, gamma=0.05)(t.model, x)
    moved = res.x_adv != x
    assert moved.any()
    expect = (x - 0.5).clamp_min(0.0)
    assert torch.equal(res.x_adv[moved], expect[moved])


def test_theta_is_a_fraction_of_the_box_range(trained_multiclass):
    """The same attack on the same data in Hounsfield units (box [-1024, 3071], the model reading HU) changes the
    same features by the same fraction of the range: θ is in units of the box, not of the data."""
    t = trained_multiclass
    x, y = t.x[:8], t.y[:8]
    lo, width = -1024.0, 4095.0

    class HU(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, v):
            return self.net((v - lo) / width)

    unit = JSMA(t.task, UNIT, theta=0.5, gamma=0.05)(t.model, x, y)
    hu = JSMA(t.task, Box(lo, lo + width), theta=0.5, gamma=0.05)(HU(t.model), lo + width * x, y)
    assert torch.equal(hu.x_adv != lo + width * x, unit.x_adv != x)
    torch.testing.assert_close((hu.x_adv - lo) / width, unit.x_adv, atol=1e-5, rtol=0)
    assert torch.equal(hu.fooled, unit.fooled)


def test_refusals():
    with pytest.raises(TypeError, match="apgd"):
        JSMA(MultiLabel(), UNIT)
    with pytest.raises(InvalidParameterError, match="bounded"):
        JSMA(MultiClass(), Box.unbounded())
    with pytest.raises(InvalidParameterError, match="theta"):
        JSMA(MultiClass(), UNIT, theta=0.0)
    with pytest.raises(InvalidParameterError, match="theta"):
        get_attack("jsma", MultiClass(), UNIT, theta=2.0)
    with pytest.raises(TypeError, match="not an Lp-ball attack"):
        JSMA(MultiClass(), Linf(0.1, bounds=(0, 1)))
    side = int(math.isqrt(PAIR_LIMIT)) + 1
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(side * side, 3))
    x = torch.rand(2, 1, side, side)
    with pytest.raises(ValueError, match="pairs=False"):
        JSMA(MultiClass(), UNIT, pairs=True)(model, x)
    assert JSMA(MultiClass(), UNIT, gamma=2 / x[0].numel())(model, x).x_adv.shape == x.shape  # single mode runs


def test_no_host_sync_in_the_loop(trained_multiclass, forbid_host_sync):
    t = trained_multiclass
    atk = JSMA(t.task, UNIT, gamma=10 / t.x[0].numel(), pairs=True)
    x, y = t.x[:4], t.y[:4]
    with torch.no_grad():
        logits = t.model(x)
    monkeypatch = forbid_host_sync()
    try:
        x_adv, details, _ = atk.perturb(t.model, x, y, logits)
    finally:
        monkeypatch.undo()
    assert (details.iterations <= 5).all() and x_adv.shape == x.shape
