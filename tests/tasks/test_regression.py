"""The ``regression`` task kind: semantics, refusals, every registered attack, and a model trained on real data.

Real data: crops of the MNI152 T1 template (nilearn wheel, offline) with their grey- and white-matter volume
fractions as targets (:func:`medadv.data.regression.tissue_fractions`); a small CNN trained here in seconds.
"""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from medadv import APGD, PGD, AutoEvaluation, CosPGD, Linf, MultiClass, Regression, evaluate
from medadv.attacks.base import attack_class, available_attacks, get_attack
from medadv.tasks import available_tasks, get_task, task_class
from medadv.threats import Box

EPS = 4 / 255  # the stated budget: L∞ on [0, 1] T1 intensities


# --- semantics ----------------------------------------------------------------------------------------------------
def test_registered_after_the_builtin_kinds_with_its_declarations() -> None:
    assert available_tasks()[:4] == ["multiclass", "multilabel", "segmentation", "regression"]
    t = get_task("regression", tolerance=0.05, loss="huber", huber_delta=0.1)
    assert isinstance(t, Regression) and task_class("regression") is Regression
    assert Regression.headline == "mae" and not Regression.higher_is_better
    assert Regression.label_source == "values" and Regression.case_view == "values"
    assert "apgd-signed" in Regression.auto_members
    schema = Regression.config_schema()
    assert schema.model_validate({"type": "regression", "tolerance": 0.05, "relative": True}).relative is True


@pytest.mark.parametrize("bad", [{"loss": "mae"}, {"tolerance": 0}, {"tolerance": -1.0}, {"huber_delta": 0.0},
                                 {"relative": "yes"}])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises((ValueError, TypeError), match=next(iter(bad))):
        Regression(**bad)


def test_losses_fooled_margin_and_metrics() -> None:
    y = torch.tensor([[1.0, 2.0], [0.0, 10.0]])
    p = torch.tensor([[1.05, 2.0], [0.3, 10.0]])
    t = Regression(tolerance=0.1)
    assert torch.allclose(t.element_loss(p, y), (p - y) ** 2)
    assert torch.allclose(Regression(loss="l1").element_loss(p, y), (p - y).abs())
    assert torch.allclose(Regression(loss="huber", huber_delta=0.1).element_loss(p, y),
                          torch.nn.functional.huber_loss(p, y, reduction="none", delta=0.1))
    assert t.fooled(p, y).tolist() == [False, True]  # sample 1: an output 0.3 off
    assert t.fooled(p, y, targeted=True).tolist() == [True, False]
    assert torch.allclose(t.element_margin(p, y), 0.1 - (p - y).abs())
    out = t.outcome(p, y)
    assert torch.allclose(out.columns["mae"], torch.tensor([0.025, 0.15]))
    assert torch.allclose(out.columns["max_error"], torch.tensor([0.05, 0.3]))
    assert torch.allclose(out.columns["rmse"], ((p - y) ** 2).mean(1).sqrt())
    # closeness 1 / (1 + largest error in tolerance units): 0.5 exactly at the tolerance
    assert torch.allclose(t.robust_metric(p, y), torch.tensor([1 / 1.5, 1 / 4.0]))
    assert float(t.robust_metric(y + 0.1, y)[0]) == pytest.approx(0.5)
    # relative: 10 % of |y| (sample 0's 0.05 on 1.0 is within; 0.3 on y = 0 is not)
    r = Regression(tolerance=0.1, relative=True)
    assert r.fooled(p, y).tolist() == [False, True]
    cols = t.sample_columns(y, t.outcome(y, y), out)
    assert torch.allclose(cols["induced_error"], torch.tensor([0.05, 0.3]))
    assert cols["changed"].tolist() == [False, True]


def test_dense_maps_and_parse_labels() -> None:
    t = Regression(tolerance=0.1)
    y = torch.zeros(2, 1, 4, 4)
    p = y.clone()
    p[1, 0, 2, 2] = 0.5
    t.validate(p, y)
    assert t.fooled(p, y).tolist() == [False, True] and "pred" not in t.outcome(p, y).columns
    assert t.parse_labels(torch.tensor([1, 2]), torch.zeros(2, 1, 4, 4)).shape == (2, 1)


def test_bad_outputs_and_labels_are_refused() -> None:
    t = Regression()
    with pytest.raises(ValueError, match=re.escape("(N, 1), not (N,)")):
        t.validate(torch.zeros(3), None)
    with pytest.raises(TypeError, match="floating target values"):
        t.validate(torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=re.escape("shape (3, 2)")):
        t.validate(torch.zeros(3, 2), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="NaN or Inf"):
        t.validate(torch.zeros(3, 2), torch.full((3, 2), float("nan")))


# --- refusals: what needs class distributions -----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["distributions", "log_probs", "target_cosine", "least_likely"])
def test_class_distribution_quantities_are_refused_with_what_to_use(method: str) -> None:
    t, z = Regression(), torch.zeros(2, 2)
    args = (z,) if method in ("log_probs", "least_likely") else (z, z)
    with pytest.raises(NotImplementedError, match="Use PGD, FGSM, BIM, SegPGD or APGD"):
        getattr(t, method)(*args)


