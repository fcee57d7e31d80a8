"""evaluate(save_adversarial=...): adversarial examples as NIfTI (input affine, original dtype), PNG (8/16-bit, the
source file's orientation), DICOM (the source's headers and geometry) or .npy, each read back and re-predicted (does
the attack survive the quantisation?)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from medadv.attacks import PGD
from medadv.attacks.base import Attack
from medadv.data.save import case_stem, load_example, original_dtype, save_example
from medadv.evaluation import evaluate
from medadv.tasks import MultiClass, Segmentation
from medadv.threats import Box, Linf

AFFINE = np.array([[0.0, 0.0, 2.5, -10.0], [1.5, 0.0, 0.0, 20.0], [0.0, -1.2, 0.0, 5.0], [0.0, 0.0, 0.0, 1.0]])


class _Shift(Attack):
    """A test attack: adds ``delta`` everywhere (0: returns the input unchanged), clipped to the box."""

    threat_kind = "box"
    delta = 0.0

    def perturb(self, model, x, y, logits):
        return self.box.clip(x + self.delta)


def _shift(task, box, delta):
    atk = _Shift(task, box)
    atk.delta = delta
    return atk


def _monai_loader(items, keys, transforms, batch_size=2):
    from monai.data import DataLoader, Dataset
    from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged

    return DataLoader(Dataset(items, Compose([LoadImaged(keys), EnsureChannelFirstd(keys), *transforms])),
                      batch_size=batch_size)


def _nifti_cases(tmp_path, dtype):
    import nibabel as nib

    g = np.random.default_rng(0)
    items = []
    for i in range(3):
        img = (g.random((6, 7, 5)) * 200).astype(dtype)
        nib.save(nib.Nifti1Image(img, AFFINE), tmp_path / f"vol{i}.nii.gz")
        nib.save(nib.Nifti1Image(g.integers(0, 3, (6, 7, 5)).astype(np.uint8), AFFINE), tmp_path / f"lab{i}.nii.gz")
        items.append({"image": str(tmp_path / f"vol{i}.nii.gz"), "label": str(tmp_path / f"lab{i}.nii.gz"),
                      "case_id": f"vol{i}.nii.gz"})
    return items


def _seg_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.Softplus(), nn.Conv3d(4, 3, 1)).eval()


@pytest.mark.parametrize("dtype", ["int16", "float32"])
def test_nifti_keeps_affine_and_dtype_and_is_re_predicted(tmp_path, dtype):
    import nibabel as nib
    from monai.transforms import ScaleIntensityRanged

    data = _monai_loader(_nifti_cases(tmp_path, dtype), ["image", "label"],
                         [ScaleIntensityRanged("image", 0, 200, 0.0, 1.0, clip=True)])
    model, task = _seg_model(), Segmentation(3)
    out = tmp_path / "adv"
    res = evaluate(model, task, data, {"pgd": PGD(task, Linf(0.05, bounds=(0.0, 1.0)), steps=2)},
                   save_adversarial=out, seed=0)
    assert [r["saved_file"] for r in res] == [f"pgd/{i:04d}_vol{i}.nii.gz" for i in range(3)]
    for r in res:
        img = nib.load(out / r["saved_file"])
        assert np.allclose(img.affine, AFFINE) and img.shape == (6, 7, 5)
        assert img.get_data_dtype() == np.dtype(dtype)  # the dtype of the file the case came from
        # re-predict the file ourselves: the row's saved_* columns are what the file does
        x_file = torch.from_numpy(np.asarray(img.dataobj, dtype=np.float32))[None, None]
        with torch.no_grad():
            logits = model(x_file)
        assert r["saved_adv_mean_dice"] == pytest.approx(float(task.mean_dice(task.predict(logits), _label(tmp_path, r))[0]))
        assert r["saved_fooled"] == bool(task.fooled(logits, _label(tmp_path, r))[0])
        assert r["saved_still_fooled"] == (r["fooled"] and r["saved_fooled"])
        if dtype == "float32":  # stored exactly: nothing lost
            assert r["saved_linf"] == pytest.approx(r["linf"]) and r["saved_adv_mean_dice"] == r["adv_mean_dice"]
        else:  # int16 over the box [0, 1]: steps of 1/65535
            assert abs(r["saved_linf"] - r["linf"]) <= 1 / 65535
    text = res.format_summary()
    assert "saved_still_fooled" in text and "quantisation" in text


def _label(tmp_path, row):
    import nibabel as nib

    return torch.from_numpy(np.asarray(nib.load(tmp_path / f"lab{row['sample']}.nii.gz").dataobj)).long()[None]


def _pngs(tmp_path, value=None, label=None):
    from PIL import Image

    g = np.random.default_rng(1)
    items = []
    for i in range(3):
        img = np.full((6, 10), value, np.uint8) if value is not None else g.integers(0, 256, (6, 10), dtype=np.uint8)
        Image.fromarray(img).save(tmp_path / f"img{i}.png")
        items.append({"image": str(tmp_path / f"img{i}.png"), "label": i % 2 if label is None else label, "case_id": f"img{i}.png"})
    return items


def test_png_of_an_unchanged_image_is_the_source_file(tmp_path):
    """8-bit PNGs read by MONAI (width first, scaled to [0, 1]) and not perturbed are written back pixel for
    pixel: same orientation, same 8-bit levels."""
    from monai.transforms import ScaleIntensityRanged
    from PIL import Image

    data = _monai_loader(_pngs(tmp_path), ["image"], [ScaleIntensityRanged("image", 0, 255, 0.0, 1.0)])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(60, 2)).eval()
    task = MultiClass()
    res = evaluate(model, task, data, {"still": _shift(task, Box(0.0, 1.0), 0.0)}, save_adversarial=tmp_path / "adv")
    for i, r in enumerate(res):
        saved = np.asarray(Image.open(tmp_path / "adv" / r["saved_file"]))
        assert saved.dtype == np.uint8 and np.array_equal(saved, np.asarray(Image.open(tmp_path / f"img{i}.png")))
        assert r["saved_linf"] == 0.0 and not r["saved_changed"] and r["saved_adv_correct"] == r["adv_correct"]


class _Threshold(nn.Module):
    """Class 0 when the image mean exceeds ``t`` (logits scaled up so that a 0.001 shift decides)."""

    def __init__(self, t: float) -> None:
        super().__init__()
        self.t = t
        self.scale = nn.Parameter(torch.tensor(1000.0))

    def forward(self, x: Tensor) -> Tensor:
        m = x.mean(dim=(1, 2, 3))
        return torch.stack([(m - self.t) * self.scale, torch.zeros_like(m)], dim=1)


def test_a_perturbation_below_the_8bit_step_does_not_survive_the_png(tmp_path):
    from monai.transforms import ScaleIntensityRanged

    task, box = MultiClass(), Box(0.0, 1.0)
    model = _Threshold(100 / 255 + 0.0005).eval()
    shift = {"shift": _shift(task, box, 0.001)}  # less than half an 8-bit step (0.00196)
    # 8-bit source files: 8-bit PNGs, where 100/255 + 0.001 rounds back to 100
    data = _monai_loader(_pngs(tmp_path, value=100, label=1), ["image"],
                         [ScaleIntensityRanged("image", 0, 255, 0.0, 1.0)])
    eight = evaluate(model, task, data, shift, save_adversarial=tmp_path / "adv8")
    # in memory the attack crosses the threshold: every (correct) prediction flips
    assert all(r["clean_correct"] and r["fooled"] and r["changed"] and r["flipped"] for r in eight)
    assert all(not r["saved_fooled"] and not r["saved_still_fooled"] and not r["saved_changed"] for r in eight)
    assert all(r["saved_linf"] < 1e-6 for r in eight)
    # the same data as tensors of unknown origin: 16-bit PNGs, fine enough to keep the shift
    x = torch.full((3, 1, 10, 6), 100 / 255)
    sixteen = evaluate(model, task, (x, torch.ones(3, dtype=torch.long)), shift, save_adversarial=tmp_path / "adv16")
    from PIL import Image

    assert Image.open(tmp_path / "adv16" / sixteen.rows[0]["saved_file"]).mode.startswith("I;16")
    assert all(r["fooled"] and r["saved_fooled"] and r["saved_still_fooled"] for r in sixteen)
    assert all(abs(r["saved_linf"] - 0.001) < 1e-5 for r in sixteen)
    summary = {s["attack"]: s for s in eight.summary()}
    assert summary["shift"]["saved_still_fooled"] == 0.0 and summary["shift"]["fooled"] == 1.0


def test_unbounded_or_multichannel_data_go_to_npy_exactly(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(2 * 4 * 4, 3)).eval()
    task = MultiClass()
    x, y = torch.rand(2, 2, 4, 4), torch.tensor([0, 1])
    res = evaluate(model, task, (x, y), {"pgd": PGD(task, Linf(0.1, bounds=(0.0, 1.0)), steps=2)},
                   save_adversarial=tmp_path)
    for r in res:
        assert r["saved_file"] == f"pgd/{r['sample']:04d}.npy" and r["case_id"] == str(r["sample"])
        arr = np.load(tmp_path / r["saved_file"])
        assert arr.dtype == np.float32 and arr.shape == (2, 4, 4)
        assert r["saved_linf"] == pytest.approx(r["linf"]) and r["saved_fooled"] == r["fooled"]


def test_save_helpers(tmp_path):
    assert case_stem("sub-01/anat/sub-01_T1w.nii.gz") == "sub-01_T1w" and case_stem("a b?.png") == "a_b"
    assert original_dtype({"datatype": torch.tensor([4, 2])}, 1) == np.uint8
    assert original_dtype({"datatype": torch.tensor([4, 2])}, 0) == np.int16
    assert original_dtype({"mode": ["L", "I;16"]}, 1) == np.uint16
    assert original_dtype({"00280100": [{"vr": "US", "Value": [16]}], "00280103": [{"Value": [1]}]}) == np.int16
    assert original_dtype({"0028|0100": ["8"]}) == np.uint8 and original_dtype({}) is None
    x = torch.rand(1, 5, 4)
    p = save_example(x, tmp_path / "a", box=Box(0.0, 1.0), dtype=np.dtype(np.uint8), width_first=True)
    assert p.suffix == ".png"
    assert torch.allclose(load_example(p, box=Box(0.0, 1.0), like=x, width_first=True), x, atol=0.5 / 255 + 1e-6)
    with pytest.raises(ValueError, match="expected"):
        load_example(p, box=Box(0.0, 1.0), like=torch.rand(1, 4, 5), width_first=True)


# --- DICOM: real CT data from pydicom-data, a file (2-D) or a series folder (3-D) ------------------------------------------
_NEW = {"SOPInstanceUID", "SeriesInstanceUID", "SeriesDescription", "PixelData"}  # what the adversarial copy changes
ROWS = 100  # CT_small cropped to 100 x 128: a transposed read-back cannot have the right shape or values


def _ct(raw_shift=0):
    """CT_small.dcm (int16, RescaleIntercept -1024), cropped to ROWS rows, stored values shifted by ``raw_shift``."""
    import pydicom
    from pydicom.data import get_testdata_file

    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    px = ds.pixel_array[:ROWS].astype(np.int16) + np.int16(raw_shift)
    ds.Rows, ds.PixelData = ROWS, px.tobytes()
    return ds


def _dicom_2d(tmp_path):
    items = []
    for i in range(2):
        ds = _ct(raw_shift=37 * i)
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = f"1.2.3.4.{i}"
        ds.save_as(tmp_path / f"ct{i}.dcm")
        items.append({"image": str(tmp_path / f"ct{i}.dcm"), "label": i, "case_id": f"ct{i}.dcm"})
    return items


def _dicom_series(tmp_path):
    """Two 3-slice series (slices 5 mm apart along z, files named against the InstanceNumber order)."""
    items = []
    for s in range(2):
        folder = tmp_path / f"series{s}"
        folder.mkdir()
        for k in range(3):
            ds = _ct(raw_shift=50 * k + 11 * s)
            pos = [float(v) for v in ds.ImagePositionPatient]
            ds.ImagePositionPatient = [pos[0], pos[1], pos[2] + 5.0 * k]
            ds.InstanceNumber, ds.SeriesInstanceUID = k + 1, f"1.2.3.9.{s}"
            ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = f"1.2.3.9.{s}.{k}"
            ds.save_as(folder / f"im{2 - k}.dcm")
        items.append({"image": str(folder), "label": s, "case_id": f"series{s}"})
    return items


class _Mean(nn.Module):
    """Two classes from the HU-scaled mean of a linear map: any image size, any dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1e-3, -1e-3]))

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(1).mean(dim=1, keepdim=True) * self.w


