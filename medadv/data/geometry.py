"""Image and label geometry from file headers, checked before any voxel is read (issue 28).

A label map is only meaningful on its image's grid: the same spatial shape and the same voxel-to-world affine
(spacing, orientation, origin). MONAI reads each file on its own and would pair a label saved at 2 mm with an
image at 1 mm, or one shifted by a few voxels, without a word; Dice is then computed between misaligned
volumes. This module reads what MONAI will read, from the headers only (nibabel for NIfTI, pydicom for DICOM
series folders, PIL for PNG / JPEG / BMP, NumPy's header for ``.npy``), and compares image and label:

* **world formats** (NIfTI, DICOM): spatial shape and affine (voxel -> RAS mm, as MONAI's readers give it) must
  agree within :data:`GEOMETRY_TOLERANCE` of the image's smallest voxel size, whatever the two formats;
* **pixel formats** (PNG / JPEG / BMP, height-first as medadv reads them) and **arrays** (``.npy``): the same
  spatial shape when image and label are of the same family (they carry no affine);
* a DICOM series is **complete**: its slices, in MONAI's order (``InstanceNumber``), are equally spaced within
  :data:`SERIES_TOLERANCE` of the slice step (a missing slice leaves a gap of two steps), with no two at one
  position, of one series, and the folder holds at least one DICOM file;
* labels are stored as integers, or as floats whose values are integers (a float label file is read to check);
  complex-valued images and labels are refused (a real model would drop their imaginary part).

The same comparison runs again on the tensors after the transforms (:func:`affine_mismatch`), so what the
transforms do to one key and not the other is caught as well.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GEOMETRY_TOLERANCE", "SERIES_TOLERANCE", "Geometry", "GeometryError", "read_geometry", "geometry_mismatch",
           "affine_mismatch", "same_grid", "non_integer_values", "check_label_values", "PIXEL_SUFFIXES",
           "WORLD_SUFFIXES", "ARRAY_SUFFIXES"]

#: image and label affines may differ by this fraction of the image's smallest voxel size (mm), per entry: the
#: float32 rounding of NIfTI headers (1e-5 mm at 500 mm from the origin) passes, a shift of a tenth of a voxel not
GEOMETRY_TOLERANCE = 1e-3
#: the steps between consecutive slices of a DICOM series may differ from their mean by this fraction of it
SERIES_TOLERANCE = 1e-2
#: file suffixes read from their header, by family
WORLD_SUFFIXES = (".nii", ".nii.gz")
PIXEL_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
ARRAY_SUFFIXES = (".npy",)
_PIL_DTYPES = {"F": np.float32, "I": np.int32, "I;16": np.uint16, "I;16B": np.uint16, "I;16L": np.uint16}


class GeometryError(ValueError):
    """A file whose header cannot be read, or an incomplete DICOM series: one line naming the file
    (``path``) and what is wrong with it (``reason``)."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason


@dataclass(frozen=True)
class Geometry:
    """What a file's header says: the spatial ``shape`` as MONAI reads it, the ``affine`` (voxel -> RAS mm;
    None for pixel formats and arrays), the stored ``dtype`` after NIfTI scaling (None: not known from the
    header), and the ``family`` ("world", "pixels", "array") whose shapes are comparable."""

    shape: tuple[int, ...]
    affine: np.ndarray | None
    dtype: np.dtype | None
    family: str


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return next((s for s in WORLD_SUFFIXES + PIXEL_SUFFIXES + ARRAY_SUFFIXES if name.endswith(s)), "")


def _short(e: BaseException) -> str:
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:160]}" if first else type(e).__name__


def _stamp(p: Path) -> tuple[Any, ...]:
    """What identifies a file's (or a series folder's) content for the cache: sizes and modification times."""
    if p.is_dir():
        return tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(p.iterdir()) if f.is_file())
    st = p.stat()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _cached_geometry(path: str, stamp: tuple[Any, ...]) -> Geometry | None:
    return _read_geometry(Path(path))


def read_geometry(path: str | Path) -> Geometry | None:
    """The geometry of one image or label file (a DICOM series: its folder) from its header; None for formats
    this module does not read (MONAI still reads them, and the tensors are compared after loading).

    Raises :class:`GeometryError` naming the file when the header cannot be read, the folder holds no DICOM
    file, or the series is incomplete. Cached per file and modification time: ``medadv evaluate`` checks the
    data, then builds the loader, reading each header once."""
    p = Path(path)
    return _cached_geometry(str(p), _stamp(p))


