"""Write the example data and models (offline, from the MNI152 template inside the nilearn wheel).

    python examples/prepare.py            # once, before the examples (a few minutes on 2 CPU cores)
    medadv evaluate examples/seg3d_nifti.yaml
    medadv evaluate examples/multilabel_png.yaml
    medadv evaluate examples/whole_volume.yaml

Writes, under ``examples/data/`` (skipping what is already there):

* ``seg3d/images/*.nii.gz`` + ``seg3d/labels/*.nii.gz``: 48^3 crops (2 mm voxels, 8-bit intensities, their
  world affine) of the right hemisphere of the MNI ICBM152 2009a T1 template, with its tissue labels
  (0 background, 1 grey matter, 2 white matter, 3 other brain; :mod:`medadv.data.mni152`);
* ``whole/mni152_2mm.nii.gz`` + label and ``whole/dataset.json`` (a MONAI/Decathlon datalist): the whole
  template at 2 mm, 99 x 117 x 95 voxels, for sliding-window inference;
* ``png/*.png`` + ``png/labels.csv``: 32 x 32 axial brain patches with 5 tissue x hemisphere labels
  (:func:`medadv.data.brain_patches.brain_patches`, the nilearn source), held-out slices;
* ``unet3d.pt``: the demo's small MONAI UNet (trained on 32^3 crops of the left hemisphere; shared with
  ``medadv demo --unet`` through its cache) and ``cnn2d.pt``: a small CNN trained on the training slices.

The models are trained here because no pretrained medical weights can be had offline.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
#: the example configs' models (the configs name the same architectures)
UNET_CHANNELS = (8, 16, 32)
CNN_WIDTH = 16
PNG_LABELS = 5


def _affine_2mm(spacing_mm: int) -> np.ndarray:
    """World affine of :func:`medadv.data.mni152.load_tissue_map` at ``spacing_mm``: voxel i pools the 1 mm
    voxels ``s*i .. s*i + s - 1`` of the template."""
    import nibabel as nib

    from medadv.data.mni152 import mni152_files

    a1 = np.asarray(nib.load(str(mni152_files()["t1"])).affine)  # type: ignore[attr-defined]
    s = float(spacing_mm)
    pool = np.array([[s, 0, 0, (s - 1) / 2], [0, s, 0, (s - 1) / 2], [0, 0, s, (s - 1) / 2], [0, 0, 0, 1]])
    return a1 @ pool


def _save(array: np.ndarray, affine: np.ndarray, path: Path) -> None:
    import nibabel as nib

    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(array, affine), str(path))


def _uint8(t: torch.Tensor) -> np.ndarray:
    return (t.clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def write_seg3d(folder: Path, n: int = 6, size: int = 48, spacing_mm: int = 2) -> None:
    """``n`` crops of the right hemisphere (held out from the UNet's training), 8-bit, with their affine."""
    from medadv.data.mni152 import load_tissue_map

    if (folder / "labels").is_dir() and len(list((folder / "labels").glob("*.nii.gz"))) >= n:
        return
    vol, lab = load_tissue_map(spacing_mm)
    affine = _affine_2mm(spacing_mm)
    d, h, w = vol.shape
    starts_x = np.linspace(d // 2, d - size, n).round().astype(int)  # right hemisphere: x >= midline
    for i, sx in enumerate(starts_x):
        sy = int(np.clip((h - size) // 2 + (i % 3 - 1) * size // 3, 0, h - size))
        sz = int(np.clip((w - size) // 2 + (i % 2) * size // 4, 0, w - size))
        sl = (slice(int(sx), int(sx) + size), slice(sy, sy + size), slice(sz, sz + size))
        crop_affine = affine.copy()
        crop_affine[:3, 3] = affine[:3, :3] @ np.array([sx, sy, sz]) + affine[:3, 3]
        name = f"mni152_right_{i:02d}.nii.gz"
        _save(_uint8(vol[sl]), crop_affine, folder / "images" / name)
        _save(lab[sl].numpy().astype(np.uint8), crop_affine, folder / "labels" / name)


def write_whole(folder: Path, spacing_mm: int = 2) -> None:
    """The whole template and its labels, and a Decathlon datalist naming them."""
    from medadv.data.mni152 import load_tissue_map

    if (folder / "dataset.json").is_file():
        return
    vol, lab = load_tissue_map(spacing_mm)
    affine = _affine_2mm(spacing_mm)
    name = f"mni152_{spacing_mm}mm"
    _save(_uint8(vol), affine, folder / "images" / f"{name}.nii.gz")
    _save(lab.numpy().astype(np.uint8), affine, folder / "labels" / f"{name}.nii.gz")
    datalist = {"name": "MNI152 tissue", "labels": {"0": "background", "1": "grey matter", "2": "white matter",
                                                    "3": "other brain"},
                "validation": [{"image": f"images/{name}.nii.gz", "label": f"labels/{name}.nii.gz", "id": name}]}
    (folder / "dataset.json").write_text(json.dumps(datalist, indent=1))


def write_png(folder: Path, n: int | None = None) -> None:
    """Held-out brain patches as 8-bit PNGs and a CSV with one 0/1 column per label."""
    from PIL import Image

    from medadv.data.brain_patches import brain_patches

    if (folder / "labels.csv").is_file():
        return
    test = brain_patches(source="nilearn", split="test")
    count = len(test) if n is None else min(n, len(test))
    folder.mkdir(parents=True, exist_ok=True)
    rows = ["image," + ",".join(test.label_names)]
    for i in range(count):
        name = f"slice{int(test.slice_index[i]):03d}_{i:03d}.png"
        Image.fromarray(_uint8(test.x[i, 0])).save(folder / name)
        rows.append(f"{name}," + ",".join(str(int(v)) for v in test.y[i].tolist()))
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")


def train_unet(path: Path, quick: bool = False) -> None:
    """The demo's UNet (cached by ``medadv demo --unet``; trained here if absent), saved as a state dict."""
    from medadv.demo import DemoConfig, build_demo_model
    from medadv.models import save_checkpoint

    if path.is_file():
        return
    cfg = DemoConfig(epochs=1, n_train=4, channels=UNET_CHANNELS) if quick else DemoConfig(channels=UNET_CHANNELS)
    model = build_demo_model(cfg, cache=path.parent / ".cache" if quick else None, progress=not quick,
                             echo=print if not quick else (lambda *_: None))
    save_checkpoint(path, model)


def train_cnn(path: Path, quick: bool = False) -> None:
    """A small multi-label CNN on the training slices (8-bit quantised, in the PNGs' orientation)."""
    from medadv.data.brain_patches import brain_patches
    from medadv.models import fit_supervised, save_checkpoint, small_cnn
    from medadv.tasks import MultiLabel

    if path.is_file():
        return
    train = brain_patches(source="nilearn", split="train")
    # trained on the patches as written to the PNGs: medadv's data sources read a PNG as PIL and torchvision
    # do, (C, H, W)
    x = torch.from_numpy(_uint8(train.x)).float() / 255
    n = 32 if quick else len(train)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = small_cnn(1, PNG_LABELS, width=CNN_WIDTH)
        fit_supervised(model, MultiLabel(), x[:n], train.y[:n], epochs=1 if quick else 20, lr=5e-3, batch_size=32,
                       seed=0, progress=not quick, desc="train CNN")
    save_checkpoint(path, model)


def prepare(folder: str | Path = HERE / "data", quick: bool = False) -> Path:
    """Write every example's data and models under ``folder`` (what exists is kept). ``quick``: a few cases
    and one training epoch, for tests (the models then barely work)."""
    folder = Path(folder)
    write_seg3d(folder / "seg3d", n=2 if quick else 6, size=24 if quick else 48)
    write_whole(folder / "whole", spacing_mm=4 if quick else 2)
    write_png(folder / "png", n=8 if quick else None)
    train_unet(folder / "unet3d.pt", quick)
    train_cnn(folder / "cnn2d.pt", quick)
    return folder


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="write the data and models of medadv's examples")
    p.add_argument("--folder", default=str(HERE / "data"))
    p.add_argument("--quick", action="store_true", help="a few cases, one training epoch (for tests)")
    print(f"example data and models in {prepare(p.parse_args().folder, p.parse_args().quick)}")
