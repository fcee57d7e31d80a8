"""Corruptions with the flip probability (Xu et al.) and the noise baseline at matched SSIM (Paschali et al.)."""

from __future__ import annotations

import pytest
import torch

from medadv import PGD, Linf, MultiClass, Segmentation
from medadv.metrics import ssim
from medadv.studies import SUITE, Corruption, corruptions, noise_baseline
from medadv.studies.corruptions import match_noise, sequence_flips
from medadv.threats import Box


def _shift(p, nd, rng, shape, keys, near):
    from monai.transforms import ShiftIntensityd

    return ShiftIntensityd(["image"], offset=p)


def _toy():
    c = torch.tensor([0.28, 0.43, 0.57, 0.72])
    x = c.reshape(4, 1, 1, 1).expand(4, 1, 2, 2).clone()
    return x, torch.tensor([1, 1, 0, 0])  # SumModel: class 0 iff the mean > 0.5, so every clean prediction is right


def test_sequence_flips_counts_elements_that_differ_from_their_reference():
    preds = [torch.tensor([0, 1, 1, 2]), torch.tensor([0, 0, 1, 2])]
    refs = [torch.tensor([0, 1, 2, 2]), torch.tensor([1, 1, 1, 2])]
    assert sequence_flips(preds, refs) == (3.0, 8)
    mask = torch.tensor([True, True, False, True])
    assert sequence_flips(preds, refs, mask) == (2.0, 6)


def test_flip_probability_of_a_ramp_equals_the_hand_computation(toy_pair):
    _, _, model, _ = toy_pair
    x, y = _toy()
    shift = Corruption("shift", (0.1, 0.2, 0.3, 0.4, 0.5), "ramp", False, 0.0, "offset", _shift)
    r = corruptions(model, MultiClass(), (x, y), bounds=(0, 1), severities=(2, 4), suite=[shift], frames=3)
    s2, s4 = r.rows
    # severity 2 (offset 0.2): frame 1 (+0.1) -> means (0.38, 0.53, 0.67, 0.82), predictions (1, 0, 0, 0): one flip
    # against the clean (1, 1, 0, 0); frame 2 (+0.2) -> (1, 0, 0, 0): no flip against frame 1. FP = 1 / (4 · 2).
    assert s2["flip_probability"] == pytest.approx(1 / 8)
    assert s2["metric"] == pytest.approx(0.75) and s2["metric_clean"] == pytest.approx(1.0)  # last frame
    # severity 4: frame 1 (+0.2) -> (1, 0, 0, 0), frame 2 (+0.4) -> (0, 0, 0, 0): one flip each. FP = 2 / 8.
    assert s4["flip_probability"] == pytest.approx(2 / 8) and s4["metric"] == pytest.approx(0.5)
    assert (s2["severity"], s2["param"], s2["kind"]) == (2, 0.2, "ramp")


def test_flip_probability_of_random_frames_compares_with_the_clean_frame(toy_pair):
    _, _, model, _ = toy_pair
    x, y = _toy()
    shift = Corruption("shift", (0.1, 0.2, 0.3, 0.4, 0.5), "random", False, 0.0, "offset", _shift)
    (row,) = corruptions(model, MultiClass(), (x, y), bounds=(0, 1), severities=[2], suite=[shift], frames=3).rows
    # frames 1 and 2 both at +0.2 -> (1, 0, 0, 0): one flip each against frame 0; metric = mean over the frames
    assert row["flip_probability"] == pytest.approx(2 / 8) and row["metric"] == pytest.approx(0.75)


def _translate(p, nd, rng, shape, keys, near):
    from monai.transforms import Affined

    modes = ["nearest" if k in near else "bilinear" for k in keys]
    return Affined(keys, translate_params=(p,) * nd, mode=modes, padding_mode="border")


def test_spatial_corruptions_move_the_labels_and_the_clean_prediction(voxel_model):
    from medadv.data import segmentation_blobs

    x, y = segmentation_blobs(n=4, num_classes=3, size=16, ndim=2, seed=1)
    x = (0.1 + 0.4 * y.float()).unsqueeze(1)  # the voxel model segments these perfectly
    task = Segmentation(3)
    moved = Corruption("shift", (1.0, 2.0, 3.0, 4.0, 5.0), "random", True, 0.0, "voxels", _translate)
    fixed = Corruption("shift_fixed", moved.levels, "random", False, 0.0, "voxels", _translate)
    r = corruptions(voxel_model, task, (x, y), bounds=(0, 1), severities=[3], suite=[moved, fixed], frames=2)
    spatial, not_moved = r.rows
    # a whole-voxel shift: the prediction follows the anatomy exactly, and so does the moved label map
    assert spatial["flip_probability"] == 0.0 and spatial["metric"] == pytest.approx(1.0)
    # the same shift without moving the reference counts the displaced boundaries as flips
    assert not_moved["flip_probability"] > 0.05 and not_moved["metric"] < 0.95


