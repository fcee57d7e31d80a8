"""Frequency study (Malik et al.) and correlation analysis (Xu et al.)."""

from __future__ import annotations

import pytest
import torch

from medadv import FGSM, PGD, Linf
from medadv.studies import correlation, frequency
from medadv.studies.correlation import cooccurrence, layer_features, pca_2d
from medadv.studies.frequency import default_bands


def test_default_bands_split_the_coefficients():
    b = default_bands((16, 16), 0.25)
    assert int(b["low"].sum()) == 4 * 4  # the [0, 4) square
    assert not (b["low"] & b["high"]).any() and (b["low"] | b["high"]).all()
    with pytest.raises(ValueError, match="cutoff"):
        default_bands((16, 16), 1.5)


def test_frequency_identity_bands_reproduce_clean_and_full_attack(trained_seg2d):
    t = trained_seg2d
    atk = PGD(t.task, Linf(0.08, bounds=(0.0, 1.0)), steps=3)
    shape = tuple(t.x.shape[2:])
    bands = {"all": torch.ones(shape, dtype=torch.bool), "none": torch.zeros(shape, dtype=torch.bool)}
    r = frequency(t.model, t.task, (t.x, t.y), {"pgd": atk}, bands=bands)
    v = {row["band"]: row for row in r.rows}
    with torch.no_grad():
        clean = float(t.task.mean_dice(t.model(t.x).argmax(1), t.y).mean())
    adv = float(t.task.mean_dice(atk(t.model, t.x, t.y).logits.argmax(1), t.y).mean())
    assert v["clean"]["value"] == pytest.approx(clean) and v["full"]["value"] == pytest.approx(adv) and adv < clean
    # keeping every DCT coefficient is the attack itself; keeping none is the clean image
    assert v["all"]["value"] == pytest.approx(adv, abs=1e-6) and v["all"]["retained"] == pytest.approx(1.0, abs=1e-5)
    assert v["none"]["value"] == pytest.approx(clean) and v["none"]["retained"] == pytest.approx(0.0, abs=1e-9)


def test_frequency_default_bands_on_volumes(trained_seg3d):
    t = trained_seg3d
    r = frequency(t.model, t.task, (t.x, t.y), [FGSM(t.task, Linf(0.1, bounds=(0.0, 1.0)))], cutoff=0.25)
    assert [row["band"] for row in r.rows] == ["clean", "full", "low", "high"] and r.meta["metric"] == "mean_dice"
    low, high = r.rows[2], r.rows[3]
    assert all(row["value"] >= r.rows[1]["value"] - 0.05 for row in (low, high))  # a band alone hurts less


def test_cooccurrence_and_pca_by_hand():
    b = torch.tensor([[1, 0, 1], [1, 1, 0], [0, 0, 1]]).float()
    assert cooccurrence(b).tolist() == [[2, 1, 1], [1, 1, 0], [1, 0, 2]]
    t = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])
    v = torch.tensor([3.0, -4.0, 0.0])  # points on a line: one axis explains everything
    coords, explained = pca_2d(t[:, None] * v)
    assert explained.tolist() == pytest.approx([1.0, 0.0], abs=1e-12)
    # the axis is v / |v| with its largest loading (−4/5) made positive: coordinate = −5 t
    assert coords[:, 0].tolist() == pytest.approx((-5 * t).tolist()) and coords[:, 1].abs().max() < 1e-9


def test_layer_features_hook_a_named_layer(trained_multiclass):
    t = trained_multiclass
    feats = layer_features(t.model, t.x, "4")  # the third conv's ReLU: (N, 16, 4, 4) averaged over space
    with torch.no_grad():
        manual = t.model[:5](t.x).mean(dim=(2, 3)).double()
    assert torch.allclose(feats, manual)
    with pytest.raises(ValueError, match="not a submodule"):
        layer_features(t.model, t.x, "40")


def test_correlation_multilabel_cooccurrence_and_embedding(trained_multilabel):
    t = trained_multilabel
    atk = PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=3)
    r = correlation(t.model, t.task, (t.x, t.y), {"pgd": atk}, layer="4", label_names=["a", "b", "c", "d"])
    with torch.no_grad():
        clean = (t.model(t.x) > 0).float()
    adv = (atk(t.model, t.x, t.y).logits > 0).float()
    assert r.meta["cooccurrence"]["clean"] == (clean.T @ clean).long().tolist()
    assert r.meta["cooccurrence"]["adv"] == (adv.T @ adv).long().tolist()
    assert r.meta["cooccurrence"]["labels"] == ["a", "b", "c", "d"]
    assert [row["adv_count"] for row in r.rows] == adv.sum(0).long().tolist()
    assert [row["clean_rowsum"] for row in r.rows] == (clean.T @ clean).sum(1).long().tolist()
    emb = r.meta["embedding"]
    assert len(emb["clean"]) == len(emb["adv"]) == len(emb["labels"]) == t.x.shape[0]
    assert all(len(p) == 2 for p in emb["clean"] + emb["adv"])
    assert emb["labels"][0] == "+".join("abcd"[j] for j in range(4) if t.y[0, j] > 0.5) or emb["labels"][0] == "none"
    assert r.rows[0]["feature_shift"] > 0.0 and r.meta["attack"] == "pgd@0.1"


