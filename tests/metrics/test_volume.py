"""Clinical endpoints: per-class volumes in ml (medadv.metrics.volume), their result columns and report sections."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from medadv import evaluate
from medadv.attacks import PGD
from medadv.evaluation import sample_rows
from medadv.metrics.volume import class_volumes, soft_volumes, volume_change, voxel_volume_ml
from medadv.results import Results
from medadv.tasks import Segmentation
from medadv.threats import Linf


def _mask() -> torch.Tensor:
    """Two cases of a 3-class 6x7x8 map: case 0 has a 2x3x4 box of class 1 and 5 voxels of class 2; case 1 a
    1x1x3 bar of class 1 and no class 2."""
    y = torch.zeros(2, 6, 7, 8, dtype=torch.long)
    y[0, 1:3, 2:5, 0:4] = 1
    y[0, 5, 0, 0:5] = 2
    y[1, 0, 0, 0:3] = 1
    return y


def test_volumes_equal_a_hand_count_times_the_voxel_volume():
    y = _mask()
    vol = class_volumes(y, 3, (2.0, 2.0, 3.0))  # 12 mm^3 = 0.012 ml per voxel
    assert vol.dtype == torch.float64 and vol.shape == (2, 3)
    assert vol[0].tolist() == pytest.approx([(336 - 24 - 5) * 0.012, 24 * 0.012, 5 * 0.012])
    assert vol[1].tolist() == pytest.approx([(336 - 3) * 0.012, 3 * 0.012, 0.0])
    # one spacing row per case (read from each header); a scalar is isotropic
    per_case = class_volumes(y, 3, [[2.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    assert per_case[1, 1].item() == pytest.approx(0.003) and per_case[0, 1].item() == pytest.approx(0.288)
    assert class_volumes(y, 3, 0.5)[0, 1].item() == pytest.approx(24 * 0.125 / 1000)
    assert voxel_volume_ml((2.0, 2.0, 3.0), 2).tolist() == pytest.approx([0.012, 0.012])
    # a mask (ignore_index voxels) leaves voxels out of the count
    mask = torch.ones_like(y, dtype=torch.bool)
    mask[0, 1, 2, 0:4] = False  # 4 voxels of the class-1 box
    assert class_volumes(y, 3, 1.0, mask)[0, 1].item() == pytest.approx(20 / 1000)


def test_change_in_ml_and_percent():
    clean = torch.tensor([[100.0, 50.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[90.0, 60.0, 2.0]], dtype=torch.float64)
    ml, pct = volume_change(clean, adv)
    assert ml.tolist() == [[-10.0, 10.0, 2.0]]
    assert pct[0, :2].tolist() == pytest.approx([-10.0, 20.0]) and math.isnan(pct[0, 2].item())  # none clean: no %


def test_soft_volume_is_the_hard_count_on_one_hot_probabilities_and_differentiable():
    y = _mask()
    onehot = torch.nn.functional.one_hot(y, 3).movedim(-1, 1).double()
    assert torch.allclose(soft_volumes(onehot, 0.012), class_volumes(y, 3, (2.0, 2.0, 3.0)))
    logits = torch.randn(2, 3, 6, 7, 8, requires_grad=True)
    v = Segmentation(3).soft_volume(logits, torch.tensor([0.012, 0.001]))
    assert v.shape == (2, 3) and torch.allclose(v.sum(dim=1), torch.tensor([336 * 0.012, 336 * 0.001]))
    (g,) = torch.autograd.grad(v[:, 1].sum(), logits)
    assert g.abs().sum() > 0  # every voxel's probability moves the volume (the arg-max count has no gradient)


def test_bad_input_is_refused_with_one_line():
    y = _mask()
    with pytest.raises(ValueError, match="`spacing`"):
        class_volumes(y, 3, (1.0, 1.0))
    with pytest.raises(ValueError, match="`spacing`"):
        class_volumes(y, 3, (1.0, -1.0, 1.0))
    with pytest.raises(TypeError, match="`labels`.*integer"):
        class_volumes(y.float(), 3, 1.0)
    with pytest.raises(ValueError, match="3-D label map"):
        class_volumes(y[:, 0], 3, 1.0)
    with pytest.raises(ValueError, match=r"class indices in \[0, 1\]"):
        class_volumes(y, 2, 1.0)
    with pytest.raises(ValueError, match="`clean`.*`adv`"):
        volume_change(torch.zeros(2, 3), torch.zeros(2, 2))


def test_task_columns_only_with_a_spacing_and_in_3d():
    task = Segmentation(3, ignore_index=255)
    y = _mask()
    y[0, 1, 2, 0] = 255  # not a reference voxel
    logits = torch.nn.functional.one_hot(_mask(), 3).movedim(-1, 1).float() * 5
    adv_logits = logits.clone()
    adv_logits[0, 1, 1:3, 2:5, 0:2] = -5  # case 0 loses 12 voxels of class 1 to the background
    adv_logits[0, 0, 1:3, 2:5, 0:2] = 5
    rows = sample_rows(task, y, logits, adv_logits, spacing=(2.0, 2.0, 3.0))
    r = rows[0]
    assert r["ref_volume_ml"][1] == pytest.approx(23 * 0.012)  # the ignored voxel is not counted
    assert r["clean_volume_ml"][1] == pytest.approx(24 * 0.012) and r["adv_volume_ml"][1] == pytest.approx(12 * 0.012)
    assert r["volume_change_ml"][1] == pytest.approx(-12 * 0.012) and r["volume_change_pct"][1] == pytest.approx(-50.0)
    assert rows[1]["volume_change_pct"][2] is None  # class 2 absent from case 1's clean prediction: no %
    assert "clean_volume_ml" not in sample_rows(task, y, logits, adv_logits)[0]  # no spacing: no volumes in ml
    y2, l2 = _mask()[:, 0], logits[:, :, 0]
    assert "clean_volume_ml" not in sample_rows(task, y2, l2, l2, spacing=(1.0, 1.0))[0]  # 2-D: an area, not ml


def _nifti_loader(tmp_path, spacings):
    import nibabel as nib
    import numpy as np
    from monai.data import DataLoader, Dataset
    from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged

    items = []
    for i, sp in enumerate(spacings):
        aff = np.diag([*sp, 1.0])
        lab = np.zeros((8, 8, 8), np.uint8)
        lab[1:5, 3:7, 2:6] = 1  # 64 voxels
        lab[5:7, 1:3, 1:7] = 2  # 24 voxels
        img = lab.astype(np.float32) / 2
        nib.save(nib.Nifti1Image(img, aff), tmp_path / f"c{i}.nii.gz")
        nib.save(nib.Nifti1Image(lab, aff), tmp_path / f"l{i}.nii.gz")
        items.append({"img": str(tmp_path / f"c{i}.nii.gz"), "seg": str(tmp_path / f"l{i}.nii.gz"), "case_id": f"c{i}"})
    keys = ["img", "seg"]
    return DataLoader(Dataset(items, Compose([LoadImaged(keys), EnsureChannelFirstd(keys)])), batch_size=2)


class _Threshold(nn.Module):
    """A segmenter that reads the class from the grey level (0, 0.5, 1): right on the clean images, differentiable,
    and a perturbation above 0.25 moves a voxel to the next class."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(8.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centres = torch.tensor([0.0, 0.5, 1.0], device=x.device).reshape(1, 3, 1, 1, 1)
        return -self.scale * (x - centres) ** 2 * 10