def _read_geometry(p: Path) -> Geometry | None:
    if p.is_dir():
        return _dicom_series(p)
    kind = _suffix(p)
    if not kind:
        return None
    if p.stat().st_size == 0:
        raise GeometryError(p, "the file is empty (0 bytes)")
    try:
        if kind in WORLD_SUFFIXES:
            return _nifti(p)
        if kind in PIXEL_SUFFIXES:
            return _pil(p)
        return _npy(p)
    except GeometryError:
        raise
    except Exception as e:  # nibabel, PIL and NumPy each raise their own kinds for a damaged header
        raise GeometryError(p, f"not a readable {kind} file ({_short(e)})") from None


def _nifti(p: Path) -> Geometry:
    import nibabel as nib

    img: Any = nib.load(str(p))
    shape = tuple(int(s) for s in img.shape)
    spatial = shape[:3] if len(shape) >= 3 else shape
    dtype = np.dtype(img.get_data_dtype())
    slope, inter = getattr(img.dataobj, "slope", 1.0), getattr(img.dataobj, "inter", 0.0)
    if dtype.kind in "iub" and not (float(slope).is_integer() and float(inter).is_integer()):
        dtype = np.dtype(np.float64)  # scaled integers: read as floats, possibly fractional
    # MONAI's NibabelReader uses nibabel's affine (sform, else qform) for the spatial axes; 2-D files get a 3x3
    affine = np.asarray(img.affine, dtype=np.float64)
    if len(spatial) == 2:
        affine = affine[np.ix_([0, 1, 3], [0, 1, 3])]
    return Geometry(spatial, affine, dtype, "world")


def _pil(p: Path) -> Geometry:
    from PIL import Image

    with Image.open(p) as im:
        w, h = im.size
        mode = im.mode
    return Geometry((h, w), None, np.dtype(_PIL_DTYPES.get(mode, np.uint8)), "pixels")


def _npy(p: Path) -> Geometry:
    arr = np.load(p, mmap_mode="r", allow_pickle=False)
    return Geometry(tuple(int(s) for s in arr.shape), None, arr.dtype, "array")


def _dicom_series(folder: Path) -> Geometry | None:
    """A DICOM series folder as MONAI's PydicomReader reads it: the files with the DICOM preamble, in
    ``InstanceNumber`` order, shape ``(columns, rows, slices)``, affine from the first and last positions."""
    import pydicom

    files = sorted(p for p in folder.iterdir() if p.is_file() and pydicom.misc.is_dicom(str(p)))
    if not files:
        raise GeometryError(folder, "the folder holds no DICOM file (a DICOM series is a folder of its slices, "
                            "each a file with the DICM preamble)")
    slices = []
    for f in files:
        try:
            slices.append(pydicom.dcmread(str(f), stop_before_pixels=True))
        except Exception as e:
            raise GeometryError(f, f"not a readable DICOM file ({_short(e)})") from None
    for f, s in zip(files, slices, strict=True):
        if "Rows" not in s or "Columns" not in s:  # pydicom reads a cut-off header up to where it ends
            raise GeometryError(f, "not a readable DICOM file (its header has no Rows / Columns: truncated?)")
    series = {str(getattr(s, "SeriesInstanceUID", "")) for s in slices}
    if len(series) > 1:
        raise GeometryError(folder, f"the folder holds {len(series)} DICOM series; give each series its own "
                            "folder")
    numbered = [s for s in slices if "InstanceNumber" in s]
    if not numbered:
        raise GeometryError(folder, "no slice has an InstanceNumber, so the slices have no order")
    numbered.sort(key=lambda s: int(s.InstanceNumber))
    first = numbered[0]
    if len(numbered) == 1 and int(getattr(first, "NumberOfFrames", 1) or 1) > 1:
        return None  # one multi-frame file: its geometry is in per-frame sequences; compared after loading
    rows, cols = int(first.Rows), int(first.Columns)
    n = len(numbered)
    shape = (cols, rows, n) if n > 1 else (cols, rows)
    if any(int(s.Rows) != rows or int(s.Columns) != cols for s in numbered):
        raise GeometryError(folder, "the slices of the series differ in size (rows x columns)")
    numbers = [int(s.InstanceNumber) for s in numbered]
    if len(set(numbers)) < n:
        twice = next(k for k in numbers if numbers.count(k) > 1)
        raise GeometryError(folder, f"two slices have InstanceNumber {twice}: a duplicated slice or two series")
    if not all("ImagePositionPatient" in s and "ImageOrientationPatient" in s for s in numbered):
        return Geometry(shape, None, None, "world")
    pos = np.array([[float(v) for v in s.ImagePositionPatient] for s in numbered], dtype=np.float64)
    if n > 2:
        steps = np.diff(pos, axis=0)
        mean = steps.mean(axis=0)
        size = float(np.linalg.norm(mean))
        dist = np.linalg.norm(steps, axis=1)
        off = np.linalg.norm(steps - mean, axis=1)
        if size == 0 or float(dist.min()) <= SERIES_TOLERANCE * size or float(off.max()) > SERIES_TOLERANCE * size:
            k = int(np.argmax(off)) if size else int(np.argmin(dist))
            typical = float(np.median(dist))
            raise GeometryError(
                folder, f"incomplete DICOM series: the slices are not equally spaced (a step of {dist[k]:.4g} mm "
                f"between InstanceNumber {numbers[k]} and {numbers[k + 1]}, typically {typical:.4g} mm): a slice "
                "is missing or duplicated")
    rx, ry, rz, cx, cy, cz = (float(v) for v in first.ImageOrientationPatient)
    spacing = [float(v) for v in getattr(first, "PixelSpacing", (1.0, 1.0))]
    dr, dc = spacing[:2]
    # MONAI's PydicomReader (monai 1.4-1.6, swap_ij): array axis 0 runs along the rows' direction cosine (one
    # column spacing per step), axis 1 along the columns' (one row spacing), axis 2 from the first to the last
    # position; then LPS -> RAS
    affine = np.eye(4)
    affine[:3, 0] = (rx * dc, ry * dc, rz * dc)
    affine[:3, 1] = (cx * dr, cy * dr, cz * dr)
    affine[:3, 3] = pos[0]
    if n > 1:
        affine[:3, 2] = (pos[-1] - pos[0]) / (n - 1)
    affine[:2] *= -1.0
    if n == 1:
        affine = affine[np.ix_([0, 1, 3], [0, 1, 3])]
    return Geometry(shape, affine, None, "world")