def test_correlation_multiclass_and_segmentation_counts(trained_multiclass, trained_seg3d):
    t = trained_multiclass
    r = correlation(t.model, t.task, (t.x, t.y), [FGSM(t.task, Linf(0.1, bounds=(0.0, 1.0)))], max_points=10)
    with torch.no_grad():
        pred = t.model(t.x).argmax(1)
    assert [row["clean_count"] for row in r.rows] == torch.bincount(pred, minlength=4).tolist()
    assert len(r.meta["embedding"]["clean"]) == 10 and "cooccurrence" not in r.meta
    s = trained_seg3d
    r = correlation(s.model, s.task, (s.x, s.y), [FGSM(s.task, Linf(0.1, bounds=(0.0, 1.0)))])
    assert sum(row["clean_count"] for row in r.rows) == s.y.numel()  # voxels per predicted class


def test_correlation_noise_matched_in_ssim(trained_multiclass):
    """``noise: ssim``: the noisy control has each sample's SSIM equal to its adversarial example's (Paschali et
    al., Fig. 3), through ``corruptions.match_noise`` with the study's seeded generator."""
    from medadv.metrics.image import ssim
    from medadv.report.blocks import Image
    from medadv.studies import run_study
    from medadv.studies.correlation import _draw_correlation
    from medadv.studies.corruptions import match_noise
    from medadv.threats import Box

    t = trained_multiclass
    x, y = t.x[:16], t.y[:16]
    before = x.clone()
    atk = FGSM(t.task, Linf(0.1, bounds=(0.0, 1.0)))
    r = correlation(t.model, t.task, (x, y), {"fgsm": atk}, noise="ssim", embedding=["pca"], seed=3)
    assert torch.equal(x, before)
    x_adv = atk(t.model, x, y).x_adv
    s_adv = ssim(x, x_adv, data_range=1.0, win_size=11)
    noise = r.meta["noise"]
    assert noise["match"] == "ssim" and noise["ssim_adv"] == pytest.approx(float(s_adv.double().mean()), abs=1e-6)
    assert abs(noise["ssim_noise"] - noise["ssim_adv"]) < 0.01 and noise["ssim_adv"] < 0.99
    # the noisy group, by hand: the same draw (seed 3) scaled to each sample's SSIM; its shift in the logits
    x_noise, _ = match_noise(x, s_adv, box=Box(0.0, 1.0), match="ssim", noise="gaussian",
                             generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fc, fn = t.model(x).double(), t.model(x_noise).double()
    spread = float((fc - fc.mean(0)).norm(dim=1).mean())
    assert r.rows[0]["noise_shift"] == pytest.approx(float((fn - fc).norm(dim=1).mean()) / spread, rel=1e-4)
    assert noise["noise_norm"] == pytest.approx(float((x_noise - x).flatten(1).norm(dim=1).mean()), rel=1e-4)
    # the default matches the L2 norm and keeps no SSIM
    plain = correlation(t.model, t.task, (x, y), {"fgsm": atk}, embedding=["pca"], seed=3)
    assert plain.meta["noise"]["match"] == "l2" and "ssim_adv" not in plain.meta["noise"]
    assert plain.rows[0]["noise_shift"] != pytest.approx(r.rows[0]["noise_shift"], rel=1e-3)
    # the config option and the section's wording
    spec = run_study("correlation", {"noise": "ssim", "embedding": ["pca"]}, t.model, t.task, (x, y), {"fgsm": atk})
    captions = [b.caption for b in _draw_correlation(spec, None).blocks if isinstance(b, Image)]
    assert any("Gaussian noise of the same SSIM" in c for c in captions)
    assert not any("same SSIM" in b.caption for b in _draw_correlation(plain, None).blocks if isinstance(b, Image))
    with pytest.raises(Exception, match="ssim"):
        run_study("correlation", {"noise": "ssmi"}, t.model, t.task, (x, y), {"fgsm": atk})


def test_frequency_notes_vafa_renormalisation(voxel_model):
    from medadv import VAFA, Box
    from medadv.report.blocks import escape as _h
    from medadv.report.html import _study_section
    from medadv.tasks import Segmentation

    task = Segmentation(3)
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (2, 8, 8, 8), generator=g)
    x = (torch.tensor([0.1, 0.5, 0.9])[y] + 0.05 * torch.randn(2, 8, 8, 8, generator=g)).clamp(0, 1).unsqueeze(1)
    kw = dict(block=4, steps=2, use_ssim=False)
    on = frequency(voxel_model, task, (x, y), {"vafa": VAFA(task, Box(0.0, 1.0), **kw)})
    off = frequency(voxel_model, task, (x, y), {"vafa": VAFA(task, Box(0.0, 1.0), renormalize="none", **kw)})
    plain = frequency(voxel_model, task, (x, y), {"pgd": PGD(task, Linf(0.1, bounds=(0.0, 1.0)), steps=2)})
    assert len(on.meta["notes"]) == 1 and "renormalisation ON" in on.meta["notes"][0]
    assert "slice_minmax" in on.meta["notes"][0] and "low-frequency" in on.meta["notes"][0]
    assert len(off.meta["notes"]) == 1 and "renormalisation OFF" in off.meta["notes"][0]
    assert "notes" not in plain.meta  # the control: no VAFA, no note
    # the report section prints them
    sec = _study_section(on, None)
    assert any(type(b).__name__ == "Bullets" and b.items == [_h(n) for n in on.meta["notes"]] for b in sec.blocks)
    assert not any(type(b).__name__ == "Bullets" for b in _study_section(plain, None).blocks)
