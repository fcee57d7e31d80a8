"""VAFA / VAFA2D: lower Dice on trained models, respect the q bounds, any size, channels, no state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv.attacks.base import get_attack
from medadv.attacks.vafa import (
    VAFA,
    VAFA2D,
    VAFADetails,
    soft_quantize,
    soft_round,
    ssim_reference,
    ssim_to_reference,
)
from medadv.dct import pad_to_multiple, to_blocks
from medadv.metrics.image import ssim
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, Segmentation
from medadv.threats import Box, Linf

UNIT = Box(0.0, 1.0)


def _dice(task, model, x, y):
    with torch.no_grad():
        return task.mean_dice(model(x).argmax(1), y)


def test_soft_round_limits_and_continuity():
    z = torch.linspace(-3.2, 3.2, 101, dtype=torch.float64)
    off_half = (z - z.floor() - 0.5).abs() > 0.2
    assert torch.allclose(soft_round(z, 1e-20)[off_half], z.round()[off_half], atol=1e-6)
    ints = torch.tensor([-2.0, 0.0, 3.0], dtype=torch.float64)
    for a in (0.1, 0.005):
        left, right = soft_round(ints - 1e-9, a), soft_round(ints + 1e-9, a)
        assert torch.allclose(left, right, atol=1e-6)  # continuous across integers
    z.requires_grad_(True)
    (g,) = torch.autograd.grad(soft_round(z, 0.05).sum(), z)
    assert torch.isfinite(g).all()
    with pytest.raises(ValueError, match="alpha"):
        soft_round(z, 0.0)


def test_soft_quantize_gradient_matches_autograd():
    g = torch.Generator().manual_seed(0)
    c = torch.randn(64, generator=g, dtype=torch.float64) * 100
    q = (torch.rand(64, generator=g, dtype=torch.float64) * 20 + 5).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: soft_quantize(t, c, 0.05), (q,))
    (g1,) = torch.autograd.grad((q * soft_round(c / q, 0.05)).sum(), q)
    (g2,) = torch.autograd.grad(soft_quantize(q, c, 0.05).sum(), q)
    assert torch.allclose(g1, g2)


def test_vafa_lowers_dice_and_respects_q_bounds(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    x_before = x.clone()
    attack = VAFA(task, UNIT, block=8, steps=10, q_min=5, q_max=20)
    res = attack(m, x, y)
    assert torch.equal(x, x_before)
    q = res.extras["q_tables"]
    assert q.shape == (x.shape[0], 1, 8, 8, 8, 8)  # (N, C, blocks of 16^3 / 8^3, 8, 8, 8)
    assert q.min() >= 5 and q.max() <= 20 and q.min() < 20  # moved, inside [q_min, q_max]
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    clean, adv = _dice(task, m, x, y), _dice(task, m, res.x_adv, y)
    assert float((clean - adv).mean()) >= 0.05
    assert res.trace["loss"].shape == (10, x.shape[0])
    # deterministic, and nothing carried over between calls
    again = attack(m, x, y)
    assert torch.equal(again.x_adv, res.x_adv) and torch.equal(again.extras["q_tables"], q)


@pytest.fixture(scope="module")
def mni152_unet():
    """MONAI UNet trained on real MNI152 T1 tissue patches (left hemisphere), tested on the right one."""
    from medadv.data.mni152 import tissue_patches
    from medadv.models import fit_supervised, small_unet

    x_tr, y_tr = tissue_patches(48, size=16, spacing_mm=2, split="train", seed=0)
    x_te, y_te = tissue_patches(4, size=16, spacing_mm=2, split="test", seed=1)
    torch.manual_seed(0)
    model = small_unet(1, 4, ndim=3, channels=(8, 16))
    task = Segmentation(4)
    fit_supervised(model, task, x_tr, y_tr, epochs=15, lr=1e-2, batch_size=16)
    return model.eval(), task, x_te, y_te


def test_vafa_on_real_brain_mri(mni152_unet):
    m, task, x, y = mni152_unet
    clean = _dice(task, m, x, y)
    assert float(clean.mean()) > 0.5  # the model does segment grey and white matter
    res = VAFA(task, UNIT, block=8, steps=20, q_max=30)(m, x, y)
    assert float((clean - _dice(task, m, res.x_adv, y)).mean()) >= 0.03
    assert res.extras["q_tables"].min() >= 5 and res.extras["q_tables"].max() <= 30


def test_vafa_without_renormalisation_is_bounded_by_q(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    q_max = 40.0
    res = VAFA(task, UNIT, block=8, steps=10, q_max=q_max, use_ssim=False, renormalize="none")(m, x, y)
    err = to_blocks(255 * (res.x_adv - x), (8, 8, 8))  # grey levels, per block
    rms = err.pow(2).mean(dim=(-3, -2, -1)).sqrt()
    assert float(rms.max()) <= q_max / 2 + 1e-3  # orthonormal DCT: rounding error <= q/2 per coefficient
    assert float(rms.max()) > 0
    assert float((_dice(task, m, x, y) - _dice(task, m, res.x_adv, y)).mean()) > 0


def test_vafa_any_size_multichannel_and_constant_slice():
    torch.manual_seed(0)
    model = nn.Conv3d(2, 3, 3, padding=1)
    task = Segmentation(3)
    x = torch.rand(2, 2, 10, 12, 9)
    x[..., 4] = 0.5  # a constant axial slice: renormalisation must not divide by zero
    y = torch.randint(0, 3, (2, 10, 12, 9))
    res = VAFA(task, UNIT, block=4, steps=3)(model, x, y)
    assert res.x_adv.shape == x.shape and torch.isfinite(res.x_adv).all()
    assert res.extras["q_tables"].shape == (2, 2, 3 * 3 * 3, 4, 4, 4)
    # custom bounds in data units (e.g. a CT window in HU) map onto grey levels and back
    hu = x * 425 - 175
    res_hu = VAFA(task, Box(-175.0, 250.0), block=4, steps=3, use_ssim=False)(
        nn.Sequential(nn.Identity(), _Scale(model)), hu, y)
    assert res_hu.x_adv.min() >= -175 and res_hu.x_adv.max() <= 250


class _Scale(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner((x + 175) / 425)


def test_vafa2d_images_and_volume_slices(trained_seg2d, trained_seg3d):
    m, task, x, y = trained_seg2d.model, trained_seg2d.task, trained_seg2d.x, trained_seg2d.y
    res = VAFA2D(task, UNIT, block=8, steps=10, q_max=40)(m, x, y)
    assert res.extras["q_tables"].shape == (x.shape[0], 2, 16, 8, 8)
    q = res.extras["q_tables"]
    assert q.min() >= 5 and q.max() <= 40
    adv = _dice(task, m, res.x_adv, y).mean()
    assert float(_dice(task, m, x, y).mean() - adv) >= 0.02
    # the optimisation of q matters: better than the initial compression at q = q_max (one step)
    once = VAFA2D(task, UNIT, block=8, steps=1, q_max=40)(m, x, y)
    assert float(adv) < float(_dice(task, m, once.x_adv, y).mean())
    m3, t3, x3, y3 = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    r3 = VAFA2D(t3, UNIT, block=8, steps=2)(m3, x3, y3)
    assert r3.extras["q_tables"].shape == (x3.shape[0], 1, 16, 4, 8, 8)  # (N, C, D slices, blocks, 8, 8)


def test_ssim_term_uses_every_channel():
    attack = VAFA(Segmentation(2), UNIT, block=4)
    u = torch.rand(1, 2, 8, 8, 8)
    v = u.clone()
    v[:, 1] = torch.rand(1, 8, 8, 8)  # only channel 1 differs
    assert float(attack._ssim_term(attack._ssim_reference(u), v)) > 0.1
    assert float(attack._ssim_term(attack._ssim_reference(u), u)) < 1e-6
    blocks = to_blocks(pad_to_multiple(u.reshape(2, 1, 8, 8, 8), (4, 4, 4)), (4, 4, 4))
    assert blocks.shape == (2, 1, 8, 4, 4, 4)


def test_vafa_bad_input(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x, trained_seg3d.y
    with pytest.raises(TypeError, match="Segmentation"):
        VAFA(MultiClass(), UNIT)
    with pytest.raises(ValueError, match="bounds"):
        VAFA(task, Box.unbounded())
    with pytest.raises(ValueError, match="q_min"):
        VAFA(task, UNIT, q_min=30, q_max=20)
    with pytest.raises(ValueError, match="renormalize"):
        VAFA(task, UNIT, renormalize="percentile")
    with pytest.raises(ValueError, match="ssim_window"):
        VAFA(task, UNIT, block=2)
    with pytest.raises(ValueError, match="bounds"):
        VAFA(task, UNIT, block=8)(m, x * 3, y)
    with pytest.raises(ValueError, match="3-D inputs"):
        VAFA(task, UNIT, block=8)(nn.Conv2d(1, 3, 1), x[:, :, 0], y[:, 0])


def test_vafa_declared_params_aliases_and_fingerprint():
    task = Segmentation(3)
    with pytest.raises(InvalidParameterError, match="steps"):
        VAFA(task, UNIT, steps=2.5)
    with pytest.raises(InvalidParameterError, match="block"):
        VAFA(task, UNIT, block=(8, 8))  # VAFA's blocks are 3-D
    with pytest.warns(FutureWarning, match="q_step"):
        assert VAFA(task, UNIT, q_step=2.0).step_size == 2.0
    with pytest.warns(FutureWarning, match="bounds"):
        assert VAFA(task, bounds=(0.0, 1.0)).box == UNIT
    with pytest.raises(TypeError, match="Box"):
        VAFA(task, Linf(0.1, bounds=(0, 1)))  # not an Lp-ball attack
    VAFA.check_declarations()
    VAFA2D.check_declarations()
    a8, a32 = VAFA(task, UNIT, block=8), VAFA(task, UNIT, block=32)
    assert a8.get_params()["block"] == (8, 8, 8)
    assert a8.fingerprint() != a32.fingerprint()
    assert a8.fingerprint() != VAFA(task, Box(0.0, 2.0), block=8).fingerprint()
    assert a8.set_params(steps=3).fingerprint() == VAFA(task, UNIT, block=8, steps=3).fingerprint()


def test_vafa_from_the_registry_with_defaults(trained_seg3d, trained_seg2d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x[:1], trained_seg3d.y[:1]
    for name, cls in (("vafa", VAFA), ("vafa2d", VAFA2D)):
        atk = get_attack(name, task, UNIT)
        assert type(atk) is cls and atk.block == (32,) * cls.block_ndim
    with pytest.warns(FutureWarning):
        assert get_attack("vafa", task, UNIT, q_step=2).step_size == 2.0
    res = get_attack("vafa", task, UNIT, steps=2)(m, x, y)
    assert res.details.q_tables.shape == (1, 1, 1, 32, 32, 32)  # 16^3 padded to one 32^3 block
    m2, t2, x2, y2 = trained_seg2d.model, trained_seg2d.task, trained_seg2d.x[:1], trained_seg2d.y[:1]
    assert get_attack("vafa2d", t2, UNIT, steps=2)(m2, x2, y2).details.q_tables.shape == (1, 2, 1, 32, 32)


def test_vafa_typed_details_and_trace(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x[:2], trained_seg3d.y[:2]
    res = VAFA(task, UNIT, block=8, steps=4)(m, x, y)
    d = res.details
    assert isinstance(d, VAFADetails) and VAFADetails.columns == ("final_loss",)
    assert d.block == (8, 8, 8) and d.q_tables.shape == (2, 1, 8, 8, 8, 8)
    torch.testing.assert_close(d.final_loss, res.trace["loss"][-1])
    assert set(res.rows()[0]) == {"final_loss"}
    # the last update is never applied: q moved by at most steps - 1 signed unit steps from q_max
    assert float(d.q_tables.min()) >= 20 - 3
    # the final loss is the loss of x_adv (the reconstruction of those tables)
    with torch.no_grad():
        torch.testing.assert_close(task.loss(m(res.x_adv), y), d.final_loss, atol=1e-5, rtol=1e-5)


def test_vafa_step_size_scales_the_table_moves(trained_seg3d):
    m, task, x, y = trained_seg3d.model, trained_seg3d.task, trained_seg3d.x[:1], trained_seg3d.y[:1]
    q1 = VAFA(task, UNIT, block=8, steps=2, use_ssim=False)(m, x, y).details.q_tables
    q2 = VAFA(task, UNIT, block=8, steps=2, use_ssim=False, step_size=3.0)(m, x, y).details.q_tables
    assert set((20 - q1).unique().tolist()) <= {0.0, 1.0} and set((20 - q2).unique().tolist()) <= {0.0, 3.0}
    torch.testing.assert_close(20 - q2, 3 * (20 - q1))


@pytest.mark.parametrize("ndim", [2, 3])
def test_ssim_to_reference_equals_ssim_with_its_own_gradient(ndim):
    g = torch.Generator().manual_seed(0)
    shape = (4, 1) + (6,) * ndim
    a = torch.rand(shape, generator=g, dtype=torch.float64)
    b = (a + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)).clamp(0, 1).requires_grad_(True)
    ref = ssim_reference(a, ndim, 3)
    mine = ssim_to_reference(b, ref, ndim, 3).reshape(4, -1).mean(1)
    theirs = ssim(a, b, data_range=1.0, win_size=3, nonnegative=True)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
    w = torch.rand(4, generator=g, dtype=torch.float64)
    (g1,) = torch.autograd.grad((mine * w).sum(), b)
    (g2,) = torch.autograd.grad((theirs * w).sum(), b)
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: ssim_to_reference(t, ref, ndim, 3), (b,))


def test_vafa_ascends_the_papers_squared_dice_without_changing_the_task(trained_seg3d):
    t = trained_seg3d
    task = Segmentation(t.task.num_classes, loss="dicece", include_background=True)  # squared_pred=False
    x, y = t.x[:2], t.y[:2]
    res = VAFA(task, Box(0.0, 1.0), block=8, steps=2, use_ssim=False)(t.model, x, y)
    assert task.squared_pred is False  # the caller's task is untouched
    squared = Segmentation(t.task.num_classes, loss="dicece", include_background=True, squared_pred=True)
    with torch.no_grad():  # the first step's loss is the clean input's reconstruction at q_max
        first = VAFA(squared, Box(0.0, 1.0), block=8, steps=2, use_ssim=False, squared_pred=False)(t.model, x, y)
    torch.testing.assert_close(res.trace["loss"], first.trace["loss"])
    plain = VAFA(task, Box(0.0, 1.0), block=8, steps=2, use_ssim=False, squared_pred=False)(t.model, x, y)
    assert not torch.allclose(plain.trace["loss"][0], res.trace["loss"][0])
