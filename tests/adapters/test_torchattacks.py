"""torchattacks in both directions: its own attacks on medical models, medadv attacks as torchattacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchattacks

from medadv.adapters.support import UnsupportedAttackError
from medadv.adapters.torchattacks import MedadvAttack, TorchattacksModel
from medadv.attacks.pgd import PGD
from medadv.models import small_unet
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import Linf

EPS = 0.1


def test_cross_entropy_view_is_exactly_the_task_loss(trained_multilabel, trained_seg3d):
    for t in (trained_multilabel, trained_seg3d):
        w = TorchattacksModel(t.model, t.task, bounds=(0.0, 1.0))
        with torch.no_grad():
            ce = F.cross_entropy(w(w.encode(t.x)), w.labels(t.y))
            ref = t.task.loss(t.model(t.x), t.task.to_target(t.y, t.x)).mean()
        assert torch.allclose(ce, ref, atol=1e-6)


@pytest.mark.parametrize("name", ["FGSM", "PGD", "BIM", "MIFGSM"])
def test_multilabel_in_hu_own_attacks(trained_multilabel, hu, name):
    wrap, to_hu, bounds = hu
    t = trained_multilabel
    model = wrap(t.model)
    x = to_hu(t.x)
    w = TorchattacksModel(model, t.task, bounds=bounds)
    eps = EPS * (bounds[1] - bounds[0])  # 409.5 HU
    kw = {} if name == "FGSM" else {"alpha": w.unit_eps(eps / 4), "steps": 10}
    atk = getattr(torchattacks, name)(w, eps=w.unit_eps(eps), **kw)
    x_adv = w.attack(atk, x, t.y)
    assert x_adv.shape == x.shape and x_adv.dtype == x.dtype and x_adv.device == x.device
    assert (x_adv - x).abs().max() <= eps * (1 + 1e-5)
    assert x_adv.min() >= bounds[0] and x_adv.max() <= bounds[1]
    assert x_adv.min() < -500 and x_adv.max() > 1.5  # HU kept, not clamped to [0, 1]
    clean = t.task.metrics(model(x), t.y)["label_accuracy"].mean()
    adv = t.task.metrics(model(x_adv), t.y)["label_accuracy"].mean()
    assert adv < clean - 0.15


def test_multilabel_targeted_by_label(trained_multilabel):
    t = trained_multilabel
    w = TorchattacksModel(t.model, t.task, bounds=(0.0, 1.0))
    target = 1 - t.y
    atk = torchattacks.PGD(w, eps=0.3, alpha=0.05, steps=20)
    atk.set_mode_targeted_by_label(quiet=True)
    x_adv = w.attack(atk, t.x, target)
    before = t.task.element_correct(t.model(t.x), target).float().mean()
    after = t.task.element_correct(t.model(x_adv), target).float().mean()
    assert after > before + 0.3


def test_segmentation_3d_hu_and_multichannel_normalisation(trained_seg3d, hu):
    wrap, to_hu, bounds = hu
    t = trained_seg3d
    model = wrap(t.model)
    x = to_hu(t.x)
    w = TorchattacksModel(model, t.task, bounds=bounds)
    eps = 0.15 * (bounds[1] - bounds[0])
    for atk in (torchattacks.PGD(w, eps=w.unit_eps(eps), alpha=w.unit_eps(eps / 4), steps=6),
                torchattacks.FGSM(w, eps=w.unit_eps(eps))):
        x_adv = w.attack(atk, x, t.y)
        assert (x_adv - x).abs().max() <= eps * (1 + 1e-5) and x_adv.min() >= bounds[0]
        clean = t.task.metrics(model(x), t.y)["mean_dice"].mean()
        assert t.task.metrics(model(x_adv), t.y)["mean_dice"].mean() < clean - 0.1, type(atk).__name__
    # two-channel 3-D volume (e.g. CT + PET) with per-channel normalisation: torchattacks' own
    # set_normalization_used cannot do this (it reshapes to (1, C, 1, 1))
    torch.manual_seed(0)
    net = small_unet(2, 3, ndim=3, channels=(8, 16)).eval()
    mean, std = torch.tensor([40.0, 2.0]), torch.tensor([400.0, 3.0])
    w2 = TorchattacksModel(net, Segmentation(3), bounds=(torch.tensor([-1024.0, 0.0]).reshape(2, 1, 1, 1),
                                                         torch.tensor([3071.0, 30.0]).reshape(2, 1, 1, 1)),
                           mean=mean, std=std)
    x2 = torch.stack((to_hu(t.x[:2, 0]), 30 * t.x[:2, 0]), dim=1)
    with torch.no_grad():
        ref = net((x2 - mean.reshape(1, 2, 1, 1, 1)) / std.reshape(1, 2, 1, 1, 1))
        assert torch.allclose(w2(w2.encode(x2)), ref, atol=1e-4)


def test_apgd_on_multiclass_in_hu(trained_multiclass, hu):
    wrap, to_hu, bounds = hu
    t = trained_multiclass
    model = wrap(t.model)
    x = to_hu(t.x)
    w = TorchattacksModel(model, MultiClass(), bounds=bounds)
    eps = EPS * (bounds[1] - bounds[0])
    atk = torchattacks.APGD(w, eps=w.unit_eps(eps), steps=10, n_restarts=1)
    x_adv = w.attack(atk, x, t.y)
    assert (x_adv - x).abs().max() <= eps * (1 + 1e-5)
    clean = (model(x).argmax(1) == t.y).float().mean()
    assert (model(x_adv).argmax(1) == t.y).float().mean() < clean - 0.2


# --- medadv attacks as torchattacks attacks ----------------------------------------------------------------
def test_medadv_attack_as_torchattacks_matches_medadv(trained_multilabel):
    t = trained_multilabel
    pgd = PGD(t.task, Linf(EPS, bounds=(0.0, 1.0)), steps=5, seed=3)
    atk = MedadvAttack(pgd, t.model)
    assert isinstance(atk, torchattacks.attack.Attack)
    x_adv = atk(t.x, t.y)
    assert torch.equal(x_adv, pgd(t.model, t.x, t.y).x_adv)  # same seed, same tensor
    assert (x_adv - t.x).abs().max() <= EPS + 1e-6
    assert t.task.metrics(t.model(x_adv), t.y)["label_accuracy"].mean() < 0.8


class _Standardise(torch.nn.Module):
    def __init__(self, m, s):
        super().__init__()
        self.m, self.s = m, s

    def forward(self, x):
        return (x - self.m) / self.s


def test_medadv_attack_normalisation_multichannel_3d(trained_seg3d):
    t = trained_seg3d
    torch.manual_seed(0)
    net = small_unet(2, 3, ndim=3, channels=(8, 16)).eval()
    x = torch.cat((t.x, t.x.flip(-1)), dim=1)  # two channels
    with torch.no_grad():
        y = net(x).argmax(1)  # any label map will do
    attack = PGD(Segmentation(3), Linf(EPS, bounds=(0.0, 1.0)), steps=5)
    mean, std = [0.5, 0.4], [0.2, 0.3]
    m, s = torch.tensor(mean).reshape(1, 2, 1, 1, 1), torch.tensor(std).reshape(1, 2, 1, 1, 1)
    # reference: the same attack on a model with the normalisation built in, fed data units
    plain = attack(torch.nn.Sequential(_Standardise(m, s), net).eval(), x, y).x_adv
    # torchattacks' convention: normalised inputs in, normalised outputs out, any rank and channel count
    atk = MedadvAttack(attack, net)
    atk.set_normalization_used(mean, std)
    normed = atk((x - m) / s, y)
    # the same attack up to round-off (a sign step can flip where the gradient is ~0)
    assert ((normed * s + m - plain).abs() < 1e-5).float().mean() > 0.99


def test_medadv_attack_targeted_and_save_on_trained_segmenter(trained_seg2d, tmp_path):
    t = trained_seg2d
    mean, std = [0.5, 0.4], [0.2, 0.3]
    m, s = torch.tensor(mean).reshape(1, 2, 1, 1), torch.tensor(std).reshape(1, 2, 1, 1)
    # a network fed normalised inputs (what set_normalization_used assumes): undo them for the [0, 1] UNet
    net = torch.nn.Sequential(_Standardise(-m / s, 1 / s), t.model).eval()
    atk = MedadvAttack(PGD(t.task, Linf(0.3, bounds=(0.0, 1.0)), steps=10), net)
    atk.set_normalization_used(mean, std)
    atk.set_mode_targeted_by_label(quiet=True)
    target = torch.zeros_like(t.y)  # erase every structure
    adv = atk((t.x - m) / s, target) * s + m
    assert (adv - t.x).abs().max() <= 0.3 + 1e-5 and adv.min() >= -1e-6 and adv.max() <= 1 + 1e-6
    organ = t.y > 0
    with torch.no_grad():
        before = (t.model(t.x).argmax(1) == target)[organ].float().mean()
        after = (t.model(adv).argmax(1) == target)[organ].float().mean()
    assert after > before + 0.15
    atk.set_mode_default()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset((t.x - m) / s, t.y), batch_size=4)
    atk.save(loader, save_path=str(tmp_path / "adv.pt"), verbose=False)
    saved = torch.load(tmp_path / "adv.pt", weights_only=True)
    assert saved["adv_inputs"].shape == t.x.shape  # saved in data units (torchattacks inverse-normalises)
    assert (saved["adv_inputs"] - t.x).abs().max() <= 0.3 + 1e-5
    with torch.no_grad():
        dice = t.task.metrics(t.model(saved["adv_inputs"]), t.y)["mean_dice"].mean()
        assert dice < t.task.metrics(t.model(t.x), t.y)["mean_dice"].mean() - 0.1


def test_bad_input(trained_multilabel, hu):
    t = trained_multilabel
    with pytest.raises(TypeError, match="medadv Attack"):
        MedadvAttack(torchattacks.PGD(t.model), t.model)
    w = TorchattacksModel(t.model, t.task, bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="outside the declared `bounds`"):
        w.attack(torchattacks.FGSM(w, eps=0.1), t.x * 10, t.y)
    with pytest.raises(ValueError, match="built on this"):
        w.attack(torchattacks.FGSM(t.model, eps=0.1), t.x, t.y)
    with pytest.raises(ValueError, match="multi-hot"):
        w.labels(t.y * 0.5)
    with pytest.raises(ValueError, match="lo < hi"):
        TorchattacksModel(t.model, t.task, bounds=(1.0, 0.0))


def test_medadv_attack_wraps_an_always_targeted_attack(trained_seg2d):
    # DAG's y is always its adversarial label map: torchattacks' default (untargeted) mode must not
    # switch the wrapped copy to untargeted; the wrapper gives DAG's own tensor
    from medadv.attacks.dag import DAG, dag_target_a
    from medadv.threats import Box

    t = trained_seg2d
    ya, _ = dag_target_a(t.y)
    dag = DAG(t.task, Box(0.0, 1.0), step_size=0.01, steps=20)
    wrapper = MedadvAttack(dag, t.model)
    x_adv = wrapper(t.x, ya)
    direct = dag(t.model, t.x, ya)
    assert torch.equal(x_adv, direct.x_adv) and not torch.equal(x_adv, t.x)
    assert dag.targeted and wrapper.targeted is False  # the configured attack itself is never mutated


# --- unsafe habits refused, targeted modes on every task (issue 9) ---------------------------------------------
class _Calls:
    """Counts the wrapped model's forwards (to show a refusal came before any work)."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(self)

    def __call__(self, *args):
        self.n += 1


