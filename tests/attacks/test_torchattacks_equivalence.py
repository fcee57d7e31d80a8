"""medadv's gradient engine reproduces torchattacks on a multi-class model (same ε, α, steps, no random start).

torchattacks uses the batch-mean cross-entropy and medadv the per-sample sum; the scale differs by N but
the sign of the gradient, and hence every L∞ step, is the same.
"""

from __future__ import annotations

import pytest
import torch

torchattacks = pytest.importorskip("torchattacks")

from medadv.attacks.bim import BIM  # noqa: E402
from medadv.attacks.fgsm import FGSM  # noqa: E402
from medadv.attacks.pgd import PGD  # noqa: E402
from medadv.threats import Linf  # noqa: E402


@pytest.mark.parametrize("eps,alpha,steps", [(8 / 255, 2 / 255, 10), (0.1, 0.01, 7), (0.03, 0.03, 1)])
def test_pgd_without_random_start_matches_torchattacks(trained_multiclass, eps, alpha, steps):
    t = trained_multiclass
    ours = PGD(t.task, Linf(eps, bounds=(0, 1)), steps=steps, step_size=alpha, random_start=False)(t.model, t.x, t.y)
    ref = torchattacks.PGD(t.model, eps=eps, alpha=alpha, steps=steps, random_start=False)(t.x, t.y)
    torch.testing.assert_close(ours.x_adv, ref, atol=1e-6, rtol=0)
    assert ours.fooled.any(), "the comparison should include samples the attack actually fools"
    assert (ours.x_adv != t.x).any()


def test_bim_matches_torchattacks(trained_multiclass):
    t = trained_multiclass
    eps, alpha, steps = 0.08, 0.01, 10
    ours = BIM(t.task, Linf(eps, bounds=(0, 1)), steps=steps, step_size=alpha)(t.model, t.x, t.y)
    ref = torchattacks.BIM(t.model, eps=eps, alpha=alpha, steps=steps)(t.x, t.y)
    torch.testing.assert_close(ours.x_adv, ref, atol=1e-6, rtol=0)


def test_fgsm_matches_torchattacks(trained_multiclass):
    t = trained_multiclass
    ours = FGSM(t.task, Linf(0.05, bounds=(0, 1)))(t.model, t.x, t.y)
    ref = torchattacks.FGSM(t.model, eps=0.05)(t.x, t.y)
    torch.testing.assert_close(ours.x_adv, ref, atol=1e-6, rtol=0)


def test_targeted_pgd_matches_torchattacks(trained_multiclass):
    t = trained_multiclass
    target = (t.y + 1) % 4
    ours = PGD(t.task, Linf(0.1, bounds=(0, 1)), steps=10, step_size=0.02, random_start=False, targeted=True)(
        t.model, t.x, target
    )
    atk = torchattacks.PGD(t.model, eps=0.1, alpha=0.02, steps=10, random_start=False)
    atk.set_mode_targeted_by_label(quiet=True)
    ref = atk(t.x, target)
    torch.testing.assert_close(ours.x_adv, ref, atol=1e-6, rtol=0)
    assert ours.fooled.any(), "some targets should be reached"
