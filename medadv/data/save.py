"""Save adversarial examples as image files a viewer opens, and read them back the way they were stored.

:func:`save_example` writes one sample ``(C, *spatial)`` in data units:

* **3-D** -> NIfTI (``.nii.gz``) with the input's affine (voxel spacing, orientation, origin as MONAI's
  loaders left them after the transforms). An input read from an integer file (``uint8``, ``int16``, ...,
  known from the MONAI metadata) is stored in that integer type, with the NIfTI scaling
  (``scl_slope``/``scl_inter``) mapping the data box onto the type's full range; a float input, or an
  unbounded box, is stored as float32 (no rounding).
* **2-D, 1 or 3 channels, bounded data** -> PNG: the data box mapped onto ``[0, 255]`` (8-bit, for inputs
  read from 8-bit files and for RGB) or ``[0, 65535]`` (16-bit, grey levels of any other input); an image
  loaded by MONAI (width first) is written back in its file's orientation.
* **DICOM source** (a file for 2-D, a series folder for 3-D; ``source``, see :func:`dicom_source`), one channel,
  still on the source's voxel grid -> DICOM: copies of the source headers (patient, study, geometry tags, pixel
  format) with new SOP/Series Instance UIDs, a SeriesDescription saying "adversarial", and the values stored
  in the source's integer type through its RescaleSlope/RescaleIntercept (data still in the source's units)
  or through a new pair mapping the box onto that type (intensity-transformed data); one file per slice.
* **anything else** (unbounded 2-D data, 2 or 4+ channels, 1-D, 4-D) -> ``.npy`` in the input's dtype
  (lossless).

:func:`load_example` reads a file written here back to data units, so that a caller can re-predict it and
see whether the attack survives the quantisation of the file format.
"""

from __future__ import annotations

import gzip
import io
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..safe_io import write_bytes
from ..threats import Box

__all__ = ["save_example", "load_example", "original_dtype", "choose_format", "case_stem", "safe_name", "dicom_source",
           "check_inside", "EXTENSIONS", "strip_suffix"]

#: file suffix of each format
EXTENSIONS = {"nifti": ".nii.gz", "png": ".png", "npy": ".npy", "dicom": ".dcm"}
#: suffixes removed from a case identifier (a file name) to name its adversarial file
_KNOWN_SUFFIXES = (".nii.gz", ".nii", ".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".dcm", ".npy", ".npz",
                   ".mha", ".mhd", ".nrrd", ".gz")
#: PIL modes of MONAI's PILReader metadata (``meta["mode"]``) -> stored dtype
_PIL_DTYPES = {"1": np.uint8, "L": np.uint8, "P": np.uint8, "RGB": np.uint8, "RGBA": np.uint8, "LA": np.uint8,
               "I;16": np.uint16, "I;16B": np.uint16, "I;16L": np.uint16, "I": np.int32, "F": np.float32}


def safe_name(text: str) -> str:
    """``text`` as one file or folder name: characters other than letters, digits and ``._@+=-`` replaced."""
    name = re.sub(r"[^A-Za-z0-9._@+=-]+", "_", str(text)).strip("._")
    return name or "case"


def strip_suffix(name: str) -> str:
    """``name`` (a file name or path) without its image suffix (``.nii.gz``, ``.png``, ``.npy`` ...; the
    longest known one, once; case-insensitive): ``"labels/case3.nii.gz"`` -> ``"labels/case3"``."""
    for suffix in _KNOWN_SUFFIXES:
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def case_stem(case_id: str) -> str:
    """A file-name stem for a case: its identifier without folders or image suffixes, unsafe characters
    replaced (``"sub-01/T1w.nii.gz"`` -> ``"T1w"``)."""
    return safe_name(strip_suffix(str(case_id).replace("\\", "/").rsplit("/", 1)[-1]))


