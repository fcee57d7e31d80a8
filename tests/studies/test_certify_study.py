"""The ``certify`` study: certified vs. empirical curves of one smoothed model, its config entry and its report."""

from __future__ import annotations

import pytest
import torch
import yaml

from medadv.config_schema import ConfigError
from medadv.params import InvalidParameterError
from medadv.studies import StudyResult, certify, run_study, validate_studies
from medadv.studies.certify import NoiseExpectation

SMALL = {"sigma": 0.12, "n0": 8, "n": 64, "batch_size": 512, "empirical_steps": 3, "draws": 4}


def _curve(result: StudyResult) -> list[dict]:
    return [r for r in result.rows if r["kind"] == "curve"]


@pytest.fixture(scope="module")
def ml_run(trained_multilabel):
    t = trained_multilabel
    return certify(t.model, t.task, (t.x[:8], t.y[:8]), radii=[0.1, 0.25, 0.5], bounds=(0.0, 1.0), **SMALL)


def test_curves_are_monotone_and_certified_is_below_empirical(ml_run):
    curve = _curve(ml_run)
    assert [r["radius"] for r in curve] == [0.0, 0.1, 0.25, 0.5]
    cert = [r["certified"] for r in curve]
    emp = [r["empirical"] for r in curve]
    assert all(a >= b for a, b in zip(cert, cert[1:], strict=False))
    assert all(a >= b for a, b in zip(emp, emp[1:], strict=False))
    assert cert[0] > 0.5  # the trained model, smoothed, is mostly right on clean inputs
    assert all(c <= e + 1e-9 for c, e in zip(cert, emp, strict=True)) and not any(r["violation"] for r in curve)
    assert ml_run.meta["violations"] == [] and ml_run.meta["metric"] == "exact_match"


def test_sample_and_label_rows(ml_run, trained_multilabel):
    samples = [r for r in ml_run.rows if r["kind"] == "sample"]
    labels = [r for r in ml_run.rows if r["kind"] == "label"]
    assert len(samples) == 8 and len(labels) == trained_multilabel.y.shape[1]
    for r in samples:
        assert r["cert_fraction@0.1"] >= r["cert_fraction@0.25"] >= r["cert_fraction@0.5"]
        assert 0.0 <= r["abstain_fraction"] <= 1.0 and r["cert_radius"] <= r["median_radius"] + 1e-9
        assert r["certified@0.1"] <= r["empirical@0.1"] + 1e-9
    # the curve is the mean of the per-sample metrics
    assert _curve(ml_run)[1]["certified"] == pytest.approx(sum(r["certified@0.1"] for r in samples) / 8)


def test_same_seed_same_rows(trained_multilabel, ml_run):
    t = trained_multilabel
    once = certify(t.model, t.task, (t.x[:8], t.y[:8]), radii=[0.1, 0.25, 0.5], bounds=(0.0, 1.0), **SMALL)
    assert once.rows == ml_run.rows and once.meta == ml_run.meta


def test_noise_expectation_is_a_fixed_average(trained_multilabel):
    t = trained_multilabel
    sur = NoiseExpectation(t.model, t.task, 0.12, draws=3, seed=5)
    x = t.x[:2]
    with torch.no_grad():
        a, b = sur(x), sur(x)
        gen = torch.Generator().manual_seed(5)
        noise = torch.randn((3, *x.shape[1:]), generator=gen)
        p = torch.stack([torch.sigmoid(t.model(x + 0.12 * z)) for z in noise]).mean(0)
    assert torch.equal(a, b)
    assert torch.allclose(torch.sigmoid(a), p, atol=1e-5)
    assert torch.equal(sur(x[:1]).detach(), a[:1])  # independent of the batch it is in


def test_segmentation_with_pgd(trained_seg2d):
    t = trained_seg2d
    r = certify(t.model, t.task, (t.x[:2], t.y[:2]), radii=[0.05, 0.2], empirical="pgd", bounds=None,
                **{**SMALL, "n": 32})
    curve = _curve(r)
    assert r.meta["metric"] == "mean_dice" and r.meta["family"] == "segmentation"
    assert all(c["certified"] <= c["empirical"] + 1e-9 for c in curve)
    assert not any(row["kind"] == "label" for row in r.rows)
    none = certify(t.model, t.task, (t.x[:2], t.y[:2]), radii=[0.05], empirical="none", **{**SMALL, "n": 32})
    assert [c["empirical"] for c in _curve(none)] == [None, None] and _curve(none)[0]["violation"] is None


