"""Case figures a radiologist reads (issue 31, item 4): CT windows, voxel proportions, and the attacked image
beside the clean one in every case figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from medadv.config_schema import ConfigError, validate_config
from medadv.report.cases import Case, most_changed_voxel, plot_case
from medadv.report.windows import WINDOWS, check_window, display_window, looks_like_hu, plane_aspect


def _ct(shape=(1, 8, 8, 8), seed=0) -> torch.Tensor:
    """A CT-like volume in HU: air (−1000) around soft tissue (≈ 40) with a bone (≈ 700) core."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full(shape, -1000.0)
    x[(slice(None), *(slice(2, -2),) * (len(shape) - 1))] = 40.0
    x[(slice(None), *(slice(3, 5),) * (len(shape) - 1))] = 700.0
    return x + 5 * torch.randn(shape, generator=g)


def _titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes]


def _panel(fig, start: str):
    (ax,) = [a for a in fig.axes if a.get_title().startswith(start)]
    return ax


# --- windows -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, expected", [("brain", (0.0, 80.0)), ("soft_tissue", (-160.0, 240.0)),
                                            ("lung", (-1350.0, 150.0)), ("bone", (-500.0, 1300.0))])
def test_presets_give_their_display_range(name, expected):
    win = display_window(_ct(), name)
    assert (win.lo, win.hi) == expected
    w, lev = WINDOWS[name]
    assert win.label == f"{name.replace('_', ' ')} W{w:g}/L{lev:g}" and win.unit == "HU"
    # [width, level] in data units is the same window written out
    assert (display_window(_ct(), [w, lev]).lo, display_window(_ct(), [w, lev]).hi) == expected


def test_hu_data_pick_the_soft_tissue_window_and_other_data_their_percentiles():
    ct = _ct()
    assert looks_like_hu(ct)
    for spec in (None, "auto"):
        win = display_window(ct, spec)
        assert (win.lo, win.hi, win.unit) == (-160.0, 240.0, "HU")
    # [0, 1] data (and MRI): the 1-99 % percentiles of the whole image
    x = torch.rand(1, 6, 7, 8, generator=torch.Generator().manual_seed(1))
    assert not looks_like_hu(x)
    win = display_window(x[0])
    lo, hi = np.percentile(x.double().numpy(), [1, 99])
    assert win.lo == pytest.approx(lo) and win.hi == pytest.approx(hi) and win.unit == "data units"
    assert 0.0 < win.lo < 0.05 and 0.95 < win.hi < 1.0
    # a CT crop that never reaches air and dense tissue is not taken for HU; "percentile" asks for it on CT
    assert not looks_like_hu(torch.full((4, 4), 40.0) + torch.arange(16.0).reshape(4, 4))
    win = display_window(ct, "percentile")
    assert win.lo == pytest.approx(np.percentile(ct.double().numpy(), 1))
    # a constant image still gets a non-empty range
    win = display_window(torch.zeros(3, 3))
    assert win.hi > win.lo


@pytest.mark.parametrize("bad, err, match", [
    ("lungs", ValueError, "`window` must be one of 'auto', 'percentile', 'brain', 'soft_tissue', 'lung', 'bone'"),
    ([0, 40], ValueError, "width > 0"),
    ([float("nan"), 40], ValueError, "finite"),
    ([400, 40, 1], ValueError, r"\[width, level\]"),
    (["400", 40], ValueError, r"\[width, level\]"),
    ([True, 40], ValueError, r"\[width, level\]"),
    (400, TypeError, "`window` must be a preset name"),
    ({"width": 400}, TypeError, "`window` must be a preset name"),
])
def test_bad_windows_are_refused_naming_the_argument(bad, err, match):
    with pytest.raises(err, match=match):
        check_window(bad)
    x = torch.zeros(1, 4, 4)
    with pytest.raises(err, match=match):  # before any figure is drawn
        Case(x, x, torch.tensor(0), torch.tensor(1), "classes", window=bad)


