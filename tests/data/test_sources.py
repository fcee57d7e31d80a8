"""Cases from files through MONAI: NIfTI, DICOM series, PNG + CSV, NumPy, Decathlon datalists; transforms by name."""

from __future__ import annotations

import json
import warnings

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from PIL import Image

from medadv.config import build_loader, check_data, data_identity
from medadv.config_schema import ConfigError, validate_config
from medadv.data import sources
from medadv.data.sources import DataError, case_spacing
from medadv.tasks import MultiClass, MultiLabel, Segmentation

AFFINE = np.diag([2.0, 2.0, 3.0, 1.0])


def _nifti(folder, n=3, shape=(10, 12, 8), affine=AFFINE, seed=0):
    """``n`` image/label pairs (same file names in images/ and labels/), returned as arrays."""
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "labels").mkdir(exist_ok=True)
    out = []
    for i in range(n):
        img = rng.random(shape, dtype=np.float32)
        lab = rng.integers(0, 3, shape).astype(np.uint8)
        nib.save(nib.Nifti1Image(img, affine), folder / "images" / f"case{i}.nii.gz")
        nib.save(nib.Nifti1Image(lab, affine), folder / "labels" / f"case{i}.nii.gz")
        out.append((img, lab))
    return out


FILES = {"source": "files", "images": "images/*.nii.gz", "labels": "labels/*.nii.gz"}


def test_nifti_files_stream_as_dict_batches_with_case_ids_and_header_spacing(tmp_path):
    arrays = _nifti(tmp_path)
    batches = list(build_loader(FILES, str(tmp_path), batch_size=2, task=Segmentation(3)))
    assert [len(b["case_id"]) for b in batches] == [2, 1]
    b = batches[0]
    assert isinstance(b["image"], MetaTensor) and b["image"].dtype == torch.float32
    assert b["image"].shape == (2, 1, 10, 12, 8) and b["label"].shape == (2, 10, 12, 8)
    assert b["label"].dtype == torch.int64 and not isinstance(b["label"], MetaTensor)
    assert b["case_id"] == ["case0.nii.gz", "case1.nii.gz"]
    assert torch.allclose(b["image"][1, 0], torch.from_numpy(arrays[1][0]))
    assert torch.equal(b["label"][1], torch.from_numpy(arrays[1][1]).long())
    assert case_spacing(b["image"], 1) == (2.0, 2.0, 3.0)


def test_transforms_by_name_fill_keys_and_never_interpolate_labels(tmp_path):
    _nifti(tmp_path, n=1)
    spec = {**FILES, "transforms": [{"name": "Spacingd", "pixdim": [1.0, 1.0, 1.5]},  # keys, label mode: filled
                                    {"name": "ScaleIntensityRanged", "a_min": 0.0, "a_max": 0.5, "b_min": 0.0,
                                     "b_max": 1.0, "clip": True}]}
    (b,) = build_loader(spec, str(tmp_path), batch_size=1, task=Segmentation(3))
    assert b["image"].shape[2:] == b["label"].shape[1:] and b["image"].shape[2] >= 19
    assert case_spacing(b["image"]) == pytest.approx((1.0, 1.0, 1.5))  # the affine follows the transforms
    assert set(b["label"].unique().tolist()) <= {0, 1, 2}  # nearest: no fractional labels rounded
    assert float(b["image"].max()) == 1.0  # the intensity transform went to the image only
    built = sources.build_transforms(validate_config({
        "model": {"builder": "small_cnn"}, "task": {"type": "multiclass"}, "data": spec, "threat": {"bounds": None},
        "attacks": ["fgsm"]}).data.transforms, ["image", "label"], ["case_id", "image", "label"])
    assert [type(t).__name__ for t in built] == ["LoadImaged", "EnsureChannelFirstd", "Spacingd",
                                                 "ScaleIntensityRanged"]
    assert list(built[3].keys) == ["image"] and list(built[2].keys) == ["image", "label"]


def test_only_one_batch_is_read_at_a_time(tmp_path, monkeypatch):
    _nifti(tmp_path, n=5)
    read = []
    original = sources.ToSample.__call__
    monkeypatch.setattr(sources.ToSample, "__call__", lambda self, d: read.append(d["case_id"]) or original(self, d))
    loader = build_loader(FILES, str(tmp_path), batch_size=2, task=Segmentation(3))
    assert read == []  # building the loader reads nothing
    it = iter(loader)
    first = next(it)
    assert read == first["case_id"] == ["case0.nii.gz", "case1.nii.gz"]
    next(it)
    assert len(read) == 4


