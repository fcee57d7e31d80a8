"""Hostile data files (issue 28, items 2 and 3): every registered file source x every file format medadv reads
from its header x every geometry, pairing and file fault. Each kind either works (**OK**: the cases load) or is
refused with one clear line (a ``ValueError`` / ``OSError`` of one line naming the faulty file; through the CLI
``medadv: error: ...``, exit 2, no traceback) before any case is attacked.

The kinds are generated: the formats from :mod:`medadv.data.geometry`'s suffix tables (plus DICOM series
folders), the sources from :data:`medadv.config_schema.FILE_SOURCES`, so a new format or source without a writer
here fails :func:`test_every_registered_source_and_format_has_a_writer`.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from medadv.cli import main
from medadv.config import build_data, build_loader, check_data
from medadv.config_schema import FILE_SOURCES, ConfigError
from medadv.data import geometry
from medadv.data.sources import PATH_KEYS
from medadv.tasks import MultiClass, MultiLabel, Segmentation

OK, CLEAR = "OK", "CLEAR"
SHAPE3 = (6, 7, 5)  # x, y, z of the 3-D images (DICOM: columns, rows, slices)
SHAPE2 = (7, 6)  # rows, columns of the 2-D images
AFFINE = np.array([[-1.5, 0, 0, 10.0], [0, -1.25, 0, 20.0], [0, 0, 2.5, -30.0], [0, 0, 0, 1]])


# --- writers, one per format ---------------------------------------------------------------------------------------
def _labels(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 3, shape).astype(np.uint8)


def _image(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return (np.random.default_rng(seed + 100).random(shape) * 200).astype(np.float32)


def _nifti(path: Path, arr: np.ndarray, affine: np.ndarray = AFFINE) -> None:
    nib.save(nib.Nifti1Image(arr, affine), str(path))


def _dicom(folder: Path, vol_xyz: np.ndarray, *, spacing: tuple[float, float] = (1.25, 1.5), step: float = 2.5,
           skip: int | None = None, duplicate: bool = False, series: int = 1,
           orientation: tuple[float, ...] = (1, 0, 0, 0, 1, 0)) -> None:
    """A CT series of ``vol_xyz`` (MONAI's (columns, rows, slices) order) in ``folder``, one file per slice;
    ``skip`` leaves one slice out, ``duplicate`` writes one twice, ``series`` > 1 splits it into series."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    folder.mkdir(parents=True)
    uids, study = [generate_uid() for _ in range(series)], generate_uid()
    orientation = tuple(round(float(v), 6) for v in orientation)  # DICOM decimal strings: 16 characters at most
    r, c = np.array(orientation[:3]), np.array(orientation[3:])
    normal = np.cross(r, c)
    slices = [k for k in range(vol_xyz.shape[2]) if k != skip] + ([1] if duplicate else [])
    for i, k in enumerate(slices):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = CTImageStorage, generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, uids[i % series]
        ds.Modality, ds.PatientID = "CT", "p"
        ds.InstanceNumber = i + 1
        ds.ImagePositionPatient = [round(float(v), 4) for v in np.array([-10.0, -20.0, -30.0]) + normal * step * k]
        ds.ImageOrientationPatient, ds.PixelSpacing, ds.SliceThickness = list(orientation), list(spacing), step
        ds.Rows, ds.Columns = vol_xyz.shape[1], vol_xyz.shape[0]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope = 0, 1
        ds.PixelData = np.ascontiguousarray(vol_xyz[:, :, k].T).astype(np.int16).tobytes()
        ds.save_as(folder / f"slice{i:03d}.dcm", enforce_file_format=True)


def _monai_affine(path: Path) -> np.ndarray:
    """The affine MONAI gives the image at ``path``: what a label of it must carry."""
    from monai.transforms import LoadImage

    return np.asarray(LoadImage(image_only=True)(str(path)).affine, dtype=np.float64)


@dataclass(frozen=True)
class Format:
    """How a test writes an image and its label in one format; ``world``: it has an affine."""

    name: str
    write_image: Callable[[Path, int], Path]
    label_suffix: str  # the label map's format: the same, or PNG for lossy image formats
    world: bool
    shape: tuple[int, ...]


def _write_nifti_image(suffix: str) -> Callable[[Path, int], Path]:
    def write(stem: Path, seed: int) -> Path:
        path = stem.with_name(stem.name + suffix)
        _nifti(path, _image(SHAPE3, seed))
        return path
    return write


def _write_pil_image(suffix: str) -> Callable[[Path, int], Path]:
    def write(stem: Path, seed: int) -> Path:
        path = stem.with_name(stem.name + suffix)
        Image.fromarray(_image(SHAPE2, seed).astype(np.uint8)).save(path)
        return path
    return write


def _write_npy_image(stem: Path, seed: int) -> Path:
    path = stem.with_name(stem.name + ".npy")
    np.save(path, _image(SHAPE2, seed))
    return path


def _write_dicom_image(stem: Path, seed: int) -> Path:
    _dicom(stem, _image(SHAPE3, seed))
    return stem


FORMATS = {
    **{s: Format(s, _write_nifti_image(s), s, True, SHAPE3) for s in geometry.WORLD_SUFFIXES},
    **{s: Format(s, _write_pil_image(s), s if s in (".png", ".bmp") else ".png", False, SHAPE2)
       for s in geometry.PIXEL_SUFFIXES},
    **{s: Format(s, _write_npy_image, s, False, SHAPE2) for s in geometry.ARRAY_SUFFIXES},
    "dicom": Format("dicom", _write_dicom_image, ".nii.gz", True, SHAPE3),
}


def _write_label(path: Path, arr: np.ndarray, affine: np.ndarray | None) -> None:
    name = path.name.lower()
    if name.endswith((".nii", ".nii.gz")):
        _nifti(path, arr, AFFINE if affine is None else affine)
    elif name.endswith(".npy"):
        np.save(path, arr)
    else:
        Image.fromarray(arr).save(path)


def _read_label(path: Path) -> np.ndarray:
    if path.suffix in (".png", ".bmp"):
        with Image.open(path) as im:
            return np.array(im)
    return np.load(path) if path.suffix == ".npy" else np.array(nib.load(path).dataobj)


# --- a data set of two cases; case1 carries the fault ---------------------------------------------------------------
@dataclass
class Data:
    root: Path
    fmt: Format
    images: list[Path] = field(default_factory=list)
    labels: list[Path] = field(default_factory=list)

    def affine(self, i: int) -> np.ndarray | None:
        """The image's affine as MONAI reads it (None for formats without one)."""
        return _monai_affine(self.images[i]) if self.fmt.world else None


def _dataset(root: Path, fmt: Format, n: int = 2) -> Data:
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    d = Data(root, fmt)
    for i in range(n):
        img = fmt.write_image(root / "images" / f"case{i}", i)
        lab = root / "labels" / f"case{i}{fmt.label_suffix}"
        affine = (AFFINE if fmt.name != "dicom" else _monai_affine(img)) if fmt.world else None
        _write_label(lab, _labels(fmt.shape, i), affine)
        d.images.append(img)
        d.labels.append(lab)
    return d


def _spec(source: str, d: Data, *, with_labels: bool = True) -> dict[str, Any]:
    """The ``data`` section of ``source`` naming the cases of ``d`` (a CSV gives class indices, not maps)."""
    rel = [p.relative_to(d.root).as_posix() for p in d.images]
    if source == "files":
        spec: dict[str, Any] = {"source": "files", "images": "images/*"}
        if with_labels:
            spec["labels"] = "labels/*"
        return spec
    if source == "datalist":
        entries = [{"image": i, "label": lab.relative_to(d.root).as_posix()}
                   for i, lab in zip(rel, d.labels, strict=True)]
        (d.root / "dataset.json").write_text(json.dumps({"validation": entries}))
        return {"source": "datalist", "path": "dataset.json"}
    assert source == "csv"
    (d.root / "y.csv").write_text("image,grade\n" + "".join(f"{p},{i % 2}\n" for i, p in enumerate(rel)))
    return {"source": "csv", "path": "y.csv", "label_column": "grade"}


MAP_SOURCES = [s for s in FILE_SOURCES if s != "csv"]  # the sources that carry label maps (csv: label columns)


def _task(source: str) -> Any:
    return MultiClass() if source == "csv" else Segmentation(3)


def _outcome(spec: dict[str, Any], root: Path, task: Any) -> tuple[str, str]:
    """(OK, "") when the config checks and every case loads; (CLEAR, the line) for a one-line refusal; an
    assertion error for anything else (a traceback of another kind, a message of several lines)."""
    try:
        check_data(spec, str(root), task)
        batches = list(build_loader(spec, str(root), batch_size=1, task=task))
    except (ValueError, OSError) as e:
        text = str(e)
        assert text and "\n" not in text.strip(), f"not one line: {text!r}"
        assert "Traceback" not in text
        return CLEAR, text
    assert batches and all(b["image"].is_floating_point() for b in batches)
    return OK, ""


# --- geometry faults: the label is not on its image's grid ----------------------------------------------------------
def _spacing(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b[:3, :3] *= 2.0  # 2 mm voxels under a 1 mm image: same shape, another grid
    return b


def _origin(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b[:3, 3] += a[:3, :3] @ np.array([3.0, 0.0, 0.0])  # shifted by three voxels
    return b


def _flip(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b[:3, 1] *= -1.0  # the y axis the other way round
    return b


GEOMETRY_FAULTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"spacing": _spacing, "origin": _origin,
                                                                   "orientation": _flip}
WORLD = [f for f in FORMATS.values() if f.world]


@pytest.mark.parametrize("source", MAP_SOURCES)
@pytest.mark.parametrize("fmt", [pytest.param(f, id=f.name) for f in WORLD])
@pytest.mark.parametrize("fault", list(GEOMETRY_FAULTS))
def test_a_label_on_another_grid_is_refused_naming_the_case(tmp_path, source, fmt, fault):
    d = _dataset(tmp_path, fmt)
    _write_label(d.labels[1], _labels(fmt.shape, 1), GEOMETRY_FAULTS[fault](d.affine(1)))
    got, line = _outcome(_spec(source, d), tmp_path, _task(source))
    assert got == CLEAR, f"{fault} on {fmt.name} via {source}: the cases loaded"
    assert "case1" in line and fault in line and "not on the image's grid" in line, line


@pytest.mark.parametrize("source", MAP_SOURCES)
@pytest.mark.parametrize("fmt", [pytest.param(f, id=f.name) for f in FORMATS.values()])
def test_a_label_of_another_shape_is_refused(tmp_path, source, fmt):
    d = _dataset(tmp_path, fmt)
    shape = tuple(s - (i == 0) for i, s in enumerate(fmt.shape))
    _write_label(d.labels[1], _labels(shape, 1), d.affine(1))
    got, line = _outcome(_spec(source, d), tmp_path, _task(source))
    assert got == CLEAR and "case1" in line and "shape" in line, line


FLOAT_LABELS = [f for f in FORMATS.values() if f.label_suffix in (".nii", ".nii.gz", ".npy")]


@pytest.mark.parametrize("source", MAP_SOURCES)
@pytest.mark.parametrize("fmt", [pytest.param(f, id=f.name) for f in FLOAT_LABELS])
@pytest.mark.parametrize("value", [0.5, float("nan"), 1e-3], ids=["half", "nan", "near-integer"])
def test_a_label_map_of_non_integers_is_refused_never_rounded(tmp_path, source, fmt, value):
    d = _dataset(tmp_path, fmt)
    lab = _labels(fmt.shape, 1).astype(np.float32)
    lab.reshape(-1)[3] = value
    _write_label(d.labels[1], lab, d.affine(1))
    got, line = _outcome(_spec(source, d), tmp_path, _task(source))
    assert got == CLEAR and "case1" in line and "integer" in line, line


@pytest.mark.parametrize("source", MAP_SOURCES)
@pytest.mark.parametrize("fmt", [pytest.param(f, id=f.name) for f in FLOAT_LABELS])
def test_float_labels_holding_integers_are_accepted(tmp_path, source, fmt):
    d = _dataset(tmp_path, fmt)
    _write_label(d.labels[1], _labels(fmt.shape, 1).astype(np.float32), d.affine(1))
    assert _outcome(_spec(source, d), tmp_path, _task(source)) == (OK, "")


@pytest.mark.parametrize("source", FILE_SOURCES)
@pytest.mark.parametrize("fmt", [pytest.param(f, id=f.name) for f in FORMATS.values()])
def test_every_source_and_format_loads_clean_data_with_both_paths(tmp_path, source, fmt):
    d = _dataset(tmp_path, fmt)
    spec, task = _spec(source, d), _task(source)
    assert _outcome(spec, tmp_path, task) == (OK, "")
    batches = list(build_loader(spec, str(tmp_path), batch_size=1, task=task))
    assert [b["path_image"] for b in batches] == [[p.relative_to(tmp_path).as_posix()] for p in d.images]
    if source != "csv":
        assert [b["path_label"] for b in batches] == [[p.relative_to(tmp_path).as_posix()] for p in d.labels]
        for b, lab in zip(batches, d.labels, strict=True):  # each image with its own label map
            assert torch.equal(b["label"][0], torch.from_numpy(_read_label(lab)).long())


@pytest.mark.parametrize("source", MAP_SOURCES)
@pytest.mark.parametrize("storage", ["flipped", "permuted"])
def test_a_label_stored_in_another_axis_order_needs_orientationd_on_both(tmp_path, source, storage):
    """The same voxels stored the other way round (LPS for a RAS image, or axes swapped) are the image's grid:
    refused only if the transforms leave the arrays misaligned, accepted and aligned with Orientationd."""
    d = _dataset(tmp_path, FORMATS[".nii.gz"])
    lab = _labels(SHAPE3, 1)
    if storage == "flipped":  # voxel i of the stored array is the image's voxel n-1-i along x
        stored, affine = lab[::-1].copy(), AFFINE @ np.array([[-1, 0, 0, SHAPE3[0] - 1], [0, 1, 0, 0],
                                                              [0, 0, 1, 0], [0, 0, 0, 1.0]])
    else:  # axes x and y swapped
        stored, affine = lab.transpose(1, 0, 2).copy(), AFFINE @ np.array([[0, 1, 0, 0], [1, 0, 0, 0],
                                                                          [0, 0, 1, 0], [0, 0, 0, 1.0]])
    _write_label(d.labels[1], stored, affine)
    spec = _spec(source, d)
    got, line = _outcome(spec, tmp_path, _task(source))
    assert got == CLEAR and "case1" in line and "Orientationd" in line, line  # found after loading, not before
    spec["transforms"] = [{"name": "Orientationd", "axcodes": "RAS"}]  # both keys: the implicit default
    assert _outcome(spec, tmp_path, _task(source)) == (OK, "")
    batches = list(build_loader(spec, str(tmp_path), batch_size=1, task=_task(source)))
    # RAS of the LPS image: x and y reversed, for the image and for its label alike
    assert torch.equal(batches[1]["label"][0], torch.from_numpy(lab[::-1, ::-1].copy()).long())
    assert torch.equal(batches[1]["image"][0, 0].as_tensor(), torch.from_numpy(_image(SHAPE3, 1)[::-1, ::-1].copy()))


def test_the_dicom_affine_from_headers_is_monais_for_an_oblique_series(tmp_path):
    """The header check predicts the affine MONAI's reader gives (else it would refuse good labels or pass bad)."""
    c, s = np.cos(0.4), np.sin(0.4)
    _dicom(tmp_path / "s", _image(SHAPE3, 0), orientation=(c, s, 0.0, -s * 0.6, c * 0.6, 0.8), spacing=(0.7, 0.9))
    g = geometry.read_geometry(tmp_path / "s")
    assert g is not None and g.affine is not None
    np.testing.assert_allclose(g.affine, _monai_affine(tmp_path / "s"), atol=1e-6)
    from monai.transforms import LoadImage

    assert g.shape == tuple(LoadImage(image_only=True)(str(tmp_path / "s")).shape)


# --- DICOM series ---------------------------------------------------------------------------------------------------
DICOM_FAULTS = {
    "missing-slice": ({"skip": 2}, "incomplete DICOM series"),
    "duplicated-slice": ({"duplicate": True}, "not equally spaced"),
    "two-series": ({"series": 2}, "2 DICOM series"),
}


@pytest.mark.parametrize("source", FILE_SOURCES)
@pytest.mark.parametrize("fault", [*DICOM_FAULTS, "empty-folder", "no-dicom-files", "corrupt-slice"])
def test_a_broken_dicom_series_is_refused_naming_the_folder(tmp_path, source, fault):
    d = _dataset(tmp_path, FORMATS["dicom"])
    folder = d.images[1]
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    if fault in DICOM_FAULTS:
        _dicom(folder, _image(SHAPE3, 1), **DICOM_FAULTS[fault][0])
        needle = DICOM_FAULTS[fault][1]
    else:
        folder.mkdir()
        needle = "holds no DICOM file"
        if fault == "no-dicom-files":
            (folder / "notes.txt").write_text("not a slice")
        elif fault == "corrupt-slice":
            _dicom(tmp_path / "tmp", _image(SHAPE3, 1))
            for f in sorted((tmp_path / "tmp").iterdir()):
                f.rename(folder / f.name)
            first = sorted(folder.iterdir())[0]
            first.write_bytes(first.read_bytes()[:200])  # the preamble and a cut-off header
            needle = "not a readable DICOM file"
    got, line = _outcome(_spec(source, d), tmp_path, _task(source))
    assert got == CLEAR and "case1" in line and needle in line, line


# --- unreadable files -----------------------------------------------------------------------------------------------
def _break(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "garbage": b"\x00garbage" * 40, "truncated": data[: len(data) // 2]}[how])


FILE_FORMATS = [f for f in FORMATS.values() if f.name != "dicom"]


@pytest.mark.parametrize("source", FILE_SOURCES)
@pytest.mark.parametrize("fmt", [pytest.param(f, id=f.name) for f in FILE_FORMATS])
@pytest.mark.parametrize("how", ["empty", "garbage", "truncated"])
def test_an_unreadable_image_file_is_one_line_naming_it(tmp_path, source, fmt, how):
    d = _dataset(tmp_path, fmt)
    _break(d.images[1], how)
    got, line = _outcome(_spec(source, d), tmp_path, _task(source))
    # a truncated file whose header survives may still decode (PIL pads a cut-off PNG): then it loads
    assert got == CLEAR or how == "truncated", line
    if got == CLEAR:
        assert "case1" in line, line


@pytest.mark.parametrize("source", MAP_SOURCES)
@pytest.mark.parametrize("suffix", sorted({f.label_suffix for f in FORMATS.values()}))
@pytest.mark.parametrize("how", ["empty", "garbage"])
def test_an_unreadable_label_file_is_one_line_naming_it(tmp_path, source, suffix, how):
    fmt = next(f for f in FORMATS.values() if f.label_suffix == suffix)
    d = _dataset(tmp_path, fmt)
    _break(d.labels[1], how)
    got, line = _outcome(_spec(source, d), tmp_path, _task(source))
    assert got == CLEAR and d.labels[1].name in line, line


COMPLEX = {".nii.gz": lambda p: _nifti(p, _image(SHAPE3, 1).astype(np.complex64)),
           ".npy": lambda p: np.save(p, _image(SHAPE2, 1) + 1j)}


@pytest.mark.parametrize("source", FILE_SOURCES)
@pytest.mark.parametrize("suffix", list(COMPLEX))
def test_a_complex_valued_image_is_refused_not_cast(tmp_path, source, suffix):
    d = _dataset(tmp_path, FORMATS[suffix])
    COMPLEX[suffix](d.images[1])
    got, line = _outcome(_spec(source, d), tmp_path, _task(source))
    assert got == CLEAR and "case1" in line and "complex" in line and "imaginary" in line, line


def test_a_complex_image_made_by_a_transform_is_refused_after_loading(tmp_path):
    """The tensors are checked too (ToSample), not only the headers."""
    from medadv.data.sources import DataError, ToSample

    with pytest.raises(DataError, match=r"^case c \(x.npy\): the image is complex"):
        ToSample("index")({"image": torch.ones(1, 2, 2, dtype=torch.complex64), "label": 1, "case_id": "c",
                           "path_image": "x.npy"})


# --- pairing (item 3) -----------------------------------------------------------------------------------------------
def _pairs(tmp_path: Path, images: list[str], labels: list[str], shape: tuple[int, ...] = SHAPE3) -> None:
    (tmp_path / "images").mkdir(parents=True)
    (tmp_path / "labels").mkdir()
    for i, name in enumerate(images):
        (tmp_path / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        _nifti(tmp_path / "images" / name, _image(shape, i))
    for i, name in enumerate(labels):
        (tmp_path / "labels" / name).parent.mkdir(parents=True, exist_ok=True)
        _nifti(tmp_path / "labels" / name, _labels(shape, i))


PAIRING = {  # images, labels, pair rule, expected, what the line names
    "one-missing-one-extra": (["a.nii.gz", "b.nii.gz", "c.nii.gz"], ["a.nii.gz", "b.nii.gz", "d.nii.gz"], None,
                              CLEAR, "1 image(s) without a label (images/c.nii.gz) and 1 label(s) without an image "
                                     "(labels/d.nii.gz)"),
    "label-missing": (["a.nii.gz", "b.nii.gz"], ["a.nii.gz"], None, CLEAR, "(images/b.nii.gz)"),
    "label-extra": (["a.nii.gz"], ["a.nii.gz", "b.nii.gz"], None, CLEAR, "label(s) without an image"),
    "same-count-other-names": (["a.nii.gz", "b.nii.gz"], ["x.nii.gz", "y.nii.gz"], None, CLEAR,
                               "2 image(s) without a label"),
    "two-labels-one-id": (["a.nii.gz"], ["a.nii.gz", "a.nii"], None, CLEAR, "have the same id 'a'"),
    "rule-not-matched": (["a_0000.nii.gz"], ["a.nii.gz"], {"image": "{id}_t1"}, CLEAR, "do not match the rule"),
    "other-suffixes": (["a.nii.gz", "b.nii.gz"], ["b.nii", "a.nii"], None, OK, ""),
    "nnunet-rule": (["a_0000.nii.gz", "b_0000.nii.gz"], ["b.nii.gz", "a.nii.gz"], {"image": "{id}_0000"}, OK, ""),
    "brats-rule": (["p1_t1.nii.gz", "p2_t1.nii.gz"], ["p2_seg.nii.gz", "p1_seg.nii.gz"],
                   {"image": "{id}_t1", "label": "{id}_seg"}, OK, ""),
}


@pytest.mark.parametrize("kind", list(PAIRING))
def test_files_pair_by_a_declared_rule_never_by_sorted_order(tmp_path, kind):
    images, labels, rule, expected, needle = PAIRING[kind]
    _pairs(tmp_path, images, labels)
    spec: dict[str, Any] = {"source": "files", "images": "images/*", "labels": "labels/*"}
    if rule is not None:
        spec["pair"] = rule
    got, line = _outcome(spec, tmp_path, Segmentation(3))
    assert got == expected and needle in line, line
    if got == OK:  # each image with the label of its own id
        for b in build_loader(spec, str(tmp_path), batch_size=1, task=Segmentation(3)):
            image, label = b["path_image"][0], b["path_label"][0]
            key = lambda p: p.split("/")[-1].split(".")[0].split("_")[0]  # noqa: E731
            assert key(image) == key(label), (image, label)


def test_a_folder_per_case_pairs_by_a_rule_on_the_folder_name(tmp_path):
    """KiTS-style layout: every image is ``imaging.nii.gz`` in its case's folder."""
    _pairs(tmp_path, ["k2/imaging.nii.gz", "k1/imaging.nii.gz"], ["k1/segmentation.nii.gz", "k2/segmentation.nii.gz"])
    spec: dict[str, Any] = {"source": "files", "images": "images/*/imaging.nii.gz", "labels": "labels/*/*.nii.gz"}
    with pytest.raises(ConfigError, match=r"the image files images/k1/imaging.nii.gz and images/k2/imaging.nii.gz "
                                          r"have the same id 'imaging' .*\(a folder per case: `pair: \{image: "
                                          r"'\{id\}/imaging'\}`\)"):
        check_data(spec, str(tmp_path), Segmentation(3))
    spec["pair"] = {"image": "{id}/imaging", "label": "{id}/segmentation"}
    batches = list(build_loader(spec, str(tmp_path), batch_size=1, task=Segmentation(3)))
    assert [(b["case_id"][0], b["path_label"][0]) for b in batches] == [
        ("k1/imaging.nii.gz", "labels/k1/segmentation.nii.gz"), ("k2/imaging.nii.gz", "labels/k2/segmentation.nii.gz")]


def test_unpaired_files_that_differ_by_one_ending_get_the_rule_that_pairs_them(tmp_path):
    _pairs(tmp_path, ["p1.nii.gz", "p2.nii.gz"], ["p1_label.nii.gz", "p2_label.nii.gz"])
    spec: dict[str, Any] = {"source": "files", "images": "images/*", "labels": "labels/*"}
    with pytest.raises(ConfigError, match=r"declare the rule: `pair: \{label: '\{id\}_label'\}` would pair them"):
        check_data(spec, str(tmp_path), Segmentation(3))
    assert _outcome({**spec, "pair": {"label": "{id}_label"}}, tmp_path, Segmentation(3)) == (OK, "")


@pytest.mark.parametrize("rule", [{"label": "seg"}, {"image": "{id}{id}"}, {"imag": "{id}"}])
def test_a_pair_rule_without_one_id_is_a_config_error(tmp_path, rule):
    _pairs(tmp_path, ["a.nii.gz"], ["a.nii.gz"])
    with pytest.raises(ConfigError) as e:
        check_data({"source": "files", "images": "images/*", "labels": "labels/*", "pair": rule}, str(tmp_path))
    assert len(e.value.messages) == 1 and "`data.pair" in e.value.messages[0], e.value.messages


def test_evaluate_rows_record_the_image_and_the_label_file(tmp_path):
    from medadv.attacks import FGSM
    from medadv.evaluation import evaluate
    from medadv.models.nets import small_unet
    from medadv.threats import Linf

    _pairs(tmp_path, ["b.nii.gz", "a.nii.gz"], ["a.nii", "b.nii"], shape=(8, 8, 4))  # the UNet halves twice
    data = build_loader({"source": "files", "images": "images/*", "labels": "labels/*"}, str(tmp_path),
                        batch_size=2, task=Segmentation(3))
    torch.manual_seed(0)
    model = small_unet(num_classes=3, channels=(4, 8))
    task = Segmentation(3)
    res = evaluate(model, task, data, [FGSM(task, Linf(0.01, bounds=None))])
    assert [(r["case_id"], r["image_path"], r["label_path"]) for r in res] == [
        ("a.nii.gz", "images/a.nii.gz", "labels/a.nii"), ("b.nii.gz", "images/b.nii.gz", "labels/b.nii")]
    assert set(PATH_KEYS.values()) <= set(res.rows[0])


# --- NPZ and CSV files ----------------------------------------------------------------------------------------------
def _npz(path: Path, **arrays: Any) -> None:
    np.savez(path, **arrays)


def _bad_crc(path: Path) -> None:
    _npz(path, x=np.ones((2, 1, 4, 4), np.float32), y=np.array([0, 1]))
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("x.npy")
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 140  # inside x's values
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


X, Y = np.ones((2, 1, 4, 4), np.float32), np.array([0, 1])
NPZ = {  # how the file is written, what the line says
    "zero-cases": (lambda p: _npz(p, x=X[:0], y=Y[:0]), "holds 0 cases"),
    "zero-bytes": (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    "truncated": (lambda p: (_npz(p, x=X, y=Y), p.write_bytes(p.read_bytes()[:150])), "is not a readable .npz"),
    "not-a-zip": (lambda p: np.save(open(p, "wb"), X), "is not a readable .npz"),
    "bad-crc": (_bad_crc, "is not a readable .npz (BadZipFile: Bad CRC-32 for file 'x.npy')"),
    "complex-x": (lambda p: _npz(p, x=X + 1j, y=Y), "array 'x' is complex"),
    "complex-y": (lambda p: _npz(p, x=X, y=Y + 0j), "array 'y' is complex"),
    "object-y": (lambda p: _npz(p, x=X, y=np.array(["a", "b"])), "array 'y' holds <U1 values"),
    "fewer-labels": (lambda p: _npz(p, x=X, y=Y[:1]), "has 2 inputs (x) but 1 labels (y)"),
    "scalar-y": (lambda p: _npz(p, x=X, y=np.array(1)), "array 'y' is a scalar"),
}


@pytest.mark.parametrize("kind", list(NPZ))
def test_a_bad_npz_is_one_line_naming_the_file(tmp_path, kind):
    write, needle = NPZ[kind]
    write(tmp_path / "d.npz")
    with pytest.raises((ValueError, OSError)) as e:
        check_data({"source": "npz", "path": "d.npz"}, str(tmp_path))
        build_data({"source": "npz", "path": "d.npz"}, str(tmp_path))
    line = str(e.value)
    assert "\n" not in line and "d.npz" in line and needle in line, line


@pytest.mark.parametrize(("task", "y"), [
    (MultiClass(), np.array([0.0, 1.5])), (MultiClass(), np.array([0.0, np.nan])),
    (Segmentation(3), np.full((2, 4, 4), 0.25)), (Segmentation(3), np.full((2, 4, 4), np.inf))],
    ids=["index-fraction", "index-nan", "map-fraction", "map-inf"])
def test_npz_labels_of_non_integers_are_refused_for_class_tasks(tmp_path, task, y):
    _npz(tmp_path / "d.npz", x=X, y=y)
    with pytest.raises(ConfigError, match=r"^`data.path`: d.npz array 'y' holds the (non-integer )?value"):
        build_loader({"source": "npz", "path": "d.npz"}, str(tmp_path), batch_size=1, task=task)
    from medadv.tasks import Regression

    build_loader({"source": "npz", "path": "d.npz"}, str(tmp_path), batch_size=1, task=Regression())  # values


def _config(tmp_path: Path, data: dict[str, Any], task: dict[str, Any]) -> Path:
    kwargs = {"in_channels": 1, "num_classes": 3, "ndim": 3, "channels": [4, 8]} if task["type"] == "segmentation" \
        else {"in_channels": 1, "num_outputs": 2, "width": 4}
    cfg = {"model": {"builder": "small_unet" if task["type"] == "segmentation" else "small_cnn", "kwargs": kwargs},
           "task": task, "data": data, "threat": {"norm": "linf", "bounds": None}, "budgets": [0.01],
           "attacks": ["fgsm"], "batch_size": 2, "output": "out"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err.splitlines()


SEG = {"type": "segmentation", "num_classes": 3}


def test_cli_validate_and_evaluate_refuse_the_issue_cases_in_one_line(tmp_path, capsys):
    # a shifted label origin: `medadv validate` said OK, now one line
    d = _dataset(tmp_path / "shift", FORMATS[".nii.gz"])
    _write_label(d.labels[1], _labels(SHAPE3, 1), _origin(AFFINE))
    path = _config(tmp_path / "shift", {"source": "files", "images": "images/*", "labels": "labels/*"}, SEG)
    rc, err = _cli(["validate", str(path)], capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith("medadv: error: case case1.nii.gz (images/case1.nii.gz "
                                                           "with label labels/case1.nii.gz): the label is not on")
    # one label missing, one extra: evaluate refuses before any work, naming both files
    _pairs(tmp_path / "pairs", ["a.nii.gz", "b.nii.gz", "c.nii.gz"], ["a.nii.gz", "b.nii.gz", "d.nii.gz"])
    path = _config(tmp_path / "pairs", {"source": "files", "images": "images/*", "labels": "labels/*"}, SEG)
    rc, err = _cli(["evaluate", str(path), "--no-progress"], capsys)
    assert rc == 2 and len(err) == 1 and "images/c.nii.gz" in err[0] and "labels/d.nii.gz" in err[0], err
    assert not (tmp_path / "pairs" / "out").exists()
    # an NPZ of 0 cases: exit 2, not 0 rows
    (tmp_path / "npz").mkdir()
    _npz(tmp_path / "npz" / "d.npz", x=np.ones((0, 1, 8, 8), np.float32), y=np.zeros(0, np.int64))
    path = _config(tmp_path / "npz", {"source": "npz", "path": "d.npz"}, {"type": "multiclass"})
    rc, err = _cli(["evaluate", str(path), "--no-progress"], capsys)
    assert rc == 2 and err == ["medadv: error: `data.path`: d.npz holds 0 cases (x has shape (0, 1, 8, 8)); nothing "
                               "to evaluate"]


def _cli_fault(root: Path, fault: str) -> str:
    """Write a two-case data set under ``root`` with ``fault`` in case1; returns what the line must name."""
    fmt = FORMATS["dicom" if fault in ("missing-slice", "empty-dicom-folder") else
                  ".npy" if fault == "complex-npy" else ".nii.gz"]
    d = _dataset(root, fmt)
    if fault == "spacing":
        _write_label(d.labels[1], _labels(SHAPE3, 1), _spacing(AFFINE))
    elif fault == "non-integer":
        _write_label(d.labels[1], _labels(SHAPE3, 1) + np.float32(0.25), AFFINE)
    elif fault == "complex-npy":
        np.save(d.images[1], _image(SHAPE2, 1) * 1j)
    elif fault == "unpaired":
        d.labels[1].rename(d.labels[1].with_name("case9.nii.gz"))
        return "case9.nii.gz"
    else:
        for f in d.images[1].iterdir():
            f.unlink()
        if fault == "missing-slice":
            d.images[1].rmdir()
            _dicom(d.images[1], _image(SHAPE3, 1), skip=2)
    return "case1"


@pytest.mark.parametrize("command", ["validate", "evaluate"])
@pytest.mark.parametrize("fault", ["spacing", "non-integer", "complex-npy", "unpaired", "missing-slice",
                                   "empty-dicom-folder"])
def test_cli_refuses_each_data_fault_in_one_line_before_any_work(tmp_path, capsys, command, fault):
    needle = _cli_fault(tmp_path, fault)
    path = _config(tmp_path, {"source": "files", "images": "images/*", "labels": "labels/*"}, SEG)
    rc, err = _cli([command, str(path), *(["--no-progress"] if command == "evaluate" else [])], capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith("medadv: error: ") and needle in err[0], err
    assert not (tmp_path / "out").exists()  # refused before the output folder was touched


def test_cli_accepts_a_csv_header_with_a_byte_order_mark(tmp_path, capsys):
    d = _dataset(tmp_path, FORMATS[".png"])
    rows = "".join(f"{p.relative_to(tmp_path).as_posix()},{i % 2},{1 - i % 2}\n" for i, p in enumerate(d.images))
    (tmp_path / "y.csv").write_bytes(("image,effusion,edema\n" + rows).encode("utf-8-sig"))
    data = {"source": "csv", "path": "y.csv"}
    (b,) = build_loader(data, str(tmp_path), batch_size=2, task=MultiLabel())
    assert b["label"].tolist() == [[0.0, 1.0], [1.0, 0.0]]
    path = _config(tmp_path, data, {"type": "multilabel", "class_names": ["effusion", "edema"]})
    rc, err = _cli(["validate", str(path)], capsys)
    assert rc == 0, err


CSV = {  # the CSV's bytes, what the line says
    "latin-1": ("image,grade\nimages/case0.png,1\nimages/caf\xe9.png,0\n".encode("latin-1"), "is not a UTF-8 CSV"),
    "empty-image-cell": (b"image,grade\nimages/case0.png,1\n,0\n", "row 3 has no image in column 'image'"),
    "short-row": (b"image,grade\nimages/case0.png,1\nimages/case1.png\n", "row 3 column 'grade' is missing"),
    "header-only": (b"image,grade\n", "has no rows"),
    "zero-bytes": (b"", "has no rows"),
}


@pytest.mark.parametrize("kind", list(CSV))
def test_a_bad_csv_is_one_line_naming_it(tmp_path, kind):
    _dataset(tmp_path, FORMATS[".png"])
    content, needle = CSV[kind]
    (tmp_path / "y.csv").write_bytes(content)
    got, line = _outcome({"source": "csv", "path": "y.csv", "label_column": "grade"}, tmp_path, MultiClass())
    assert got == CLEAR and "y.csv" in line and needle in line, line


def test_every_registered_source_and_format_has_a_writer():
    suffixes = geometry.WORLD_SUFFIXES + geometry.PIXEL_SUFFIXES + geometry.ARRAY_SUFFIXES
    assert set(FORMATS) == {*suffixes, "dicom"}
    assert set(MAP_SOURCES) | {"csv"} == set(FILE_SOURCES)


def test_the_suite_generates_at_least_forty_new_kinds():
    kinds = (12 + 4 + len(GEOMETRY_FAULTS) * len(WORLD) * len(MAP_SOURCES) + len(FORMATS) * len(MAP_SOURCES)
             + 3 * len(FLOAT_LABELS) * len(MAP_SOURCES) + (len(DICOM_FAULTS) + 3) * len(FILE_SOURCES)
             + 3 * len(FILE_FORMATS) * len(FILE_SOURCES) + len(COMPLEX) * len(FILE_SOURCES) + len(PAIRING)
             + len(NPZ) + 4 + len(CSV))
    assert kinds >= 40, kinds
