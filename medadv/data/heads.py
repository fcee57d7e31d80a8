"""Real T1 heads with reference brain masks, from Debian packages: the inputs of brain extraction (deepbet).

* **Colin27** (Holmes et al., J Comput Assist Tomogr 1998: one subject scanned 27 times and averaged), Debian
  ``mricron-data`` (``apt-get install mricron-data``), ``/usr/share/mricron/templates/``: ``ch2.nii.gz`` the T1
  head **with skull**, 181×217×181 uint8 grey levels, 1 mm, RAS; ``ch2bet.nii.gz`` the same image skull-stripped
  (its voxels > 0 are the reference brain mask, 1737 ml); ``ch2better.nii.gz`` a 0.5 mm 301×370×316 version that
  is **already skull-stripped** (no skull: not the input brain extraction expects; its mask is its own voxels
  > 0, 1628 ml, Dice 0.946 with ch2bet's mask resampled onto its grid).
* **ITK KmeansTest** (a second subject), Debian ``insighttoolkit5-examples``
  (``apt-get install insighttoolkit5-examples``): ``KmeansTest_T1UCharRaw.nii.gz`` a T1 head with skull,
  128×128×62 grey levels 0..255 (stored int16), 2×2×3 mm, LSA on disk; ``KmeansTest_T1RawSkullStrip.nii.gz`` its
  skull-stripped k-means labels {0, 4, 5, 6} (voxels > 0 are the brain, ≈1540 ml). Both are reoriented to RAS.

Each loader returns a :class:`Head`: the image as float32 grey levels ``(D, H, W)`` in RAS canonical orientation
(values unchanged: no scaling, no resampling), the reference brain mask (bool, same grid), the voxel spacing in
mm and the affine. Nothing downloads; a missing package is one line naming the ``apt-get`` command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["Head", "colin27", "itk_head", "MRICRON_DIR", "ITK_DIR"]

MRICRON_DIR = Path("/usr/share/mricron/templates")
ITK_DIR = Path("/usr/share/doc/insighttoolkit5-examples/examples/Data")


@dataclass(frozen=True)
class Head:
    """One real T1 head and its reference brain mask, RAS canonical.

    Attributes:
        name: which subject and file.
        image: float32 ``(D, H, W)`` grey levels as stored (Colin27: 0..254).
        mask: bool ``(D, H, W)``, the reference brain (from the skull-stripped image).
        spacing: voxel size per axis, mm.
        affine: 4×4 float64 voxel-to-world (RAS mm) matrix of the canonical grid.
        with_skull: whether ``image`` shows the skull (what brain extraction expects as input).
        files: the files read.
    """

    name: str
    image: Tensor
    mask: Tensor
    spacing: tuple[float, float, float]
    affine: Tensor
    with_skull: bool
    files: tuple[str, ...]

    @property
    def voxel_ml(self) -> float:
        """The volume of one voxel in ml (mm³ / 1000)."""
        return self.spacing[0] * self.spacing[1] * self.spacing[2] / 1000.0

    def batch(self) -> Tensor:
        """The image as a model input ``(1, 1, D, H, W)`` (a copy)."""
        return self.image[None, None].clone()


def _read(path: Path, package: str) -> Any:
    import nibabel as nib

    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: it comes with the Debian package {package}; install it with: "
                                f"apt-get install {package}")
    return nib.as_closest_canonical(nib.load(str(path)))


def _head(name: str, image_path: Path, mask_path: Path, package: str, with_skull: bool) -> Head:
    import numpy as np

    img = _read(image_path, package)
    ref = _read(mask_path, package)
    if img.shape != ref.shape or not np.allclose(img.affine, ref.affine, atol=1e-4):
        raise ValueError(f"{mask_path} is not on {image_path}'s grid: shapes {img.shape} and {ref.shape}")
    data = np.asanyarray(img.dataobj)
    # from the canonical affine's columns: the header's zooms are in the file's axis order
    spacing = tuple(float(v) for v in np.linalg.norm(np.asarray(img.affine, float)[:3, :3], axis=0))
    return Head(name=name, image=torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)),
                mask=torch.from_numpy(np.ascontiguousarray(np.asanyarray(ref.dataobj) > 0)),
                spacing=(spacing[0], spacing[1], spacing[2]), affine=torch.from_numpy(np.asarray(img.affine, float)),
                with_skull=with_skull, files=(str(image_path), str(mask_path)))


def colin27(resolution: float = 1, directory: str | Path = MRICRON_DIR) -> Head:
    """Colin27 from Debian ``mricron-data``: the 1 mm T1 head with skull and ch2bet's brain (``resolution=1``), or
    the 0.5 mm image, already skull-stripped, with its own voxels > 0 as the mask (``resolution=0.5``)."""
    d = Path(directory)
    if resolution == 1:
        return _head("colin27 (ch2, 1 mm)", d / "ch2.nii.gz", d / "ch2bet.nii.gz", "mricron-data", True)
    if resolution == 0.5:
        return _head("colin27 (ch2better, 0.5 mm, skull-stripped)", d / "ch2better.nii.gz", d / "ch2better.nii.gz",
                     "mricron-data", False)
    raise ValueError(f"`resolution` must be 1 or 0.5 (mm; the two Colin27 images mricron-data ships), got {resolution!r}")


def itk_head(directory: str | Path = ITK_DIR) -> Head:
    """The ITK KmeansTest T1 head (Debian ``insighttoolkit5-examples``) and its skull-stripped labels > 0 as mask."""
    d = Path(directory)
    return _head("itk KmeansTest T1 (2x2x3 mm)", d / "KmeansTest_T1UCharRaw.nii.gz",
                 d / "KmeansTest_T1RawSkullStrip.nii.gz", "insighttoolkit5-examples", True)