def _headers_match(saved, source, also_new=()):
    new = _NEW | set(also_new)
    src = {e.keyword: e.value for e in source if e.keyword and e.keyword not in new}
    out = {e.keyword: e.value for e in saved if e.keyword and e.keyword not in new}
    assert out == src  # patient, study, geometry, pixel format: all as in the source
    assert saved.SOPInstanceUID != source.SOPInstanceUID and saved.SeriesInstanceUID != source.SeriesInstanceUID
    assert saved.file_meta.MediaStorageSOPInstanceUID == saved.SOPInstanceUID
    assert "adversarial" in saved.SeriesDescription


def _decoded(ds):
    return ds.pixel_array.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)


def _repredict(model, task, path, y):
    from monai.transforms import LoadImage

    x = LoadImage(reader="PydicomReader", image_only=True)(str(path))
    with torch.no_grad():
        logits = model(torch.as_tensor(np.asarray(x), dtype=torch.float32)[None, None])
    return bool(task.fooled(logits, torch.tensor([y]))[0]), float(task.predict(logits)[0] == y)


def test_dicom_file_keeps_the_source_header_and_geometry(tmp_path):
    import pydicom

    items = _dicom_2d(tmp_path)
    data = _monai_loader(items, ["image"], [])
    model, task, box = _Mean().eval(), MultiClass(), Box(-1024.0, 3071.0)
    attacks = {"shift": _shift(task, box, 7.3), "pgd": PGD(task, Linf(30.0, bounds=(-1024.0, 3071.0)), steps=2)}
    res = evaluate(model, task, data, attacks, save_adversarial=tmp_path / "adv", seed=0)
    assert sorted(r["saved_file"] for r in res) == sorted(f"{a}/{i:04d}_ct{i}.dcm" for a in attacks for i in range(2))
    for r in res:
        i = r["sample"]
        saved, source = pydicom.dcmread(tmp_path / "adv" / r["saved_file"]), pydicom.dcmread(items[i]["image"])
        _headers_match(saved, source)
        assert saved.pixel_array.dtype == np.int16 and saved.pixel_array.shape == (ROWS, 128)
        if r["attack"] == "shift":  # the adversarial example is source + 7.3 HU: stored as source + 7 (slope 1)
            assert np.abs(_decoded(saved) - (_decoded(source) + 7.3)).max() <= 0.5
            assert r["saved_linf"] == pytest.approx(7.0) and r["linf"] == pytest.approx(7.3, abs=1e-3)
        else:
            assert np.abs(_decoded(saved) - _decoded(source)).max() <= 30.5
            assert abs(r["saved_linf"] - r["linf"]) <= 0.5
        # the saved_* columns are what the file does when read back as the input was
        fooled, correct = _repredict(model, task, tmp_path / "adv" / r["saved_file"], items[i]["label"])
        assert r["saved_fooled"] == fooled and r["saved_adv_correct"] == correct
        assert r["saved_still_fooled"] == (r["fooled"] and fooled)


