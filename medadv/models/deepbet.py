"""deepbet brain extraction with its preprocessing inside the model, so a threat model is stated in grey levels.

deepbet 1.0.2 (Fisch et al., "deepbet: Fast brain extraction of T1-weighted MRI using Convolutional Neural
Networks", Computers in Biology and Medicine 2024; PyPI, MIT) ships two TorchScript 3-D UNets (~2.1 M parameters
each) in its wheel's data, ``<site-packages>/data/models/bbox_model.pt`` and ``model.pt``. Its pipeline
(``deepbet.bet.BrainExtraction.run_model``), for a T1 head **with skull** in RAS canonical orientation:

1. resample the image to 128³ (``nearest-exact``); ``lo, hi`` = its 0.5 % and 99.5 % quantiles;
2. normalise: ``clamp((x - lo) / (hi - lo), 0, 1)``, then z-score over the image, then ``* 0.226 + 0.449``;
3. the **bbox** net gives brain probabilities on the 128³ grid; threshold 0.5, keep the largest connected
   component (26-connectivity), take its bounding box (rows whose mean exceeds 0.02) on the original grid with
   a 10 % margin per side;
4. crop the original image to that box, resample it to 256³, normalise it with the same ``lo, hi`` (z-score over
   the crop), run the **fine** net and resample its probabilities back into the box; outside the box the brain
   probability is 0.

:class:`DeepbetBBox` is stage 1-3's network alone (its probabilities resampled back to the input grid);
:class:`Deepbet` is the whole pipeline as one module. Both take the image in the scanner's own units (grey levels
as float, ``(N, 1, D, H, W)``, RAS canonical: e.g. :func:`medadv.data.heads.colin27`) and return softmax
**probabilities** ``(N, 2, D, H, W)`` on the input grid (channel 1: brain), so a task reads them with
``Segmentation(num_classes=2, outputs="probabilities")`` and ε is in grey levels.

**What is held fixed.** Called as they are, both modules recompute everything from the image they are given, as
deepbet does: the quantiles ``lo, hi`` (differentiable: ``torch.quantile``'s gradient reaches the two voxels
interpolated) and, for :class:`Deepbet`, the box (discrete: no gradient; the bbox net runs under ``no_grad``).
After :meth:`fit` on the clean image they are **frozen** to the clean image's values: an attacker then moves
the voxels within the clean normalisation window and the clean box, the threat model of a pipeline whose
preprocessing was fixed before the attack, and the box cannot jump between attack steps (which would make the
loss discontinuous in the input). The z-score mean and standard deviation stay live and differentiable in both
modes: deepbet computes them per image, they move smoothly with the input, and freezing them would
under-state what the attacker controls. ``nearest-exact`` resampling has no gradient with respect to sample
positions (there are none to move), but passes gradients to the voxels it samples: an input voxel that no
output sample reads gets zero gradient, as it has zero influence.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DeepbetBBox", "Deepbet", "deepbet_weights", "load_deepbet_net", "DISTRIBUTION", "VERSION",
           "QUANTILES", "PAPER", "INSTALL"]

#: the distribution whose wheel holds the weights, and the version the wrapper reproduces
DISTRIBUTION = "deepbet"
VERSION = "1.0.2"
INSTALL = f"pip install {DISTRIBUTION}=={VERSION}"
PAPER = ("Fisch L. et al., deepbet: Fast brain extraction of T1-weighted MRI using Convolutional Neural Networks, "
         "Computers in Biology and Medicine 179 (2024) 108845")
#: the intensity quantiles deepbet normalises with (of the 128³ resample)
QUANTILES = (0.005, 0.995)
#: deepbet's affine after the z-score (ImageNet's grey mean and std)
_SCALE, _SHIFT = 0.226, 0.449
#: a grid side must be a multiple of this (checked on the TorchScript nets: 32, 64, 96 and 128 run, 48 fails)
_MULTIPLE = 32
_FILES = {"bbox": "data/models/bbox_model.pt", "fine": "data/models/model.pt"}


def deepbet_weights(distribution: str = DISTRIBUTION) -> dict[str, Path]:
    """``{"bbox": path, "fine": path}``: the TorchScript files inside the installed ``distribution``'s wheel.

    Found through ``importlib.metadata`` (the wheel's RECORD), never by importing ``deepbet`` (its package imports
    GUI and connected-component libraries a model does not need). Each file's SHA-256 is checked against the
    RECORD. Raises ``FileNotFoundError`` in one line naming what to install when the distribution or a file is
    missing or altered.
    """
    try:
        files = importlib.metadata.files(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"deepbet's weights not found: the distribution {distribution!r} is not "
                                f"installed; install it with: {INSTALL}") from None
    by_name = {str(f): f for f in files or []}
    out: dict[str, Path] = {}
    for stage, rel in _FILES.items():
        record = by_name.get(rel)
        path = Path(str(record.locate())) if record is not None else None
        if record is None or path is None or not path.is_file():
            raise FileNotFoundError(f"deepbet's {stage} weights {rel} are missing from the installed distribution "
                                    f"{distribution!r}; reinstall it with: {INSTALL} --force-reinstall")
        if record.hash is not None and record.hash.mode == "sha256":
            import base64

            digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
            if digest != record.hash.value:
                raise FileNotFoundError(f"deepbet's {stage} weights {path} differ from the wheel's record (sha256); "
                                        f"reinstall with: {INSTALL} --force-reinstall")
        out[stage] = path
    return out


def load_deepbet_net(stage: str, distribution: str = DISTRIBUTION) -> nn.Module:
    """One of deepbet's two TorchScript UNets (``stage`` ``"bbox"`` or ``"fine"``), on the CPU in eval mode."""
    from .io import load_torchscript

    if stage not in _FILES:
        raise ValueError(f"`stage` must be 'bbox' or 'fine', got {stage!r}")
    path = deepbet_weights(distribution)[stage]
    return load_torchscript(path, "cpu", where=f"deepbet {stage} model").eval()