def _dicom_series(folder, vol, spacing=(0.7, 0.8), thickness=2.5):
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    folder.mkdir(parents=True)
    series, study = generate_uid(), generate_uid()
    for k in range(vol.shape[0]):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = CTImageStorage, generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.Modality, ds.PatientID = study, series, "CT", "p"
        ds.InstanceNumber, ds.ImagePositionPatient = k + 1, [0.0, 0.0, thickness * k]
        ds.ImageOrientationPatient, ds.PixelSpacing, ds.SliceThickness = [1, 0, 0, 0, 1, 0], list(spacing), thickness
        ds.Rows, ds.Columns = vol.shape[1:]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope = -1024, 1
        ds.PixelData = vol[k].astype(np.int16).tobytes()
        ds.save_as(folder / f"slice{k:02d}.dcm", enforce_file_format=True)


def test_dicom_series_folders_read_in_hounsfield_units_with_their_spacing(tmp_path):
    rng = np.random.default_rng(0)
    vol = rng.integers(0, 2000, (5, 12, 10))
    _dicom_series(tmp_path / "ct" / "patient1", vol)
    lab = np.zeros((10, 12, 5), np.uint8)  # MONAI's (x, y, z) order of the series
    lab[2:5, 3:7, 1:3] = 1
    # the label on the series' grid: MONAI's RAS affine of the series (LPS x and y flipped)
    nib.save(nib.Nifti1Image(lab, np.diag([-0.8, -0.7, 2.5, 1.0])), tmp_path / "patient1_label.nii.gz")
    spec = {"source": "files", "images": ["ct/patient1"], "labels": ["patient1_label.nii.gz"],
            "pair": {"label": "{id}_label"}}
    (b,) = build_loader(spec, str(tmp_path), batch_size=1, task=Segmentation(2))
    assert b["case_id"] == ["patient1"] and b["image"].shape == (1, 1, 10, 12, 5)
    assert float(b["image"].min()) == float(vol.min() - 1024) and float(b["image"].max()) == float(vol.max() - 1024)
    # DICOM PixelSpacing is (between rows, between columns): x (columns) 0.8 mm, y (rows) 0.7 mm
    assert case_spacing(b["image"]) == pytest.approx((0.8, 0.7, 2.5))
    assert int(b["label"].sum()) == int(lab.sum())