def test_dicom_of_intensity_scaled_data_gets_its_own_rescale(tmp_path):
    """Data no longer in the source's units (here scaled to [0, 1]) are stored with a new RescaleSlope /
    RescaleIntercept mapping the box onto int16: what a viewer shows is what the model saw."""
    import pydicom
    from monai.transforms import ScaleIntensityRanged

    items = _dicom_2d(tmp_path)
    data = _monai_loader(items, ["image"], [ScaleIntensityRanged("image", -1024, 3071, 0.0, 1.0)])
    task = MultiClass()
    res = evaluate(_Mean().eval(), task, data, {"shift": _shift(task, Box(0.0, 1.0), 0.01)},
                   save_adversarial=tmp_path / "adv")
    for r in res:
        saved, source = pydicom.dcmread(tmp_path / "adv" / r["saved_file"]), pydicom.dcmread(items[r["sample"]]["image"])
        _headers_match(saved, source, also_new={"RescaleSlope", "RescaleIntercept"})
        step = float(saved.RescaleSlope)
        assert step == pytest.approx(1 / 65535, rel=1e-6)
        expected = (_decoded(source) + 1024) / 4095 + 0.01
        assert np.abs(_decoded(saved) - expected).max() <= step / 2 + 1e-6
        assert r["saved_linf"] <= r["linf"] + step and r["saved_still_fooled"] == r["fooled"]