def _fmt(values: Sequence[float] | np.ndarray) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


def _axcodes(affine: np.ndarray) -> str:
    """The axis directions of an affine as nibabel names them (``RAS``, ``LPS`` ...)."""
    from nibabel.orientations import aff2axcodes

    try:
        return "".join(str(c) for c in aff2axcodes(affine))
    except Exception:  # a degenerate affine: its matrix says more
        return str(np.round(affine[:-1, :-1], 4).tolist())


def affine_mismatch(image_affine: Any, label_affine: Any) -> str | None:
    """How a label's affine differs from its image's (spacing, orientation or origin, in mm), or None when
    they agree within :data:`GEOMETRY_TOLERANCE` of the image's smallest voxel size. Affines of different
    sizes (a 2-D and a 3-D one) are not compared here: the shapes tell them apart."""
    a = np.asarray(image_affine, dtype=np.float64)
    b = np.asarray(label_affine, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] != a.shape[1] or not (np.isfinite(a).all()
                                                                             and np.isfinite(b).all()):
        return None
    d = a.shape[0] - 1
    sa, sb = np.linalg.norm(a[:d, :d], axis=0), np.linalg.norm(b[:d, :d], axis=0)
    smallest = float(sa.min()) if sa.size else 1.0
    tol = GEOMETRY_TOLERANCE * (smallest if smallest > 0 else 1.0)
    if np.allclose(a, b, rtol=0.0, atol=tol):
        return None
    if not np.allclose(sa, sb, rtol=0.0, atol=tol):
        return f"spacing {_fmt(sb)} mm, the image's {_fmt(sa)} mm"
    if not np.allclose(a[:d, :d], b[:d, :d], rtol=0.0, atol=tol):
        return f"orientation {_axcodes(b)}, the image's {_axcodes(a)} (the direction cosines differ)"
    return f"origin {_fmt(b[:d, d])} mm, the image's {_fmt(a[:d, d])} mm"