def _item(value: Any, i: int) -> Any:
    """Sample ``i`` of a collated metadata entry (a tensor or list with one entry per sample, or a scalar)."""
    if isinstance(value, Tensor):
        return value[i].tolist() if value.ndim >= 1 else value.item()
    if isinstance(value, np.ndarray):
        return value[i].tolist() if value.ndim >= 1 else value.item()
    if isinstance(value, list | tuple):
        return value[i] if len(value) > i else None
    return value


def _dicom_int(meta: Mapping[str, Any], keys: tuple[str, ...], i: int) -> int | None:
    for k in keys:
        if k in meta:
            v = _item(meta[k], i)
            if isinstance(v, Mapping):  # pydicom's JSON form {"vr": "US", "Value": [16]}
                v = (v.get("Value") or [None])[0]
            try:
                return int(v)
            except (TypeError, ValueError):
                return None
    return None


def original_dtype(meta: Mapping[str, Any] | None, i: int = 0) -> np.dtype | None:
    """The dtype sample ``i`` had in its file, from MONAI's (collated) image metadata; ``None`` if unknown.

    NIfTI: the header's ``datatype`` code; PNG/JPEG (PILReader): the PIL ``mode``; DICOM: Bits Allocated
    (0028,0100) with Pixel Representation (0028,0103), as PydicomReader or ITKReader store them.
    """
    if not meta:
        return None
    try:
        if "datatype" in meta:  # NIfTI header (NibabelReader)
            import nibabel as nib

            code = _item(meta["datatype"], i)
            found: Any = nib.nifti1.data_type_codes.dtype[int(code)]
            return np.dtype(found)
        if "mode" in meta:  # PILReader
            mode = _item(meta["mode"], i)
            return np.dtype(_PIL_DTYPES[mode]) if mode in _PIL_DTYPES else None
    except (KeyError, TypeError, ValueError):
        return None
    bits = _dicom_int(meta, ("00280100", "0028|0100"), i)
    if bits in (8, 16, 32):
        signed = _dicom_int(meta, ("00280103", "0028|0103"), i) == 1
        return np.dtype(f"{'i' if signed else 'u'}{bits // 8}")
    return None