def test_dicom_series_one_file_per_slice_at_the_source_positions(tmp_path):
    import pydicom

    items = _dicom_series(tmp_path)
    data = _monai_loader(items, ["image"], [])
    model, task, box = _Mean().eval(), MultiClass(), Box(-1024.0, 3071.0)
    res = evaluate(model, task, data, {"shift": _shift(task, box, -12.6)}, save_adversarial=tmp_path / "adv")
    assert [r["saved_file"] for r in res] == ["shift/0000_series0", "shift/0001_series1"]
    for r in res:
        folder = tmp_path / "adv" / r["saved_file"]
        saved = [pydicom.dcmread(p) for p in sorted(folder.iterdir())]
        source = sorted((pydicom.dcmread(p) for p in (tmp_path / f"series{r['sample']}").iterdir()),
                        key=lambda d: d.InstanceNumber)
        assert len(saved) == 3 and len({d.SeriesInstanceUID for d in saved}) == 1
        for out, src in zip(sorted(saved, key=lambda d: d.InstanceNumber), source, strict=True):
            _headers_match(out, src)  # ImagePositionPatient included: each slice where its source was
            assert np.abs(_decoded(out) - (_decoded(src) - 12.6)).max() <= 0.5
        assert r["saved_linf"] == pytest.approx(13.0) and r["linf"] == pytest.approx(12.6, abs=1e-3)  # -12.6 stored as -13
        fooled, correct = _repredict(model, task, folder, items[r["sample"]]["label"])
        assert r["saved_fooled"] == fooled and r["saved_adv_correct"] == correct


