"""Transfer rows with HD95 (Malik et al.: DSC and HD95 under transfer) and Paschali's %Drop, on hand-made models.

Volumes 2 × 1 × 10³: background 0.1, a 4³ block of class 1 (intensity 0.35 → 0.65 along one axis) and a 3³
cube of class 2 (0.9). ``Levels`` labels each voxel by the nearest level: A (0.1, 0.5, 0.9) is right everywhere,
B (0.1, 0.75, 0.9) calls the darker part of the class-1 block background (clean Dice < 1, clean HD95 > 0). FGSM
on A pushes each voxel away from A's level for it, so the white-box cell loses structure and HD95 rises.
"""

from __future__ import annotations

import importlib
import math
import warnings

import pytest
import torch
from monai.metrics import compute_hausdorff_distance
from torch import nn

from medadv import FGSM, Linf, MultiClass
from medadv.studies import transfer
from medadv.studies.schema import run_study
from medadv.tasks import Segmentation


class Levels(nn.Module):
    def __init__(self, levels: tuple[float, float, float]) -> None:
        super().__init__()
        self.levels = nn.Parameter(torch.tensor(levels), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -50.0 * (x - self.levels.reshape(1, -1, 1, 1, 1)) ** 2


def _volumes() -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.zeros(2, 10, 10, 10, dtype=torch.long)
    y[0, 1:5, 1:5, 1:5] = 1
    y[0, 6:9, 6:9, 6:9] = 2
    y[1, 4:8, 2:6, 3:7] = 1
    y[1, 1:4, 6:9, 1:4] = 2
    levels = torch.tensor([0.1, 0.5, 0.9])
    ramp = torch.linspace(-0.15, 0.15, 10).reshape(1, 10, 1, 1)  # class-1 intensities 0.35 .. 0.65 along axis 1
    return (levels[y] + ramp * (y == 1)).unsqueeze(1), y


def _monai_case_hd95(pred: torch.Tensor, y: torch.Tensor, spacing=None) -> float:
    """Per-case mean over the foreground classes of MONAI's HD95, averaged over the cases (no class lost)."""
    oh = lambda t: torch.nn.functional.one_hot(t, 3).movedim(-1, 1).float()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hd = compute_hausdorff_distance(oh(pred), oh(y), include_background=True, percentile=95, spacing=spacing)
    return float(hd[:, 1:].mean())


def test_transfer_rows_carry_hd95_and_drops():
    x, y = _volumes()
    task = Segmentation(3)
    a, b = Levels((0.1, 0.5, 0.9)), Levels((0.1, 0.75, 0.9))
    atk = FGSM(task, Linf(0.15, bounds=(0.0, 1.0)))
    r = transfer({"A": a}, {"A": a, "B": b}, task, (x, y), {"fgsm": atk}, hd95=True, spacing=[1.0, 1.0, 2.0])
    rows = {row["target"]: row for row in r.rows}
    # clean HD95 equals MONAI's on the clean predictions (in mm: the last axis has 2 mm voxels)
    for name, model in (("A", a), ("B", b)):
        with torch.no_grad():
            pred = model(x).argmax(1)
        assert rows[name]["hd95_clean"] == pytest.approx(_monai_case_hd95(pred, y, [1.0, 1.0, 2.0]), abs=1e-6)
    assert rows["A"]["hd95_clean"] == 0.0  # A is perfect on clean data
    # the white-box attack damages A: HD95 up, Dice down; drops follow their definitions
    white = rows["A"]
    assert white["white_box"] and white["hd95_adv"] > white["hd95_clean"] + 1.0
    for row in r.rows:
        assert row["drop_points"] == pytest.approx(100 * (row["clean"] - row["adv"]))
        assert row["drop_pct"] == pytest.approx(100 * (row["clean"] - row["adv"]) / row["clean"])
    assert white["drop_pct"] > 10.0
    assert r.meta["hd95_units"].startswith("units of `spacing`")
    # without hd95 the columns are absent (control), and voxel units with spacing=None
    plain = transfer({"A": a}, {"B": b}, task, (x, y), {"fgsm": atk})
    assert "hd95_adv" not in plain.rows[0] and plain.rows[0]["adv"] == pytest.approx(rows["B"]["adv"])
    vox = transfer({"A": a}, {"A": a}, task, (x, y), {"fgsm": atk}, hd95=True)
    assert vox.meta["hd95_units"] == "voxels" and not math.isclose(vox.rows[0]["hd95_adv"], white["hd95_adv"])


def test_transfer_hd95_config_and_refusals(toy_pair):
    x, y = _volumes()
    task = Segmentation(3)
    a = Levels((0.1, 0.5, 0.9))
    atk = FGSM(task, Linf(0.3, bounds=(0.0, 1.0)))
    r = run_study("transfer", {"study": "transfer", "hd95": True, "spacing": 2.0}, {"A": a}, task, (x, y),
                  {"fgsm": atk})
    direct = transfer({"A": a}, {"A": a}, task, (x, y), {"fgsm": atk}, hd95=True, spacing=2.0)
    assert r.rows[0]["hd95_adv"] == pytest.approx(direct.rows[0]["hd95_adv"])
    xc, yc, sa, sb = toy_pair
    mc = MultiClass()
    with pytest.raises(ValueError, match="hd95=True.*segmentation"):
        transfer({"A": sa}, {"B": sb}, mc, (xc, yc), [FGSM(mc, Linf(0.25, bounds=(0, 1)))], hd95=True)
    with pytest.raises(ValueError, match="spacing"):
        transfer({"A": a}, {"A": a}, task, (x, y), [atk], hd95=True, spacing=[1.0, -1.0, 1.0])
    with pytest.raises(TypeError, match="hd95"):
        transfer({"A": a}, {"A": a}, task, (x, y), [atk], hd95="yes")  # type: ignore[arg-type]


def test_paschali_drops_and_all_cell_average(toy_pair):
    """The hand table of test_transfer_models: A clean 0.75, adv (A→A 0.5, B→A 0.75); B clean 0.75, adv
    (A→B 0.5, B→B 0.5)."""
    x, y, a, b = toy_pair
    task = MultiClass()
    r = transfer({"A": a, "B": b}, {"A": a, "B": b}, task, (x, y), {"fgsm": FGSM(task, Linf(0.25, bounds=(0, 1)))})
    cell = {(row["surrogate"], row["target"]): row for row in r.rows}
    assert cell[("A", "B")]["drop_points"] == pytest.approx(25.0)
    assert cell[("A", "B")]["drop_pct"] == pytest.approx(100 * 0.25 / 0.75)
    assert cell[("B", "A")]["drop_pct"] == pytest.approx(0.0)
    s = {row["target"]: row for row in r.meta["summary"]}
    assert s["B"]["drop_pct"] == pytest.approx(100 * 0.25 / 0.75)
    # Paschali's Table 1 Avg: the diagonal counts too
    assert s["A"]["avg_all_cells"] == pytest.approx(0.625) and s["A"]["drop_points_all_cells"] == pytest.approx(12.5)
    assert s["B"]["avg_all_cells"] == pytest.approx(0.5)


def test_report_draws_table2_matrix_and_hd95(toy_pair, monkeypatch):
    import medadv.report.html as html

    x, y = _volumes()
    task = Segmentation(3)
    a, b = Levels((0.1, 0.5, 0.9)), Levels((0.1, 0.75, 0.9))
    r = transfer({"A": a, "B": b}, {"A": a, "B": b}, task, (x, y), {"fgsm": FGSM(task, Linf(0.15, bounds=(0, 1)))},
                 hd95=True)
    titles: list[str] = []
    drawn_by = importlib.import_module("medadv.studies.transfer")  # the module (the package binds the function)

    real = drawn_by.heatmap
    monkeypatch.setattr(drawn_by, "heatmap", lambda ax, m, *args, **kw: (titles.append(kw.get("title")),
                                                                       real(ax, m, *args, **kw)))
    sec = html._study_section(r, None)
    assert "Could not draw" not in sec.intro
    assert titles == ["mean Dice attacked", "drop (points: 100 × (clean − attacked))", "fooling rate",
                      "HD95 attacked (voxels)"]
    table = next(blk for blk in sec.blocks if type(blk).__name__ == "Table")
    heads = [h.title for h in table.headers]
    assert heads[:4] == ["evaluated model", "clean mean Dice", "fgsm ε=0.15 · from A", "fgsm ε=0.15 · from B"]
    assert [row[0].text for row in table.rows] == ["A", "B"]
    cell = {(row["surrogate"], row["target"]): row["adv"] for row in r.rows}
    assert table.rows[1][2].text == html.fmt(cell[("A", "B")])  # row B (evaluated), column source A