def test_bad_options_are_refused_with_their_name(trained_multilabel):
    t = trained_multilabel
    data = (t.x[:2], t.y[:2])
    with pytest.raises(InvalidParameterError, match="radii"):
        certify(t.model, t.task, data, sigma=0.1, radii=[-0.1])
    with pytest.raises(InvalidParameterError, match="radii"):
        certify(t.model, t.task, data, sigma=0.1, radii=[])
    with pytest.raises(InvalidParameterError, match="sigma"):
        certify(t.model, t.task, data, sigma=0.0, radii=[0.1])
    with pytest.raises(InvalidParameterError, match="empirical"):
        certify(t.model, t.task, data, sigma=0.1, radii=[0.1], empirical="fgsm")
    with pytest.raises(InvalidParameterError, match="draws"):
        certify(t.model, t.task, data, sigma=0.1, radii=[0.1], draws=0)
    with pytest.raises(ConfigError) as e:
        validate_studies([{"study": "certify", "sigma": -1.0, "radii": [0.1]},
                          {"study": "certify", "sigma": 0.1, "radius": [0.1]},
                          {"study": "certify", "sigma": 0.1, "radii": [0.1], "empirical": "fgsm"},
                          {"study": "certify", "sigma": 0.1, "radii": [0.1], "correction": "holm"},
                          {"study": "certify", "sigma": 0.1, "radii": []}])
    text = str(e.value)
    assert "studies[0].sigma" in text and "unknown key `radius`" in text and "did you mean `radii`" in text
    assert "studies[2].empirical" in text and "`studies[3]` needs `tau` with `correction: holm`" in text
    assert "studies[4].radii" in text


def test_run_study_takes_the_attacks_box(trained_multilabel):
    from medadv import L2, PGD

    t = trained_multilabel
    atk = {"pgd": PGD(t.task, L2(0.5, bounds=(0.0, 1.0)), steps=2)}
    r = run_study("certify", {"radii": [0.1], "empirical": "pgd", **SMALL}, t.model, t.task, (t.x[:2], t.y[:2]),
                  atk)
    assert r.meta["bounds"] == "(0, 1)" and r.study == "certify"


def test_report_draws_the_curve_and_flags_a_violation(ml_run, tmp_path):
    from medadv.report.html import render_html_report
    from medadv.studies.certify import CERTIFY_RULE

    html = render_html_report(studies=[ml_run])
    assert "study-certify" in html and "<img" in html and CERTIFY_RULE in html
    assert "VIOLATION" not in html and "holds at every radius" in html
    bad = StudyResult("certify", [dict(r) for r in ml_run.rows], dict(ml_run.meta))
    row = next(r for r in bad.rows if r["kind"] == "curve" and r["radius"] == 0.5)
    row.update(certified=row["empirical"] + 0.25, violation=True)
    html = render_html_report(studies=[bad])
    assert "VIOLATION at r = 0.5" in html and 'class="bad"' in html


def test_config_runs_the_certify_study_end_to_end(trained_multilabel, tmp_path, capsys):
    import numpy as np

    from medadv.cli import main
    from medadv.models import save_checkpoint

    save_checkpoint(tmp_path / "cnn.pt", trained_multilabel.model)
    np.savez(tmp_path / "data.npz", x=trained_multilabel.x[:6].numpy(), y=trained_multilabel.y[:6].numpy())
    cfg = {
        "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 4, "width": 8},
                  "checkpoint": "cnn.pt"},
        "task": {"type": "multilabel", "threshold": 0.5},
        "data": {"source": "npz", "path": "data.npz"},
        "threat": {"norm": "l2", "bounds": [0.0, 1.0]},
        "budgets": [0.1],
        "attacks": [{"name": "pgd", "steps": 2}],
        "batch_size": 6,
        "output": "out",
        "studies": [{"study": "certify", "sigma": 0.12, "n": 128, "radii": [0.025, 0.05, 0.1], "n0": 8,
                     "empirical_steps": 2, "draws": 2}],
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 0
    out = tmp_path / "out"
    study = StudyResult.from_json(out / "study_0_certify.json")
    curve = _curve(study)
    assert [r["radius"] for r in curve] == [0.0, 0.025, 0.05, 0.1]
    assert all(r["violation"] is False for r in curve) and study.meta["bounds"] == "(0, 1)"
    html = (out / "report.html").read_text()
    assert "Certified robustness (randomized smoothing)" in html and "must hold at every radius" in html
