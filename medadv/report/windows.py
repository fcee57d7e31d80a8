"""Grey-level windows and voxel proportions of the case figures, as a radiologist reads an image.

A CT in Hounsfield units (HU) shown from its minimum to its maximum (air at −1000 to bone or metal at +3000)
is grey mush: soft tissue differs by tens of HU. Radiology displays CT through a **window**: a width W and a
level L (both HU) map ``[L − W/2, L + W/2]`` to black..white. The named presets (:data:`WINDOWS`) are the
common reading windows of radiology practice (see e.g. Radiopaedia, "Windowing (CT)"):

- ``brain``: W 80, L 40 HU;
- ``soft_tissue``: W 400, L 40 HU;
- ``lung``: W 1500, L −600 HU;
- ``bone``: W 1800, L 400 HU.

:func:`display_window` chooses the window of a case: a preset name or ``[W, L]`` when the config sets one
(``report: {window: lung}`` or ``report: {window: [400, 40]}``), else from the data's units: data that look
like HU (minimum ≤ −500 and maximum ≥ 500: air and dense tissue in one image) get the soft-tissue window;
anything else (MRI, [0, 1] images, z-scores) the 1–99 % percentiles of the clean image. The clean and the
attacked image are always drawn with the same window, so what differs between them is the attack.

:func:`plane_aspect` gives the physical proportions: matplotlib's ``imshow(aspect=...)`` is the height of a
row over the width of a column, i.e. the voxel spacing along the displayed rows over the spacing along the
displayed columns (2 × 2 × 5 mm voxels: 2.5 in the two planes that contain the 5 mm axis).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

__all__ = ["WINDOWS", "PERCENTILES", "DisplayWindow", "check_window", "looks_like_hu", "display_window",
           "plane_aspect"]

#: named CT windows, (width, level) in HU
WINDOWS: dict[str, tuple[float, float]] = {
    "brain": (80.0, 40.0),
    "soft_tissue": (400.0, 40.0),
    "lung": (1500.0, -600.0),
    "bone": (1800.0, 400.0),
}
#: the preset HU-looking data get when the config names none
DEFAULT_CT_WINDOW = "soft_tissue"
#: data whose minimum is at most this and maximum at least :data:`HU_HIGH` look like HU (air and dense tissue)
HU_LOW, HU_HIGH = -500.0, 500.0
#: the percentiles (%) that bound the grey range of data that do not look like HU
PERCENTILES = (1.0, 99.0)
#: the window settings other than a preset: choose from the data, or percentiles whatever the data
MODES = ("auto", "percentile")

WindowSpec = str | Sequence[float] | None


@dataclass(frozen=True)
class DisplayWindow:
    """The grey range an image is drawn with: ``lo`` → black, ``hi`` → white (data units), how it was chosen
    (``label``, shown in the figure) and the unit of the data (``"HU"`` for CT, else ``"data units"``)."""

    lo: float
    hi: float
    label: str
    unit: str

    @property
    def width(self) -> float:
        return self.hi - self.lo


def check_window(window: Any) -> str | tuple[float, float] | None:
    """``window`` checked and normalised: ``None``, ``"auto"``, ``"percentile"``, a preset name of
    :data:`WINDOWS`, or ``[width, level]`` (two finite numbers, width > 0, in the data's units).
    ValueError/TypeError naming ``window`` otherwise."""
    names = (*MODES, *WINDOWS)
    if window is None:
        return None
    if isinstance(window, str):
        if window not in names:
            raise ValueError(f"`window` must be one of {', '.join(map(repr, names))} or [width, level], "
                             f"got {window!r}")
        return window
    if isinstance(window, Tensor | np.ndarray):
        window = window.tolist()
    if not isinstance(window, Sequence) or isinstance(window, bytes):
        raise TypeError(f"`window` must be a preset name ({', '.join(WINDOWS)}) or [width, level], "
                        f"got {type(window).__name__}")
    vals = list(window)
    if len(vals) != 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
        raise ValueError(f"`window` as numbers must be [width, level] (two numbers in the data's units), got {window!r}")
    w, lev = float(vals[0]), float(vals[1])
    if not (math.isfinite(w) and math.isfinite(lev) and w > 0):
        raise ValueError(f"`window` [width, level] needs a finite width > 0 and a finite level, got {window!r}")
    return (w, lev)


def looks_like_hu(image: Tensor) -> bool:
    """Whether ``image``'s values span air and dense tissue in HU (min ≤ −500 and max ≥ 500)."""
    lo, hi = float(image.min()), float(image.max())
    return lo <= HU_LOW and hi >= HU_HIGH


def _wl(width: float, level: float) -> tuple[float, float]:
    return level - width / 2.0, level + width / 2.0


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def display_window(image: Tensor, window: WindowSpec = None) -> DisplayWindow:
    """The grey range of ``image`` (the values drawn: one channel, any spatial shape), as chosen by
    ``window`` (see :func:`check_window` and the module docstring); ``None`` and ``"auto"`` choose from the
    data's units."""
    spec = check_window(window)
    hu = looks_like_hu(image)
    unit = "HU" if hu else "data units"
    if spec is None or spec == "auto":
        spec = DEFAULT_CT_WINDOW if hu else "percentile"
    if isinstance(spec, tuple):
        lo, hi = _wl(*spec)
        return DisplayWindow(lo, hi, f"window W{spec[0]:g}/L{spec[1]:g}", unit)
    if spec in WINDOWS:
        w, lev = WINDOWS[spec]
        lo, hi = _wl(w, lev)
        return DisplayWindow(lo, hi, f"{spec.replace('_', ' ')} W{w:g}/L{lev:g}", unit)
    # percentiles of the whole image (every slice of a volume drawn alike); numpy: torch.quantile refuses
    # inputs above 16 M elements (a 256^3 volume)
    vals = image.detach().cpu().double().reshape(-1).numpy()
    lo, hi = (float(v) for v in np.percentile(vals, PERCENTILES))
    if not hi > lo:  # a constant image: any range shows it; keep it non-empty for matplotlib
        hi = lo + max(abs(lo), 1.0) * 1e-6
    p0, p1 = (f"{p:g}" for p in PERCENTILES)
    return DisplayWindow(lo, hi, f"{p0}–{p1} % range [{_fmt(lo)}, {_fmt(hi)}]", unit)


def plane_aspect(spacing: Sequence[float] | None, row_axis: int, col_axis: int) -> float:
    """``imshow``'s ``aspect`` for a plane whose displayed rows run along array axis ``row_axis`` and columns
    along ``col_axis``: ``spacing[row_axis] / spacing[col_axis]`` (1 without a spacing: square voxels)."""
    if spacing is None:
        return 1.0
    return float(spacing[row_axis]) / float(spacing[col_axis])