def same_grid(image_shape: Sequence[int], image_affine: Any, label_shape: Sequence[int], label_affine: Any) -> bool:
    """Whether the label's voxels are the image's voxels stored in another axis order or direction (a label
    written ``LPS`` for a ``RAS`` image, or with its axes permuted): the same points in the world, within
    :data:`GEOMETRY_TOLERANCE` of a voxel. MONAI's ``Orientationd`` on both keys then aligns the arrays; the
    tensors are compared again after the transforms (:class:`medadv.data.sources.ToSample`)."""
    a = np.asarray(image_affine, dtype=np.float64)
    b = np.asarray(label_affine, dtype=np.float64)
    d = len(image_shape)
    if a.shape != b.shape or a.shape[0] != d + 1 or len(label_shape) != d:
        return False
    try:
        m = np.linalg.solve(a, b)  # label voxel index -> image voxel index
    except np.linalg.LinAlgError:
        return False
    r, t = m[:d, :d], m[:d, d]
    p = np.round(r)
    if not np.allclose(r, p, rtol=0.0, atol=GEOMETRY_TOLERANCE) or not (np.abs(p).sum(axis=0) == 1).all() \
            or not (np.abs(p).sum(axis=1) == 1).all():
        return False
    for j in range(d):
        i = int(np.argmax(np.abs(p[:, j])))
        first = 0.0 if p[i, j] > 0 else image_shape[i] - 1.0  # where the label's voxel 0 lies on the image's axis
        if label_shape[j] != image_shape[i] or abs(t[i] - first) > GEOMETRY_TOLERANCE:
            return False
    return True


def geometry_mismatch(image: Geometry, label: Geometry) -> str | None:
    """How a label file's geometry differs from its image's (shape, spacing, orientation, origin), or None
    when they agree, when the label holds the image's voxels in another storage order (:func:`same_grid`:
    checked again after the transforms), or when they cannot be compared (a pixel image and an array label)."""
    comparable = image.family == label.family or (image.affine is not None and label.affine is not None)
    if not comparable:
        return None
    if image.affine is not None and label.affine is not None:
        if image.shape == label.shape and affine_mismatch(image.affine, label.affine) is None:
            return None
        if same_grid(image.shape, image.affine, label.shape, label.affine):
            return None
    if image.shape != label.shape:
        return f"shape {_fmt(label.shape)}, the image's {_fmt(image.shape)}"
    if image.affine is not None and label.affine is not None:
        return affine_mismatch(image.affine, label.affine)
    return None


def non_integer_values(values: Any) -> str | None:
    """Why ``values`` (a NumPy array or a torch tensor of label values) are not integer labels (complex, a
    NaN or Inf, a non-integer value, quoted), or None when every value is an integer."""
    import torch

    if isinstance(values, torch.Tensor):
        if values.is_complex():
            return f"complex values ({values.dtype})"
        if not values.is_floating_point():
            return None
        flat_t = values.detach().reshape(-1)
        bad_t, frac_t = ~torch.isfinite(flat_t), flat_t != flat_t.round()
        if not bool(bad_t.any() | frac_t.any()):
            return None
        flat, bad, frac = flat_t.cpu().numpy(), bad_t.cpu().numpy(), frac_t.cpu().numpy()
    else:
        arr = np.asarray(values)
        if arr.dtype.kind == "c":
            return f"complex values ({arr.dtype})"
        if arr.dtype.kind != "f":
            return None if arr.dtype.kind in "iub" else f"values of type {arr.dtype}"
        flat = arr.reshape(-1)
        bad = ~np.isfinite(flat)
        frac = flat != np.round(flat)  # exact: a label map resampled with mode 'nearest' keeps its integers
    if bad.any():
        return f"the value {float(flat[bad][0])}"
    if frac.any():
        count = int(frac.sum())
        return f"the non-integer value {float(flat[frac][0]):.6g}" + (f" ({count} voxels)" if count > 1 else "")
    return None


def check_label_values(path: str | Path, geometry: Geometry) -> str | None:
    """Why the label file at ``path`` does not hold integer labels (:func:`non_integer_values`), reading its
    values only when its header says they are stored as floats; complex labels are refused from the header."""
    if geometry.dtype is None or geometry.dtype.kind in "iub":
        return None
    if geometry.dtype.kind == "c":
        return f"complex values ({geometry.dtype})"
    p = Path(path)
    return _cached_values(str(p), _stamp(p), geometry.family)


@functools.lru_cache(maxsize=1024)
def _cached_values(path: str, stamp: tuple[Any, ...], family: str) -> str | None:
    """:func:`check_label_values` of a float label file, read once per modification (check, then load)."""
    p = Path(path)
    if family == "world":
        import nibabel as nib

        values: Any = np.asanyarray(nib.load(str(p)).dataobj)  # type: ignore[attr-defined]
    elif family == "array":
        values = np.load(p, mmap_mode="r", allow_pickle=False)
    else:
        from PIL import Image

        with Image.open(p) as im:
            values = np.asarray(im)
    return non_integer_values(values)