def test_the_config_names_the_window_in_the_report_section():
    base = {"model": {"builder": "small_cnn"}, "task": {"type": "multiclass"}, "data": {"source": "mni152"},
            "threat": {"norm": "linf", "bounds": [0, 1]}, "budgets": [0.1], "attacks": ["fgsm"]}
    assert validate_config({**base, "report": {"window": "lung"}}).report.window == "lung"
    assert validate_config({**base, "report": {"window": [400, 40]}}).report.window == [400, 40]
    assert validate_config({**base, "report": {"title": "t"}}).report.window is None
    with pytest.raises(ConfigError) as e:
        validate_config(yaml.safe_load(yaml.safe_dump({**base, "report": {"window": "lungs"}})))
    assert e.value.messages == ["`report.window` must be one of 'auto', 'percentile', 'brain', 'soft_tissue', "
                                "'lung', 'bone'; got 'lungs' (str); did you mean 'lung'?"]
    with pytest.raises(ConfigError) as e:
        validate_config({**base, "report": {"window": [-5, 40]}})
    assert e.value.messages == ["`report.window` [width, level] needs a finite width > 0 and a finite level, "
                                "got [-5, 40]"]


# --- proportions -------------------------------------------------------------------------------------------------
def test_aspect_from_spacing_2x2x5_is_2_5_in_the_sagittal_and_coronal_planes():
    assert plane_aspect((2.0, 2.0, 5.0), 2, 1) == 2.5 and plane_aspect(None, 2, 1) == 1.0
    x = _ct()
    same = torch.zeros(8, 8, 8, dtype=torch.long)
    case = Case(x, x + 4.0, same, same, "map", spacing=(2, 2, 5), axis_names=("sagittal", "coronal", "axial"))
    fig = plot_case(case)
    grid = np.array(fig.axes).reshape(3, 5)  # 3 planes x (clean, attacked, perturbation, clean, attacked)
    # the slices through axis 0 and axis 1 show axis 2 (5 mm) vertically against a 2 mm axis
    for r, expected in enumerate((2.5, 2.5, 1.0)):
        assert all(ax.get_aspect() == pytest.approx(expected) for ax in grid[r])
    assert grid[2][0].get_xlabel() == "voxel 2 × 2 × 5 mm"
    # square voxels without a spacing; a 2-D image: rows along the first axis
    fig = plot_case(Case(x, x + 4.0, same, same, "map"))
    assert all(ax.get_aspect() == 1.0 for ax in fig.axes)
    x2 = _ct((1, 8, 8))
    fig = plot_case(Case(x2, x2, torch.tensor(0), torch.tensor(1), "classes", spacing=(3.0, 0.75)))
    assert _panel(fig, "clean image").get_aspect() == 4.0
    with pytest.raises(ValueError, match="`spacing` per axis must have 2 values"):
        Case(x2, x2, torch.tensor(0), torch.tensor(1), "classes", spacing=(1, 1, 1))


