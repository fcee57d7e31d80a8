"""Real regression data, offline: tissue volume fractions of crops of the MNI152 brain template.

The MNI ICBM152 2009a T1 template and its grey/white-matter probability maps ship inside the ``nilearn`` wheel
(:mod:`medadv.data.mni152`; Fonov et al., NeuroImage 2011). A crop of the T1 image is the input, and its targets
are the share of the crop's voxels labelled grey matter and white matter in the tissue map derived from the
probability maps (:func:`medadv.data.mni152.load_tissue_map`): two numbers in [0, 1] per crop, a tissue
*volume fraction* (times the crop's volume, a tissue volume in mm³). They are computed from the real anatomy,
not drawn at random, and a model has to read the image's intensities and texture to predict them (grey matter
is darker than white matter on T1).

Splits follow :func:`~medadv.data.mni152.tissue_patches`: training crops come from the left hemisphere, test
crops from the right one (the template is nearly symmetric, so the task transfers while the crops differ).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .mni152 import sample_crops

__all__ = ["TISSUE_FRACTIONS", "tissue_fractions"]

#: the targets of :func:`tissue_fractions`, in column order
TISSUE_FRACTIONS = ("grey_matter_fraction", "white_matter_fraction")


def tissue_fractions(
    n: int,
    size: int = 24,
    spacing_mm: int = 2,
    split: str = "train",
    ndim: int = 2,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Crops of the MNI152 T1 template with their grey- and white-matter volume fractions.

    Returns ``x`` ``(n, 1, s, s)`` (``ndim=2``: axial slices of the crop) or ``(n, 1, s, s, s)`` (``ndim=3``),
    float32 in [0, 1], and ``y`` ``(n, 2)`` float32: the fraction of the crop's voxels (pixels) labelled grey
    matter and white matter (columns :data:`TISSUE_FRACTIONS`).

    Crop centres are drawn among brain voxels, so every crop holds tissue.

    Args:
        n: number of crops (>= 1).
        size: crop edge in voxels.
        spacing_mm: voxel size in mm (see :func:`~medadv.data.mni152.load_tissue_map`).
        split: ``"train"`` (left hemisphere), ``"test"`` (right hemisphere) or ``"all"``.
        ndim: 2 (axial 2-D crops) or 3 (cubic crops).
        seed: seed of the crop positions.
    """
    if ndim not in (2, 3):
        raise ValueError(f"`ndim` must be 2 or 3, got {ndim!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be an integer >= 1, got {n!r}")
    vol, lab, crops = sample_crops(n, size, spacing_mm, split, seed)
    xs, ys = [], []
    for (s0, s1, s2), c in crops:
        if ndim == 3:
            sl: tuple[slice | int, ...] = (slice(s0, s0 + size), slice(s1, s1 + size), slice(s2, s2 + size))
        else:  # the axial slice through the centre
            sl = (slice(s0, s0 + size), slice(s1, s1 + size), int(c[2]))
        crop, labels = vol[sl], lab[sl]
        xs.append(crop)
        ys.append(torch.stack([(labels == 1).float().mean(), (labels == 2).float().mean()]))
    return torch.stack(xs).unsqueeze(1).contiguous(), torch.stack(ys).contiguous()
