"""The frequency study's `bands:`: Malik et al.'s five filters and explicit coefficient ranges (spec 003 §3.8)."""

from __future__ import annotations

import pytest
import torch

from medadv import PGD, Linf
from medadv.config_schema import ConfigError
from medadv.frequency import highpass_mask, keep_cube
from medadv.studies import frequency, run_study
from medadv.studies.frequency import band_ranges, malik2024_bands
from medadv.studies.registry import study_drawer, validate_study


def test_the_preset_at_96_is_the_papers_cubes_and_16_96_is_not_the_high_pass():
    r = malik2024_bands(96)
    assert r == {"0-8": (0, 8), "0-16": (0, 16), "0-32": (0, 32), "16-48": (16, 48), "16-96": (16, 96)}
    lo, hi = r["16-96"]
    mask = keep_cube(96, lo, None if hi == 96 else hi, ndim=3)
    assert torch.equal(mask, keep_cube(96, 16, None, ndim=3))
    assert int(mask.sum()) == 80 ** 3 and not torch.equal(mask, highpass_mask(96, 16, ndim=3))


def test_the_preset_scales_to_the_grid_and_explicit_ranges_are_checked():
    assert list(malik2024_bands(32).values()) == [(0, 3), (0, 5), (0, 11), (5, 16), (5, 32)]
    assert band_ranges({"a": [2, None], "b": [0, 4]}, 8) == {"a": (2, 8), "b": (0, 4)}
    with pytest.raises(ValueError, match=r"bands\['b'\].*past the 8 coefficients"):
        band_ranges({"b": [0, 9]}, 8)
    with pytest.raises(ValueError, match=r"bands\['b'\].*0 <= lo < hi"):
        band_ranges({"b": [4, 4]}, 8)
    with pytest.raises(ValueError, match="empty on a grid of 2"):
        malik2024_bands(2)


def test_a_band_keeping_everything_is_the_full_attack_and_ranges_reach_meta_and_the_report(trained_seg2d):
    t = trained_seg2d
    x, y = t.x[:4], t.y[:4]
    atk = PGD(t.task, Linf(0.08, bounds=(0.0, 1.0)), steps=3, seed=0)
    r = frequency(t.model, t.task, (x, y), {"pgd": atk}, bands={"all": [0, None], "dc": [0, 1], "top": [16, 32]})
    v = {row["band"]: row for row in r.rows}
    assert v["full"]["value"] < v["clean"]["value"]  # the attack did something, so `retained` is defined
    assert v["all"]["value"] == pytest.approx(v["full"]["value"], abs=1e-6)
    assert v["all"]["retained"] == pytest.approx(1.0, abs=1e-5)
    assert r.meta["band_ranges"] == {"all": [0, 32], "dc": [0, 1], "top": [16, 32]} and r.meta["cutoff"] is None
    # the [16, 32) cube of a 32² grid is a quarter-side corner: it differs from the full perturbation
    assert v["top"]["value"] != pytest.approx(v["full"]["value"], abs=1e-6)
    section = study_drawer("frequency")(r, None)  # type: ignore[misc]
    table = next(b for b in section.blocks if getattr(b, "kind", "") == "table")
    headers = [c.text for c in table.headers]
    assert "all [0, 32)" in headers and "top [16, 32)" in headers


def test_the_config_entry_takes_the_preset_and_refuses_bad_ranges(trained_seg2d):
    t = trained_seg2d
    x, y = t.x[:2], t.y[:2]
    atk = PGD(t.task, Linf(0.08, bounds=(0.0, 1.0)), steps=1, seed=0)
    r = run_study("frequency", {"bands": "malik2024"}, t.model, t.task, (x, y), {"pgd": atk})
    assert r.meta["bands"] == ["0-8", "0-16", "0-32", "16-48", "16-96"]
    assert r.meta["band_ranges"]["16-48"] == [5, 16] and r.meta["band_ranges"]["16-96"] == [5, 32]
    with pytest.raises(ConfigError, match=r"0 <= lo < hi"):
        validate_study({"study": "frequency", "bands": {"x": [8, 4]}})
    with pytest.raises(ConfigError, match="not both"):
        validate_study({"study": "frequency", "bands": "malik2024", "cutoff": 0.3})
    with pytest.raises(ConfigError, match="bands"):
        validate_study({"study": "frequency", "bands": "malik"})
    # a range past the grid is refused before anything is attacked
    calls = []
    with pytest.raises(ValueError, match=r"bands\['wide'\].*past the 32"):
        frequency(_Counting(t.model, calls), t.task, (x, y), {"pgd": atk}, bands={"wide": [0, 40]})
    assert calls == []


class _Counting(torch.nn.Module):
    """The model, counting its forwards (none may happen before a bad band is refused)."""

    def __init__(self, model: torch.nn.Module, calls: list[int]) -> None:
        super().__init__()
        self.model, self.calls = model, calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.shape[0])
        return self.model(x)
