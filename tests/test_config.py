"""Every registered attack from a config entry; unknown keys named with the closest valid one."""

from __future__ import annotations

import pytest
import torch
import yaml

import medadv  # noqa: F401  (registers every attack)
from medadv.attacks.base import attack_class, available_attacks, get_attack
from medadv.config import build_attacks, build_target_fn
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import L2, Box, Linf

BASE = {"threat": {"norm": "linf", "bounds": [0.0, 1.0]}, "budgets": [0.05, 0.1]}


def _task_for(name: str):
    cls = attack_class(name)
    from medadv.tasks import registered_task_classes

    # the built-in kinds first, then every kind registered later (its first example's task)
    later = (k.example().task for k in registered_task_classes() if k not in (MultiClass, MultiLabel, Segmentation))
    for task in (MultiClass(), MultiLabel(), Segmentation(3), *later):
        if not cls.tasks or any(c.__name__ in cls.tasks for c in type(task).__mro__):
            return task
    raise AssertionError(f"{name} admits no task")


def _cfg(entries, **over):
    # through YAML text, as `medadv evaluate` reads it
    return yaml.safe_load(yaml.safe_dump({**BASE, "attacks": entries, **over}))


@pytest.mark.parametrize("name", available_attacks())
def test_every_registered_attack_builds_from_its_name(name):
    cls = attack_class(name)
    if name == "gap":  # a generator built fresh from its name is untrained: refused before anything runs
        with pytest.raises(ValueError, match="untrained: give `generator: {checkpoint: gap.pt}`"):
            build_attacks(_cfg([{"name": name}]), _task_for(name))
        return
    built = build_attacks(_cfg([{"name": name}]), _task_for(name))
    if cls.threat_kind == "box":
        # no ε-ball: the threat's data box, once, budget None
        assert list(built) == [name]
        assert built[name].budget is None and built[name].threat is None
        assert built[name].box == Box(0.0, 1.0)
    else:
        assert list(built) == [f"{name}@0.05", f"{name}@0.1"]
        assert [a.budget for a in built.values()] == [0.05, 0.1]
        # the task's own data box (a promptable task's pins its prompt-code channels)
        box = _task_for(name).input_box(0.0, 1.0)
        assert all(isinstance(a.threat, Linf) and a.box == box for a in built.values())
        assert box == Box(0.0, 1.0) or type(box) is not Box
    assert all(type(a) is cls for a in built.values())


def test_box_attacks_need_no_budgets_and_ball_attacks_get_one_per_budget():
    task = Segmentation(3)
    built = build_attacks(_cfg(["vafa", {"name": "pgd", "steps": 3}], budgets=[0.01, 0.02, 0.03]), task)
    assert list(built) == ["vafa", "pgd@0.01", "pgd@0.02", "pgd@0.03"]
    assert built["pgd@0.03"].steps == 3
    only_box = {"threat": {"bounds": [0.0, 1.0]}, "attacks": [{"name": "vafa", "block": 8}]}
    assert build_attacks(only_box, task)["vafa"].block == (8, 8, 8)
    with pytest.raises(ValueError, match="budgets"):
        build_attacks({"threat": {"bounds": [0.0, 1.0]}, "attacks": ["pgd"]}, task)


def test_ball_or_box_attacks_get_the_ball():
    task = Segmentation(3)
    cls = attack_class("dag")
    assert cls.threat_kind == "ball_or_box"
    built = build_attacks(_cfg([{"name": "dag", "steps": 5}]), task)
    assert list(built) == ["dag@0.05", "dag@0.1"] and built["dag@0.1"].threat.eps == 0.1


def test_l2_threat_and_labels():
    built = build_attacks(_cfg([{"name": "pgd", "label": "pgd-l2"}], threat={"norm": "l2", "bounds": [0, 1]}),
                          MultiClass())
    assert all(isinstance(a.threat, L2) for a in built.values()) and "pgd-l2@0.1" in built


