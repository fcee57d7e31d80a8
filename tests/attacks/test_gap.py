"""GAP: budget and bounds, learning beats same-norm noise, targeted/universal forms, checkpoints, transfer."""

from __future__ import annotations

import pytest
import torch

import medadv
from medadv.attacks.base import get_attack
from medadv.attacks.gap import GAP, GAPTrainer
from medadv.attacks.pgd import PGD
from medadv.data.synthetic import multiclass_blobs, multilabel_blobs
from medadv.evaluation import evaluate
from medadv.models import fit_supervised, small_cnn
from medadv.models.generators import ResnetGenerator, UnetGenerator
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import L2, Box, Linf


class Trained:
    def __init__(self, model, task, x_train, x, y):
        self.model, self.task, self.x_train, self.x, self.y = model, task, x_train, x, y


def _trained(task, data_fn):
    """A small CNN trained on blobs, seeded before it is built (so the test is order-independent)."""
    x, y = data_fn(n=288, seed=0)
    torch.manual_seed(0)
    model = small_cnn(1, 4, width=8)
    fit_supervised(model, task, x[:256], y[:256], epochs=15, lr=1e-2, batch_size=16)
    return Trained(model.eval(), task, x[:256], x[256:], y[256:])


@pytest.fixture(scope="module")
def ml():
    return _trained(MultiLabel(), multilabel_blobs)


@pytest.fixture(scope="module")
def mc():
    return _trained(MultiClass(), multiclass_blobs)


