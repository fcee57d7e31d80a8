"""Real 3-D brain MRI with a tissue label map, offline: the MNI ICBM152 2009a template.

The T1 template and its grey/white-matter probability maps ship inside the ``nilearn`` wheel, so they
load with no network. Labels are derived from the probability maps (a tissue segmentation of real
anatomy, 152 subjects averaged): 0 background, 1 grey matter, 2 white matter, 3 other brain (brain
voxels where neither GM nor WM dominates). The files are found without importing nilearn.

For train/test splits the volume is cut at the mid-sagittal plane: training crops come from the
left hemisphere, test crops from the right one, so a model is evaluated on anatomy it never saw.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["TISSUE_CLASSES", "KINDS", "mni152_files", "load_tissue_map", "tissue_patches", "tissue_slices",
           "tissue_classes", "tissue_labels"]

TISSUE_CLASSES = ("background", "grey matter", "white matter", "other brain")


def mni152_files() -> dict[str, Path]:
    """Paths of the T1, GM and WM templates inside the installed nilearn package."""
    spec = importlib.util.find_spec("nilearn")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the MNI152 template ships with nilearn: `pip install nilearn` (no network needed at run time)")
    root = Path(spec.submodule_search_locations[0]) / "datasets" / "data"
    files = {k: root / f"mni_icbm152_{k}_tal_nlin_sym_09a_converted.nii.gz" for k in ("t1", "gm", "wm")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"MNI152 template files missing from the nilearn install: {missing}")
    return files


@lru_cache(maxsize=4)
def _load(spacing_mm: int) -> tuple[np.ndarray, np.ndarray]:
    import nibabel as nib

    files = mni152_files()
    # nibabel types load() as the generic FileBasedImage; these files are NIfTI images
    vols = {k: np.asarray(nib.load(str(p)).get_fdata(), dtype=np.float32) / 255.0  # type: ignore[attr-defined]
            for k, p in files.items()}
    if spacing_mm > 1:
        # average-pool intensities and probabilities, then label the pooled maps: labels stay
        # consistent with the image at the coarser grid
        def pool(v: np.ndarray) -> np.ndarray:
            t = torch.from_numpy(v)[None, None]
            return F.avg_pool3d(t, spacing_mm, ceil_mode=True)[0, 0].numpy()

        vols = {k: pool(v) for k, v in vols.items()}
    t1, gm, wm = vols["t1"], vols["gm"], vols["wm"]
    lab = np.zeros(t1.shape, np.int64)
    lab[t1 > 0.2] = 3
    lab[(gm > wm) & (gm > 0.3)] = 1
    lab[(wm >= gm) & (wm > 0.3)] = 2
    return np.clip(t1, 0.0, 1.0), lab


def load_tissue_map(spacing_mm: int = 2) -> tuple[Tensor, Tensor]:
    """The whole MNI152 T1 volume in [0, 1] ``(D, H, W)`` float32 and its tissue labels (int64).

    Args:
        spacing_mm: isotropic voxel size in mm (integer >= 1; 1 is the native grid, 197x233x189).
    """
    if int(spacing_mm) != spacing_mm or spacing_mm < 1:
        raise ValueError(f"`spacing_mm` must be an integer >= 1, got {spacing_mm}")
    t1, lab = _load(int(spacing_mm))
    return torch.from_numpy(t1.copy()), torch.from_numpy(lab.copy())


def sample_crops(n: int, size: int, spacing_mm: int, split: str, seed: int
                 ) -> tuple[Tensor, Tensor, list[tuple[list[int], Tensor]]]:
    """The T1 volume, its tissue labels and ``n`` seeded crop positions: per crop the start index of a ``size``³
    cube on each axis (inside the split's hemisphere along axis 0) and the brain voxel it is centred on."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"`split` must be 'train', 'test' or 'all', got {split!r}")
    vol, lab = load_tissue_map(spacing_mm)
    d = vol.shape[0]
    lo, hi = {"train": (0, d // 2), "test": (d // 2, d), "all": (0, d)}[split]
    if hi - lo < size or min(vol.shape[1:]) < size:
        raise ValueError(f"`size`={size} does not fit the {split} region of a {tuple(vol.shape)} volume")
    gen = torch.Generator().manual_seed(seed)
    brain = (lab > 0).nonzero()
    half = size // 2
    crops = []
    for _ in range(n):
        c = brain[torch.randint(len(brain), (1,), generator=gen)].squeeze(0)
        starts = [min(max(int(c[0]) - half, lo), hi - size),
                  min(max(int(c[1]) - half, 0), vol.shape[1] - size),
                  min(max(int(c[2]) - half, 0), vol.shape[2] - size)]
        crops.append((starts, c))
    return vol, lab, crops


def tissue_patches(
    n: int,
    size: int = 32,
    spacing_mm: int = 2,
    split: str = "train",
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Random cubic crops of the MNI152 tissue task: ``x (n, 1, s, s, s)`` in [0, 1], ``y (n, s, s, s)``.

    Crop centres are drawn among brain voxels, so every crop contains tissue.

    Args:
        n: number of crops.
        size: crop edge in voxels.
        spacing_mm: voxel size (see :func:`load_tissue_map`).
        split: ``"train"`` (left hemisphere), ``"test"`` (right hemisphere) or ``"all"``.
        seed: seed of the crop positions.
    """
    if n < 1:
        raise ValueError(f"`n` must be >= 1, got {n}")
    vol, lab, crops = sample_crops(n, size, spacing_mm, split, seed)
    xs, ys = [], []
    for starts, _ in crops:
        sl = tuple(slice(s, s + size) for s in starts)
        xs.append(vol[sl])
        ys.append(lab[sl])
    return torch.stack(xs).unsqueeze(1).contiguous(), torch.stack(ys).contiguous()


def tissue_slices(n: int, size: int = 32, spacing_mm: int = 2, split: str = "train", seed: int = 0
                  ) -> tuple[Tensor, Tensor]:
    """2-D segmentation: the middle axial slice of each :func:`tissue_patches` crop, ``x (n, 1, s, s)`` in [0, 1]
    and its tissue labels ``y (n, s, s)`` (the four :data:`TISSUE_CLASSES`)."""
    x, y = tissue_patches(n, size=size, spacing_mm=spacing_mm, split=split, seed=seed)
    return x[..., size // 2].contiguous(), y[..., size // 2].contiguous()


def tissue_classes(n: int, size: int = 32, spacing_mm: int = 2, split: str = "train", seed: int = 0
                   ) -> tuple[Tensor, Tensor]:
    """2-D multi-class classification: which tissue is at the centre of an axial patch.

    ``x (n, 1, s, s)`` in [0, 1]; ``y (n,)`` 0 grey matter, 1 white matter, 2 other brain. Centres are drawn
    in turn from the voxels of each tissue (balanced classes), inside the split's hemisphere, so that the patch
    fits the volume without shifting its centre.
    """
    if n < 1:
        raise ValueError(f"`n` must be >= 1, got {n}")
    if split not in ("train", "test", "all"):
        raise ValueError(f"`split` must be 'train', 'test' or 'all', got {split!r}")
    vol, lab = load_tissue_map(spacing_mm)
    d, h, w = vol.shape
    half = size // 2
    lo, hi = {"train": (0, d // 2), "test": (d // 2, d), "all": (0, d)}[split]
    if hi - lo < 1 or h < size or w < size:
        raise ValueError(f"`size`={size} does not fit a {tuple(vol.shape)} volume")
    inside = torch.zeros_like(lab, dtype=torch.bool)
    inside[lo:hi, half:h - size + half + 1, half:w - size + half + 1] = True
    gen = torch.Generator().manual_seed(seed)
    pools = [((lab == k) & inside).nonzero() for k in (1, 2, 3)]
    xs, ys = [], []
    for i in range(n):
        k = i % 3
        c = pools[k][torch.randint(len(pools[k]), (1,), generator=gen)].squeeze(0).tolist()
        xs.append(vol[c[0], c[1] - half:c[1] - half + size, c[2] - half:c[2] - half + size])
        ys.append(k)
    return torch.stack(xs).unsqueeze(1).contiguous(), torch.tensor(ys, dtype=torch.long)


def tissue_labels(n: int, size: int = 32, spacing_mm: int = 2, split: str = "train", seed: int = 0,
                  min_fraction: float = 0.3) -> tuple[Tensor, Tensor]:
    """2-D multi-label classification: which of background, grey matter and white matter cover at least
    ``min_fraction`` of an axial patch (at 0.3: about 40 %, 85 % and 50 % of the patches).

    ``x (n, 1, s, s)`` in [0, 1] (the slices of :func:`tissue_slices`); ``y (n, 3)`` float 0/1.
    """
    if not 0.0 < min_fraction < 1.0:
        raise ValueError(f"`min_fraction` must be in (0, 1), got {min_fraction}")
    x, seg = tissue_slices(n, size=size, spacing_mm=spacing_mm, split=split, seed=seed)
    frac = torch.stack([(seg == k).flatten(1).float().mean(1) for k in (0, 1, 2)], dim=1)
    return x, (frac >= min_fraction).float()


#: the ``mni152`` config source's ``kind``: its function (``n`` and the ``kwargs`` are passed on)
KINDS = {"patches": tissue_patches, "slices": tissue_slices, "classes": tissue_classes, "labels": tissue_labels}