def test_unknown_keys_are_named_with_the_closest_valid_one():
    task = MultiClass()
    with pytest.raises(InvalidParameterError,
                       match=r"`attacks` entry 'pgd': unknown parameter `stepz` for attack 'pgd'; did you mean 'steps'"):
        build_attacks(_cfg([{"name": "pgd", "stepz": 3}]), task)
    with pytest.raises(InvalidParameterError, match=r"unknown attack 'pgdd'; did you mean 'pgd'"):
        build_attacks(_cfg([{"name": "pgdd"}]), task)
    with pytest.raises(ValueError, match=r"unknown key `bound` in `threat`; did you mean `bounds`"):
        build_attacks(_cfg(["pgd"], threat={"bound": [0, 1]}), task)
    with pytest.raises(InvalidParameterError, match=r"`steps` of PGD must be an integer >= 1; got 2.5"):
        build_attacks(_cfg([{"name": "pgd", "steps": 2.5}]), task)
    with pytest.raises(ValueError, match="needs a `name`"):
        build_attacks(_cfg([{"steps": 2}]), task)
    with pytest.raises(ValueError, match="non-empty list"):
        build_attacks(_cfg([]), task)


def test_components_are_given_by_name():
    from medadv.explain import Explanation, available_explanations

    takes = [n for n in available_attacks() if "explanation" in attack_class(n).param_names()]
    assert takes, "no registered attack takes an explanation"
    assert "smoothgrad" in available_explanations()
    for name in takes:
        # a name, or a mapping with the component's own parameters
        for expl in ("smoothgrad", {"name": "smoothgrad", "n_samples": 3}):
            (atk,) = build_attacks(_cfg([{"name": name, "explanation": expl}], budgets=[0.1]),
                                   _task_for(name)).values()
            assert isinstance(atk.explanation, Explanation) and atk.explanation.name == "smoothgrad"
        assert atk.explanation.n_samples == 3
    with pytest.raises(InvalidParameterError, match=r"did you mean"):
        build_attacks(_cfg([{"name": takes[0], "explanation": "smoothgrd"}]), _task_for(takes[0]))


def test_target_functions():
    x, y = torch.rand(2, 1, 4, 4), torch.tensor([[0, 1], [2, 1]]).repeat_interleave(2, 1)[:, None].expand(2, 4, 4)
    seg = Segmentation(3)
    logits = torch.randn(2, 3, 4, 4)
    assert build_target_fn(None, seg) is None
    bg = build_target_fn("background", seg)
    assert torch.equal(bg(x, y, logits), torch.zeros_like(y))
    ll = build_target_fn("least_likely", seg)
    assert torch.equal(ll(x, y, logits), logits.argmin(1))
    assert bg.__qualname__ != ll.__qualname__  # evaluate() fingerprints targeted rows by this name
    assert build_target_fn("medadv.attacks.dag:dag_target_a", seg).__name__ == "dag_target_a"
    with pytest.raises(ValueError, match=r"did you mean 'background'"):
        build_target_fn("backgrund", seg)


def test_label_names_the_entry_unless_the_attack_has_a_label_parameter():
    task = MultiLabel()
    built = build_attacks(_cfg([{"name": "saliency_relevance", "label": 2, "id": "rel-2"}]), task)
    assert list(built) == ["rel-2@0.05", "rel-2@0.1"] and built["rel-2@0.05"].label == 2
    built = build_attacks(_cfg([{"name": "saliency_relevance", "label": 1}]), task)
    assert list(built) == ["saliency_relevance@0.05", "saliency_relevance@0.1"]
    assert built["saliency_relevance@0.1"].label == 1
    built = build_attacks(_cfg([{"name": "pgd", "label": "pgd-a"}, {"name": "pgd", "id": "pgd-b", "steps": 3}]), task)
    assert list(built) == ["pgd-a@0.05", "pgd-a@0.1", "pgd-b@0.05", "pgd-b@0.1"]


def test_component_checkpoints_are_relative_to_the_config_folder(tmp_path):
    from medadv.models.generators import UnetGenerator
    from medadv.training import GAPTrainer

    task = MultiLabel()
    gap = get_attack("gap", task, Linf(0.05, bounds=(0.0, 1.0)), generator=UnetGenerator(1, ngf=4, depth=2))
    x = torch.rand(4, 1, 16, 16)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256, 3))
    GAPTrainer(gap, model, epochs=1, checkpoint=str(tmp_path / "gap.pt")).fit(x)
    cfg = {**_cfg([{"name": "gap", "generator": {"checkpoint": "gap.pt"}}]), "_dir": str(tmp_path)}
    built = build_attacks(cfg, task)
    assert built["gap@0.05"].trained