def _png_csv(tmp_path, n=4, size=16):
    rng = np.random.default_rng(0)
    (tmp_path / "png").mkdir()
    rows = ["file,patient,frontal,occipital,cerebellum"]
    labels = []
    for i in range(n):
        Image.fromarray((rng.random((size, size)) * 255).astype(np.uint8)).save(tmp_path / "png" / f"p{i}.png")
        lab = [int(v) for v in rng.integers(0, 2, 3)]
        labels.append(lab)
        rows.append(f"png/p{i}.png,pat{i},{','.join(map(str, lab))}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    return labels


def test_png_folder_and_csv_give_multi_hot_labels(tmp_path):
    labels = _png_csv(tmp_path)
    spec = {"source": "csv", "path": "labels.csv", "image_column": "file", "id_column": "patient",
            "transforms": [{"name": "ScaleIntensityRanged", "a_min": 0, "a_max": 255, "b_min": 0, "b_max": 1}]}
    batches = list(build_loader(spec, str(tmp_path), batch_size=3, task=MultiLabel()))
    assert batches[0]["image"].shape == (3, 1, 16, 16) and float(batches[0]["image"].max()) <= 1.0
    y = torch.cat([b["label"] for b in batches])
    assert y.dtype == torch.float32 and y.tolist() == labels  # every column but the image and id columns
    assert sum((b["case_id"] for b in batches), []) == ["pat0", "pat1", "pat2", "pat3"]
    # a subset of the label columns, ids from the file names
    (b,) = build_loader({"source": "csv", "path": "labels.csv", "image_column": "file", "label_columns": ["occipital"],
                         "n": 2}, str(tmp_path), batch_size=4, task=MultiLabel())
    assert b["label"].tolist() == [[lab[1]] for lab in labels[:2]] and b["case_id"] == ["p0.png", "p1.png"]


def test_numpy_files_and_a_class_index_column(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"x{i}.npy", np.full((8, 8), i, np.float32))
    (tmp_path / "y.csv").write_text("image,grade\nx0.npy,2\nx1.npy,0\nx2.npy,1\n")
    (b,) = build_loader({"source": "csv", "path": "y.csv", "label_column": "grade"}, str(tmp_path), batch_size=3,
                        task=MultiClass())
    assert b["label"].tolist() == [2, 0, 1] and b["label"].dtype == torch.int64
    assert b["image"][:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0]


def test_decathlon_datalist_with_ids_and_a_base_dir(tmp_path):
    _nifti(tmp_path / "data", n=3)
    datalist = {"training": [{"image": "images/case0.nii.gz", "label": "labels/case0.nii.gz"}],
                "validation": [{"image": f"images/case{i}.nii.gz", "label": f"labels/case{i}.nii.gz", "id": f"sub-{i}"}
                               for i in (1, 2)]}
    (tmp_path / "dataset.json").write_text(json.dumps(datalist))
    spec = {"source": "datalist", "path": "dataset.json", "base_dir": "data"}
    (b,) = build_loader(spec, str(tmp_path), batch_size=2, task=Segmentation(3))
    assert b["case_id"] == ["sub-1", "sub-2"] and b["label"].shape == (2, 10, 12, 8)
    (b,) = build_loader({**spec, "key": "training"}, str(tmp_path), batch_size=2, task=Segmentation(3))
    assert b["case_id"] == ["case0.nii.gz"]
    with pytest.raises(ConfigError, match=r"`data.key`: dataset.json has no non-empty list 'validaton'; did you mean "
                                          r"'validation'\? \(its lists: training, validation\)"):
        check_data({**spec, "key": "validaton"}, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"4 file\(s\) listed in dataset.json not found"):
        check_data({"source": "datalist", "path": "dataset.json"}, str(tmp_path))  # relative to the JSON: no data/


def _base_config(data):
    return {"model": {"builder": "small_cnn"}, "task": {"type": "segmentation", "num_classes": 3}, "data": data,
            "threat": {"bounds": None}, "attacks": ["fgsm"]}


@pytest.mark.parametrize(("transform", "message"), [
    ({"name": "Spacingdd", "pixdim": 1}, "`data.transforms[0]`: unknown MONAI transform 'Spacingdd'; did you mean "
                                          "'Spacingd'?"),
    ("ScaleIntensityRange", "`data.transforms[0]`: 'ScaleIntensityRange' is an array transform: name its dictionary "
                            "version 'ScaleIntensityRanged'; the cases are dictionaries with keys image, label"),
    ({"pixdim": 1}, "`data.transforms[0]`: each entry of `transforms` needs the `name` of a MONAI transform"),
])
def test_transform_names_are_checked_by_the_schema(transform, message):
    with pytest.raises(ConfigError) as e:
        validate_config(_base_config({**FILES, "transforms": [transform]}))
    assert e.value.messages[0].startswith(message), e.value.messages


def test_transform_arguments_and_keys_are_checked_without_reading(tmp_path):
    _nifti(tmp_path, n=1)
    seg = Segmentation(3)

    def error(transforms):
        with pytest.raises(ConfigError) as e:
            check_data({**FILES, "transforms": transforms}, str(tmp_path), seg)
        return str(e.value)

    assert error([{"name": "Spacingd", "pixdm": [1, 1, 1]}]).startswith(
        "unknown key `pixdm` in `data.transforms[0]`; did you mean `pixdim`?")
    assert error(["Spacingd"]) .startswith("`data.transforms[0]` lacks `pixdim` (required")
    assert error([{"name": "Orientationd", "keys": ["img"], "axcodes": "RAS"}]) == (
        "`data.transforms[0].keys`: Orientationd names the key 'img', which the cases do not have; did you mean "
        "'image'? (they have case_id, image, label)")
    assert error([{"name": "Spacingd", "pixdim": "a"}]) == ("`data.transforms[0]` (Spacingd): ValueError: could not "
                                                             "convert string to float: 'a'")


def test_missing_and_mismatched_files_are_one_line(tmp_path):
    _nifti(tmp_path, n=2)
    seg = Segmentation(3)
    with pytest.raises(FileNotFoundError, match=r"^`data.images`: no file matches 'imgs/\*.nii.gz' \(in "):
        check_data({**FILES, "images": "imgs/*.nii.gz"}, str(tmp_path), seg)
    with pytest.raises(FileNotFoundError, match=r"^`data.images`: file not found: .*case9.nii.gz \('images/case9"):
        check_data({**FILES, "images": ["images/case9.nii.gz"]}, str(tmp_path), seg)
    with pytest.raises(ConfigError, match=r"^`data.labels`: 1 image\(s\) without a label \(images/case1.nii.gz\)"):
        check_data({**FILES, "labels": ["labels/case0.nii.gz"]}, str(tmp_path), seg)
    with pytest.raises(ConfigError, match="the cases have no labels"):
        check_data({"source": "files", "images": "images/*"}, str(tmp_path), seg)
    with pytest.raises(ConfigError, match=r"^`data`: the task reads 0/1 label columns but the data's labels are label maps"):
        check_data(FILES, str(tmp_path), MultiLabel())


def test_csv_mistakes_name_the_column_and_row(tmp_path):
    _png_csv(tmp_path, n=2)
    with pytest.raises(ConfigError, match=r"`data.image_column`: labels.csv has no column 'fiel'; did you mean "
                                          r"'file'\? \(its columns: file, patient, frontal, occipital, cerebellum\)"):
        check_data({"source": "csv", "path": "labels.csv", "image_column": "fiel"}, str(tmp_path), MultiLabel())
    (tmp_path / "bad.csv").write_text("file,patient,frontal,occipital\npng/p0.png,a,1,0\npng/p1.png,b,0.5,1\n")
    with pytest.raises(ConfigError, match=r"bad.csv row 3 column 'frontal' is '0.5'; multi-label columns hold 0 or 1"):
        check_data({"source": "csv", "path": "bad.csv", "image_column": "file", "id_column": "patient"}, str(tmp_path))
    (tmp_path / "bad.csv").write_text("file,grade\npng/p0.png,1\npng/p1.png,high\n")
    with pytest.raises(ConfigError, match=r"bad.csv row 3 column 'grade' is 'high', not a number"):
        check_data({"source": "csv", "path": "bad.csv", "image_column": "file", "label_column": "grade"}, str(tmp_path))


def test_unreadable_files_and_unequal_sizes_name_the_case(tmp_path):
    _nifti(tmp_path, n=2)
    _nifti(tmp_path / "big", n=1, shape=(10, 12, 9))
    (tmp_path / "big" / "images" / "case0.nii.gz").rename(tmp_path / "images" / "case9.nii.gz")
    (tmp_path / "big" / "labels" / "case0.nii.gz").rename(tmp_path / "labels" / "case9.nii.gz")
    with pytest.raises(DataError, match=r"^the cases of one batch differ in size \(case0.nii.gz \(1, 10, 12, 8\), "
                                        r"case1.nii.gz \(1, 10, 12, 8\), case9.nii.gz \(1, 10, 12, 9\)\): set "
                                        r"`batch_size: 1`"):
        list(build_loader(FILES, str(tmp_path), batch_size=3, task=Segmentation(3)))
    assert len(list(build_loader(FILES, str(tmp_path), batch_size=1, task=Segmentation(3)))) == 3
    (tmp_path / "images" / "case1.nii.gz").write_bytes(b"not a nifti file")
    with pytest.raises(DataError, match=r"^case case1.nii.gz \(.*case1.nii.gz\): not a readable .nii.gz file \(\w+"):
        list(build_loader(FILES, str(tmp_path), batch_size=1, task=Segmentation(3)))


def test_data_identity_follows_the_files(tmp_path):
    _nifti(tmp_path, n=2)
    before = data_identity(FILES, str(tmp_path))
    assert len(before) == 4 and all(len(entry) == 3 for entry in before)
    assert data_identity(FILES, str(tmp_path)) == before
    _nifti(tmp_path, n=1, seed=1, shape=(10, 12, 9))  # case0 rewritten
    assert data_identity(FILES, str(tmp_path)) != before


def test_random_transforms_draw_per_case_whatever_the_batching(tmp_path):
    # a case's random draws depend on (seed, case index) only: sharded, resumed or re-batched runs see the same data
    _nifti(tmp_path, n=4)
    spec = {**FILES, "transforms": [{"name": "RandGaussianNoised", "prob": 1.0, "std": 0.1}]}

    def images(batch_size, seed=0):
        out = []
        for b in build_loader(spec, str(tmp_path), batch_size=batch_size, task=Segmentation(3), seed=seed):
            out += list(b["image"].as_tensor())
        return out

    one, two = images(1), images(2)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(one, images(3), strict=True))
    assert not torch.equal(images(1, seed=1)[0], one[0])  # the draws follow the config's seed


