"""Whole-volume attacks: through MONAI sliding windows (gradients flow) and tile by tile."""

from __future__ import annotations

import pytest
import torch

from medadv.attacks.dag import DAG, dag_target_a
from medadv.attacks.pgd import PGD
from medadv.attacks.tilewise import TileDetails, attack_tilewise
from medadv.attacks.vafa import VAFA
from medadv.data.synthetic import segmentation_blobs
from medadv.models.sliding import SlidingWindow, TileWise, tile_slices
from medadv.threats import L2, Box, Linf

UNIT = Box(0.0, 1.0)


@pytest.fixture(scope="module")
def big(trained_seg3d):
    x, y = segmentation_blobs(n=2, num_classes=3, size=24, ndim=3, seed=5)
    return trained_seg3d.model, trained_seg3d.task, x, y


def test_tile_order_and_border_shift():
    sl = tile_slices((20, 16), (8, 8))
    assert [(s[0].start, s[1].start) for s in sl] == [(0, 0), (0, 8), (8, 0), (8, 8), (12, 0), (12, 8)]
    with pytest.raises(ValueError, match="smaller"):
        tile_slices((4, 16), (8, 8))


def test_sliding_window_matches_model_and_tiles_and_is_differentiable(trained_seg3d):
    m = trained_seg3d.model
    x = trained_seg3d.x[:1]
    with torch.no_grad():
        direct = m(x)
        assert torch.allclose(SlidingWindow(m, 16, overlap=0.0, mode="constant")(x), direct, atol=1e-5)
    vol = torch.rand(1, 1, 32, 32, 16, generator=torch.Generator().manual_seed(0))
    sw, tw = SlidingWindow(m, 16, overlap=0.0, mode="constant"), TileWise(m, 16)
    grads = []
    for net in (sw, tw):
        v = vol.clone().requires_grad_(True)
        out = net(v)
        assert out.shape == (1, 3, 32, 32, 16) and type(out) is torch.Tensor
        (g,) = torch.autograd.grad(out[:, 1].sum(), v)
        grads.append(g)
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)
    # overlapping Gaussian windows: still differentiable end to end
    v = vol.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(SlidingWindow(m, 16, overlap=0.5)(v)[:, 2].sum(), v)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_pgd_through_sliding_window_lowers_dice(big):
    m, task, x, y = big
    sw = SlidingWindow(m, 16, overlap=0.5, sw_batch_size=8)
    flags = [p.requires_grad for p in m.parameters()]
    eps = 8 / 255
    res = PGD(task, Linf(eps, bounds=(0, 1)), steps=5)(sw, x, y)
    assert (res.linf <= eps + 1e-6).all() and res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    with torch.no_grad():
        clean = task.mean_dice(sw(x).argmax(1), y)
    adv = task.mean_dice(res.logits.argmax(1), y)
    assert float((clean - adv).mean()) > 0.05
    assert [p.requires_grad for p in m.parameters()] == flags  # the wrapped model's state is restored