# --- whole volumes: `inference:` wraps the model in MONAI sliding-window inference -------------------------------
def test_inference_section_wraps_the_model_in_a_sliding_window():
    from medadv.config import wrap_inference
    from medadv.models import small_unet
    from medadv.models.sliding import SlidingWindow

    torch.manual_seed(0)
    net = small_unet(1, 3, ndim=3, channels=(4, 8)).eval()
    assert wrap_inference(net, None) is net
    sw = wrap_inference(net, {"roi_size": [8, 8, 8], "overlap": 0.25, "sw_batch_size": 2, "mode": "constant"})
    assert isinstance(sw, SlidingWindow) and sw.model is net
    assert (sw.roi_size, sw.overlap, sw.sw_batch_size, sw.mode, sw.checkpoint) == ([8, 8, 8], 0.25, 2, "constant", True)
    with pytest.raises(ValueError, match=r"unknown key `roi_sise` in `inference`; did you mean `roi_size`\?"):
        wrap_inference(net, {"roi_sise": 8})
    # a whole 12 x 14 x 10 volume through 8^3 windows; the attack's budget holds on the whole volume
    x, y = torch.rand(1, 1, 12, 14, 10), torch.randint(0, 3, (1, 12, 14, 10))
    assert sw(x).shape == (1, 3, 12, 14, 10)
    res = get_attack("pgd", Segmentation(3), Linf(0.05, bounds=(0.0, 1.0)), steps=2)(sw, x, y)
    assert res.x_adv.shape == x.shape and float(res.linf.max()) <= 0.05 + 1e-6


def test_window_checkpointing_gives_the_same_values_and_gradients():
    from medadv.models import small_unet
    from medadv.models.sliding import SlidingWindow

    torch.manual_seed(0)
    net = small_unet(1, 3, ndim=3, channels=(4, 8)).eval().requires_grad_(False)
    x = torch.rand(1, 1, 14, 12, 10)
    grads, outs = [], []
    for checkpoint in (False, True):
        xv = x.clone().requires_grad_(True)
        out = SlidingWindow(net, 8, overlap=0.5, sw_batch_size=3, checkpoint=checkpoint)(xv)
        (g,) = torch.autograd.grad(out.square().mean(), xv)
        outs.append(out.detach())
        grads.append(g)
    assert torch.equal(outs[0], outs[1]) and torch.allclose(grads[0], grads[1], atol=1e-7, rtol=1e-5)
    assert grads[0].abs().sum() > 0


# --- the resume fingerprint: the whole config and the data's identity ----------------------------------------------
def test_config_fingerprint_covers_the_config_the_data_and_the_model_files(tmp_path):
    import numpy as np

    from medadv.config import config_fingerprint, load_config

    np.savez(tmp_path / "d.npz", x=np.zeros((2, 1, 4, 4), np.float32), y=np.arange(2))
    (tmp_path / "w.pt").write_bytes(b"weights")
    cfg = {"model": {"builder": "small_cnn", "checkpoint": "w.pt"}, "task": {"type": "multiclass"},
           "data": {"source": "npz", "path": "d.npz"}, "threat": {"bounds": [0, 1]}, "budgets": [0.1],
           "attacks": ["fgsm"], "output": "a"}

    def fp(**over):
        (tmp_path / "c.yaml").write_text(yaml.safe_dump({**cfg, **over}))
        return config_fingerprint(load_config(tmp_path / "c.yaml"))

    base = fp()
    assert fp() == base and fp(output="elsewhere") == base  # where results go is not what they are
    assert len({base, fp(budgets=[0.2]), fp(batch_size=2), fp(seed=1), fp(hd95=True),
                fp(attacks=[{"name": "fgsm", "id": "x"}])}) == 6
    import os

    st = (tmp_path / "d.npz").stat()
    os.utime(tmp_path / "d.npz", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the data changed
    changed = fp()
    assert changed != base
    (tmp_path / "w.pt").write_bytes(b"other weights")  # the checkpoint changed
    assert fp() != changed