def test_apgd_losses_that_do_not_apply_are_refused_before_work() -> None:
    threat = Linf(0.1, bounds=(0.0, 1.0))
    with pytest.raises(TypeError, match="loss='margin'"):
        APGD(Regression(), threat, loss="dlr")
    with pytest.raises(TypeError, match="loss='ce'"):
        APGD(Regression(), threat, loss="balanced-ce")
    with pytest.raises(TypeError, match="signed_error"):
        APGD(MultiClass(), threat, loss="signed-up")
    with pytest.raises(TypeError, match="untargeted"):
        APGD(Regression(), threat, loss="signed-down", targeted=True)


def _small(cls: type, ex) -> dict:
    names = cls.param_names()
    kw: dict = {k: v for k, v in {"steps": 3, "queries": 20}.items() if k in names}
    if cls.__name__ == "AutoEvaluation":
        kw["version"] = "fast"
    if "generator" in names:
        conv = nn.Conv2d if ex.x.ndim == 4 else nn.Conv3d
        torch.manual_seed(1)
        kw["generator"] = nn.Sequential(conv(1, 1, 3, padding=1), nn.Tanh())
    return kw


@pytest.mark.parametrize("key", [ex.key for ex in Regression.examples()])
@pytest.mark.parametrize("name", available_attacks())
def test_every_registered_attack_works_or_is_refused_with_what_to_use(name: str, key: str) -> None:
    """Each attack either returns x_adv in the box and ball, leaving the model and x as they were, or refuses
    the kind before any adversarial step (construction, or the first objective) saying what to use instead."""
    ex = next(e for e in Regression.examples() if e.key == key)
    cls = attack_class(name)
    threat = Box(0.0, 1.0) if cls.threat_kind == "box" else Linf(0.1, bounds=(0.0, 1.0))
    x0 = ex.x.clone()
    weights = [p.detach().clone() for p in ex.model.parameters()]
    try:
        atk = get_attack(name, ex.task, threat, **_small(cls, ex))
        res = atk(ex.model, ex.x, ex.target if cls.always_targeted else ex.y)
    except TypeError as e:  # the attack's declared tasks (AutoAttack, DAG, VAFA) or its class-score objective
        assert "Regression" in str(e)
        assert "must be" in str(e) or ("not class scores" in str(e) and cls.needs_class_scores)
        return
    except NotImplementedError as e:  # needs class distributions: the task's own refusal names the alternatives
        assert "Use PGD" in str(e)
        return
    assert torch.equal(ex.x, x0) and res.x_adv.shape == ex.x.shape
    assert float(res.x_adv.min()) >= 0.0 and float(res.x_adv.max()) <= 1.0
    if cls.threat_kind != "box":
        assert float((res.x_adv - ex.x).abs().max()) <= 0.1 + 1e-6
    assert all(torch.equal(a, b) for a, b in zip(weights, ex.model.parameters(), strict=True))
    assert not ex.model.training and res.fooled.dtype == torch.bool


def test_class_score_attacks_are_refused_before_work() -> None:
    ex = Regression.example()
    with pytest.raises(TypeError, match="not class scores: use PGD"):
        CosPGD(ex.task, Linf(0.1, bounds=(0.0, 1.0)), steps=2)
    with pytest.raises(TypeError, match="not class scores: use loss='ce'"):
        APGD(ex.task, Linf(0.1, bounds=(0.0, 1.0)), loss="js")
    with pytest.raises(NotImplementedError, match="CosPGD's weight"):  # the task's own refusal, for direct use
        ex.task.target_cosine(ex.model(ex.x), ex.y)