def test_evaluate_rows_carry_volumes_in_millimetres_of_each_header(tmp_path):
    loader = _nifti_loader(tmp_path, [(2.0, 2.0, 3.0), (1.0, 1.0, 1.0)])
    task = Segmentation(3)
    pgd = {"pgd": PGD(task, Linf(0.3, bounds=(0.0, 1.0)), steps=5, loss="volume", volume_class=1)}
    res = evaluate(_Threshold(), task, loader, pgd, image_key="img", label_key="seg", seed=0)
    r0, r1 = res.rows
    assert r0["ref_volume_ml"][1:] == pytest.approx([64 * 0.012, 24 * 0.012])  # 2 x 2 x 3 mm from the affine
    assert r1["ref_volume_ml"][1:] == pytest.approx([64 * 0.001, 24 * 0.001])  # 1 mm
    assert r0["clean_volume_ml"][1:] == pytest.approx(r0["ref_volume_ml"][1:])  # the model is right when clean
    for r, voxel in ((r0, 0.012), (r1, 0.001)):
        assert r["adv_volume_ml"][1] < r["clean_volume_ml"][1]  # the volume attack shrank class 1
        assert r["volume_change_ml"][1] == pytest.approx(r["adv_volume_ml"][1] - r["clean_volume_ml"][1])
        assert r["volume_change_pct"][1] == pytest.approx(100 * r["volume_change_ml"][1] / r["clean_volume_ml"][1])
        assert (r["adv_volume_ml"][1] / voxel) == pytest.approx(round(r["adv_volume_ml"][1] / voxel))  # whole voxels
    summary = res.summary()[0]
    assert summary["volume_change_pct"][1] == pytest.approx((r0["volume_change_pct"][1] + r1["volume_change_pct"][1]) / 2)
    assert "volume_change_pct" in res.format_summary()  # the printed summary shows the change per attack and budget
    fixed = evaluate(_Threshold(), task, loader, pgd, spacing=1.0, image_key="img", label_key="seg", seed=0)
    assert fixed.rows[0]["ref_volume_ml"][1] == pytest.approx(0.064)  # an explicit spacing wins over the headers