def test_direct_call_on_hu_data_is_refused_with_the_right_call(trained_seg3d, hu):
    wrap, to_hu, bounds = hu
    t = trained_seg3d
    x = to_hu(t.x[:2])
    w = TorchattacksModel(wrap(t.model), t.task, bounds=bounds)
    eps = w.unit_eps(100.0)
    for atk in (torchattacks.PGD(w, eps=eps, alpha=eps / 4, steps=2), torchattacks.FGSM(w, eps=eps)):
        calls = _Calls(t.model)
        with pytest.raises(UnsupportedAttackError, match=r"outside \[0, 1\].*call w\.attack\(atk, x, y\), or "
                                                         r"atk\(w\.encode\(x\), w\.labels\(y\)\)"):
            atk(x, w.labels(t.y[:2]))  # HU handed straight to torchattacks: it would clamp them to [0, 1]
        assert calls.n == 0
        with pytest.raises(UnsupportedAttackError, match=r"torch\.float32 labels.*w\.labels\(y\)"):
            atk(w.encode(x), t.y[:2].float())
        # the right calls: both keep HU and ε
        for x_adv in (w.attack(atk, x, t.y[:2]), w.decode(atk(w.encode(x), w.labels(t.y[:2])), x)):
            assert (x_adv - x).abs().max() <= 100.0 * (1 + 1e-4) and x_adv.min() < -500
        calls.handle.remove()


