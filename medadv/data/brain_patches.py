"""Real 2-D multi-label brain-MRI patches with real anatomical labels (offline).

Primary source: the Colin27 T1 MRI (``ch2bet``, skull-stripped, 1 mm) and the AAL atlas (116 expert
regions on the same grid) from the Debian package ``mricron-data`` (``apt-get install mricron-data``,
files in ``/usr/share/mricron/templates``). The 116 AAL regions are grouped into 8 macro-regions and an
axial patch is labelled with every macro-region that covers at least ``min_pixels`` of its pixels.

Pip-only fallback (when the Debian package is absent): the MNI ICBM152 2009a T1 template and its
grey/white-matter probability maps shipped inside the ``nilearn`` wheel; labels are tissue class x
hemisphere: grey matter and white matter (probability > 0.3, the larger of the two) in the left and the
right hemisphere (the template is symmetric, midline at world x = 0), and other brain tissue (CSF and
deep structures: brain voxels that are neither). Tissue alone would not do: nearly every patch holds
grey matter.

Both are real anatomy (one subject averaged over 27 scans; a 152-subject template) with atlas-derived
labels. :attr:`BrainPatches.source` says which one was used. Cite Holmes et al. 1998 (Colin27) and
Tzourio-Mazoyer et al. 2002 (AAL), or Fonov et al. 2011 (ICBM152 2009a).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["BrainPatches", "brain_patches", "AAL_MACRO_REGIONS", "TISSUE_LABELS", "MRICRON_DIR"]

MRICRON_DIR = Path(os.environ.get("MEDADV_MRICRON_DIR", "/usr/share/mricron/templates"))

#: AAL label ranges (inclusive) of the 8 macro-regions.
AAL_MACRO_REGIONS: dict[str, list[tuple[int, int]]] = {
    "frontal": [(1, 28), (69, 70)],
    "insula_cingulate": [(29, 36)],
    "medial_temporal": [(37, 42)],
    "occipital": [(43, 56)],
    "parietal": [(57, 68)],
    "subcortical": [(71, 78)],
    "temporal": [(79, 90)],
    "cerebellum": [(91, 116)],
}
TISSUE_LABELS = ("grey_matter_left", "grey_matter_right", "white_matter_left", "white_matter_right", "other_brain")


@dataclass
class BrainPatches:
    """A patch set: ``x`` ``(N, 1, S, S)`` float32 in [0, 1]; ``y`` ``(N, L)`` float32 multi-hot.

    Attributes:
        label_names: the L label names, in column order.
        source: ``"mricron:colin27+aal"`` or ``"nilearn:mni152+tissue-hemisphere"``.
        slice_index: ``(N,)`` axial slice (voxel z) of each patch; train/test splits never share a slice.
    """

    x: Tensor
    y: Tensor
    label_names: tuple[str, ...]
    source: str
    slice_index: Tensor

    def __len__(self) -> int:
        return int(self.x.shape[0])


def _load(path: Path, affine: bool = False):
    import nibabel as nib

    img: Any = nib.load(str(path))  # typed as the generic FileBasedImage; these are NIfTI/Analyze images
    return (np.asarray(img.dataobj), img.affine) if affine else np.asarray(img.dataobj)


def _mricron() -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    img = _load(MRICRON_DIR / "ch2bet.nii.gz").astype(np.float32)
    aal = _load(MRICRON_DIR / "aal.nii.gz").astype(np.int64)
    lut = np.zeros(max(hi for r in AAL_MACRO_REGIONS.values() for _, hi in r) + 1, dtype=np.int64)
    for k, ranges in enumerate(AAL_MACRO_REGIONS.values(), start=1):
        for lo, hi in ranges:
            lut[lo:hi + 1] = k
    return img / img.max(), lut[np.clip(aal, 0, lut.size - 1)], tuple(AAL_MACRO_REGIONS)


def _nilearn_dir() -> Path:
    spec = importlib.util.find_spec("nilearn")  # locate the wheel's data without importing nilearn
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"no brain-MRI source found: install the Debian package `mricron-data` (expected {MRICRON_DIR}) "
            "or the PyPI package `nilearn` (MNI152 templates inside its wheel)"
        )
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data"


def _mni152() -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    d = _nilearn_dir()

    def load(kind: str) -> np.ndarray:
        return _load(d / f"mni_icbm152_{kind}_tal_nlin_sym_09a_converted.nii.gz").astype(np.float32) / 255.0

    t1, gm, wm = load("t1"), load("gm"), load("wm")
    affine = _load(d / "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz", affine=True)[1]
    world_x = affine[0, 0] * np.arange(t1.shape[0]) + affine[0, 3]
    right = (world_x > 0)[:, None, None]  # RAS: positive x is the subject's right
    lab = np.zeros(t1.shape, np.int64)
    lab[t1 > 0.2] = 5
    lab[(gm > wm) & (gm > 0.3)] = 1
    lab[(wm >= gm) & (wm > 0.3)] = 3
    lab = np.where((lab == 1) | (lab == 3), lab + right, lab)
    return t1 / t1.max(), lab, TISSUE_LABELS


def brain_patches(
    *,
    source: str = "auto",
    patch: int = 64,
    downsample: int = 2,
    slice_step: int = 3,
    crops_per_slice: int = 8,
    min_pixels: int = 50,
    min_brain: float = 0.25,
    split: str = "all",
    test_every: int = 5,
    seed: int = 0,
) -> BrainPatches:
    """Build the patch set (deterministic for a seed; about a second).

    Args:
        source: ``"auto"`` (mricron-data if installed, else nilearn), ``"mricron"`` or ``"nilearn"``.
        patch: side of the square crop at 1 mm, in voxels.
        downsample: average-pooling factor applied to the crop (64 / 2 gives 32x32 patches at 2 mm);
            labels are computed at 1 mm before pooling.
        slice_step: use every ``slice_step``-th axial slice that contains labelled brain.
        crops_per_slice: random crops per slice (crops with less than ``min_brain`` brain are redrawn,
            up to 20 tries each).
        min_pixels: a label is present when its region covers at least this many 1 mm pixels.
        min_brain: minimum fraction of labelled brain pixels in a crop.
        split: ``"all"``, ``"train"`` or ``"test"``. Slices are grouped in blocks of two consecutive
            used slices; every ``test_every``-th block is test. Patches of one slice overlap, so they never
            straddle the split; neighbouring blocks are still anatomically similar.
        test_every: see ``split``.
        seed: seed of the crop positions.
    """
    if source not in ("auto", "mricron", "nilearn"):
        raise ValueError(f"`source` must be 'auto', 'mricron' or 'nilearn', got {source!r}")
    if split not in ("all", "train", "test"):
        raise ValueError(f"`split` must be 'all', 'train' or 'test', got {split!r}")
    for name, v in (("patch", patch), ("downsample", downsample), ("slice_step", slice_step),
                    ("crops_per_slice", crops_per_slice), ("min_pixels", min_pixels), ("test_every", test_every)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"`{name}` must be an integer >= 1, got {v!r}")
    if patch % downsample:
        raise ValueError(f"`patch` ({patch}) must be a multiple of `downsample` ({downsample})")
    if not 0.0 <= float(min_brain) <= 1.0:
        raise ValueError(f"`min_brain` must be in [0, 1], got {min_brain}")
    if source == "mricron" or (source == "auto" and (MRICRON_DIR / "ch2bet.nii.gz").is_file()):
        if not (MRICRON_DIR / "ch2bet.nii.gz").is_file():
            raise FileNotFoundError(f"mricron-data not found: expected {MRICRON_DIR / 'ch2bet.nii.gz'} "
                                    "(apt-get install mricron-data, or set MEDADV_MRICRON_DIR)")
        img, lab, names, tag = *_mricron(), "mricron:colin27+aal"
    else:
        img, lab, names, tag = *_mni152(), "nilearn:mni152+tissue-hemisphere"
    if patch > min(img.shape[0], img.shape[1]):
        raise ValueError(f"`patch` ({patch}) exceeds the in-plane size {img.shape[:2]}")

    rng = np.random.default_rng(seed)
    zs = np.flatnonzero((lab > 0).any(axis=(0, 1)))[::slice_step]
    xs, ys, zi = [], [], []
    n_labels = len(names)
    for k, z in enumerate(zs):
        is_test = (k // 2) % test_every == test_every - 1
        if (split == "train" and is_test) or (split == "test" and not is_test):
            continue
        sl, ll = img[:, :, z], lab[:, :, z]
        for _ in range(crops_per_slice):
            for _try in range(20):
                i = int(rng.integers(0, sl.shape[0] - patch + 1))
                j = int(rng.integers(0, sl.shape[1] - patch + 1))
                lp = ll[i:i + patch, j:j + patch]
                if (lp > 0).mean() >= min_brain:
                    break
            else:
                continue
            counts = np.bincount(lp.ravel(), minlength=n_labels + 1)[1:]
            xs.append(sl[i:i + patch, j:j + patch])
            ys.append(counts >= min_pixels)
            zi.append(int(z))
    if not xs:
        raise ValueError("no patch met `min_brain`; lower it or the patch size")
    x = torch.from_numpy(np.stack(xs)).unsqueeze(1).float()
    if downsample > 1:
        x = torch.nn.functional.avg_pool2d(x, downsample)
    # Axial slices are stored (x: left-right, y: posterior-anterior); transpose so anterior is up.
    x = x.transpose(-1, -2).flip(-2).contiguous().clamp(0.0, 1.0)
    y = torch.from_numpy(np.stack(ys)).float()
    return BrainPatches(x=x, y=y, label_names=tuple(names), source=tag, slice_index=torch.tensor(zi))