def _channel_range(box: Box, x: Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-channel ``(lo, hi)`` of the data box for one sample ``x`` ``(C, *spatial)`` (None: unbounded or
    not finite)."""
    if not box.bounded:
        return None
    lo, hi = box.lohi(x.unsqueeze(0))
    shape = (1, *x.shape)
    lo_c = torch.broadcast_to(lo, shape)[0].reshape(x.shape[0], -1).amin(dim=1)
    hi_c = torch.broadcast_to(hi, shape)[0].reshape(x.shape[0], -1).amax(dim=1)
    lo_n, hi_n = lo_c.double().cpu().numpy(), hi_c.double().cpu().numpy()
    if not (np.isfinite(lo_n).all() and np.isfinite(hi_n).all()):
        return None
    return lo_n, hi_n


def choose_format(x: Tensor, box: Box, dtype: np.dtype | None = None) -> tuple[str, int | None]:
    """``(format, bits)`` for one sample ``(C, *spatial)``: ``("nifti", None)``, ``("png", 8 | 16)`` or
    ``("npy", None)`` (see the module docstring)."""
    spatial, channels = x.ndim - 1, x.shape[0]
    if spatial == 3:
        return "nifti", None
    if spatial == 2 and channels in (1, 3) and _channel_range(box, x) is not None:
        eight = channels == 3 or (dtype is not None and dtype.kind in "iub" and dtype.itemsize == 1)
        return "png", 8 if eight else 16
    return "npy", None


def check_inside(path: str | Path, root: str | Path) -> Path:
    """``path`` itself, refused (``PermissionError``) when it resolves outside ``root``: a folder or file
    on the way that is a symbolic link to somewhere else would make a write land there (a shared results
    folder whose ``adversarial/pgd`` points at someone's data). Links that stay inside ``root``, and a
    ``root`` that is itself a link, are fine."""
    p, base = Path(path), Path(root).resolve()
    target = p.resolve()  # follows every link on the way, existing or dangling
    if target == base or base in target.parents:
        return p
    if p.is_relative_to(root):  # name the link responsible: the first one below root whose target is outside
        here = Path(root)
        for part in p.relative_to(root).parts:
            here = here / part
            if here.is_symlink():
                to = here.resolve()
                if not (to == base or base in to.parents):
                    raise PermissionError(f"{here} is a symbolic link to {to}, outside the output folder {base}: "
                                          "medadv does not write through it; remove the link or choose another "
                                          "output")
    raise PermissionError(f"{p} resolves to {target}, outside the output folder {base}: medadv does not write there")


def save_example(x: Tensor, stem: str | Path, *, box: Box, affine: Tensor | np.ndarray | None = None,
                 dtype: np.dtype | None = None, width_first: bool = False, source: str | Path | None = None,
                 root: str | Path | None = None) -> Path:
    """Write one sample ``x`` ``(C, *spatial)`` (data units) to ``stem`` + the format's suffix; returns the path.

    Args:
        x: the sample; not modified.
        stem: the path without suffix (its folder is created).
        box: the data box: PNG and integer NIfTI map it onto the file's integer range.
        affine: the 4x4 voxel-to-world matrix of a 3-D sample (identity when None).
        dtype: the dtype of the file the sample was read from (:func:`original_dtype`), None if unknown.
        width_first: a 2-D sample in MONAI's layout (``(C, W, H)``, as ``LoadImage`` reads PNGs): written
            transposed so the PNG has the orientation of the file it came from.
        source: the DICOM file (2-D) or series folder (3-D) the sample was read from (:func:`dicom_source`):
            a one-channel sample still on the source's voxel grid (located through ``affine``) is written as
            DICOM, ``stem.dcm`` or, for a series, the folder ``stem`` with one file per slice.
        root: the output folder: nothing is written (no folder created) through a symbolic link that leads
            outside it (``PermissionError``, :func:`check_inside`). ``None``: the folder of ``stem``.
    """
    root = Path(stem).parent if root is None else root
    arr = x.detach().cpu()
    if source is not None and affine is not None and arr.shape[0] == 1 and arr.ndim in (3, 4):
        aff = np.asarray(affine.detach().cpu() if isinstance(affine, Tensor) else affine, dtype=np.float64)
        plan = _dicom_plan(source, aff, tuple(arr.shape[1:]))
        if plan is not None:
            path = check_inside(Path(str(stem) + EXTENSIONS["dicom"]) if arr.ndim == 3 else Path(stem), root)
            path.parent.mkdir(parents=True, exist_ok=True)
            rng = _channel_range(box, arr)
            box_range = (float(rng[0].min()), float(rng[1].max())) if rng is not None else None
            _save_dicom(arr[0].double().numpy(), path, plan, box_range)
            return path
    fmt, bits = choose_format(x, box, dtype)
    path = check_inside(Path(str(stem) + EXTENSIONS[fmt]), root)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, arr.numpy())
        write_bytes(path, buf.getvalue())  # every file: never written through a link (medadv.safe_io)
        return path
    rng = _channel_range(box, arr)
    if fmt == "png":
        from PIL import Image

        assert rng is not None and bits is not None
        top = (1 << bits) - 1
        lo, hi = (torch.from_numpy(v).reshape(-1, 1, 1) for v in rng)
        levels = ((arr.double() - lo) / (hi - lo)).clamp(0, 1).mul(top).round()
        img = levels.numpy().astype(np.uint8 if bits == 8 else np.uint16)
        if width_first:
            img = img.transpose(0, 2, 1)
        img = img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        write_bytes(path, buf.getvalue())
        return path
    import nibabel as nib

    vol = arr.numpy()
    vol = vol[0] if vol.shape[0] == 1 else np.moveaxis(vol, 0, -1)  # channels as the 4th NIfTI axis
    aff = np.eye(4) if affine is None else np.asarray(affine.detach().cpu() if isinstance(affine, Tensor)
                                                       else affine, dtype=np.float64)
    if dtype is not None and dtype.kind in "iu" and rng is not None:
        info = np.iinfo(dtype)
        lo_v, hi_v = float(rng[0].min()), float(rng[1].max())
        slope = (hi_v - lo_v) / (float(info.max) - float(info.min))
        inter = lo_v - float(info.min) * slope
        raw = np.clip(np.rint((vol.astype(np.float64) - inter) / slope), info.min, info.max).astype(dtype)
        nii = nib.Nifti1Image(raw, aff)
        nii.header.set_slope_inter(slope, inter)
    else:
        nii = nib.Nifti1Image(vol.astype(np.float64 if vol.dtype == np.float64 else np.float32), aff)
    nii.header.set_xyzt_units("mm")
    data = nii.to_bytes()  # what nib.save writes to a .nii; .nii.gz is its gzip
    write_bytes(path, gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def load_example(path: str | Path, *, box: Box, like: Tensor, width_first: bool = False,
                 affine: Tensor | np.ndarray | None = None) -> Tensor:
    """A file written by :func:`save_example`, back in data units, shaped and typed like ``like``
    ``(C, *spatial)`` (on ``like``'s device). ``affine``: the sample's voxel-to-world matrix, which places a
    DICOM file's pixels (as :func:`save_example` did); without it a DICOM is read in MONAI's layout."""
    p = Path(path)
    name = p.name.lower()
    if p.is_dir() or name.endswith(".dcm"):
        aff = None if affine is None else np.asarray(
            affine.detach().cpu() if isinstance(affine, Tensor) else affine, dtype=np.float64)
        arr = _load_dicom(p, tuple(like.shape[1:]), aff)[None]
    elif name.endswith(".npy"):
        arr = np.load(p)
    elif name.endswith(".png"):
        from PIL import Image

        with Image.open(p) as im:
            img = np.asarray(im)
        top = 255.0 if img.dtype == np.uint8 else 65535.0
        img = img[None] if img.ndim == 2 else img.transpose(2, 0, 1)
        if width_first:
            img = img.transpose(0, 2, 1)
        rng = _channel_range(box, like.detach().cpu())
        assert rng is not None, "a PNG is written only for bounded data"
        lo, hi = (v.reshape(-1, 1, 1) for v in rng)
        arr = img.astype(np.float64) / top * (hi - lo) + lo
    elif name.endswith((".nii", ".nii.gz")):
        import nibabel as nib

        loaded: Any = nib.load(p)
        vol = np.asanyarray(loaded.dataobj)  # applies scl_slope / scl_inter
        arr = vol[None] if vol.ndim == like.ndim - 1 else np.moveaxis(vol, -1, 0)
    else:
        raise ValueError(f"not a file written by medadv.data.save: {p}")
    out = torch.from_numpy(np.ascontiguousarray(arr)).to(device=like.device, dtype=like.dtype)
    if tuple(out.shape) != tuple(like.shape):
        raise ValueError(f"{p} holds shape {tuple(out.shape)}, expected {tuple(like.shape)}")
    return box.clip(out.unsqueeze(0))[0]


# --- DICOM --------------------------------------------------------------------------------------------------------------
def dicom_source(meta: Mapping[str, Any] | None, i: int = 0) -> str | None:
    """The DICOM file (2-D) or series folder (3-D) sample ``i`` was read from, from MONAI's (collated) image
    metadata (``filename_or_obj``); ``None`` when the sample was not read from DICOM or the source is gone."""
    if not meta or "filename_or_obj" not in meta:
        return None
    src = _item(meta["filename_or_obj"], i)
    if not isinstance(src, str | os.PathLike) or not os.path.exists(src):
        return None
    return str(src) if _dicom_files(Path(src)) else None


def _dicom_files(src: Path) -> list[Path]:
    """The DICOM files of a source (the file itself, or the files of a series folder); [] if none."""
    import pydicom

    files = sorted(p for p in src.iterdir() if p.is_file()) if src.is_dir() else [src]
    out = []
    for p in files:
        try:
            pydicom.dcmread(p, stop_before_pixels=True, specific_tags=["SOPClassUID"])
        except Exception:  # not DICOM (pydicom raises several types): not part of the series
            continue
        out.append(p)
    return out


def _stored_range(ds: Any) -> tuple[np.dtype, int, int]:
    """``(dtype, lo, hi)`` of a dataset's stored pixel values (BitsAllocated / PixelRepresentation, clipped to
    BitsStored)."""
    bits, signed = int(ds.BitsAllocated), int(getattr(ds, "PixelRepresentation", 0)) == 1
    stored = int(getattr(ds, "BitsStored", bits))
    dtype = np.dtype(f"<{'i' if signed else 'u'}{bits // 8}")
    lo, hi = (-(1 << (stored - 1)), (1 << (stored - 1)) - 1) if signed else (0, (1 << stored) - 1)
    return dtype, lo, hi


def _slice_index(ds: Any, affine: np.ndarray, spatial: tuple[int, ...]) -> tuple[np.ndarray, ...] | None:
    """Index arrays (one per spatial axis, each ``(Rows, Columns)``) locating every pixel of the DICOM slice
    ``ds`` in a sample of shape ``spatial`` with voxel-to-world ``affine`` (RAS, as MONAI's readers give it);
    ``None`` when the slice is not exactly on the sample's voxel grid (the sample was resampled or cropped)."""
    try:
        pos = np.asarray(ds.ImagePositionPatient, np.float64)
        iop = np.asarray(ds.ImageOrientationPatient, np.float64)
        d_row, d_col = (float(v) for v in ds.PixelSpacing)  # between rows, between columns
        rows, cols = int(ds.Rows), int(ds.Columns)
    except (AttributeError, TypeError, ValueError):
        return None
    lps_to_ras = np.array([-1.0, -1.0, 1.0])
    inv = np.linalg.inv(affine)

    def index(r: float, c: float) -> np.ndarray:  # DICOM pixel (row r, column c) -> voxel index of the sample
        world = (pos + c * d_col * iop[:3] + r * d_row * iop[3:]) * lps_to_ras
        return inv[:3, :3] @ world + inv[:3, 3]

    v0 = index(0, 0)
    along_row, along_col = index(0, 1) - v0, index(1, 0) - v0  # voxel steps per column / per row
    r_grid, c_grid = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    idx = [v0[k] + r_grid * along_col[k] + c_grid * along_row[k] for k in range(3)]
    rounded = [np.rint(v) for v in idx]
    if any(np.abs(v - q).max() > 1e-3 for v, q in zip(idx, rounded, strict=True)):
        return None
    if any(np.abs(rounded[k]).max() > 0 for k in range(len(spatial), 3)):  # a 2-D sample has index 0 there
        return None
    out = tuple(rounded[k].astype(np.int64) for k in range(len(spatial)))
    if any(v.min() < 0 or v.max() >= n for v, n in zip(out, spatial, strict=True)):
        return None
    return out


def _dicom_plan(src: str | Path, affine: np.ndarray, spatial: tuple[int, ...]) -> list[tuple[Any, tuple[np.ndarray, ...]]] | None:
    """Each source dataset with the voxel indices of its pixels, ``None`` if the sample is not on the source's
    grid (then it is not written as DICOM) or not covered by it exactly once."""
    import pydicom

    files = _dicom_files(Path(src))
    if not files or (len(files) > 1) != (len(spatial) == 3):
        return None
    plan, covered = [], np.zeros(spatial, np.int64)
    for p in files:
        ds = pydicom.dcmread(p)
        if int(getattr(ds, "SamplesPerPixel", 1)) != 1 or int(getattr(ds, "NumberOfFrames", 1) or 1) != 1 \
                or int(getattr(ds, "BitsAllocated", 0)) not in (8, 16, 32):
            return None
        where = _slice_index(ds, affine, spatial)
        if where is None:
            return None
        np.add.at(covered, where, 1)
        plan.append((ds, where))
    return plan if bool((covered == 1).all()) else None


def _rescale(ds: Any) -> tuple[float, float]:
    return float(getattr(ds, "RescaleSlope", 1) or 1), float(getattr(ds, "RescaleIntercept", 0) or 0)


def _decoded(ds: Any) -> np.ndarray:
    """A dataset's pixel values in its own units (RescaleSlope / RescaleIntercept applied), ``(Rows, Columns)``."""
    slope, inter = _rescale(ds)
    return np.asarray(ds.pixel_array, np.float64) * slope + inter


def _save_dicom(vol: np.ndarray, folder_or_file: Path, plan: list[tuple[Any, tuple[np.ndarray, ...]]],
                box_range: tuple[float, float] | None) -> None:
    """Write ``vol`` (spatial, data units) as copies of the ``plan``'s source datasets (see :func:`save_example`)."""
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    # the sample is in the source's units (no intensity transform) when it stays close to the source's values:
    # then the source's own RescaleSlope / RescaleIntercept are kept, else a new pair maps the data onto the
    # stored range, as for an integer NIfTI (a viewer then shows what the model saw, in its units)
    src_vals = [_decoded(ds) for ds, _ in plan]
    s_lo, s_hi = min(float(v.min()) for v in src_vals), max(float(v.max()) for v in src_vals)
    diff = max(float(np.abs(vol[w] - v).max()) for (_, w), v in zip(plan, src_vals, strict=True))
    same_units = diff <= 0.25 * max(s_hi - s_lo, 1e-12)
    series_uid = generate_uid()
    single = len(plan) == 1 and vol.ndim == 2
    if not single:
        folder_or_file.mkdir(parents=True, exist_ok=True)
    for k, (ds, where) in enumerate(sorted(plan, key=lambda e: int(getattr(e[0], "InstanceNumber", 0) or 0))):
        dtype, lo, hi = _stored_range(ds)
        values = vol[where].astype(np.float64)
        if same_units:
            slope, inter = _rescale(ds)
        else:
            v_lo, v_hi = box_range if box_range is not None else (float(vol.min()), float(vol.max()))
            slope = max(v_hi - v_lo, 1e-12) / float(hi - lo)
            inter = v_lo - lo * slope
            ds.RescaleSlope, ds.RescaleIntercept = f"{slope:.10g}"[:16], f"{inter:.10g}"[:16]
            slope, inter = _rescale(ds)  # the values as the header (16-character DS strings) holds them
        raw = np.clip(np.rint((values - inter) / slope), lo, hi).astype(dtype)
        ds.PixelData = raw.tobytes()
        ds["PixelData"].VR = "OB" if dtype.itemsize == 1 else "OW"
        for tag in ("SmallestImagePixelValue", "LargestImagePixelValue"):  # would no longer hold
            if tag in ds:
                del ds[tag]
        ds.SOPInstanceUID = generate_uid()
        ds.SeriesInstanceUID = series_uid
        ds.SeriesDescription = (f"{ds.get('SeriesDescription', '')} adversarial (medadv)").strip()[:64]
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        ts = ds.file_meta.get("TransferSyntaxUID")
        if ts is None or ts.is_compressed or not ts.is_little_endian:  # written uncompressed, little endian
            ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        buf = io.BytesIO()
        ds.save_as(buf)
        write_bytes(folder_or_file if single else folder_or_file / f"{k:04d}.dcm", buf.getvalue())


def _load_dicom(p: Path, spatial: tuple[int, ...], affine: np.ndarray | None) -> np.ndarray:
    """A DICOM file or series folder written by :func:`save_example` as a ``spatial`` array in data units."""
    if affine is None:  # MONAI's own layout (the one the input had without an affine to say otherwise)
        from monai.transforms import LoadImage

        return np.asarray(LoadImage(reader="PydicomReader", image_only=True)(str(p)), np.float64)
    plan = _dicom_plan(p, affine, spatial)
    if plan is None:
        raise ValueError(f"{p} is not on the voxel grid of the sample (affine / shape {spatial})")
    vol = np.zeros(spatial, np.float64)
    for ds, where in plan:
        vol[where] = _decoded(ds)
    return vol
