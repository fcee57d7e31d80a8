"""The models study with HD95 (Malik et al. 2024, Table 1): HD95 clean/attacked and ASR-H per model, with GN.

Volumes 2 × 1 × 10³ (background 0.1, a class-1 block whose intensity ramps 0.35 → 0.65, a class-2 cube at 0.9);
``Levels`` labels each voxel by the nearest level: A (0.1, 0.5, 0.9) is right everywhere, B (0.1, 0.75, 0.9)
calls the darker half of the class-1 block background (clean HD95 > 0).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from monai.metrics import compute_hausdorff_distance
from torch import nn

from medadv import FGSM, Linf, MultiClass
from medadv.attacks import Noise
from medadv.config_schema import ConfigError
from medadv.studies import models, run_study
from medadv.studies.registry import study_drawer, validate_study
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
    ramp = torch.linspace(-0.15, 0.15, 10).reshape(1, 10, 1, 1)
    return (levels[y] + ramp * (y == 1)).unsqueeze(1), y


def _monai_hd95(pred: torch.Tensor, y: torch.Tensor, spacing: float) -> float:
    """The mean over the cases of MONAI's foreground HD95 (no class lost on these predictions)."""
    oh = lambda t: torch.nn.functional.one_hot(t, 3).movedim(-1, 1).float()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hd = compute_hausdorff_distance(oh(pred), oh(y), include_background=True, percentile=95, spacing=spacing)
    return float(hd[:, 1:].mean())


def _attacks(task: Segmentation) -> dict[str, object]:
    return {"noise": Noise(task, Linf(8 / 255, bounds=(0.0, 1.0)), seed=0),
            "fgsm": FGSM(task, Linf(0.15, bounds=(0.0, 1.0)))}


def test_rows_carry_hd95_and_asr_h_for_every_model_including_the_noise_row():
    x, y = _volumes()
    task = Segmentation(3)
    nets = {"A": Levels((0.1, 0.5, 0.9)), "B": Levels((0.1, 0.75, 0.9))}
    r = models(nets, task, (x, y), _attacks(task), hd95=True, spacing=2.0)
    assert {(row["model"], row["attack"]) for row in r.rows} == {(m, a) for m in "AB" for a in ("noise", "fgsm")}
    for row in r.rows:
        assert row["asr_h"] == pytest.approx(row["hd95_adv"] - row["hd95_clean"])
        assert row["drop_points"] == pytest.approx(100 * (row["clean"] - row["adv"]))
    with torch.no_grad():
        for name, net in nets.items():
            expected = _monai_hd95(net(x).argmax(1), y, 2.0)
            assert all(row["hd95_clean"] == pytest.approx(expected, abs=1e-6) for row in r.rows if row["model"] == name)
    rows = {(row["model"], row["attack"]): row for row in r.rows}
    assert rows[("A", "noise")]["hd95_clean"] == 0.0 and rows[("B", "noise")]["hd95_clean"] > 0.0
    # white-box FGSM on the perfect model moves the boundaries: a positive ASR-H, far above the noise row's
    assert rows[("A", "fgsm")]["asr_h"] > 2.0 > rows[("A", "noise")]["asr_h"]
    assert r.meta["hd95_units"] == "units of `spacing` (mm)"
    # without hd95 the columns are absent and the rest is unchanged (control)
    plain = models(nets, task, (x, y), _attacks(task))
    assert "asr_h" not in plain.rows[0] and "hd95_units" not in plain.meta
    assert [row["adv"] for row in plain.rows] == pytest.approx([row["adv"] for row in r.rows])


def test_the_report_has_maliks_table_1():
    x, y = _volumes()
    task = Segmentation(3)
    nets = {"A": Levels((0.1, 0.5, 0.9)), "B": Levels((0.1, 0.75, 0.9))}
    r = run_study("models", {"hd95": True}, nets, task, (x, y), _attacks(task))
    section = study_drawer("models")(r, None)  # type: ignore[misc]
    table = next(b for b in section.blocks if getattr(b, "caption", "").startswith("Malik et al., Table 1"))
    assert [c.text for c in table.headers] == ["attack", "A D", "A H", "B D", "B H", "Avg D", "Avg H"]
    body = {row[0].text: row for row in table.rows}
    assert list(body)[0] == "Clean" and len(body) == 3
    rows = {(row["model"], row["attack"]): row for row in r.rows}
    clean_b = 100 * rows[("B", "fgsm")]["clean"]
    assert float(body["Clean"][3].text) == pytest.approx(clean_b, abs=0.01)  # the clean DSC in %
    fgsm = next(v for k, v in body.items() if k.startswith("fgsm"))
    avg_h = (rows[("A", "fgsm")]["asr_h"] + rows[("B", "fgsm")]["asr_h"]) / 2
    assert float(fgsm[6].text) == pytest.approx(avg_h, rel=1e-2)


def test_hd95_is_refused_on_a_classifier_and_spacing_needs_hd95(toy_pair):
    xc, yc, sa, sb = toy_pair
    mc = MultiClass()
    with pytest.raises(ValueError, match="hd95=True.*segmentation"):
        models({"A": sa, "B": sb}, mc, (xc, yc), [FGSM(mc, Linf(0.25, bounds=(0, 1)))], hd95=True)
    x, y = _volumes()
    task = Segmentation(3)
    with pytest.raises(ValueError, match="spacing.*hd95"):
        models({"A": Levels((0.1, 0.5, 0.9))}, task, (x, y), _attacks(task), spacing=2.0)
    with pytest.raises(ConfigError, match="spacing.*hd95"):
        validate_study({"study": "models", "spacing": 2.0})
    with pytest.raises(ConfigError, match="hd95"):
        validate_study({"study": "models", "hd95": "yes"})
