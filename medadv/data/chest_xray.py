"""A real PA chest radiograph, offline: ``RG1_UNCR.dcm`` from the ``pydicom-data`` package.

The file is a Philips computed radiograph (1955×1841, 15-bit, MONOCHROME1: high values are dark), from
the NEMA WG04 test set. It is loaded with its own VOI window, inverted to the usual MONOCHROME2 look,
centre-cropped to a square and resized: the CheXNet preprocessing (Rajpurkar et al., 2017) minus the
ImageNet normalisation, which :class:`ImageNetNormalize` applies *inside* the model so that attacks
and bounds stay in [0, 1] pixel units. A colour fundus photograph (``skimage.data.retina``) is offered
for RGB experiments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["load_chest_xray", "load_fundus", "ImageNetNormalize", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _square_resize(img: Tensor, size: int) -> Tensor:
    """Centre-crop ``(C, H, W)`` to a square and resize (antialiased bilinear) to ``size``×``size``."""
    _, h, w = img.shape
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    img = img[:, top : top + s, left : left + s]
    out = F.interpolate(img[None], size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0]
    return out.clamp(0.0, 1.0)


def _check_size(size: int) -> int:
    if not isinstance(size, int) or isinstance(size, bool) or size < 8:
        raise ValueError(f"`size` must be an int >= 8 (pixels), got {size!r}")
    return size


def load_chest_xray(size: int = 224, channels: int = 1, window: tuple[float, float] | None = None) -> Tensor:
    """The real PA chest X-ray ``(channels, size, size)`` float32 in [0, 1], lungs dark, bones bright.

    Args:
        size: output side in pixels (CheXNet uses 224).
        channels: 1 (grey) or 3 (grey replicated, for ImageNet-style networks such as CheXNet).
        window: ``(center, width)`` in stored pixel values; default the file's own VOI window
            (15000, 30000).
    """
    _check_size(size)
    if channels not in (1, 3):
        raise ValueError(f"`channels` must be 1 or 3, got {channels}")
    import pydicom
    from pydicom.data import get_testdata_file

    try:
        path = get_testdata_file("RG1_UNCR.dcm")
    except Exception as err:  # pydicom would try GitHub without pydicom-data
        raise FileNotFoundError("RG1_UNCR.dcm ships with the `pydicom-data` package: `pip install pydicom-data`") from err
    if path is None:
        raise FileNotFoundError("RG1_UNCR.dcm not found: install the `pydicom-data` package")
    ds = pydicom.dcmread(path)
    px = torch.from_numpy(ds.pixel_array.astype("float32"))
    if window is None:
        center, width = float(ds.WindowCenter), float(ds.WindowWidth)
    else:
        center, width = (float(v) for v in window)
        if not width > 0:
            raise ValueError(f"`window` width must be > 0, got {width}")
    lo = center - width / 2
    img = ((px - lo) / width).clamp(0.0, 1.0)
    if ds.PhotometricInterpretation == "MONOCHROME1":
        img = 1.0 - img  # MONOCHROME1 stores air as high values; display convention is air dark
    # the window spans the full 15-bit range: stretch to the image's own 0.5–99.5 percentiles
    flat = img.flatten()[:: max(1, img.numel() // 200_000)]
    q = torch.quantile(flat, torch.tensor([0.005, 0.995]))
    img = ((img - q[0]) / (q[1] - q[0])).clamp(0.0, 1.0)
    out = _square_resize(img[None], size)
    return out.expand(channels, -1, -1).contiguous()


def load_fundus(size: int = 224) -> Tensor:
    """A real colour fundus photograph (``skimage.data.retina``, CC0) ``(3, size, size)`` in [0, 1]."""
    _check_size(size)
    from skimage import data

    img = torch.from_numpy(data.retina().astype("float32") / 255.0).permute(2, 0, 1)
    return _square_resize(img, size)


class ImageNetNormalize(nn.Module):
    """``(x − mean) / std`` per channel as the first layer of a model, so inputs stay in [0, 1].

    Put it in front of an ImageNet-style network (``nn.Sequential(ImageNetNormalize(), chexnet())``):
    attack budgets and bounds are then in pixel units, not normalised units (the ambiguity of spec 002
    A3 / anchors §1.6 disappears).
    """

    mean: Tensor
    std: Tensor

    def __init__(self, mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD) -> None:
        super().__init__()
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError("`mean` and `std` must have equal length and std > 0")
        self.register_buffer("mean", torch.tensor(mean).reshape(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).reshape(1, -1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.mean.shape[1]:
            raise ValueError(f"expected (N, {self.mean.shape[1]}, H, W) input, got {tuple(x.shape)}")
        return (x - self.mean) / self.std