def test_monai_suite_is_seeded_and_worse_at_higher_severity(trained_seg2d):
    t = trained_seg2d
    kw = dict(bounds=Box(0.0, 1.0), severities=(1, 5), suite=["gaussian_noise", "blur", "elastic"], frames=3)
    r = corruptions(t.model, t.task, (t.x, t.y), **kw)
    assert r.rows == corruptions(t.model, t.task, (t.x, t.y), **kw).rows  # seeded: the same draws
    by = {(row["corruption"], row["severity"]): row for row in r.rows}
    for name in ("gaussian_noise", "blur"):
        assert by[(name, 5)]["flip_probability"] > by[(name, 1)]["flip_probability"] > 0.0
        assert by[(name, 5)]["metric"] < by[(name, 1)]["metric"] <= by[(name, 1)]["metric_clean"] + 0.02
    assert r.meta["metric"] == "mean_dice" and [c["name"] for c in r.meta["suite"]] == kw["suite"]
    other = corruptions(t.model, t.task, (t.x, t.y), **{**kw, "suite": ["gaussian_noise"]}, seed=1)
    assert other.rows[1]["flip_probability"] != by[("gaussian_noise", 5)]["flip_probability"]


def test_every_suite_member_runs_in_3d(trained_seg3d):
    t = trained_seg3d
    r = corruptions(t.model, t.task, (t.x[:2], t.y[:2]), bounds=(0, 1), severities=[3], frames=2)
    assert [row["corruption"] for row in r.rows] == [c.name for c in SUITE]
    assert all(0.0 <= row["flip_probability"] <= 1.0 and 0.0 <= row["metric"] <= 1.0 for row in r.rows)
    with pytest.raises(ValueError, match="did you mean 'blur'"):
        corruptions(t.model, t.task, (t.x, t.y), bounds=(0, 1), suite=["blurr"])


@pytest.mark.parametrize("match", ["ssim", "l2"])
@pytest.mark.parametrize("noise", ["gaussian", "rician"])
def test_match_noise_hits_the_target_per_sample(match, noise):
    x = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    box = Box(0.0, 1.0)
    target = torch.tensor([0.95, 0.8, 0.6]) if match == "ssim" else torch.tensor([0.5, 1.0, 2.0])
    xn, sigma = match_noise(x, target, box=box, match=match, noise=noise, generator=torch.Generator().manual_seed(1))
    got = ssim(x, xn, win_size=11) if match == "ssim" else (xn - x).flatten(1).norm(dim=1)
    assert got.tolist() == pytest.approx(target.tolist(), abs=1e-3)
    assert (sigma[1:] > sigma[:-1]).all()  # more noise for a lower SSIM / larger distance
    assert float(xn.min()) >= 0.0 and float(xn.max()) <= 1.0


def test_noise_baseline_adversarial_drop_exceeds_noise_at_matched_ssim(trained_multiclass):
    t = trained_multiclass
    atk = PGD(t.task, Linf(0.08, bounds=(0.0, 1.0)), steps=5)
    (row,) = noise_baseline(t.model, t.task, (t.x, t.y), {"pgd": atk}).rows
    assert row["ssim_noise"] == pytest.approx(row["ssim_adv"], abs=2e-3) and row["ssim_adv"] < 0.99
    assert row["adv_metric"] < row["noise_metric"]  # Paschali et al.: not merely noise
    assert row["clean_metric"] == pytest.approx(float((t.model(t.x).argmax(1) == t.y).float().mean()))
    res = atk(t.model, t.x, t.y)
    assert row["adv_metric"] == pytest.approx(float((res.logits.argmax(1) == t.y).float().mean()))
    l2 = noise_baseline(t.model, t.task, (t.x, t.y), {"pgd": atk}, match="l2").rows[0]
    assert l2["l2_noise"] == pytest.approx(l2["l2_adv"], rel=1e-3)