def test_direct_calls_that_need_w_attack_are_refused_before_work(trained_multilabel, trained_seg3d):
    t = trained_multilabel
    w = TorchattacksModel(t.model, t.task, bounds=(0.0, 1.0))
    u, lab = w.encode(t.x[:2]), w.labels(t.y[:2])
    calls = _Calls(t.model)
    with pytest.raises(UnsupportedAttackError, match=r"torchattacks CW reads one class per sample.*call "
                                                     r"w\.attack\(atk, x, y\)"):
        torchattacks.CW(w, steps=2)(u, lab)
    pgd = torchattacks.PGD(w, eps=0.1, alpha=0.02, steps=2)
    pgd.set_mode_targeted_random(quiet=True)
    with pytest.raises(UnsupportedAttackError, match=r"targeted\(random\) mode picks one class per sample.*"
                                                     r"w\.attack\(atk, x, y\)"):
        pgd(u, lab)
    with pytest.raises(UnsupportedAttackError, match=r"eps=0\.0 divides by a zero perturbation norm"):
        w.attack(torchattacks.PGDL2(w, eps=0.0), t.x[:2], t.y[:2])  # torchattacks would return NaN
    with pytest.raises(UnsupportedAttackError, match=r"torchattacks Jitter does not apply to a multi-label model"):
        w.attack(torchattacks.MultiAttack([torchattacks.PGD(w), torchattacks.Jitter(w)]), t.x[:2], t.y[:2])
    assert calls.n == 0
    calls.handle.remove()
    s = trained_seg3d
    ws = TorchattacksModel(s.model, s.task, bounds=(0.0, 1.0))
    calls = _Calls(s.model)
    with pytest.raises(UnsupportedAttackError, match=r"PGDL2 reshapes per-sample norms .* one volume at a time"):
        torchattacks.PGDL2(ws, eps=1.0, steps=2)(ws.encode(s.x[:2]), ws.labels(s.y[:2]))  # would crash inside
    assert calls.n == 0
    calls.handle.remove()
    x_adv = ws.attack(torchattacks.PGDL2(ws, eps=2.0, alpha=0.5, steps=3), s.x[:2], s.y[:2])
    assert ((x_adv - s.x[:2]).flatten(1).norm(dim=1) <= 2.0 + 1e-4).all()


