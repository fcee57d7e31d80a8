"""ASR (Malik et al. 2024): both definitions, the paper's table arithmetic, Dice/HD95 per case."""

from __future__ import annotations

import math

import pytest
import torch

from medadv.attacks.pgd import PGD
from medadv.metrics.attack_success import attack_success_rate, segmentation_asr
from medadv.tasks import Segmentation
from medadv.threats import Linf


def test_signed_mean_difference_reproduces_the_tables():
    # BTCV, UNet -> SegResNet, FGSM-8 (Table 10 -> Table 2): 80.84 - 77.98 = 2.86
    asr = attack_success_rate(torch.tensor([80.84]), torch.tensor([77.98]))
    assert math.isclose(float(asr), 2.86, abs_tol=1e-5)
    # HD95 grows under attack: ASR-H = adv - clean, and may be negative (GN rows of the paper)
    assert math.isclose(float(attack_success_rate(torch.tensor([10.0]), torch.tensor([9.37]),
                                                  higher_is_better=False)), -0.63, abs_tol=1e-5)


def test_the_two_definitions_differ_as_documented():
    clean = torch.tensor([80.0, 60.0, float("nan")])
    adv = torch.tensor([70.0, 65.0, 10.0])
    assert math.isclose(float(attack_success_rate(clean, adv)), 70.0 - (70 + 65 + 10) / 3, abs_tol=1e-9)
    assert math.isclose(float(attack_success_rate(clean, adv, mode="per_case_abs")), 7.5, abs_tol=1e-9)
    with pytest.raises(ValueError, match="mode"):
        attack_success_rate(clean, adv, mode="relative")
    with pytest.raises(ValueError, match="same shape"):
        attack_success_rate(clean, adv[:2])


def test_segmentation_asr_hand_made_case():
    task = Segmentation(3, include_background=False)
    y = torch.zeros(1, 8, 8, 8, dtype=torch.long)
    y[:, 2:5, 2:5, 2:5] = 1
    y[:, 5:7, 5:7, 5:7] = 2
    clean = torch.nn.functional.one_hot(y, 3).movedim(-1, 1).float() * 10
    adv_pred = y.clone()
    adv_pred[y == 2] = 0  # the attack erases class 2
    adv = torch.nn.functional.one_hot(adv_pred, 3).movedim(-1, 1).float() * 10
    out = segmentation_asr(task, clean, adv, y)
    assert math.isclose(float(out["dice_clean"][0]), 100.0, abs_tol=1e-4)
    assert math.isclose(float(out["dice_adv"][0]), 50.0, abs_tol=1e-4)  # class 1 perfect, class 2 zero
    assert math.isclose(float(out["asr_d"]), 50.0, abs_tol=1e-4)
    # an erased class gets the volume diagonal, not NaN: ASR-H sees the damage
    diag = math.sqrt(3 * 7**2)
    assert math.isclose(float(out["hd95_adv"][0]), diag / 2, rel_tol=1e-5)
    assert float(out["asr_h"]) > 0
    with_bg = segmentation_asr(task, clean, adv, y, include_background=True, percent=False)
    assert with_bg["dice_adv"][0] < 1


def test_segmentation_asr_of_a_real_attack(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    res = PGD(task, Linf(8 / 255, bounds=(0, 1)), steps=5)(m, x, y)
    with torch.no_grad():
        clean = m(x)
    out = segmentation_asr(task, clean, res.logits, y, spacing=(1.5, 1.5, 2.0))
    assert float(out["asr_d"]) > 0
    for k in ("dice_clean", "dice_adv", "hd95_clean", "hd95_adv"):
        assert out[k].shape == (x.shape[0],) and torch.isfinite(out[k]).all()


def test_segmentation_asr_ignores_ignore_index_voxels():
    from medadv.metrics.attack_success import segmentation_asr
    from medadv.tasks import Segmentation

    torch.manual_seed(0)
    y = torch.randint(0, 3, (2, 16, 16))
    z = torch.randn(2, 3, 16, 16)
    y_ign = y.clone()
    y_ign[:, :2] = 255
    z_other = z.clone()
    z_other[:, :, :2] = torch.randn(2, 3, 2, 16)  # predictions inside the ignored rows must not matter
    a = segmentation_asr(Segmentation(3, ignore_index=255), z, z, y_ign)
    b = segmentation_asr(Segmentation(3, ignore_index=255), z_other, z_other, y_ign)
    torch.testing.assert_close(a["dice_clean"], b["dice_clean"])
    assert torch.isfinite(a["dice_clean"]).all()