# --- a model trained on real data -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained():
    """A small CNN regressing the grey/white-matter fractions of 24x24 MNI152 crops (2 mm), trained here."""
    from medadv.data.regression import tissue_fractions
    from medadv.models import small_cnn

    x, y = tissue_fractions(384, size=24, split="train", seed=0)
    xt, yt = tissue_fractions(32, size=24, split="test", seed=1)
    torch.manual_seed(0)
    net = small_cnn(1, 2, width=8)
    opt = torch.optim.Adam(net.parameters(), 3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        idx = torch.randint(0, x.shape[0], (48,), generator=g)
        loss = ((net(x[idx]) - y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    return net, xt, yt


def _induced(net: nn.Module, x: torch.Tensor, x_adv: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return (net(x_adv) - net(x)).abs().amax(dim=1)


def test_trained_model_learns_the_real_targets(trained) -> None:
    net, x, y = trained
    with torch.no_grad():
        mae = (net(x) - y).abs().mean(dim=0)
    baseline = (y - y.mean(dim=0)).abs().mean(dim=0)
    assert bool((mae < 0.6 * baseline).all()), (mae, baseline)


def test_pgd20_moves_the_output_5x_more_than_random_noise_of_the_same_norm(trained) -> None:
    net, x, y = trained
    task = Regression(tolerance=0.05)
    res = PGD(task, Linf(EPS, bounds=(0.0, 1.0)), steps=20)(net, x, y)
    g = torch.Generator().manual_seed(0)
    noise = (x + EPS * (2.0 * torch.randint(0, 2, x.shape, generator=g) - 1.0)).clamp(0.0, 1.0)  # ±ε per pixel
    ratio = float(_induced(net, x, res.x_adv).mean() / _induced(net, x, noise).mean())
    assert ratio >= 5.0, ratio


def _largest_error(net: nn.Module, x_adv: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((net(x_adv) - y).abs().amax(dim=1).mean())


def test_auto_induces_at_least_pgd100s_error(trained) -> None:
    """Against the true values, auto's largest error ≥ PGD-100's; attacking the clean prediction (``y=None``), the
    move it induces in the output ≥ PGD-100's."""
    net, x, y = trained
    task = Regression(tolerance=0.05)
    threat = Linf(EPS, bounds=(0.0, 1.0))
    pgd = PGD(task, threat, steps=100)(net, x, y)
    auto = AutoEvaluation(task, threat, version="fast")(net, x, y)
    assert _largest_error(net, auto.x_adv, y) >= _largest_error(net, pgd.x_adv, y)
    with torch.no_grad():
        assert float(task.robust_metric(net(auto.x_adv), y).mean()) <= float(task.robust_metric(net(pgd.x_adv), y).mean())
    assert auto.details.masking == []  # the unbounded attack drives the closeness down: no masking flag
    assert auto.details.components == ["apgd-ce", "apgd-signed"]
    pgd0 = PGD(task, threat, steps=100)(net, x)
    auto0 = AutoEvaluation(task, threat, version="fast", checks=False)(net, x)
    assert float(_induced(net, x, auto0.x_adv).mean()) >= float(_induced(net, x, pgd0.x_adv).mean())


def test_apgd_signed_losses_move_the_output_up_and_down(trained) -> None:
    net, x, y = trained
    threat = Linf(EPS, bounds=(0.0, 1.0))
    with torch.no_grad():
        clean = net(x)
        # y=None: the clean prediction, where the squared error's gradient vanishes and the signed error's does not
        up = net(APGD(Regression(), threat, steps=10, loss="signed-up", random_start=False)(net, x).x_adv)
        down = net(APGD(Regression(), threat, steps=10, loss="signed-down", random_start=False)(net, x).x_adv)
    assert bool((up.mean(dim=1) > clean.mean(dim=1)).all()) and bool((down.mean(dim=1) < clean.mean(dim=1)).all())


def test_evaluate_gives_the_regression_columns(trained) -> None:
    net, x, y = trained
    task = Regression(tolerance=0.05)
    res = evaluate(net, task, (x[:8], y[:8]), {"pgd": PGD(task, Linf(EPS, bounds=(0.0, 1.0)), steps=5)})
    row = res.rows[0]
    for col in ("clean_mae", "adv_mae", "clean_rmse", "adv_rmse", "clean_max_error", "adv_max_error",
                "clean_closeness", "adv_closeness", "induced_error", "changed", "flipped", "label"):
        assert col in row, col
    assert len(row["adv_pred"]) == 2
    assert np.mean([r["adv_mae"] for r in res.rows]) > np.mean([r["clean_mae"] for r in res.rows])


def test_config_run_writes_a_report_with_the_error_scatter(trained, tmp_path) -> None:
    from medadv.cli import main
    from medadv.models import save_checkpoint

    net, x, y = trained
    save_checkpoint(tmp_path / "cnn.pt", net)
    np.savez(tmp_path / "data.npz", x=x[:12].numpy(), y=y[:12].numpy())
    cfg = {
        "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 2, "width": 8},
                  "checkpoint": "cnn.pt"},
        "task": {"type": "regression", "tolerance": 0.05, "class_names": ["grey matter", "white matter"]},
        "data": {"source": "npz", "path": "data.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": [EPS],
        "attacks": [{"name": "pgd", "steps": 5}],
        "batch_size": 12,
        "output": "out",
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert len(rows) == 12 and all("adv_mae" in r and "induced_error" in r for r in rows)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "max_error per case, clean vs attacked" in html


def test_csv_source_reads_real_valued_targets(tmp_path) -> None:
    from medadv.config_schema import ConfigError, CsvData
    from medadv.data.sources import make_loader

    for i in range(2):
        np.save(tmp_path / f"img{i}.npy", np.random.default_rng(i).random((1, 8, 8)).astype(np.float32))
    with (tmp_path / "cases.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image", "volume_ml", "age"])
        w.writerows([["img0.npy", "12.5", "63"], ["img1.npy", "-0.25", "41.5"]])
    conf = CsvData(source="csv", path="cases.csv", label_columns=["volume_ml", "age"])
    batch = next(iter(make_loader(conf, tmp_path, batch_size=2, label_source=Regression.label_source)))
    assert torch.allclose(batch["label"], torch.tensor([[12.5, 63.0], [-0.25, 41.5]]))
    with pytest.raises(ConfigError, match="multi-label columns hold 0 or 1"):  # a multi-label task still refuses
        make_loader(conf, tmp_path, label_source="vector")