@pytest.mark.parametrize("mode", ["random", "least_likely", "function"])
def test_targeted_modes_per_label_and_voxel(trained_multilabel, trained_seg2d, trained_multiclass, mode):
    for t in (trained_multilabel, trained_seg2d, trained_multiclass):
        x, y = t.x[:4], t.y[:4]
        w = TorchattacksModel(t.model, t.task, bounds=(0.0, 1.0))
        atk = torchattacks.PGD(w, eps=0.3, alpha=0.05, steps=10)
        if mode == "random":
            atk.set_mode_targeted_random(quiet=True)
        elif mode == "least_likely":
            atk.set_mode_targeted_least_likely(quiet=True)
        else:
            atk.set_mode_targeted_by_function(lambda u, lab: 1 - lab if lab.ndim == 2 else (lab + 1) % 3, quiet=True)
        torch.manual_seed(0)
        x_adv = w.attack(atk, x, y)
        assert atk.attack_mode.startswith("targeted(") and atk.attack_mode != "targeted(label)"  # mode kept
        with torch.no_grad():
            clean, adv = t.model(x), t.model(x_adv)
        if isinstance(t.task, MultiClass):
            assert ((adv.argmax(1) != y).float().mean() > 0.7) and ((clean.argmax(1) == y).all())
            continue
        # every label / voxel was driven away from its label: towards another class of its own
        before = t.task.element_correct(clean, y).float().mean()
        after = t.task.element_correct(adv, y).float().mean()
        assert after < before - 0.3, (mode, float(before), float(after))
        if isinstance(t.task, MultiLabel) and mode != "function":
            # a label's only other class is its flip: random and least-likely both target 1 - y
            assert t.task.element_correct(adv, 1 - y).float().mean() > 0.6


