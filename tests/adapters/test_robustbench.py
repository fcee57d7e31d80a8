"""RobustBench offline loading (RobustBench's own loader) and AutoAttack as a medadv attack."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv.adapters import robustbench as mrb
from medadv.attacks.autoattack import AutoAttack
from medadv.attacks.base import get_attack
from medadv.attacks.fgsm import FGSM
from medadv.attacks.pgd import PGD
from medadv.models.io import CheckpointError
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import L2, Linf

ZOO = "Ding2020MMA"  # WRN-28-4 (5.8 M parameters), small enough for a test


def test_missing_checkpoint_names_the_exact_file_and_downloads_nothing(tmp_path, monkeypatch):
    mrb.import_robustbench()
    import robustbench.utils

    def no_download(*a, **k):
        raise AssertionError("RobustBench tried to download")

    monkeypatch.setattr(robustbench.utils, "download_gdrive_new", no_download)
    expected = tmp_path / "cifar10" / "Linf" / f"{ZOO}.pt"
    with pytest.raises(FileNotFoundError) as err:
        mrb.load_zoo_model(ZOO, tmp_path)
    assert str(expected.resolve()) in str(err.value) and str(expected.parent.resolve()) in str(err.value)
    assert not (tmp_path / "cifar10").exists()  # no side effects either
    assert mrb.zoo_checkpoint_paths(ZOO, tmp_path) == [expected]


def test_local_checkpoint_loads_through_robustbench_load_model(tmp_path, monkeypatch):
    mrb.import_robustbench()
    import robustbench.utils

    calls = []
    real = robustbench.utils.load_model
    monkeypatch.setattr(robustbench.utils, "load_model", lambda *a, **k: calls.append(k) or real(*a, **k))
    torch.manual_seed(0)
    net = mrb.build_zoo_architecture(ZOO).eval()
    path = mrb.save_zoo_checkpoint(net, ZOO, tmp_path)
    assert path == tmp_path / "cifar10" / "Linf" / f"{ZOO}.pt"
    torch.load(path, weights_only=True)  # a plain tensor state dict
    zoo = mrb.load_zoo_model(ZOO, tmp_path)
    assert len(calls) == 1  # RobustBench's own loading code did the work
    assert isinstance(zoo.task, MultiClass) and zoo.bounds == (0.0, 1.0) and zoo.num_classes == 10
    assert not zoo.model.training
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(zoo.model(x), net(x))
    # the zoo model is an ordinary medadv target
    result = FGSM(zoo.task, Linf(8 / 255, bounds=zoo.bounds))(zoo.model, x)
    assert result.linf.max() <= 8 / 255 + 1e-6 and result.x_adv.min() >= 0 and result.x_adv.max() <= 1


def test_bad_names_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="not a RobustBench"):
        mrb.load_zoo_model("NoSuchModel2099", tmp_path)
    with pytest.raises(ValueError, match="dataset"):
        mrb.load_zoo_model(ZOO, tmp_path, dataset="chestxray")
    with pytest.raises(ValueError, match="threat_model"):
        mrb.load_zoo_model(ZOO, tmp_path, threat_model="L1")


# --- AutoAttack ------------------------------------------------------------------------------------------
def test_autoattack_fools_trained_multiclass_in_unit_range(trained_multiclass):
    t = trained_multiclass
    clean = (t.model(t.x).argmax(1) == t.y).float().mean()
    atk = get_attack("autoattack", t.task, Linf(0.1, bounds=(0.0, 1.0)), version="custom", attacks=["apgd-ce"])
    assert isinstance(atk, AutoAttack)
    r = atk(t.model, t.x, t.y)
    assert r.x_adv.shape == t.x.shape and r.linf.max() <= 0.1 + 1e-6
    assert r.x_adv.min() >= 0 and r.x_adv.max() <= 1
    robust = 1 - r.fooled.float().mean()
    pgd = PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=20)(t.model, t.x, t.y)
    assert robust <= 1 - pgd.fooled.float().mean()  # the ensemble is at least as strong as PGD-20
    assert robust < clean - 0.2


def test_autoattack_in_hounsfield_units_l2(trained_multiclass, hu):
    wrap, to_hu, bounds = hu
    t = trained_multiclass
    model = wrap(t.model)
    x = to_hu(t.x)
    eps = 1.0 * (bounds[1] - bounds[0])  # L2 radius in HU
    r = AutoAttack(t.task, L2(eps, bounds=bounds), version="custom", attacks=["apgd-ce"])(model, x, t.y)
    assert r.l2.max() <= eps * (1 + 1e-5)
    assert r.x_adv.min() >= bounds[0] and r.x_adv.max() <= bounds[1] and r.x_adv.min() < -500
    assert r.fooled.float().mean() > 0.5
    # samples AutoAttack could not fool come back bit-exact despite the round trip through its unit box
    assert torch.equal(r.x_adv[~r.fooled], x[~r.fooled])


def test_autoattack_rejects_what_it_cannot_do(trained_multiclass):
    with pytest.raises(TypeError, match="MultiClass"):
        AutoAttack(Segmentation(3), Linf(0.1, bounds=(0.0, 1.0)))
    with pytest.raises(ValueError, match="one label"):  # a single-logit head only (issue 28)
        AutoAttack(MultiLabel(), Linf(0.1, bounds=(0.0, 1.0)))(trained_multiclass.model, trained_multiclass.x[:2],
                                                               torch.zeros(2, 4))
    with pytest.raises(ValueError, match="bounds"):
        AutoAttack(MultiClass(), Linf(0.1, bounds=None))
    with pytest.raises(ValueError, match="untargeted"):
        AutoAttack(MultiClass(), Linf(0.1, bounds=(0.0, 1.0)), targeted=True)
    with pytest.raises(ValueError, match="attacks"):
        AutoAttack(MultiClass(), Linf(0.1, bounds=(0.0, 1.0)), version="custom")
    with pytest.raises(ValueError, match="attacks"):
        AutoAttack(MultiClass(), Linf(0.1, bounds=(0.0, 1.0)), version="custom", attacks=["pgd"])


def test_autoattack_declares_its_parameters():
    task, threat = MultiClass(), Linf(0.1, bounds=(0.0, 1.0))
    AutoAttack.check_declarations()
    atk = get_attack("autoattack", task, threat, version="custom", attacks=["APGD-CE", "square"], batch_size=8.0)
    assert atk.get_params() == {"version": "custom", "attacks": ["apgd-ce", "square"], "batch_size": 8,
                                "targeted": False, "seed": 0}
    assert AutoAttack(task, threat, **atk.get_params()).fingerprint() == atk.fingerprint()
    assert atk.set_params(batch_size=4).fingerprint() != atk.fingerprint()
    with pytest.raises(ValueError, match="did you mean 'standard'"):
        AutoAttack(task, threat, version="standrd")
    with pytest.raises(ValueError, match="did you mean 'apgd-ce'"):
        AutoAttack(task, threat, version="custom", attacks=["apgd-c"])
    with pytest.raises(ValueError, match="`batch_size` of AutoAttack must be None or an integer >= 1"):
        AutoAttack(task, threat, batch_size=2.5)


def test_autoattack_leaves_the_global_rng_alone(trained_multiclass):
    # regression: pyautoattack calls torch.manual_seed(seed), which reset the caller's random stream
    t = trained_multiclass
    atk = AutoAttack(t.task, Linf(0.05, bounds=(0.0, 1.0)), version="custom", attacks=["apgd-ce"], seed=3)
    torch.manual_seed(123)
    expected = torch.rand(8)
    torch.manual_seed(123)
    first = atk(t.model, t.x[:8], t.y[:8])
    assert torch.equal(torch.rand(8), expected)
    # still seeded: the same seed gives the same adversarial tensor
    assert torch.equal(atk(t.model, t.x[:8], t.y[:8]).x_adv, first.x_adv)


def test_autoattack_runs_every_member_on_2_classes():
    # issue 28: APGD-T takes the targeted CE on 2 classes (was refused: "apgd-t need(s) at least 4 classes")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 2)).eval()
    res = AutoAttack(MultiClass(), Linf(1e-4, bounds=(0.0, 1.0)))(model, torch.rand(3, 1, 4, 4))
    assert res.linf.max() <= 1e-4 + 1e-7
    res = AutoAttack(MultiClass(), Linf(1e-4, bounds=(0.0, 1.0)), version="custom",
                     attacks=["apgd-ce", "fab", "square"])(model, torch.rand(3, 1, 4, 4))
    assert res.linf.max() <= 1e-4 + 1e-7


@pytest.mark.parametrize("num_classes", [4, 6])
def test_autoattack_standard_runs_on_models_with_fewer_than_ten_classes(num_classes):
    # APGD-T and FAB-T take 9 target classes by default; with K <= 9 classes only K - 1 exist
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, num_classes)).eval()
    x = torch.rand(3, 1, 4, 4)
    y = model(x).argmax(1)
    threat = Linf(1e-4, bounds=(0.0, 1.0))  # too small to fool with APGD-CE: the targeted members run too
    res = AutoAttack(MultiClass(), threat, version="standard")(model, x, y)
    assert (res.x_adv - x).abs().max() <= 1e-4 + 1e-7
    assert res.x_adv.min() >= 0.0 and res.x_adv.max() <= 1.0


# --- checkpoint messages ----------------------------------------------------------------------------------
def test_zoo_checkpoint_of_another_architecture_is_a_short_message(tmp_path):
    torch.manual_seed(0)
    state = mrb.build_zoo_architecture(ZOO).state_dict()
    keys = list(state)
    for k in keys[:3]:  # three keys of the architecture missing
        del state[k]
    state["head.weight"], state["head.bias"] = torch.zeros(2, 2), torch.zeros(2)  # two it does not have
    wrong = next(k for k in keys[3:] if k.endswith("conv1.weight"))
    state[wrong] = torch.zeros(3, 3)  # one of the wrong shape
    path = tmp_path / "cifar10" / "Linf" / f"{ZOO}.pt"
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    with pytest.raises(CheckpointError) as err:
        mrb.load_zoo_model(ZOO, tmp_path)
    msg = str(err.value)
    lines = msg.splitlines()
    assert lines[0].startswith(f"RobustBench checkpoint for '{ZOO}' (cifar10/Linf): {path} does not fit RobustBench's "
                               f"{ZOO} architecture")
    assert lines[1] == f"3 key(s) of the model missing in the checkpoint: {', '.join(keys[:3])}"
    assert lines[2] == "2 unexpected key(s) in the checkpoint: head.weight, head.bias"
    assert lines[3].startswith(f"1 shape mismatch(es): {wrong} (checkpoint (3, 3), model (")
    assert len(lines) == 4 and "weights_only" not in msg
    # a checkpoint of an unrelated network: counts and the first few keys only, not torch's list of every key
    torch.save(nn.Sequential(*[nn.Linear(4, 4) for _ in range(30)]).state_dict(), path)
    with pytest.raises(CheckpointError) as err:
        mrb.load_zoo_model(ZOO, tmp_path)
    msg = str(err.value)
    n_model = len([k for k in keys if not k.endswith("num_batches_tracked")])  # BatchNorm fills in its counters
    assert f"{n_model} key(s) of the model missing in the checkpoint: " in msg and f"... and {n_model - 10} more" in msg
    assert "60 unexpected key(s) in the checkpoint: 0.weight, 0.bias, 1.weight" in msg and "... and 50 more" in msg
    assert len(msg) < 1500, len(msg)


@pytest.mark.parametrize("damage", ["truncated", "text", "empty"])
def test_corrupt_zoo_checkpoint_names_the_file(tmp_path, damage):
    path = tmp_path / "cifar10" / "Linf" / f"{ZOO}.pt"
    path.parent.mkdir(parents=True)
    if damage == "truncated":
        torch.save({"w": torch.zeros(1000)}, path)
        path.write_bytes(path.read_bytes()[:2000])
    else:
        path.write_text("" if damage == "empty" else "<html>Google Drive quota exceeded</html>\n")
    with pytest.raises(CheckpointError) as err:
        mrb.load_zoo_model(ZOO, tmp_path)
    msg = str(err.value)
    assert str(path) in msg and "not a valid PyTorch checkpoint" in msg
    assert "weights_only=False" not in msg and len(msg.splitlines()) == 1
    assert err.value.__cause__ is None and err.value.__suppress_context__  # torch's advice is not chained either
