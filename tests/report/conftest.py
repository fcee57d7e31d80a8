"""Fixtures of the report tests: a real evaluation of the small 3-D UNet, real cases, and one study of each
kind built by hand following the row conventions of :mod:`medadv.studies` (so these tests do not depend on
how the studies compute their numbers)."""

from __future__ import annotations

import pytest

from medadv.attacks import FGSM, PGD
from medadv.evaluation import evaluate
from medadv.report.cases import select_cases
from medadv.report.html import write_html_report
from medadv.studies.base import StudyResult
from medadv.threats import Linf

SEG_NAMES = ["background", "organ A", "organ B"]
CLASSES = ["cat", "dog", "bird", "deer"]
CONFUSION_CLEAN = [[7, 1, 0, 0], [0, 8, 0, 0], [1, 0, 6, 1], [0, 0, 1, 7]]
CONFUSION_PGD = [[2, 5, 1, 0], [3, 3, 2, 0], [4, 1, 2, 1], [5, 0, 1, 2]]


def _box(x):
    return float(x.min()), float(x.max())


def make_studies() -> list[StudyResult]:
    classwise = StudyResult("classwise", [
        {"attack": "pgd", "budget": 8 / 255, "class": c, "support": 8, "clean": [0.875, 1.0, 0.75, 0.875][j],
         "adv": [0.25, 0.375, 0.25, 0.25][j], "cfps_clean": [0.25, 0.25, 0.25, 0.25][j],
         "cfps_adv": [0.5, 0.25, 0.167, 0.083][j]} for j, c in enumerate(CLASSES)],
        {"confusion": {"clean": CONFUSION_CLEAN, "pgd@0.0314": CONFUSION_PGD}, "classes": CLASSES,
         "attractors": {"pgd@0.0314": ["cat", "dog", "bird", "deer"]}, "metric": "recall"})
    transfer = StudyResult("transfer", [
        {"attack": "pgd", "budget": 8 / 255, "surrogate": s, "target": t, "clean": 0.9,
         "adv": 0.1 if s == t else 0.5 + 0.1 * i - 0.05 * k, "fooling_rate": 0.9 if s == t else 0.3 + 0.1 * k}
        for i, s in enumerate(("cnn", "resnet", "unet")) for k, t in enumerate(("cnn", "resnet", "unet"))],
        {"metric": "accuracy"})
    corruptions = StudyResult("corruptions", [
        {"corruption": c, "severity": s, "metric_clean": 0.9, "metric": 0.9 - 0.08 * s * (1 + i / 5),
         "flip_probability": 0.04 * s * (1 + i / 5)}
        for i, c in enumerate(("gaussian_noise", "bias_field", "gibbs", "blur", "contrast", "elastic"))
        for s in range(1, 6)], {"metric": "mean_dice"})
    noise = StudyResult("noise_baseline", [
        {"attack": "pgd", "budget": b, "adv_metric": a, "noise_metric": 0.88, "ssim_adv": 0.9, "ssim_noise": 0.9}
        for b, a in ((2 / 255, 0.7), (8 / 255, 0.3))], {"metric": "accuracy"})
    frequency = StudyResult("frequency", [
        {"attack": "pgd", "budget": 8 / 255, "band": band, "value": v}
        for band, v in (("full", 0.1), ("low", 0.3), ("high", 0.7))], {"metric": "accuracy"})
    models = StudyResult("models", [
        {"model": m, "clean": c, "attack": "pgd", "budget": 8 / 255, "adv": a}
        for m, c, a in (("cnn", 0.9, 0.1), ("resnet", 0.95, 0.05), ("vit", 0.85, 0.2))], {"metric": "accuracy"})
    pts = [[(i % 3) + 0.1 * (i % 5), 0.2 * ((i * 7) % 5) - 0.4] for i in range(30)]
    correlation = StudyResult("correlation", [], {
        "embedding": {"clean": pts, "adv": [[p[0] + 1.0, p[1] + 0.5] for p in pts], "labels": [i % 3 for i in range(30)]},
        "cooccurrence": {"clean": [[10, 2, 1], [2, 8, 0], [1, 0, 5]], "adv": [[4, 5, 3], [5, 9, 2], [3, 2, 6]],
                         "labels": ["effusion", "edema", "nodule"]}})
    return [classwise, transfer, corruptions, noise, frequency, models, correlation]


