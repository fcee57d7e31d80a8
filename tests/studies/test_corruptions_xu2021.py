"""Xu et al.'s 14 Robust-Benchmark sequences (spec 000 §6): each corruption seeded, in the box, monotone in
severity, geometric ones moving the anatomy as they say; the study and its config entry with ``suite: xu2021``."""

from __future__ import annotations

import math

import pytest
import torch

from medadv import Segmentation
from medadv.studies import Corruption, corruptions, run_study
from medadv.studies.corruptions import CORRUPTIONS, SUITES, XU2021, _apply, corruption_suite
from medadv.studies.robust_benchmark import translate
from medadv.threats import Box

BOX = Box(0.0, 1.0)


def _images(n: int = 2, size: int = 32, seed: int = 0) -> torch.Tensor:
    """Smooth, non-periodic images in [0.1, 0.8]: three Gaussian blobs each."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    out = torch.zeros(n, 1, size, size)
    for i in range(n):
        for _ in range(3):
            cy, cx = (torch.rand(2, generator=g) * size * 0.6 + size * 0.2).tolist()
            out[i, 0] += torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * (size / 8) ** 2))
    return 0.1 + 0.7 * out / out.amax(dim=(1, 2, 3), keepdim=True)


def _corrupt(name: str, severity: int, x: torch.Tensor, seeds=(11, 12)) -> torch.Tensor:
    corr = CORRUPTIONS[name]
    return _apply(corr, corr.levels[severity - 1], x, {}, list(seeds), BOX.data_range(x), BOX)[0]


def test_the_xu2021_suite_is_the_papers_14():
    assert len(XU2021) == 14 and SUITES["robust_benchmark"] == XU2021
    names = [c.name for c in corruption_suite("xu2021")]
    assert names == list(XU2021) and len(set(names)) == 14
    assert [c.name for c in corruption_suite(["gaussian_blur"])] == ["blur"]  # the paper's name
    with pytest.raises(ValueError, match="did you mean 'xu2021'"):
        corruption_suite("xu2012")
    # noise is compared with the clean frame (ImageNet-P), every other sequence frame to frame
    assert {c.name for c in corruption_suite("xu2021") if c.kind == "random"} == {
        "gaussian_noise", "shot_noise", "speckle_noise"}


@pytest.mark.parametrize("name", XU2021)
def test_each_corruption_is_seeded_in_the_box_and_grows_with_severity(name):
    x = _images()
    before = x.clone()
    outs = [_corrupt(name, s, x) for s in range(1, 6)]
    assert torch.equal(x, before)  # the caller's tensor is not modified
    for out in outs:
        assert out.shape == x.shape and out.dtype == x.dtype
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    assert torch.equal(outs[2], _corrupt(name, 3, x))  # same seeds, same tensor
    change = [float((o - x).abs().mean()) for o in outs]
    assert change[0] > 1e-4, f"{name}: severity 1 changes nothing"
    assert all(b > a for a, b in zip(change, change[1:], strict=False)), f"{name}: mean |Δ| {change} not increasing"
    if CORRUPTIONS[name].kind == "random" or name in ("snow", "spatter", "motion_blur"):
        other = _corrupt(name, 3, x, seeds=(21, 22))  # control: other seeds, other draws
        assert not torch.equal(other, outs[2])


def _centroid(x: torch.Tensor) -> torch.Tensor:
    """(N, 2) intensity-weighted (row, column) centroid of x − its minimum."""
    m = (x - 0.1).clamp_min(0)[:, 0]
    h, w = m.shape[-2:]
    r, c = torch.arange(h).float(), torch.arange(w).float()
    total = m.sum((1, 2))
    return torch.stack([(m.sum(2) * r).sum(1) / total, (m.sum(1) * c).sum(1) / total], 1)


def _blob(size: int = 32, cy: float = 10.0, cx: float = 20.0) -> torch.Tensor:
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    return (0.1 + 0.8 * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * 2.0**2)))[None, None]


def test_geometric_corruptions_move_the_mass_as_they_say():
    x = _blob()
    c0 = _centroid(x)[0]
    centre = torch.tensor([15.5, 15.5])
    # translate: the last axis, by level × width (severity 5: 0.08 × 32 = 2.56 px)
    shift = _centroid(_corrupt("translate", 5, x, (0,)))[0] - c0
    assert shift[1].item() == pytest.approx(0.08 * 32, abs=0.05) and abs(shift[0].item()) < 0.05
    # rotate: same distance to the centre, turned by the level (15°)
    c = _centroid(_corrupt("rotate", 5, x, (0,)))[0]
    a0, a1 = (c0 - centre), (c - centre)
    assert a1.norm().item() == pytest.approx(a0.norm().item(), rel=0.02)
    angle = math.degrees(math.acos(float(a0 @ a1 / (a0.norm() * a1.norm()))))
    assert angle == pytest.approx(15.0, abs=0.5)
    # scale 0.75: towards the centre by the factor
    c = _centroid(_corrupt("scale", 5, x, (0,)))[0]
    assert ((c - centre) / (c0 - centre)).tolist() == pytest.approx([0.75, 0.75], abs=0.02)
    # shear: the row moves in proportion to the column offset (tan 15° × 4.5 px), the column stays
    c = _centroid(_corrupt("shear", 5, x, (0,)))[0]
    assert abs((c - c0)[0].item()) == pytest.approx(math.tan(math.radians(15)) * (20 - 15.5), abs=0.1)
    assert (c - c0)[1].item() == pytest.approx(0.0, abs=0.1)
    # tilt moves an off-centre blob, and more at a higher severity; the centre pixel stays where it is
    d = [float((_centroid(_corrupt("tilt", s, x, (0,)))[0] - c0).norm()) for s in (1, 5)]
    assert 0.05 < d[0] < d[1]
    # intensity corruptions leave the centroid alone (control)
    bright = _corrupt("brightness", 1, x, (0,))
    assert float((_centroid(bright - bright.amin() + 0.1)[0] - c0).norm()) < 0.05


def test_2d_only_corruptions_refuse_volumes_and_the_others_run_in_3d():
    v = torch.rand(1, 1, 8, 16, 16, generator=torch.Generator().manual_seed(0))
    for name in ("snow", "spatter", "motion_blur", "tilt"):
        with pytest.raises(ValueError, match=f"corruption '{name}' is defined for 2-D images only"):
            _corrupt(name, 3, v, (0,))
    for name in ("rotate", "shear", "translate"):  # in the axial plane: every slice keeps its mass
        out = _corrupt(name, 5, v, (0,))
        assert out.shape == v.shape
        inside = torch.zeros_like(v)
        inside[..., 4:12, 4:12] = v[..., 4:12, 4:12]
        moved = _corrupt(name, 5, inside, (0,))
        assert moved.sum((0, 1, 3, 4)).tolist() == pytest.approx(inside.sum((0, 1, 3, 4)).tolist(), rel=0.05)
    for name in ("scale", "zoom_blur", "shot_noise", "speckle_noise", "brightness"):
        assert _corrupt(name, 2, v, (0,)).shape == v.shape


def test_a_whole_pixel_translate_moves_the_labels_with_the_anatomy(voxel_model):
    from medadv.data import segmentation_blobs

    x, y = segmentation_blobs(n=3, num_classes=3, size=16, ndim=2, seed=1)
    x = (0.1 + 0.4 * y.float()).unsqueeze(1)
    one_px = Corruption("translate_1px", (1 / 16,) * 5, "ramp", True, 0.0, "1 px", apply=translate)
    fixed = Corruption("translate_fixed", (1 / 16,) * 5, "ramp", False, 0.0, "1 px", apply=translate)
    moved, not_moved = corruptions(voxel_model, Segmentation(3), (x, y), bounds=(0, 1), severities=[1],
                                   suite=[one_px, fixed], frames=2).rows
    assert moved["flip_probability"] == 0.0 and moved["metric"] == pytest.approx(1.0)
    assert not_moved["flip_probability"] > 0.01 and not_moved["metric"] < 0.99


def test_the_study_runs_the_xu2021_suite_seeded_and_from_a_config(trained_multiclass):
    t = trained_multiclass
    x, y = t.x[:12], t.y[:12]
    kw = dict(bounds=(0.0, 1.0), severities=[1, 5], suite="xu2021", frames=3)
    r = corruptions(t.model, t.task, (x, y), **kw)
    assert [row["corruption"] for row in r.rows] == [n for n in XU2021 for _ in (1, 5)]
    assert all(0.0 <= row["flip_probability"] <= 1.0 for row in r.rows)
    assert r.rows == corruptions(t.model, t.task, (x, y), **kw).rows
    by = {(row["corruption"], row["severity"]): row["flip_probability"] for row in r.rows}
    assert sum(by[(n, 5)] for n in XU2021) > sum(by[(n, 1)] for n in XU2021)  # stronger, more flips
    spec = run_study("corruptions", {"suite": "xu2021", "severities": [3], "frames": 2, "bounds": [0.0, 1.0]},
                     t.model, t.task, (x, y), None)
    assert [row["corruption"] for row in spec.rows] == list(XU2021)
    assert [c["name"] for c in spec.meta["suite"]] == list(XU2021)
    from medadv.report.html import render_html_report

    html = render_html_report(None, studies=[spec])
    assert "Could not draw" not in html and "mean of all" in html
    with pytest.raises(Exception, match="xu2021"):
        run_study("corruptions", {"suite": "xu2012", "bounds": [0.0, 1.0]}, t.model, t.task, (x, y), None)


def test_relative_flip_probability_of_several_models(trained_multiclass):
    t = trained_multiclass
    steady = _steady(t)
    r = run_study("corruptions", {"suite": ["gaussian_noise", "translate"], "severities": [5], "bounds": [0.0, 1.0],
                                  "models": ["cnn", "steady"]}, {"cnn": t.model, "steady": steady}, t.task,
                  (t.x, t.y), None)
    rows = {row["model"]: row for row in r.meta["rfp"]}
    assert rows["cnn"]["rfp"] == pytest.approx(1.0) and rows["cnn"]["flip_probability"] > 0
    assert rows["steady"]["flip_probability"] == 0.0 and rows["steady"]["rfp"] == 0.0
    fps = [row["flip_probability"] for row in r.rows if row["model"] == "cnn"]
    assert rows["cnn"]["flip_probability"] == pytest.approx(sum(fps) / len(fps))


def _steady(t):
    """A model that predicts class 0 whatever the input: it never flips."""
    from torch import nn

    steady = nn.Sequential(nn.Flatten(), nn.Linear(t.x[0].numel(), 4))
    nn.init.zeros_(steady[1].weight)
    with torch.no_grad():
        steady[1].bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0]))  # the same class whatever the input: never flips
    return steady


def test_models_give_one_section_with_every_models_rows_and_table_3(trained_multiclass):
    from medadv.report.blocks import Table, fmt
    from medadv.report.html import render_html_report
    from medadv.studies.corruptions import _draw_corruptions, relative_flip_probability

    t = trained_multiclass
    x, y = t.x[:16], t.y[:16]
    steady = _steady(t)
    opts = {"suite": ["gaussian_noise", "translate"], "severities": [3, 5], "frames": 3, "bounds": [0.0, 1.0]}
    models = {"cnn": t.model, "steady": steady}
    r = run_study("corruptions", {**opts, "models": ["steady", "cnn"]}, models, t.task, (x, y), None)
    # every model's rows, the reference's first, each tagged with the row contract's `model` column
    assert [row["model"] for row in r.rows] == ["cnn"] * 4 + ["steady"] * 4
    assert r.meta["reference"] == "cnn" and r.meta["models"] == ["cnn", "steady"]
    # the reference rows are a single-model run's, and the other model's rows its own single-model run's
    alone = {n: run_study("corruptions", opts, {n: m}, t.task, (x, y), None) for n, m in models.items()}
    for n in models:
        assert [{k: v for k, v in row.items() if k != "model"} for row in r.rows if row["model"] == n] \
            == alone[n].rows
    assert all(row["flip_probability"] == 0.0 for row in r.rows if row["model"] == "steady")
    assert any(row["flip_probability"] > 0.0 for row in r.rows if row["model"] == "cnn")
    # the RFP of meta is the one of the separate runs (Table 4), unchanged by the new rows
    assert r.meta["rfp"] == relative_flip_probability({"cnn": alone["cnn"], "steady": alone["steady"]})
    # without `models:` nothing changes: no model column, no Table 3
    assert "model" not in alone["cnn"].rows[0] and "reference" not in alone["cnn"].meta

    # Table 3: corruption x model mean flip probability, and the mean over the corruptions
    sec = _draw_corruptions(r, None)
    table3 = [b for b in sec.blocks if isinstance(b, Table) and [h.text for h in b.headers] == ["corruption", "cnn",
                                                                                                 "steady"]]
    assert len(table3) == 1
    cells = {row[0].text: [c.text for c in row[1:]] for row in table3[0].rows}
    assert list(cells) == ["gaussian_noise", "translate", "mean of all"]
    fp = {c: [row["flip_probability"] for row in alone["cnn"].rows if row["corruption"] == c]
          for c in ("gaussian_noise", "translate")}
    assert cells["gaussian_noise"] == [fmt(sum(fp["gaussian_noise"]) / 2), "0.000"]
    mean_all = (sum(fp["gaussian_noise"]) / 2 + sum(fp["translate"]) / 2) / 2
    assert cells["mean of all"] == [fmt(mean_all), "0.000"]
    assert not any(isinstance(b, Table) and [h.text for h in b.headers][:2] == ["corruption", "cnn"]
                   for b in _draw_corruptions(alone["cnn"], None).blocks)
    html = render_html_report(None, studies=[r])
    assert "Could not draw" not in html and "Xu et al., Table 3" in html and "Xu et al., Table 4" in html
    with pytest.raises(ValueError, match="did you mean 'steady'"):
        run_study("corruptions", {**opts, "models": ["stedy"]}, models, t.task, (x, y), None)
