"""evaluate(save_adversarial=...): adversarial examples as NIfTI (input affine, original dtype), PNG (8/16-bit, the
source file's orientation) or .npy, each read back and re-predicted (does the attack survive the quantisation?)."""

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