def test_dicom_helpers(tmp_path):
    from medadv.data.save import dicom_source

    items = _dicom_2d(tmp_path)
    assert dicom_source({"filename_or_obj": [items[0]["image"], items[1]["image"]]}, 1) == items[1]["image"]
    (tmp_path / "x.txt").write_text("not dicom")
    assert dicom_source({"filename_or_obj": [str(tmp_path / "x.txt")]}) is None and dicom_source(None) is None
    # a sample that is not on the source's grid (resampled: another shape) falls back to NIfTI / PNG
    x = torch.zeros(1, 64, 50)
    p = save_example(x, tmp_path / "r", box=Box(-1024.0, 3071.0), affine=np.eye(4), source=items[0]["image"])
    assert p.suffix == ".png"


def test_a_symlink_leading_outside_the_output_folder_is_refused(tmp_path):
    """A sub-folder (or file) of the output folder that is a symlink to somewhere else is not written through."""
    root, outside = tmp_path / "out", tmp_path / "elsewhere"
    (root / "adversarial").mkdir(parents=True)
    outside.mkdir()
    (root / "adversarial" / "pgd").symlink_to(outside, target_is_directory=True)
    x = torch.rand(1, 4, 4, 4)
    with pytest.raises(PermissionError, match=r"is a symbolic link to .*elsewhere, outside the output folder"):
        save_example(x, root / "adversarial" / "pgd" / "0000_case", box=Box(0.0, 1.0), root=root)
    (root / "adversarial" / "fgsm").mkdir()
    (root / "adversarial" / "fgsm" / "0000_case.nii.gz").symlink_to(outside / "victim.nii.gz")
    with pytest.raises(PermissionError, match=r"outside the output folder"):
        save_example(x, root / "adversarial" / "fgsm" / "0000_case", box=Box(0.0, 1.0), root=root)
    assert list(outside.iterdir()) == []
    # links that stay inside, and an output folder that is itself a link, are fine
    (root / "adversarial" / "inside").symlink_to(root / "adversarial" / "fgsm", target_is_directory=True)
    (tmp_path / "link").symlink_to(root, target_is_directory=True)
    saved = save_example(x, tmp_path / "link" / "adversarial" / "inside" / "0001", box=Box(0.0, 1.0),
                         root=tmp_path / "link")
    assert saved.is_file() and (root / "adversarial" / "fgsm" / "0001.nii.gz").is_file()
