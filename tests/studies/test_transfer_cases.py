"""Case figures of the transfer study (Paschali et al.'s Fig. 2, Malik et al.'s Figs. 2/7): examples crafted on
one surrogate, drawn with each target's own predictions, and the matched-noise image."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import medadv.report.cases as cases_module
from medadv import FGSM, Linf, MultiClass
from medadv.studies import transfer
from medadv.studies.registry import run_study


class Const(nn.Module):
    """A stub target: always class 2, whatever the input (its logits are fixed)."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor([0.0, 1.0, 4.0]), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.shape[0], 3) + 0.0 * x.flatten(1).sum(1, keepdim=True)


def _tiny(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12 * 12, 3))


@pytest.fixture
def setting():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(5, 1, 12, 12, generator=g)
    y = torch.randint(0, 2, (5,), generator=g)
    task = MultiClass()
    return x, y, task, {"fgsm": FGSM(task, Linf(8 / 255, bounds=(0, 1)))}


@pytest.fixture
def drawn(monkeypatch):
    """The Case objects the study's figures were drawn from (``case_meta`` draws each with ``plot_case``)."""
    seen: list = []
    real = cases_module.plot_case
    monkeypatch.setattr(cases_module, "plot_case", lambda c, *a, **kw: (seen.append(c), real(c, *a, **kw))[1])
    return seen


def test_two_targets_give_one_figure_each_with_the_targets_prediction(setting, drawn):
    x, y, task, attacks = setting
    src, plain, stub = _tiny(1), _tiny(2), Const()
    r = transfer({"src": src}, {"plain": plain, "stub": stub}, task, (x, y), attacks, cases=1)
    entries = r.meta["cases"]
    assert [e["title"].split(" · sample")[0] for e in entries] == [
        "fgsm ε=0.03137 (8/255) · from src · on plain", "fgsm ε=0.03137 (8/255) · from src · on stub"]
    assert all(e["png"] and e["width"] > 0 and e["height"] > 0 for e in entries)
    json.dumps(r.meta)  # strict JSON, as the study files are written
    on_stub = drawn[1]
    # the prediction drawn is the target's (the stub always says class 2), not the surrogate's
    assert int(on_stub.clean) == 2 and int(on_stub.adv) == 2
    assert torch.allclose(on_stub.adv_scores, torch.softmax(torch.tensor([0.0, 1.0, 4.0]), 0))
    # the attacked image is the one crafted on the surrogate
    i = int(entries[1]["title"].rsplit("sample ", 1)[1])
    assert torch.allclose(on_stub.x_adv, attacks["fgsm"](src, x, y).x_adv[i])
    with torch.no_grad():
        assert int(drawn[0].adv) == int(plain(on_stub.x_adv[None]).argmax(1))


def test_white_box_target_is_left_out_and_options_are_checked(setting):
    x, y, task, attacks = setting
    a, b = _tiny(1), _tiny(2)
    r = transfer({"a": a}, {"a": a, "b": b}, task, (x, y), attacks, cases=2)
    assert {e["title"].split(" · sample")[0].rsplit(" on ", 1)[1] for e in r.meta["cases"]} == {"b"}
    assert len(r.meta["cases"]) == 2
    # an attack is chosen by its entry name, with or without the budget
    r = transfer({"a": a}, {"b": b}, task, (x, y), {"fgsm@0.0314": attacks["fgsm"]}, cases=1, case_attacks=["fgsm"])
    assert len(r.meta["cases"]) == 1
    with pytest.raises(ValueError, match="case_surrogate.*did you mean 'a'"):
        transfer({"a": a}, {"b": b}, task, (x, y), attacks, cases=1, case_surrogate="aa")
    with pytest.raises(ValueError, match="case_attacks.*'pgd'"):
        transfer({"a": a}, {"b": b}, task, (x, y), attacks, cases=1, case_attacks=["pgd"])
    with pytest.raises(ValueError, match="`cases`"):
        transfer({"a": a}, {"b": b}, task, (x, y), attacks, cases=-1)
    assert "cases" not in transfer({"a": a}, {"b": b}, task, (x, y), attacks).meta


def test_noise_case_is_drawn_on_the_same_sample(setting, drawn):
    x, y, task, attacks = setting
    r = transfer({"src": _tiny(1)}, {"t": _tiny(2)}, task, (x, y), attacks, cases=1, noise="rician")
    titles = [e["title"] for e in r.meta["cases"]]
    assert len(titles) == 2 and titles[1].startswith("Rician noise, SSIM 0.") and " · on t" in titles[1]
    assert titles[0].rsplit("sample ", 1)[1] == titles[1].rsplit("sample ", 1)[1]
    noisy = drawn[1]
    assert not torch.equal(noisy.x_adv, noisy.x) and float(noisy.x_adv.min()) >= 0.0


def test_config_entry_with_cases(setting):
    x, y, task, attacks = setting
    models = {"m": _tiny(1), "m-src": _tiny(2)}
    r = run_study("transfer", {"surrogates": ["m-src"], "targets": ["m"], "cases": {"k": 1, "surrogate": "m-src"}},
                  models, task, (x, y), attacks)
    assert len(r.meta["cases"]) == 1 and r.meta["cases"][0]["title"].startswith("fgsm ε=0.03137 (8/255) · from m-src")
    r = run_study("transfer", {"cases": 1}, models, task, (x, y), attacks)
    assert len(r.meta["cases"]) == 1  # the short form; the first surrogate's own cell (white-box) is left out
    with pytest.raises(Exception, match="did you mean `k`"):
        run_study("transfer", {"cases": {"kk": 1}}, models, task, (x, y), attacks)


class Levels(nn.Module):
    """3-D segmentation into 3 classes voxel by voxel: the class whose level is nearest the intensity."""

    def __init__(self, levels: tuple[float, float, float]) -> None:
        super().__init__()
        self.levels = nn.Parameter(torch.tensor(levels), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -50.0 * (x - self.levels.reshape(1, -1, 1, 1, 1)) ** 2


def test_volumes_are_drawn_with_their_spacing_on_each_target(drawn):
    from medadv.tasks import Segmentation

    y = torch.zeros(2, 10, 10, 10, dtype=torch.long)
    y[:, 2:6, 2:6, 2:6] = 1
    y[:, 6:9, 6:9, 6:9] = 2
    x = torch.tensor([0.1, 0.5, 0.9])[y].unsqueeze(1)
    task = Segmentation(3)
    a, b, c = Levels((0.1, 0.5, 0.9)), Levels((0.1, 0.6, 0.9)), Levels((0.1, 0.4, 0.8))
    r = transfer({"a": a}, {"b": b, "c": c}, task, (x, y), {"fgsm": FGSM(task, Linf(0.2, bounds=(0, 1)))},
                 cases=1, spacing=2.0, hd95=True)
    assert [e["title"].split(" · sample")[0].rsplit(" on ", 1)[1] for e in r.meta["cases"]] == ["b", "c"]
    assert all(case.volumetric and tuple(case.spacing) == (2.0, 2.0, 2.0) for case in drawn)
    # b and c read the same attacked volume differently: each case draws its own target's label map
    with torch.no_grad():
        for case, model in zip(drawn, (b, c), strict=True):
            assert torch.equal(case.adv, model(case.x_adv[None]).argmax(1)[0])
    assert torch.equal(drawn[0].x_adv, drawn[1].x_adv) and not torch.equal(drawn[0].adv, drawn[1].adv)