def _noise_fooling(model, task, x, eps, seed=0):
    """Fooling rate of random ±eps sign noise (the same L∞ norm as the attack), clipped to [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    noise = (torch.randint(0, 2, x.shape, generator=g) * 2 - 1).float() * eps
    with torch.no_grad():
        clean = task.predict(model(x))
        return float(task.fooled(model((x + noise).clamp(0, 1)), clean).float().mean())


def test_budget_and_bounds_per_channel_and_per_sample():
    task = MultiClass()
    model = small_cnn(3, 4, width=4).eval()
    x = torch.rand(5, 3, 12, 12)
    x[:, 0] = 0.0  # a channel at the lower bound: clipping must keep it inside
    lo = torch.tensor([0.0, 0.0, 0.2]).reshape(3, 1, 1)
    hi = torch.tensor([1.0, 0.8, 1.0]).reshape(3, 1, 1)
    x = torch.maximum(torch.minimum(x, hi), lo)
    eps = 0.05
    for per_channel in (True, False):
        # instance norm: an untrained generator already has an O(1) output in eval mode
        gen = ResnetGenerator(3, ngf=4, norm="instance").eval()
        atk = GAP(task, Linf(eps, bounds=(lo, hi)), gen, per_channel=per_channel)
        res = atk(model, x)
        d = res.x_adv - x
        assert float(res.linf.max()) <= eps + 1e-6
        assert bool((res.x_adv >= lo).all() and (res.x_adv <= hi).all())
        raw = atk.scale(atk.raw(x))  # before the bound clip every sample (and channel) sits on the budget
        peaks = raw.abs().amax(dim=(2, 3)) if per_channel else raw.abs().amax(dim=(1, 2, 3))
        assert torch.allclose(peaks, torch.full_like(peaks, eps), atol=1e-6)
        if per_channel:  # channels 1-2 are off their bounds: there the budget is used, not only shrunk
            assert float(d[:, 1:].abs().amax()) > 0.9 * eps


def test_small_output_scale_is_never_amplified():
    atk = GAP(MultiClass(), Linf(0.5, bounds=(0.0, 1.0)), UnetGenerator(1, ngf=4), output_scale=1e-3)
    u = atk.raw(torch.rand(2, 1, 8, 8))
    assert torch.equal(atk.scale(u), u)  # min(1, eps/||u||) = 1


def test_trained_gap_beats_same_norm_noise_multilabel(ml, tmp_path):
    t = ml
    eps = 0.05
    atk = GAP(t.task, Linf(eps, bounds=(0.0, 1.0)), UnetGenerator(1, ngf=8))
    before = atk(t.model, t.x).fooling_rate
    GAPTrainer(atk, t.model, epochs=6, batch_size=16, lr=1e-2, checkpoint=tmp_path / "g.pt").fit(t.x_train)
    res = atk(t.model, t.x)
    noise = _noise_fooling(t.model, t.task, t.x, eps)
    assert float(res.linf.max()) <= eps + 1e-6
    assert res.fooling_rate >= noise + 0.25 and res.fooling_rate >= before + 0.25, (res.fooling_rate, noise, before)
    # the model under attack is untouched: eval mode kept, parameters still trainable
    assert not t.model.training and all(p.requires_grad for p in t.model.parameters())


def test_trained_gap_beats_noise_multiclass_eq4_loss(mc):
    t = mc
    eps = 0.1
    atk = GAP(t.task, Linf(eps, bounds=(0.0, 1.0)), UnetGenerator(1, ngf=8), loss="neg_true_logprob")
    GAPTrainer(atk, t.model, epochs=6, batch_size=16, lr=1e-2).fit(t.x_train)
    res = atk(t.model, t.x)
    assert res.fooling_rate >= _noise_fooling(t.model, t.task, t.x, eps) + 0.25


def test_targeted_multilabel_vector(ml):
    t = ml
    target = torch.tensor([1.0, 0.0, 1.0, 0.0])
    atk = GAP(t.task, Linf(0.1, bounds=(0.0, 1.0)), UnetGenerator(1, ngf=8), targeted=True)
    ys = target.expand(t.x.shape[0], 4)
    before = atk(t.model, t.x, ys).fooling_rate
    GAPTrainer(atk, t.model, epochs=6, batch_size=16, lr=1e-2, target=target).fit(t.x_train)
    after = atk(t.model, t.x, ys)
    assert after.fooling_rate >= before + 0.3  # fraction of samples whose labels all equal the target


def test_universal_perturbation_is_shared(ml):
    t = ml
    atk = GAP(t.task, Linf(0.05, bounds=(0.0, 1.0)), ResnetGenerator(1, ngf=4), universal=True,
              input_shape=tuple(t.x.shape[1:]))
    GAPTrainer(atk, t.model, epochs=2, batch_size=32, lr=1e-2).fit(t.x_train)
    res = atk(t.model, t.x)
    with torch.no_grad():
        delta = atk.scale(atk.raw(t.x))
    assert delta.shape == (1, *t.x.shape[1:])  # one perturbation for the whole batch
    assert torch.allclose(res.x_adv, (t.x + delta).clamp(0, 1), atol=1e-6)
    assert float(delta.abs().max()) == pytest.approx(0.05, abs=1e-6)
    with pytest.raises(ValueError, match="sample shape"):
        atk(t.model, torch.rand(2, 1, 8, 8))


def test_resume_after_interruption_matches_uninterrupted(ml, tmp_path):
    t = ml
    x = t.x_train[:96]

    def fresh():
        return GAP(t.task, Linf(0.05, bounds=(0.0, 1.0)), UnetGenerator(1, ngf=4, seed=3))

    full = fresh()
    GAPTrainer(full, t.model, epochs=3, batch_size=32, lr=1e-2, seed=7).fit(x)

    ckpt = tmp_path / "gap.pt"
    crashed = fresh()

    def crash(epoch, record):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        GAPTrainer(crashed, t.model, epochs=3, batch_size=32, lr=1e-2, seed=7, checkpoint=ckpt).fit(x, callback=crash)
    resumed = fresh()
    tr = GAPTrainer(resumed, t.model, epochs=3, batch_size=32, lr=1e-2, seed=7, checkpoint=ckpt)
    tr.fit(x)
    assert [h["epoch"] for h in tr.history] == [1, 2, 3]
    for (k, a), b in zip(full.generator.state_dict().items(), resumed.generator.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_checkpoint_round_trip_transfer_and_evaluate(ml, tmp_path):
    t = ml
    ckpt = tmp_path / "gap.pt"
    atk = GAP(t.task, Linf(0.05, bounds=(0.0, 1.0)), UnetGenerator(1, ngf=4))
    GAPTrainer(atk, t.model, epochs=2, batch_size=32, lr=1e-2, checkpoint=ckpt).fit(t.x_train)
    again = GAP.from_checkpoint(ckpt, t.task, Linf(0.05, bounds=(0.0, 1.0)))
    assert torch.equal(atk(t.model, t.x).x_adv, again(t.model, t.x).x_adv)
    # a smaller budget at test time rescales the same generator
    smaller = GAP.from_checkpoint(ckpt, t.task, Linf(0.02, bounds=(0.0, 1.0)))
    assert float(smaller(t.model, t.x).linf.max()) <= 0.02 + 1e-6
    # transfer: the trained generator attacks another model, and evaluate() runs it like any attack
    other = small_cnn(1, 4, width=4).eval()
    res = again(other, t.x)
    assert res.x_adv.shape == t.x.shape and res.fooled.shape == (t.x.shape[0],)
    table = evaluate(t.model, t.task, (t.x, t.y), {"gap": again})
    assert len(table) == t.x.shape[0] and all(r["linf"] <= 0.05 + 1e-6 for r in table)


def test_segmentation_3d_least_likely_voxels():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv3d(2, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv3d(8, 3, 3, padding=1))
    task, model = Segmentation(3), model.eval()
    x = torch.rand(4, 2, 8, 8, 8)
    atk = GAP(task, Linf(0.1, bounds=(0.0, 1.0)), UnetGenerator(2, ngf=4, depth=2, ndim=3))
    tr = GAPTrainer(atk, model, epochs=2, batch_size=2, lr=1e-2)
    tr.fit(x)
    assert tr.history[-1]["loss"] < tr.history[0]["loss"]  # pulled towards the least-likely voxel classes
    res = atk(model, x)
    assert res.x_adv.shape == x.shape
    assert float(res.linf.max()) <= 0.1 + 1e-6 and bool((res.x_adv >= 0).all() and (res.x_adv <= 1).all())


def test_registered_and_bad_inputs():
    task, g = MultiClass(), UnetGenerator(1, ngf=4)
    assert isinstance(get_attack("gap", task, Linf(0.1, bounds=(0.0, 1.0)), generator=g), GAP)
    with pytest.raises(TypeError, match="Linf"):
        GAP(task, L2(0.1, bounds=(0.0, 1.0)), g)
    with pytest.raises(TypeError, match="generator"):
        GAP(task, Linf(0.1, bounds=(0.0, 1.0)), 42)
    with pytest.raises(ValueError, match="`generator` of GAP must be one of 'unet', 'resnet'; got 'unte'; did you mean 'unet'"):
        GAP(task, Linf(0.1, bounds=(0.0, 1.0)), "unte")
    with pytest.raises(ValueError, match="ngf"):
        GAP(task, Linf(0.1, bounds=(0.0, 1.0)), {"name": "resnet", "ngf": 0})
    with pytest.raises(ValueError, match="input_shape"):
        GAP(task, Linf(0.1, bounds=(0.0, 1.0)), g, universal=True)
    with pytest.raises(ValueError, match="loss"):
        GAP(task, Linf(0.1, bounds=(0.0, 1.0)), g, loss="cw")
    atk = GAP(MultiLabel(), Linf(0.1, bounds=(0.0, 1.0)), g)
    with pytest.raises(ValueError, match="target"):
        GAPTrainer(atk, small_cnn(1, 4), target=torch.ones(4))
    with pytest.raises(ValueError, match="outside the declared bounds"):
        GAPTrainer(atk, small_cnn(1, 4)).fit(torch.full((4, 1, 8, 8), 2.0))




def test_gap_from_a_config_refuses_untrained_until_fitted(ml, tmp_path):
    t = ml
    threat = Linf(0.05, bounds=(0.0, 1.0))
    atk = get_attack("gap", t.task, threat)  # the default generator, built by name
    assert isinstance(atk, GAP) and not atk.trained
    with pytest.raises(RuntimeError, match=r"untrained.*GAPTrainer.*checkpoint"):
        atk(t.model, t.x)
    small = get_attack("gap", t.task, threat, generator={"name": "resnet", "ngf": 4, "n_blocks": 1})
    assert type(small.generator).__name__ == "ResnetGenerator" and small.generator.config["ngf"] == 4
    ckpt = tmp_path / "gap.pt"
    GAPTrainer(small, t.model, epochs=1, batch_size=32, lr=1e-2, checkpoint=ckpt).fit(t.x_train[:64])
    assert small.trained and small.set_params(seed=1).trained
    res = small(t.model, t.x)
    # {checkpoint: ...} rebuilds the same attack from a config
    again = get_attack("gap", t.task, threat, generator={"checkpoint": str(ckpt)})
    assert again.trained and torch.equal(again(t.model, t.x).x_adv, res.x_adv)
    assert again.fingerprint() == small.fingerprint() != atk.fingerprint()
    with pytest.raises(ValueError, match="per_channel"):  # G was trained per channel
        get_attack("gap", t.task, threat, generator={"checkpoint": str(ckpt)}, per_channel=False)
    with pytest.raises(ValueError, match="no other keys"):
        get_attack("gap", t.task, threat, generator={"checkpoint": str(ckpt), "ngf": 4})
    with pytest.raises(FileNotFoundError):
        get_attack("gap", t.task, threat, generator={"checkpoint": str(tmp_path / "missing.pt")})


def test_universal_checkpoint_settings_are_adopted(ml, tmp_path):
    t = ml
    ckpt = tmp_path / "u.pt"
    atk = GAP(t.task, Linf(0.05, bounds=(0.0, 1.0)), {"name": "resnet", "ngf": 4}, universal=True,
              input_shape=tuple(t.x.shape[1:]), seed=5, output_scale=50.0)
    GAPTrainer(atk, t.model, epochs=1, batch_size=32, lr=1e-2, checkpoint=ckpt).fit(t.x_train[:64])
    again = GAP(t.task, Linf(0.05, bounds=(0.0, 1.0)), {"checkpoint": ckpt})
    assert again.universal and again.input_shape == atk.input_shape and again.output_scale == 50.0
    assert torch.equal(again.noise, atk.noise)
    assert torch.equal(again(t.model, t.x).x_adv, atk(t.model, t.x).x_adv)


def test_output_scale_is_relative_to_the_data_range():
    g = UnetGenerator(1, ngf=4).eval()
    x = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        unit = GAP(MultiClass(), Linf(0.5, bounds=(0.0, 1.0)), g).raw(x)
        hu = GAP(MultiClass(), Linf(0.5, bounds=Box(-1000.0, 1000.0)), g).raw(x)
        free = GAP(MultiClass(), Linf(0.5, bounds=None), g, output_scale=3.0).raw(x)
        gx = g(x)
    assert torch.allclose(unit, 100.0 * gx) and torch.allclose(hu, 2000.0 * unit)
    assert torch.allclose(free, 3.0 * gx)  # unbounded: data units


def test_gap_output_is_exactly_inside_the_box_so_pgd_accepts_it():
    # regression: the straight-through clip x + (clip(x) - x).detach() left values one ulp outside the box
    torch.manual_seed(0)
    model = small_cnn(3, 4, width=4).eval()
    lo = torch.tensor([-0.37, 0.11, -1.3]).reshape(3, 1, 1)
    hi = torch.tensor([0.61, 0.93, 2.7]).reshape(3, 1, 1)
    x = lo + (hi - lo) * torch.rand(16, 3, 12, 12)
    threat = Linf(0.3, bounds=(lo, hi))
    gen = ResnetGenerator(3, ngf=4, norm="instance")
    atk = GAP(MultiClass(), threat, gen)
    u = atk.scale(atk.raw(x))
    old = (x + u) + (threat.clip(x + u) - (x + u))  # the former forward value
    assert bool(((old < lo) | (old > hi)).any())  # the data do hit the rounding problem
    res = atk(model, x)
    assert bool(((res.x_adv >= lo) & (res.x_adv <= hi)).all())
    assert float(res.linf.max()) <= 0.3 + 1e-6
    PGD(MultiClass(), threat, steps=1)(model, res.x_adv)  # accepted as an input of the same box


def test_gap_declares_its_parameters_and_is_exported():
    GAP.check_declarations()
    assert medadv.GAPTrainer is GAPTrainer and GAPTrainer.__module__ == "medadv.training.gap"
    atk = GAP(MultiClass(), Linf(0.1, bounds=(0.0, 1.0)), "resnet", loss="neg_true_logprob")
    params = atk.get_params()
    assert set(params) == {"generator", "universal", "input_shape", "per_channel", "loss", "output_scale",
                           "targeted", "seed"}
    assert params["loss"] == "neg_true_logprob" and params["output_scale"] == 100.0
    assert "generator=ResnetGenerator(kind='resnet'" in repr(atk) and "\n" not in repr(atk)
    with pytest.raises(ValueError, match="output_scale"):
        GAP(MultiClass(), Linf(0.1, bounds=(0.0, 1.0)), "unet", output_scale=0.0)


def test_building_and_running_gap_leaves_the_global_rng_alone(ml, tmp_path):
    """A fresh generator's random initial weights come from a fork of the global RNG: building the attack (by
    name, by mapping, from a checkpoint, universal) and running it do not advance the caller's random stream."""
    threat = Linf(8 / 255, bounds=(0.0, 1.0))
    ckpt = tmp_path / "gap.pt"
    GAPTrainer(GAP(MultiLabel(), threat, UnetGenerator(1, ngf=4)), ml.model, epochs=1, batch_size=16,
               checkpoint=ckpt).fit(ml.x_train[:16])
    torch.manual_seed(123)
    state = torch.get_rng_state()
    atk = get_attack("gap", MultiLabel(), threat, generator="unet")
    GAP(MultiLabel(), threat, {"name": "resnet", "ngf": 4}, universal=True, input_shape=(1, 16, 16))
    loaded = get_attack("gap", MultiLabel(), threat, generator={"checkpoint": str(ckpt)})
    GAP.from_checkpoint(ckpt, MultiLabel(), threat)
    assert torch.equal(torch.get_rng_state(), state)
    atk.trained = True
    atk(ml.model, ml.x[:4])
    loaded(ml.model, ml.x[:4])
    assert torch.equal(torch.get_rng_state(), state)
    # the same global seed gives the same fresh generator
    torch.manual_seed(123)
    again = get_attack("gap", MultiLabel(), threat, generator="unet")
    assert all(torch.equal(a, b) for a, b in zip(atk.generator.state_dict().values(),
                                                 again.generator.state_dict().values(), strict=True))