def test_report_sections_show_the_volume_change(tmp_path):
    from medadv.report.html import volume_rows, write_html_report
    from medadv.report.markdown import write_report

    loader = _nifti_loader(tmp_path, [(2.0, 2.0, 3.0), (1.0, 1.0, 1.0)])
    task = Segmentation(3)
    attacks = {f"pgd@{e}": PGD(task, Linf(e, bounds=(0.0, 1.0)), steps=3, loss="volume") for e in (0.1, 0.3)}
    res = evaluate(_Threshold(), task, loader, attacks, image_key="img", label_key="seg", seed=0,
                   meta={"classes": ["bg", "brain", "<b>csf</b>"]})
    rows = volume_rows(res, ["bg", "brain", "<b>csf</b>"])
    assert [(r["attack"], r["class"]) for r in rows] == [("pgd@0.1", "brain"), ("pgd@0.1", "<b>csf</b>"),
                                                         ("pgd@0.3", "brain"), ("pgd@0.3", "<b>csf</b>")]
    big = next(r for r in rows if r["attack"] == "pgd@0.3" and r["class"] == "brain")
    assert big["change (%)"] == pytest.approx(sum(r["volume_change_pct"][1] for r in res.rows if r["attack"] == "pgd@0.3") / 2)
    assert big["change (%)"] < 0
    html = write_html_report(res, tmp_path / "out", class_names=["bg", "brain", "<b>csf</b>"]).read_text()
    assert "Volumes (clinical endpoint)" in html and "volume change (%) vs budget" in html
    assert "<b>csf</b>" not in html and "&lt;b&gt;csf&lt;/b&gt;" in html  # user strings escaped
    plain = Results([{k: v for k, v in r.items() if "volume" not in k} for r in res.rows], res.meta)
    assert volume_rows(plain) == [] and "## Volumes" not in write_report(plain, tmp_path / "plain").read_text()
    md = write_report(res, tmp_path / "md").read_text()
    assert "## Volumes" in md and "change (%)" in md and f"{big['change (%)']:.4g}" in md


def test_volume_columns_and_soft_volume_do_not_sync_with_the_host(forbid_host_sync):
    task = Segmentation(3, ignore_index=255)
    y = _mask()
    logits = torch.randn(2, 3, 6, 7, 8)
    clean, adv = task.outcome(logits, y), task.outcome(-logits, y)
    monkeypatch = forbid_host_sync()
    cols = task.volume_columns(y, clean, adv, [[2.0, 2.0, 3.0], [1.0, 1.0, 1.0]])  # header spacings: host lists
    soft = task.soft_volume(logits, 0.012)
    monkeypatch.undo()
    assert set(cols) == {"ref_volume_ml", "clean_volume_ml", "adv_volume_ml", "volume_change_ml", "volume_change_pct"}
    assert all(v.shape == (2, 3) for v in cols.values()) and soft.shape == (2, 3)
    assert torch.allclose(cols["ref_volume_ml"], class_volumes(y, 3, [[2.0, 2.0, 3.0], [1.0, 1.0, 1.0]]))


@pytest.mark.parametrize("spacing", [-1.0, (1.0, 0.0, 2.0), "2mm", (1.0, 1.0), [[1.0, 1.0, 1.0]]])
def test_a_bad_spacing_is_refused_before_any_attack(spacing):
    calls = []

    class Counting(_Threshold):
        def forward(self, x):
            calls.append(1)
            return super().forward(x)

    task = Segmentation(3)
    x, y = torch.zeros(2, 1, 4, 4, 4), torch.zeros(2, 4, 4, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="`spacing`"):
        evaluate(Counting(), task, (x, y), {"pgd": PGD(task, Linf(0.1, bounds=(0.0, 1.0)), steps=1)}, spacing=spacing)
    assert calls == []