@pytest.fixture(scope="session")
def seg3d_results(trained_seg3d):
    """A real evaluation: FGSM and PGD at two budgets on the small 3-D UNet, attacks named like the config
    names them (``label@budget``)."""
    t = trained_seg3d
    attacks = {}
    for eps in (4 / 255, 16 / 255):
        attacks[f"fgsm@{eps:.6g}"] = FGSM(t.task, Linf(eps, bounds=_box(t.x)))
        attacks[f"pgd@{eps:.6g}"] = PGD(t.task, Linf(eps, bounds=_box(t.x)), steps=3)
    return evaluate(t.model, t.task, (t.x, t.y), attacks, meta={"model": "small UNet 3-D", "classes": SEG_NAMES})


@pytest.fixture(scope="session")
def full_report(tmp_path_factory, seg3d_results, trained_seg3d, trained_multiclass):
    """report.html with every kind of section: evaluation, the seven studies, a 3-D and a 2-D case."""
    s3, mc = trained_seg3d, trained_multiclass
    cases = select_cases(s3.model, s3.task, s3.x, s3.y, PGD(s3.task, Linf(16 / 255, bounds=_box(s3.x)), steps=3),
                         k=1, class_names=SEG_NAMES)
    cases += select_cases(mc.model, mc.task, mc.x, mc.y, PGD(mc.task, Linf(0.1, bounds=(0.0, 1.0)), steps=3), k=1)
    out = tmp_path_factory.mktemp("report")
    return write_html_report(seg3d_results, out, studies=make_studies(), cases=cases, title="medadv test report")


@pytest.fixture
def studies() -> list[StudyResult]:
    return make_studies()


@pytest.fixture(scope="session")
def cli_report(tmp_path_factory, trained_seg3d):
    """``medadv evaluate`` on NIfTI files (2 mm voxels, RAS) of the small 3-D UNet's held-out volumes, with HD95
    and class names: the report every evaluate run writes. Returns the output folder."""
    import nibabel as nib
    import numpy as np
    import yaml

    from medadv.cli import main
    from medadv.models import save_checkpoint

    t = trained_seg3d
    work = tmp_path_factory.mktemp("cli_report")
    for sub in ("images", "labels"):
        (work / sub).mkdir()
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    for i in range(t.x.shape[0]):
        nib.save(nib.Nifti1Image(t.x[i, 0].numpy().astype(np.float32), affine), work / "images" / f"sub{i}.nii.gz")
        nib.save(nib.Nifti1Image(t.y[i].numpy().astype(np.uint8), affine), work / "labels" / f"sub{i}.nii.gz")
    save_checkpoint(work / "unet.pt", t.model)
    lo, hi = _box(t.x)
    cfg = {"model": {"builder": "small_unet", "kwargs": {"in_channels": 1, "num_classes": 3, "ndim": 3,
                                                         "channels": [8, 16]}, "checkpoint": "unet.pt"},
           "task": {"type": "segmentation", "num_classes": 3, "class_names": SEG_NAMES},
           "data": {"source": "files", "images": "images/*.nii.gz", "labels": "labels/*.nii.gz"},
           "threat": {"norm": "linf", "bounds": [lo, hi]}, "budgets": ["4/255", "16/255"],
           "attacks": ["fgsm", {"name": "pgd", "steps": 3}], "batch_size": 2, "hd95": True, "seed": 3,
           "output": "out"}
    (work / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(work / "cfg.yaml"), "--no-progress"]) == 0
    return work / "out"