def _grid(value: int | Sequence[int], name: str) -> tuple[int, int, int]:
    sides = (value,) * 3 if isinstance(value, int) and not isinstance(value, bool) else value
    if (not isinstance(sides, Sequence) or len(sides) != 3
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sides)):
        raise TypeError(f"`{name}` must be a positive int or three of them (voxels per side), got {value!r}")
    bad = [s for s in sides if s % _MULTIPLE]
    if bad:
        raise ValueError(f"`{name}` sides must be multiples of {_MULTIPLE} (the TorchScript UNets fail on a side of 48), "
                         f"got {tuple(sides)}")
    return (int(sides[0]), int(sides[1]), int(sides[2]))


def _check_input(x: Any, what: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 5 or x.shape[1] != 1 or x.shape[0] == 0:
        raise ValueError(f"{what} takes one T1 image per sample, (N, 1, D, H, W) with N >= 1, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{what} takes grey levels as a floating-point tensor, got {x.dtype} (use x.float())")


def _resample(x: Tensor, size: Sequence[int]) -> Tensor:
    """deepbet's resampling: ``nearest-exact`` (gradients reach the sampled voxels)."""
    return F.interpolate(x, size=tuple(size), mode="nearest-exact")


def _quantiles(small: Tensor) -> tuple[Tensor, Tensor]:
    """Per sample ``(lo, hi)``, each ``(N,)``: deepbet's 0.5 / 99.5 % quantiles of the resampled image."""
    q = torch.tensor(QUANTILES, dtype=small.dtype, device=small.device)
    # one sample at a time: torch.quantile refuses inputs over 2**24 elements
    both = torch.stack([s.flatten().quantile(q) for s in small])
    return both[:, 0], both[:, 1]


def _normalize(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """``deepbet.utils.normalize`` per sample: window to ``[lo, hi]``, clamp, z-score, ``* 0.226 + 0.449``."""
    shape = (-1,) + (1,) * (x.ndim - 1)
    x = ((x - lo.view(shape)) / (hi - lo).view(shape)).clamp(0, 1)
    dims = tuple(range(1, x.ndim))
    x = (x - x.mean(dim=dims, keepdim=True)) / x.std(dim=dims, keepdim=True)
    return _SCALE * x + _SHIFT


def _check_window(lo: Tensor, hi: Tensor, what: str) -> None:
    if not bool(torch.isfinite(lo).all() & torch.isfinite(hi).all()):
        raise ValueError(f"{what}: the image holds NaN or Inf (its intensity quantiles are not finite)")
    if not bool((hi > lo).all()):
        raise ValueError(f"{what}: the image's 0.5 % and 99.5 % intensity quantiles are equal (a constant image?); "
                         "deepbet normalises by their difference")


def largest_component_box(mask_small: Tensor, shape: Sequence[int], margin: float = 0.1) -> tuple[slice, ...]:
    """deepbet's crop box on the grid ``shape`` from the coarse mask ``mask_small`` (a bool ``(d, h, w)``).

    The largest 26-connected component, the rows/columns/slices whose mean over it exceeds 0.02, scaled to
    ``shape``, widened by ``margin`` of its size on each side and rounded half to even (torch's ``round``), as
    ``BrainExtraction.get_bbox_with_margin`` does. Raises ``ValueError`` when the coarse mask is empty.
    """
    import numpy as np
    from scipy import ndimage

    arr = mask_small.detach().cpu().numpy().astype(bool)
    labels, n = ndimage.label(arr, structure=np.ones((3, 3, 3), dtype=bool))
    if n == 0:
        raise ValueError("deepbet's bbox stage found no brain in the image (no voxel above 0.5); is it a T1 head in "
                         "RAS orientation, in grey levels?")
    largest = int(np.bincount(labels[labels != 0]).argmax())
    m = torch.from_numpy(labels == largest).float()
    rs = [torch.where(m.mean(dims) > 0.02)[0] for dims in [(1, 2), (0, 2), (0, 1)]]
    if any(r.numel() == 0 for r in rs):
        raise ValueError("deepbet's bbox stage found too little brain to place a box (rows with >2 % brain)")
    # the same tensor arithmetic as deepbet (float32, then round half to even) so the box is the same voxel for voxel
    center = torch.tensor([(r.max() + 1 + r.min()) / 2 for r in rs])
    size = torch.tensor([(r.max() + 1) - r.min() for r in rs])
    scale = torch.tensor(list(shape)) / torch.tensor(m.shape)
    center, size = scale * center, scale * size
    size = (1 + 2 * (margin * torch.ones(3))) * size
    center, size = center.round(), size.round()
    box = [[int(c - s / 2), int(c + s / 2)] for c, s in zip(center, size, strict=True)]
    return tuple(slice(max(0, b[0]), min(int(s), b[1])) for b, s in zip(box, shape, strict=True))


class DeepbetBBox(nn.Module):
    """deepbet's coarse (bbox) network with its preprocessing: grey levels in, brain probabilities out.

    ``forward(x)``: ``x`` ``(N, 1, D, H, W)`` float grey levels, RAS canonical; resampled to ``size``
    (``nearest-exact``), normalised as deepbet does (module docstring), the bbox net's softmax probabilities
    resampled back to ``(N, 2, D, H, W)`` (``nearest-exact``). ``size`` 128 is deepbet's; 96 or 64 run in a
    fraction of the time on a CPU (multiples of 16). Quantiles are live until :meth:`fit` freezes them.

    Args:
        size: the resampled grid (an int or three), voxels per side.
        net: the TorchScript bbox net (default: read from the installed ``distribution``).
        distribution: where the weights come from (:func:`deepbet_weights`).
    """

    def __init__(self, size: int | Sequence[int] = 128, net: nn.Module | None = None,
                 distribution: str = DISTRIBUTION) -> None:
        super().__init__()
        self.size = _grid(size, "size")
        self.net = net if net is not None else load_deepbet_net("bbox", distribution)
        self._window: tuple[Tensor, Tensor] | None = None
        self._fitted_shape: tuple[int, ...] | None = None

    @property
    def frozen(self) -> bool:
        """Whether :meth:`fit` froze the normalisation window (quantiles) to a clean image's."""
        return self._window is not None

    def window(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The clean image's ``(lo, hi)`` per sample, ``(N,)`` each (grey levels), computed without gradient."""
        _check_input(x, type(self).__name__)
        with torch.no_grad():
            lo, hi = _quantiles(_resample(x, self.size))
        _check_window(lo, hi, f"{type(self).__name__}.fit")
        return lo, hi

    def fit(self, x_clean: Tensor) -> DeepbetBBox:
        """Freeze the normalisation window to ``x_clean``'s quantiles (per sample); returns ``self``.

        Later calls must give inputs of ``x_clean``'s shape (the same cases, e.g. attacked); :meth:`reset` unfreezes.
        ``x_clean`` is read, never modified."""
        self._window = self.window(x_clean)
        self._fitted_shape = tuple(x_clean.shape)
        return self

    def reset(self) -> DeepbetBBox:
        """Forget what :meth:`fit` froze: quantiles are recomputed from each input again."""
        self._window, self._fitted_shape = None, None
        return self

    def _frozen_window(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        if self._window is None:
            return None
        if tuple(x.shape) != self._fitted_shape:
            raise ValueError(f"{type(self).__name__} was fitted on images of shape {self._fitted_shape}, got "
                             f"{tuple(x.shape)}: call fit(x_clean) on these cases first (or reset())")
        lo, hi = self._window
        return lo.to(x.device, x.dtype), hi.to(x.device, x.dtype)

    def coarse(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(probabilities on the small grid (N, 2, *size), lo, hi)``: the bbox net on the normalised resample."""
        _check_input(x, type(self).__name__)
        small = _resample(x, self.size)
        window = self._frozen_window(x)
        if window is None:
            lo, hi = _quantiles(small)
            _check_window(lo.detach(), hi.detach(), type(self).__name__)
        else:
            lo, hi = window
        return self.net(_normalize(small, lo, hi)), lo, hi

    def forward(self, x: Tensor) -> Tensor:
        """Brain probabilities ``(N, 2, D, H, W)`` on ``x``'s grid (channel 1: brain)."""
        probs, _, _ = self.coarse(x)
        return _resample(probs, x.shape[2:])


class Deepbet(nn.Module):
    """deepbet's two-stage pipeline as one module: grey levels in, brain probabilities on the input grid out.

    ``forward(x)``: ``x`` ``(N, 1, D, H, W)`` float grey levels, RAS canonical. The bbox stage
    (:class:`DeepbetBBox` at ``bbox_size``) places a box around the brain (:func:`largest_component_box`); the
    box is cropped from ``x``, resampled to ``size``, normalised with the bbox stage's ``lo, hi`` (z-score over the
    crop) and segmented by the fine net; its probabilities are resampled back into the box. Outside the box the
    output is background with probability 1, as in deepbet. deepbet's sizes are ``bbox_size=128, size=256``.

    Live by default (quantiles and box recomputed from each input, the box without gradient); :meth:`fit` freezes
    the clean image's quantiles and box (module docstring says why). deepbet's post-processing of the final
    mask (largest component, filled voids, after thresholding) is not part of the model: it has no gradient and
    works on the thresholded mask; a caller reproducing deepbet's saved mask applies it after thresholding.

    Args:
        bbox_size: the bbox stage's grid (voxels per side, multiples of 16).
        size: the fine stage's grid for the cropped box.
        margin: the box's margin on each side, a fraction of its size (deepbet: 0.1).
        bbox_net, net: the TorchScript nets (default: read from the installed ``distribution``).
        distribution: where the weights come from (:func:`deepbet_weights`).
    """

    def __init__(self, bbox_size: int | Sequence[int] = 128, size: int | Sequence[int] = 256, margin: float = 0.1,
                 bbox_net: nn.Module | None = None, net: nn.Module | None = None,
                 distribution: str = DISTRIBUTION) -> None:
        super().__init__()
        if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin < 1:
            raise ValueError(f"`margin` must be a number in [0, 1) (a fraction of the box's size), got {margin!r}")
        self.size = _grid(size, "size")
        self.margin = float(margin)
        weights = deepbet_weights(distribution) if bbox_net is None or net is None else None
        self.bbox = DeepbetBBox(bbox_size, net=bbox_net if bbox_net is not None else
                                _load(weights, "bbox"))
        self.net = net if net is not None else _load(weights, "fine")
        self._boxes: list[tuple[slice, ...]] | None = None

    @property
    def frozen(self) -> bool:
        """Whether :meth:`fit` froze the quantiles and the box to a clean image's."""
        return self._boxes is not None

    @property
    def boxes(self) -> list[tuple[slice, ...]] | None:
        """The frozen boxes, one ``(slice, slice, slice)`` per sample on the input grid (``None`` when live)."""
        return None if self._boxes is None else list(self._boxes)

    def locate(self, x: Tensor) -> list[tuple[slice, ...]]:
        """The box per sample that deepbet would crop for ``x`` (no gradient; the bbox stage's quantiles as set)."""
        with torch.no_grad():
            probs, _, _ = self.bbox.coarse(x)
        return [largest_component_box(p[1] > 0.5, x.shape[2:], self.margin) for p in probs]

    def fit(self, x_clean: Tensor) -> Deepbet:
        """Freeze the quantiles and the box to ``x_clean``'s (per sample); returns ``self``. ``x_clean`` is only read."""
        self.bbox.reset()
        self.bbox.fit(x_clean)
        self._boxes = self.locate(x_clean)
        return self

    def reset(self) -> Deepbet:
        """Forget what :meth:`fit` froze."""
        self.bbox.reset()
        self._boxes = None
        return self

    def forward(self, x: Tensor) -> Tensor:
        """Brain probabilities ``(N, 2, D, H, W)`` on ``x``'s grid (channel 1: brain)."""
        _check_input(x, type(self).__name__)
        small = _resample(x, self.bbox.size)
        window = self.bbox._frozen_window(x)
        if window is None:  # live: the window from this input, then its box
            lo, hi = _quantiles(small)
            _check_window(lo.detach(), hi.detach(), type(self).__name__)
            with torch.no_grad():
                coarse = self.bbox.net(_normalize(small.detach(), lo.detach(), hi.detach()))
            boxes = [largest_component_box(p[1] > 0.5, x.shape[2:], self.margin) for p in coarse]
        else:
            lo, hi = window
            assert self._boxes is not None  # fitted together with the window
            boxes = self._boxes
        crops = torch.cat([_resample(x[i:i + 1, :, box[0], box[1], box[2]], self.size) for i, box in enumerate(boxes)])
        fine = self.net(_normalize(crops, lo, hi))
        # channel 0 is background: 1 outside the box, as deepbet's mask is 0 there; pad (p - bg) with zeros
        background = torch.tensor([1.0, 0.0], dtype=fine.dtype, device=fine.device).view(1, 2, 1, 1, 1)
        outs = []
        for i, box in enumerate(boxes):
            inside = _resample(fine[i:i + 1], [b.stop - b.start for b in box])
            pad: list[int] = []
            for b, n in zip(reversed(box), reversed(x.shape[2:]), strict=True):  # F.pad: last axis first
                pad += [b.start, int(n) - b.stop]
            outs.append(F.pad(inside - background, pad) + background)
        return torch.cat(outs)


def _load(weights: dict[str, Path] | None, stage: str) -> nn.Module:
    from .io import load_torchscript

    assert weights is not None  # read when a net was not given
    return load_torchscript(weights[stage], "cpu", where=f"deepbet {stage} model").eval()
