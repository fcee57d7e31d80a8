"""RandomizedSmoothing: radii, abstention, determinism, parameters, every task path, the caller's state."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from medadv.certify import (
    ABSTAIN,
    CertifyResult,
    RandomizedSmoothing,
    certified_accuracy,
    certified_dice,
)
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, MultiLabel, Segmentation, Task


def ndtri(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


class HalfSpace(nn.Module):
    """Two classes split by the hyperplane x₀ = t (class 0 above): the certified radius of a point at distance R is
    at most R, and tends to R with many samples (Cohen et al.: the bound is tight for linear classifiers)."""

    def __init__(self, t: float = 0.0) -> None:
        super().__init__()
        self.t = nn.Parameter(torch.tensor(float(t)))

    def forward(self, x):
        z = x.flatten(1)[:, :1] - self.t
        return torch.cat([z, -z], dim=1)


class Ball(nn.Module):
    """Class 0 inside the L2 ball of radius ``r`` around the origin, class 1 outside (3 logits: class 2 never)."""

    def __init__(self, r: float) -> None:
        super().__init__()
        self.r = r
        self.lin = nn.Linear(1, 1)  # a parameter, for the state checks

    def forward(self, x):
        inside = (x.flatten(1).norm(dim=1, keepdim=True) <= self.r).float()
        return torch.cat([inside, 1 - inside, torch.full_like(inside, -1.0)], dim=1)


def test_a_model_constant_in_a_ball_certifies_the_closed_form_radius_inside_the_ball():
    # σ = 0.25 in 4 dims: a draw leaves the ball of radius 3 with probability ~ e^-70, so every count is n and
    # the radius is exactly σ Φ⁻¹(α^{1/n}); it is inside the ball (sound) and covers a ball of radius 0.6
    x = torch.zeros(3, 1, 4)
    res = RandomizedSmoothing(MultiClass(), 0.25, n0=50, n=2000, alpha=0.001, batch_size=1024).certify(Ball(3.0), x)
    expected = 0.25 * ndtri(0.001 ** (1 / 2000))
    assert (res.prediction == 0).all() and not res.abstain.any() and (res.count == 2000).all()
    assert torch.allclose(res.radius, torch.full((3,), expected), atol=1e-5)
    assert 0.6 <= expected <= 3.0


def test_radius_is_sound_and_close_for_a_linear_boundary():
    # points at distance 1 from the boundary, σ = 0.5: p = Φ(2); radius <= 1 and close to it with n = 10000
    x = torch.zeros(8, 1, 3)
    x[:, 0, 0] = 1.0
    res = RandomizedSmoothing(MultiClass(), 0.5, n0=100, n=10000, alpha=0.001, batch_size=8192).certify(HalfSpace(), x)
    assert (res.prediction == 0).all()
    assert (res.radius <= 1.0).all() and (res.radius >= 0.9).all()
    # and the bound is the Clopper-Pearson one of the observed count
    from medadv.certify import lower_confidence_bound

    assert torch.allclose(res.p_lower.double(), lower_confidence_bound(res.count, 10000, 0.001), atol=1e-6)


def test_tied_classes_abstain():
    x = torch.zeros(6, 1, 2)  # on the boundary: both classes have probability 1/2
    rs = RandomizedSmoothing(MultiClass(), 0.5, n0=50, n=500, alpha=0.01)
    res = rs.certify(HalfSpace(), x)
    assert res.abstain.all() and (res.prediction == ABSTAIN).all() and (res.radius == 0).all()
    assert (res.p_lower < 0.5).all()
    pred = rs.predict(HalfSpace(), x)
    assert pred.abstain.all() and (pred.prediction == ABSTAIN).all()
    # far from the boundary PREDICT answers
    assert not rs.predict(HalfSpace(), x + torch.tensor([3.0, 0.0])).abstain.any()


def test_seeded_runs_are_identical_and_seeds_matter():
    x = torch.zeros(4, 1, 2)
    x[:, 0, 0] = torch.tensor([0.1, 0.3, 0.5, 0.7])
    rs = RandomizedSmoothing(MultiClass(), 0.5, n0=20, n=200, seed=7, batch_size=100)
    a, b = rs.certify(HalfSpace(), x), rs.certify(HalfSpace(), x)
    assert torch.equal(a.count, b.count) and torch.equal(a.radius, b.radius)
    c = rs.set_params(seed=8).certify(HalfSpace(), x)
    assert not torch.equal(a.count, c.count)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(rs.certify(HalfSpace(), x, generator=g1).count, rs.certify(HalfSpace(), x, generator=g2).count)


def test_parameters_are_declared_and_bad_ones_refused_by_name():
    rs = RandomizedSmoothing(MultiClass(), 0.25, n0=10.0, n=100)
    assert rs.n0 == 10 and isinstance(rs.n0, int)
    assert rs.get_params() == {"sigma": 0.25, "n0": 10, "n": 100, "alpha": 0.001, "batch_size": 256,
                               "correction": "bonferroni", "tau": None, "seed": 0, "bounds": None,
                               "allow_large_budgets": False}
    assert rs.fingerprint() == RandomizedSmoothing(MultiClass(), 0.25, n0=10, n=100).fingerprint()
    assert rs.fingerprint() != rs.set_params(sigma=0.5).fingerprint()
    assert rs.fingerprint() != RandomizedSmoothing(MultiLabel(), 0.25, n0=10, n=100).fingerprint()
    RandomizedSmoothing.check_declarations()
    for kw, name in (({"sigma": 0.0}, "sigma"), ({"sigma": -1.0}, "sigma"), ({"n0": 0}, "n0"), ({"n": 2.5}, "n"),
                     ({"alpha": 1.0}, "alpha"), ({"alpha": 0}, "alpha"), ({"batch_size": 0}, "batch_size"),
                     ({"tau": 0.5}, "tau"), ({"tau": 1.0}, "tau"), ({"seed": "x"}, "seed")):
        args = {"sigma": 0.25, **kw}
        with pytest.raises(InvalidParameterError, match=f"`{name}` of RandomizedSmoothing"):
            RandomizedSmoothing(MultiClass(), **args)
    with pytest.raises(InvalidParameterError, match="`correction`.*did you mean 'holm'"):
        RandomizedSmoothing(MultiClass(), 0.25, correction="hlom")
    with pytest.raises(InvalidParameterError, match="`tau` of RandomizedSmoothing must be given with correction='holm'"):
        RandomizedSmoothing(MultiClass(), 0.25, correction="holm")


def test_unsupported_task_kinds_are_refused_naming_the_supported_ones():
    class Regression(Task):  # a user task: not one of the three kinds
        name = "regression"

    Regression.__abstractmethods__ = frozenset()  # a concrete user task (the methods are not needed here)
    with pytest.raises(InvalidParameterError, match="multiclass, multilabel, segmentation"):
        RandomizedSmoothing(Regression(), 0.25)
    with pytest.raises(InvalidParameterError, match="`task` of RandomizedSmoothing"):
        RandomizedSmoothing("multiclass", 0.25)  # type: ignore[arg-type]


def test_bad_inputs_are_refused():
    rs = RandomizedSmoothing(MultiClass(), 0.25, n0=5, n=10)
    with pytest.raises(TypeError, match="`model` must be a torch.nn.Module"):
        rs.certify(lambda t: t, torch.zeros(1, 1, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`x` contains NaN"):
        rs.certify(HalfSpace(), torch.full((1, 1, 2), float("nan")))
    with pytest.raises(ValueError, match="`x` is an empty batch"):
        rs.certify(HalfSpace(), torch.zeros(0, 1, 2))
    with pytest.raises(ValueError, match=r"`y` has labels out of range \[0, 1\]"):
        rs.certify(HalfSpace(), torch.zeros(2, 1, 2), torch.tensor([0, 5]))
    with pytest.raises(TypeError, match="`generator` must be a torch.Generator"):
        rs.certify(HalfSpace(), torch.zeros(2, 1, 2), generator=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model output must be"):  # a multi-class task on segmentation logits
        rs.certify(nn.Conv2d(1, 3, 1), torch.zeros(1, 1, 4, 4))
    with pytest.raises(ValueError, match="`result` of certified_dice must come from a Segmentation"):
        certified_dice(rs.certify(HalfSpace(), torch.zeros(2, 1, 2)), torch.tensor([0, 1]), [0.0])
    with pytest.raises(InvalidParameterError, match="`radii` of certified_accuracy"):
        certified_accuracy(rs.certify(HalfSpace(), torch.zeros(2, 1, 2)), torch.tensor([0, 1]), [-1.0])


def test_caller_tensors_and_model_state_are_untouched():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    model.train()
    model[1].weight.requires_grad_(False)
    model[2].eval()  # a submodule in its own mode
    x = torch.randn(3, 1, 4)
    x_copy, y = x.clone(), torch.tensor([0, 1, 2])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rs = RandomizedSmoothing(MultiClass(), 0.1, n0=10, n=50)
    rs.certify(model, x, y)
    rs.predict(model, x)
    assert torch.equal(x, x_copy) and torch.equal(y, torch.tensor([0, 1, 2]))
    assert model.training and model[1].training and not model[2].training
    assert not model[1].weight.requires_grad and model[3].weight.requires_grad
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert model[3].weight.grad is None
    # eval mode inside: dropout off, so the smoothed votes come from the deterministic network
    seen = []
    model[3].register_forward_pre_hook(lambda m, inp: seen.append(model[2].training or model.training))
    rs.certify(model, x)
    assert seen and not any(seen)


def test_multilabel_certifies_each_label_with_bonferroni_or_holm():
    # label j is present iff x_j > 0; x far from 0 in labels 0-2, on the boundary in label 3
    class Labels(nn.Module):
        def forward(self, x):
            return 10 * x.flatten(1)

    x = torch.tensor([[[2.0, -2.0, 1.5, 0.0]], [[-2.0, 2.0, 2.0, 2.0]]])
    y = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    rs = RandomizedSmoothing(MultiLabel(), 0.5, n0=50, n=1000, alpha=0.01, batch_size=500)
    res = rs.certify(Labels(), x, y)
    assert res.prediction.shape == (2, 4)
    assert res.prediction[0].tolist() == [1, 0, 1, ABSTAIN] and res.prediction[1].tolist() == [0, 1, 1, 1]
    # Bonferroni over 4 labels: the per-label bound is at level alpha / 4, below Cohen's single-label bound
    from medadv.certify import lower_confidence_bound

    assert torch.allclose(res.p_lower.double(), lower_confidence_bound(res.count, 1000, 0.01 / 4), atol=1e-6)
    assert 0 < float(res.radius[1, 0]) <= 2.0  # label 0 of sample 1 is 2 away from its boundary
    assert res.sample_radius[0] == 0 and res.sample_radius[1] == res.radius[1].min()
    cols = res.columns()
    assert cols["cert_correct"].tolist() == [False, True] and cols["cert_label_radius"].shape == (2, 4)
    exact = certified_accuracy(res, y, [0.0, float(res.radius[1].min()), 5.0])
    assert exact.tolist() == [0.5, 0.5, 0.0]
    holm = rs.set_params(correction="holm", tau=0.9).certify(Labels(), x, y)
    assert holm.prediction[0].tolist() == [1, 0, 1, ABSTAIN]
    assert torch.allclose(holm.radius[~holm.abstain], torch.tensor(0.5 * ndtri(0.9)))


def _seg_checks(res: CertifyResult, y: torch.Tensor, task: Segmentation) -> None:
    assert res.prediction.shape == y.shape and res.radius.shape == y.shape
    d = certified_dice(res, y, [0.0, 0.05, 0.1, 10.0], reduction="none")
    assert d.shape == (y.shape[0], 4)
    assert (d[:, :-1].diff(dim=1) <= 1e-6).all()  # non-increasing in the radius
    assert (d[:, -1] <= 1e-6).all() or res.radius.max() >= 10.0
    # at radius 0 with no abstention the certified Dice is the task's mean Dice of the smoothed map
    if not res.abstain.any():
        assert torch.allclose(d[:, 0], task.mean_dice(res.prediction, y))


def test_segmentation_2d_on_a_trained_unet(trained_seg2d):
    t = trained_seg2d
    x, y = t.x[:2], t.y[:2]
    rs = RandomizedSmoothing(t.task, 0.05, n0=8, n=64, alpha=0.01, batch_size=32)
    res = rs.certify(t.model, x, y)
    _seg_checks(res, y, t.task)
    assert 0.0 < float(res.abstain_fraction.mean()) < 1.0
    # SegCertify: Holm with tau over the voxels; every certified voxel at sigma * Phi^-1(tau); Holm certifies at
    # least the voxels Bonferroni certifies with the same tau
    holm = rs.set_params(correction="holm", tau=0.75).certify(t.model, x, y)
    bonf = rs.set_params(tau=0.75).certify(t.model, x, y)
    assert torch.allclose(holm.radius[~holm.abstain], torch.tensor(0.05 * ndtri(0.75)))
    assert not (holm.abstain & ~bonf.abstain).any()
    acc = certified_accuracy(holm, y, [0.0, 0.05 * ndtri(0.75), 0.05])
    assert acc[0] == acc[1] > 0 and acc[2] == 0
    with torch.no_grad():
        clean = (t.task.predict(t.model(x)) == y).float().mean()
    assert float(acc[0]) <= float(clean) + 0.05  # abstentions are errors: certified <= clean (up to noise)


def test_segmentation_3d_through_a_sliding_window(trained_seg3d):
    from medadv.models.sliding import SlidingWindow

    t = trained_seg3d
    x, y = t.x[:1], t.y[:1]
    rs = RandomizedSmoothing(t.task, 0.05, n0=4, n=24, alpha=0.01, batch_size=4, seed=0)
    direct = rs.certify(t.model, x, y)
    _seg_checks(direct, y, t.task)
    window = SlidingWindow(t.model, 16, overlap=0.0, sw_batch_size=4)
    wrapped = rs.certify(window, x, y)  # one window covers the volume: the same votes
    assert torch.equal(direct.count, wrapped.count) and torch.equal(direct.prediction, wrapped.prediction)
    assert set(direct.columns()) == {"cert_radius", "cert_abstain_fraction", "cert_pixel_accuracy", "cert_mean_dice"}


def test_batch_size_bounds_the_forward_size():
    sizes = []
    model = HalfSpace()
    model.register_forward_pre_hook(lambda m, inp: sizes.append(inp[0].shape[0]))
    RandomizedSmoothing(MultiClass(), 0.5, n0=10, n=25, batch_size=7).certify(model, torch.zeros(3, 1, 2))
    assert max(sizes) <= 7 and sum(sizes) == 3 * (10 + 25)


def test_noise_has_the_declared_sigma():
    seen = []

    class Probe(HalfSpace):
        def forward(self, x):
            seen.append(x.clone())
            return super().forward(x)

    x = torch.full((2, 1, 50), 3.0)
    RandomizedSmoothing(MultiClass(), 0.3, n0=10, n=40, batch_size=1000).certify(Probe(), x)
    noise = torch.cat(seen) - 3.0
    assert abs(float(noise.std()) - 0.3) < 0.01 and abs(float(noise.mean())) < 0.01
    assert math.isclose(float(noise.numel()), 2 * 50 * 50)