# --- panels ------------------------------------------------------------------------------------------------------
def _cases() -> dict[str, Case]:
    ct2, ct3 = _ct((1, 8, 8)), _ct()
    lab2, lab3 = (ct2[0] > 300).long(), (ct3[0] > 300).long()
    scores = torch.tensor([0.7, 0.2, 0.1])
    return {
        "classes 2-D": Case(ct2, ct2 + 3, torch.tensor(0), torch.tensor(1), "classes", label=torch.tensor(0),
                            clean_scores=scores, adv_scores=scores.flip(0)),
        "labels 2-D": Case(ct2, ct2 + 3, torch.tensor([1, 0, 1]), torch.tensor([0, 0, 1]), "labels",
                           clean_scores=scores, adv_scores=scores.flip(0)),
        "map 2-D": Case(ct2, ct2 + 3, lab2, 1 - lab2, "map", label=lab2),
        "values 2-D": Case(ct2, ct2 + 3, torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.0]), "values"),
        "image 2-D": Case(ct2, ct2 + 3, torch.tensor(0), torch.tensor(0), "image"),
        "rgb 2-D": Case(torch.rand(3, 8, 8), torch.rand(3, 8, 8), torch.tensor(0), torch.tensor(1), "classes",
                        clean_scores=scores, adv_scores=scores),
        "classes 3-D": Case(ct3, ct3 + 3, torch.tensor(0), torch.tensor(1), "classes", clean_scores=scores,
                            adv_scores=scores.flip(0)),
        "map 3-D": Case(ct3, ct3 + 3, lab3, 1 - lab3, "map", label=lab3, spacing=(2, 2, 5)),
        "values 3-D": Case(ct3, ct3 + 3, torch.tensor([1.0]), torch.tensor([2.0]), "values"),
        "image 3-D": Case(ct3, ct3 + 3, torch.tensor(0), torch.tensor(0), "image"),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_every_case_figure_shows_clean_and_attacked_image_and_the_perturbation_with_its_scale(name):
    case = _cases()[name]
    fig = plot_case(case)
    titles = _titles(fig)
    assert any(t.startswith("clean image") for t in titles), titles
    assert any(t.startswith("attacked image") for t in titles), titles
    assert any(t.startswith("perturbation, amplified ×") for t in titles), titles
    clean, adv, pert = _panel(fig, "clean image"), _panel(fig, "attacked image"), _panel(fig, "perturbation")
    # the attacked image is x_adv, drawn through the same window as the clean image
    shown = np.ma.getdata(adv.images[0].get_array())
    if case.x.shape[0] == 3:  # RGB: both scaled by the clean image's range
        lo, hi = float(case.x.min()), float(case.x.max())
        np.testing.assert_allclose(shown, ((case.x_adv - lo) / (hi - lo)).clamp(0, 1).permute(1, 2, 0).numpy(),
                                   rtol=1e-6)
    else:
        assert clean.images[0].get_clim() == adv.images[0].get_clim() == (-160.0, 240.0)  # HU: soft tissue
        np.testing.assert_allclose(shown, case.x_adv[0].numpy() if not case.volumetric else
                                   case.x_adv[0][most_changed_voxel(case)[0]].numpy().T)
    # the perturbation's scale: a colour bar in the data's units, ±max|δ|
    lim = float(case.delta.abs().max())
    assert pert.images[0].get_clim() == pytest.approx((-lim, lim))
    (bar,) = pert.child_axes  # the colour bar, an inset as tall as the panel
    assert bar.get_ylabel() == ("HU" if case.x.shape[0] == 1 else "data units")
    assert bar.get_ylim() == pytest.approx((-lim, lim))
    # the amplification is the grey window's width over the perturbation's colour range
    win = 400.0 if case.x.shape[0] == 1 else float(case.x.max() - case.x.min())
    assert f"×{win / (2 * lim):.3g}" in pert.get_title()
    if case.kind in ("classes", "labels", "map"):
        assert any(t.startswith("clean prediction") for t in titles) and \
            any(t.startswith("attacked prediction") for t in titles)


@pytest.mark.filterwarnings("ignore:model builder 'small_unet' has no `checkpoint`")
def test_evaluate_config_window_and_spacing_reach_the_case_figures(tmp_path, monkeypatch):
    """`report: {window: ...}` and `spacing:` of an evaluate config are what the drawn cases carry."""
    import medadv.report.html as html
    from medadv.cli import main

    drawn: list[Case] = []
    real = html.plot_case
    monkeypatch.setattr(html, "plot_case", lambda c, *a, **k: (drawn.append(c), real(c, *a, **k))[1])
    g = torch.Generator().manual_seed(0)
    x = torch.where(torch.rand(2, 1, 8, 8, 8, generator=g) > 0.5, 600.0, -900.0)
    np.savez(tmp_path / "ct.npz", x=x.numpy(), y=(x[:, 0] > 0).long().numpy())
    cfg = {
        "model": {"builder": "small_unet", "kwargs": {"in_channels": 1, "num_classes": 2, "ndim": 3,
                                                      "channels": [4, 8]}},
        "task": {"type": "segmentation", "num_classes": 2},
        "data": {"source": "npz", "path": "ct.npz"},
        "threat": {"norm": "linf", "bounds": [-1024, 3071]},
        "budgets": [8],
        "attacks": [{"name": "fgsm"}],
        "spacing": [2, 2, 5],
        "cases": 1,
        "report": {"window": "lung"},
        "output": "out",
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 0
    assert len(drawn) == 1 and drawn[0].window == "lung" and drawn[0].spacing == (2.0, 2.0, 5.0)
