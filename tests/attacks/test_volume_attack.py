"""The ``volume`` attack loss (a segmentation's clinical endpoint) in PGD, APGD and ``auto``, on a trained 3-D UNet."""

from __future__ import annotations

import pytest
import torch

from medadv.attacks import APGD, PGD
from medadv.attacks.auto import AutoEvaluation
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, Segmentation
from medadv.threats import Linf

EPS, STEPS, CLS = 0.05, 10, 1


def _volume(trained, x: torch.Tensor, cls: int = CLS) -> torch.Tensor:
    """The predicted (arg-max) voxel count of ``cls`` per sample, ``(N,)``."""
    with torch.no_grad():
        pred = trained.task.predict(trained.model(x))
    return (pred == cls).reshape(x.shape[0], -1).sum(dim=1)


def _sign_noise(x: torch.Tensor, eps: float, seed: int = 0) -> torch.Tensor:
    """Random-sign noise of L∞ size ``eps`` (every element ±eps), clipped to the box [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    return (x + eps * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1).to(x.dtype)).clamp(0.0, 1.0)


def _in_ball_and_box(x: torch.Tensor, x_adv: torch.Tensor, eps: float) -> None:
    assert (x_adv - x).abs().max() <= eps + 1e-6
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0


def test_volume_shrink_moves_the_volume_more_than_ce_pgd_and_noise(trained_seg3d):
    t = trained_seg3d
    x, y = t.x, t.y
    x0 = x.clone()
    threat = Linf(EPS, bounds=(0.0, 1.0))
    clean = _volume(t, x)
    assert bool((clean > 50).all())  # the trained model finds the structure in every case
    ce = PGD(t.task, threat, steps=STEPS)(t.model, x, y).x_adv
    shrink = PGD(t.task, threat, steps=STEPS, loss="volume", volume_class=CLS)(t.model, x, y).x_adv
    noise = _sign_noise(x, EPS)
    for x_adv in (ce, shrink):
        _in_ball_and_box(x, x_adv, EPS)
    d_ce, d_vol, d_noise = ((clean - _volume(t, v)).sum().item() for v in (ce, shrink, noise))
    assert d_vol > 0 and d_vol > 1.5 * d_ce  # the endpoint attack shrinks the volume more than CE at equal ε, T
    assert abs(d_noise) < 0.25 * d_vol  # a random perturbation of the same L∞ size barely moves it
    assert torch.equal(x, x0)  # the caller's input is not modified


def test_volume_grow_increases_the_volume_and_apgd_takes_the_loss(trained_seg3d):
    t = trained_seg3d
    threat = Linf(EPS, bounds=(0.0, 1.0))
    clean = _volume(t, t.x)
    grow = PGD(t.task, threat, steps=STEPS, loss="volume", volume_goal="grow")(t.model, t.x, t.y).x_adv
    _in_ball_and_box(t.x, grow, EPS)
    assert bool((_volume(t, grow) > clean).all())
    apgd = APGD(t.task, threat, steps=STEPS, loss="volume", volume_goal="shrink")(t.model, t.x, t.y).x_adv
    _in_ball_and_box(t.x, apgd, EPS)
    ce = APGD(t.task, threat, steps=STEPS)(t.model, t.x, t.y).x_adv
    assert (clean - _volume(t, apgd)).sum() > 1.5 * (clean - _volume(t, ce)).sum()


def test_volume_target_fraction_reaches_the_target(trained_seg3d):
    t = trained_seg3d
    threat = Linf(EPS, bounds=(0.0, 1.0))
    with torch.no_grad():
        soft = t.task.soft_volume(t.model(t.x))[:, CLS]
    for fraction in (0.7, 1.3):
        atk = APGD(t.task, threat, steps=STEPS, loss="volume", volume_goal="target", volume_fraction=fraction)
        with torch.no_grad():
            got = t.task.soft_volume(t.model(atk(t.model, t.x, t.y).x_adv))[:, CLS]
        assert bool(((got - fraction * soft).abs() < 0.1 * soft).all())  # the soft volume within 10 % of the target
    # a target in ml reads the voxel volume: 2 x 2 x 2 mm voxels (0.008 ml), the target 0.7 x the clean volume
    target = 0.7 * float(soft[0])
    ml = APGD(t.task, threat, steps=STEPS, loss="volume", volume_goal="target", volume_target=target * 0.008,
              voxel_volume_ml=0.008)(t.model, t.x[:1], t.y[:1]).x_adv
    with torch.no_grad():
        assert abs(float(t.task.soft_volume(t.model(ml))[0, CLS]) - target) < 0.1 * float(soft[0])


def test_auto_takes_the_volume_members(trained_seg3d):
    t = trained_seg3d
    threat = Linf(EPS, bounds=(0.0, 1.0))
    auto = AutoEvaluation(t.task, threat, version="custom", attacks=["apgd-volume-shrink"], steps=5, checks=False)
    res = auto(t.model, t.x, t.y)
    _in_ball_and_box(t.x, res.x_adv, EPS)
    assert bool((_volume(t, res.x_adv) < _volume(t, t.x)).all())


def test_bad_volume_settings_are_refused_before_work(trained_seg3d):
    t = trained_seg3d
    threat = Linf(EPS, bounds=(0.0, 1.0))
    with pytest.raises(TypeError, match="soft_volume"):
        APGD(MultiClass(), threat, loss="volume")
    with pytest.raises(TypeError, match="untargeted"):
        PGD(t.task, threat, loss="volume", targeted=True)
    with pytest.raises(InvalidParameterError, match="exactly one of `volume_target`"):
        APGD(t.task, threat, loss="volume", volume_goal="target")
    with pytest.raises(InvalidParameterError, match="volume_goal='target'"):
        PGD(t.task, threat, loss="volume", volume_goal="shrink", volume_target=1.0)
    implied = PGD(t.task, threat, loss="volume", volume_fraction=0.8)  # a target given is the goal
    assert implied._volume is not None and implied._volume.goal == "target"
    with pytest.raises(InvalidParameterError, match="apply to loss='volume'"):
        APGD(t.task, threat, volume_fraction=0.5)
    with pytest.raises(InvalidParameterError, match="`volume_class`"):
        PGD(Segmentation(3), threat, loss="volume", volume_class=3)
    with pytest.raises(InvalidParameterError, match="`volume_goal`"):
        APGD(t.task, threat, loss="volume", volume_goal="smaller")
    with pytest.raises(InvalidParameterError, match="`voxel_volume_ml`"):
        PGD(t.task, threat, loss="volume", voxel_volume_ml=0.0)
    with pytest.raises(ValueError, match="`weight` does not apply to loss='volume'"):
        APGD(t.task, threat, steps=1, loss="volume")(t.model, t.x, t.y, weight=torch.ones_like(t.y, dtype=t.x.dtype))