def test_attack_tilewise_pgd_dag_and_vafa(big):
    m, task, x, y = big
    eps = 8 / 255
    res = attack_tilewise(PGD(task, Linf(eps, bounds=(0, 1)), steps=5), m, x, y, roi_size=16, tiles_per_batch=4)
    assert res.x_adv.shape == x.shape and (res.linf <= eps + 1e-6).all()
    with torch.no_grad():
        clean = task.mean_dice(TileWise(m, 16)(x).argmax(1), y)
    assert float((clean - task.mean_dice(res.logits.argmax(1), y)).mean()) > 0.05
    # DAG with a per-voxel mask cut like the labels
    ya, mask = dag_target_a(y)
    r_dag = attack_tilewise(DAG(task, UNIT, step_size=0.01, steps=60), m, x, ya, roi_size=16, tiles_per_batch=8,
                            tile_kwargs={"target_mask": mask})
    assert len(r_dag.extras["tiles"]) == 1 and len(r_dag.details.tiles) == 1
    assert isinstance(r_dag.details, TileDetails) and type(r_dag.details).__module__ == "medadv.attacks.tilewise"
    assert r_dag.details.tiles[0].fooled_fraction.shape == (8 * 2,)  # the tile batch's own typed details
    with torch.no_grad():
        clean_hit = ((TileWise(m, 16)(x).argmax(1) == 0) & mask).sum() / mask.sum()
    hit = ((r_dag.logits.argmax(1) == 0) & mask).sum() / mask.sum()
    assert float(hit) >= float(clean_hit) + 0.2
    # VAFA tiles: each tile batch keeps its own quantisation tables
    r_vafa = attack_tilewise(VAFA(task, UNIT, block=8, steps=3), m, x, y, roi_size=16, tiles_per_batch=4)
    assert len(r_vafa.extras["tiles"]) == 2
    assert r_vafa.extras["tiles"][0]["q_tables"].shape == (4 * 2, 1, 8, 8, 8, 8)


def test_attack_tilewise_l2_budget_holds_for_the_whole_volume(big):
    # regression: each tile used to get the whole L2 budget (whole-volume ‖δ‖₂ reached 1.9 ε on 8 tiles)
    m, task, x, y = big
    eps = 0.5
    attack = PGD(task, L2(eps, bounds=(0, 1)), steps=5)
    res = attack_tilewise(attack, m, x, y, roi_size=16, tiles_per_batch=4)
    l2 = (res.x_adv - x).flatten(1).norm(dim=1)
    assert (l2 <= eps * (1 + 1e-5)).all() and torch.allclose(res.l2, l2)
    # the shared budget is used (each tile gets ε/√8 here; overlapping tiles overwrite part of it)
    assert (l2 >= 0.2 * eps).all()
    assert attack.threat.eps == eps  # the caller's attack is not changed
    # L∞: every tile keeps the whole ε, which is the whole volume's L∞ budget
    r_inf = attack_tilewise(PGD(task, Linf(4 / 255, bounds=(0, 1)), steps=3), m, x, y, roi_size=16, tiles_per_batch=8)
    assert (r_inf.linf <= 4 / 255 + 1e-6).all() and (r_inf.linf >= 4 / 255 - 1e-6).all()


def test_tilewise_pads_small_volumes(trained_seg3d):
    m, task = trained_seg3d.model, trained_seg3d.task
    x, y = trained_seg3d.x[:1, :, :12], trained_seg3d.y[:1, :12]  # depth 12 < ROI 16
    res = attack_tilewise(PGD(task, Linf(4 / 255, bounds=(0, 1)), steps=2), m, x, y, roi_size=16)
    assert res.x_adv.shape == x.shape and res.logits.shape == (1, 3, 12, 16, 16)


def test_bad_input(trained_seg3d):
    m = trained_seg3d.model
    with pytest.raises(ValueError, match="overlap"):
        SlidingWindow(m, 16, overlap=1.0)
    with pytest.raises(ValueError, match="mode"):
        SlidingWindow(m, 16, mode="mean")
    with pytest.raises(TypeError, match="Attack"):
        attack_tilewise(object(), m, trained_seg3d.x, roi_size=16)
    with pytest.raises(ValueError, match="roi_size"):
        TileWise(m, (16, 16))(trained_seg3d.x)


def test_attack_tilewise_lives_with_the_attacks():
    """The models import no attack (tests/test_layout.py): the tile-wise attack moved to medadv.attacks.tilewise and
    medadv.models no longer offers it (an alias would bring the models -> attacks import back)."""
    import medadv.models
    import medadv.models.sliding

    assert not hasattr(medadv.models, "attack_tilewise") and "attack_tilewise" not in medadv.models.__all__
    assert not hasattr(medadv.models.sliding, "attack_tilewise")