def test_margin_view_targeted_and_untargeted_follow_the_task(trained_multilabel):
    t = trained_multilabel
    x, y = t.x[:4], t.y[:4]
    w = TorchattacksModel(t.model, t.task, bounds=(0.0, 1.0))
    # DeepFool stops exactly when the task says "fooled" (a label flipped): minimal, one label per sample. An
    # overshoot of 0.02 left one sample's flipped logit at +1e-6 on this machine's kernels (on the boundary, not
    # past it), and 0.05 did with one thread; 0.1 crosses it and still flips one label
    x_adv = w.attack(torchattacks.DeepFool(w, steps=20, overshoot=0.1), x, y)
    with torch.no_grad():
        fooled = t.task.fooled(t.model(x_adv), y)
        flipped = (~t.task.element_correct(t.model(x_adv), y)).sum(1)
    assert fooled.all() and (flipped == 1).float().mean() >= 0.75
    # targeted CW: every label of the target reached, which is the task's targeted success
    cw = torchattacks.CW(w, c=20.0, steps=60, lr=0.05)
    cw.set_mode_targeted_by_label(quiet=True)
    target = y.clone()
    target[:, 0] = 1 - target[:, 0]
    x_t = w.attack(cw, x, target)
    with torch.no_grad():
        assert t.task.fooled(t.model(x_t), target, targeted=True).float().mean() >= 0.75


def test_lgv_runs_and_its_trainloader_must_be_in_the_wrappers_form(trained_multilabel, hu):
    wrap, to_hu, bounds = hu
    t = trained_multilabel
    model, x = wrap(t.model), to_hu(t.x)
    w = TorchattacksModel(model, t.task, bounds=bounds)
    eps = w.unit_eps(0.1 * (bounds[1] - bounds[0]))
    raw = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, t.y), batch_size=8)  # HU, float labels
    with pytest.raises(UnsupportedAttackError, match=r"LGV trains on its trainloader .* \(w\.encode\(x\), "
                                                     r"w\.labels\(y\)\)"):
        w.attack(torchattacks.LGV(w, raw, epochs=1, nb_models_epoch=1, verbose=False, eps=eps), x[:4], t.y[:4])
    good = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(w.encode(x), w.labels(t.y)), batch_size=8)
    torch.manual_seed(0)
    lgv = torchattacks.LGV(w, good, lr=0.01, epochs=1, nb_models_epoch=2, verbose=False, eps=eps, alpha=eps / 4,
                           steps=5)
    x_adv = w.attack(lgv, x[:8], t.y[:8])  # LGV attacks a copy of w: accepted
    assert (x_adv - x[:8]).abs().max() <= 0.1 * (bounds[1] - bounds[0]) * (1 + 1e-5)
    with torch.no_grad():
        clean = t.task.metrics(model(x[:8]), t.y[:8])["label_accuracy"].mean()
        adv = t.task.metrics(model(x_adv), t.y[:8])["label_accuracy"].mean()
    assert adv < clean - 0.15