# --- issue 19: PNG / JPEG reach the model as PIL and torchvision give them, (C, H, W) ------------------------------
def _photos(tmp_path):
    """A real photograph (scikit-image's cat, non-square RGB) and its mirror image, plus a grey crop of the
    camera man, as PNGs and JPEG; label 1 when the left half of the image is brighter than the right half."""
    from skimage import data
    from skimage.transform import resize

    cat = (resize(data.chelsea(), (30, 45), anti_aliasing=True) * 255).astype(np.uint8)
    grey = data.camera()[100:140, 200:260]  # 40 rows x 60 columns
    images = {"cat.png": cat, "cat_mirrored.png": cat[:, ::-1], "camera.png": grey, "camera_mirrored.jpg": grey[:, ::-1]}
    rows = ["image,left_brighter"]
    for name, arr in images.items():
        Image.fromarray(np.ascontiguousarray(arr)).save(tmp_path / name, quality=95)
        w = arr.shape[1]
        rows.append(f"{name},{int(arr[:, : w // 2].mean() > arr[:, w - w // 2:].mean())}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    return list(images)


def _left_brighter(t: torch.Tensor) -> int:
    w = t.shape[-1]
    return int(t[..., : w // 2].mean() > t[..., w - w // 2:].mean())


@pytest.mark.parametrize("loader", ["implicit", "named"])
def test_png_and_jpeg_are_read_height_first_as_torchvision_reads_them(tmp_path, loader):
    from torchvision.transforms.functional import to_tensor

    names = _photos(tmp_path)
    scale = {"name": "ScaleIntensityRanged", "a_min": 0, "a_max": 255, "b_min": 0.0, "b_max": 1.0}
    transforms = [scale] if loader == "implicit" else \
        [{"name": "LoadImaged", "keys": ["image"]}, {"name": "EnsureChannelFirstd", "keys": ["image"]}, scale]
    spec = {"source": "csv", "path": "labels.csv", "label_column": "left_brighter", "transforms": transforms}
    batches = list(build_loader(spec, str(tmp_path), batch_size=1, task=MultiClass()))
    assert [b["case_id"][0] for b in batches] == names
    # the mirror images have the opposite label: a transposed read (left/right = top/bottom) gets one of each wrong
    labels = [int(b["label"]) for b in batches]
    assert labels[0] != labels[1] and labels[2] != labels[3]
    for b in batches:
        with Image.open(tmp_path / b["case_id"][0]) as im:
            expected = to_tensor(im)
        image = b["image"][0].as_tensor()
        assert image.shape == expected.shape, b["case_id"]  # (C, H, W): 3 x 30 x 45 and 1 x 40 x 60
        torch.testing.assert_close(image, expected, atol=1e-6, rtol=0)
        assert _left_brighter(image) == int(b["label"])
        assert not sources.width_first(b["image"].meta)  # what saving the adversarial example follows


def test_monai_layout_on_request_and_for_monai_pipelines(tmp_path):
    """``reverse_indexing: true`` on a named LoadImaged keeps MONAI's (C, W, H); a batch from the user's own MONAI
    pipeline (LoadImage defaults) is width-first; a batch without MONAI metadata is not."""
    from monai.data import list_data_collate
    from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged

    _photos(tmp_path)
    spec = {"source": "csv", "path": "labels.csv", "label_column": "left_brighter", "n": 1,
            "transforms": [{"name": "LoadImaged", "keys": ["image"], "reverse_indexing": True},
                           {"name": "EnsureChannelFirstd", "keys": ["image"]}]}
    (b,) = build_loader(spec, str(tmp_path), batch_size=1, task=MultiClass())
    assert b["image"].shape == (1, 3, 45, 30) and sources.width_first(b["image"].meta)
    with warnings.catch_warnings():  # MONAI's notice that its optional GPU DICOM decoder is absent
        warnings.simplefilter("ignore")
        own = Compose([LoadImaged(["image"]), EnsureChannelFirstd(["image"])])
    batch = list_data_collate([own({"image": str(tmp_path / "cat.png")})])
    assert batch["image"].shape == (1, 3, 45, 30) and sources.width_first(batch["image"].meta)
    assert not sources.width_first(None)


def test_adversarial_example_saved_from_a_png_source_has_the_source_orientation(tmp_path):
    from medadv.attacks import FGSM
    from medadv.evaluation import evaluate
    from medadv.threats import Linf

    names = _photos(tmp_path)
    spec = {"source": "csv", "path": "labels.csv", "label_column": "left_brighter", "n": 2,
            "transforms": [{"name": "ScaleIntensityRanged", "a_min": 0, "a_max": 255, "b_min": 0.0, "b_max": 1.0}]}
    data = build_loader(spec, str(tmp_path), batch_size=2, task=MultiClass())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 30 * 45, 2)).eval()
    task = MultiClass()
    res = evaluate(model, task, data, {"still": FGSM(task, Linf(0.0, bounds=(0.0, 1.0)))},
                   save_adversarial=tmp_path / "adv")
    for r, name in zip(res, names[:2], strict=True):
        saved = np.asarray(Image.open(tmp_path / "adv" / r["saved_file"]))
        assert np.array_equal(saved, np.asarray(Image.open(tmp_path / name)))