def test_what_margin_view_attacks_report_as_success_is_the_tasks_fooled_test(trained_multilabel, trained_seg2d):
    """Issue 28, item 8: DeepFool stops and CW keeps an iterate when *they* see success on the margin view; those
    results must pass the task's own test. Before, DeepFool (no overshoot) stopped on the multi-label boundary
    (4 of 16 samples not fooled by the task's test) and CW kept soft-Dice "successes" whose hard Dice was still
    above the threshold."""
    t = trained_multilabel
    x, y = t.x[:16], t.y[:16]
    w = TorchattacksModel(t.model, t.task, bounds=(0.0, 1.0))
    x_adv = w.attack(torchattacks.DeepFool(w, steps=20, overshoot=0.0), x, y)
    with torch.no_grad():
        assert t.task.fooled(t.model(x_adv), y).all()  # DeepFool returned each sample when it saw it fooled
    s = trained_seg2d
    x, y = s.x[:8], s.y[:8]
    w = TorchattacksModel(s.model, s.task, bounds=(0.0, 1.0))
    x_adv = w.attack(torchattacks.CW(w, c=300.0, steps=30, lr=0.05), x, y)
    changed = (x_adv != x).reshape(8, -1).any(1)  # CW returns the clean image unless it saw success
    with torch.no_grad():
        fooled = s.task.fooled(s.model(x_adv), y)
    assert changed.sum() >= 6 and bool((fooled | ~changed).all()), (changed, fooled)


def test_attack_result_gives_the_success_flag_torchattacks_does_not(trained_multilabel, trained_seg2d):
    """CW and Square return the clean image where they fail and no flag: ``attack_result`` says which failed, by
    the task's own test on the returned batch (untargeted and targeted)."""
    s = trained_seg2d
    x, y = s.x[:4], s.y[:4]
    w = TorchattacksModel(s.model, s.task, bounds=(0.0, 1.0))
    for atk in (torchattacks.CW(w), torchattacks.Square(w, n_queries=20), torchattacks.CW(w, c=300.0, steps=30, lr=0.1)):
        r = w.attack_result(atk, x, y)
        with torch.no_grad():
            truth = s.task.fooled(s.model(r.x_adv), y)
        assert torch.equal(r.fooled, truth) and r.fooled.dtype == torch.bool and r.fooled.shape == (4,)
        assert torch.equal(r.y, y) and torch.allclose(r.linf, (r.x_adv - x).flatten(1).abs().amax(1))
        changed = (r.x_adv != x).reshape(4, -1).any(1)
        assert bool((r.fooled | ~changed).all())  # what came back perturbed is a success
        if type(atk).__name__ == "CW" and atk.c == 1:
            assert not r.fooled.any() and not changed.any()  # default c: the clean image, now flagged as a failure
    assert r.fooled.sum() >= 3  # CW with c=300 succeeds
    t = trained_multilabel
    w = TorchattacksModel(t.model, t.task, bounds=(0.0, 1.0))
    cw = torchattacks.CW(w, c=20.0, steps=40, lr=0.05)
    cw.set_mode_targeted_by_label(quiet=True)
    target = t.y[:4].clone()
    target[:, 0] = 1 - target[:, 0]
    r = w.attack_result(cw, t.x[:4], target)
    with torch.no_grad():
        assert torch.equal(r.fooled, t.task.fooled(t.model(r.x_adv), target, targeted=True))
    assert r.fooled.sum() >= 3 and torch.equal(r.y, target)
    # the targets torchattacks draws itself cannot be tested: refused, not a wrong flag
    m = TorchattacksModel(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256, 4)).eval(), MultiClass(),
                          bounds=(0.0, 1.0))
    fab = torchattacks.FAB(m, steps=2, n_classes=4, multi_targeted=False)
    fab.set_mode_targeted_random(quiet=True)
    with pytest.raises(UnsupportedAttackError, match=r"^torchattacks FAB draws its targets inside torchattacks"):
        m.attack_result(fab, t.x[:2], torch.tensor([0, 1]))
