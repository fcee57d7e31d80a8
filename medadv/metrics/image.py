"""Similarity of a perturbed input to the clean one: MSE, PSNR and SSIM (2-D and 3-D), per sample.

All functions take batches ``(N, C, *spatial)`` with 1, 2 or 3 spatial dims, stay on the tensors'
device, are differentiable (VAFA uses SSIM as a loss term) and return one value per sample ``(N,)``.

SSIM follows Wang et al. (2004) with a separable Gaussian window applied without padding ("valid"
convolution), constants ``K1 = 0.01``, ``K2 = 0.03`` and the mean over channels and positions — the
convention of ``pytorch_msssim.ssim`` that VAFA's authors use (window 11, σ 1.5 by default; VAFA uses
window 3). In 3-D the window is a 3-D Gaussian, not per-slice 2-D SSIM.

LPIPS (Zhang et al., CVPR 2018) is computed here on torchvision's AlexNet/VGG-16 features from two local files
the user supplies (the ImageNet backbone and LPIPS's calibrated linear layers, :func:`lpips`); medadv never
downloads them, and without them :func:`lpips` raises, naming the files and where to get them, rather than
returning a stand-in number. Checked once against the ``lpips`` 0.1.4 package on the same weights (not a
dependency): largest difference 9e-10 (AlexNet) and 0 (VGG).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["mse", "psnr", "ssim", "lpips", "LPIPS_FILES", "LPIPS_ENV"]


def _pair(x: Tensor, y: Tensor, names: tuple[str, str] = ("x", "x_adv")) -> int:
    for n, t in zip(names, (x, y), strict=True):
        if not isinstance(t, Tensor):
            raise TypeError(f"`{n}` must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"`{n}` must be a floating-point tensor, got dtype {t.dtype}")
    if x.shape != y.shape:
        raise ValueError(f"`{names[0]}` and `{names[1]}` must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.ndim not in (3, 4, 5):
        raise ValueError(f"inputs must be (N, C, *spatial) with 1-3 spatial dims, got shape {tuple(x.shape)}")
    return x.ndim - 2


def mse(x: Tensor, x_adv: Tensor) -> Tensor:
    """Mean squared difference per sample ``(N,)`` (data units squared)."""
    _pair(x, x_adv)
    return (x_adv - x).pow(2).reshape(x.shape[0], -1).mean(dim=1)


def psnr(x: Tensor, x_adv: Tensor, data_range: float = 1.0) -> Tensor:
    """Peak signal-to-noise ratio per sample ``(N,)`` in dB; ``inf`` where the inputs are equal.

    Args:
        data_range: span of the data (``hi - lo`` of the bounds), in data units.
    """
    if not float(data_range) > 0:
        raise ValueError(f"`data_range` must be > 0, got {data_range}")
    m = mse(x, x_adv)
    return 10.0 * torch.log10(float(data_range) ** 2 / m)


@lru_cache(maxsize=32)
def _gaussian(win: int, sigma: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    # cached per device: SSIM inside attack loops reuses the window without a host-to-device copy
    r = torch.arange(win, dtype=torch.float64) - (win - 1) / 2
    g = torch.exp(-(r**2) / (2 * sigma**2))
    return (g / g.sum()).to(dtype=dtype, device=device)


def _blur(t: Tensor, g: Tensor, ndim: int) -> Tensor:
    """Separable valid Gaussian filter over the trailing ``ndim`` dims, as sums of shifted views.

    Single-channel 3-D convolutions are slow on CPU; for the small windows used here a weighted sum
    of ``win`` shifted slices per axis is the same arithmetic with no im2col and fuses well on GPU.
    """
    win = g.numel()
    for axis in range(t.ndim - ndim, t.ndim):
        n = t.shape[axis] - win + 1
        acc = t.narrow(axis, 0, n) * g[0]
        for i in range(1, win):
            acc = acc + t.narrow(axis, i, n) * g[i]
        t = acc
    return t


def ssim(
    x: Tensor,
    x_adv: Tensor,
    *,
    data_range: float = 1.0,
    win_size: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
    nonnegative: bool = False,
    window: str = "gaussian",
    sample_covariance: bool = False,
) -> Tensor:
    """Structural similarity per sample ``(N,)``, averaged over channels and window positions.

    Args:
        x, x_adv: ``(N, C, *spatial)`` batches (1, 2 or 3 spatial dims), same shape.
        data_range: span of the data in data units (``L`` in the SSIM constants).
        win_size: Gaussian window length along each spatial axis (odd, at most the smallest spatial
            size, since the filter is applied without padding).
        sigma: Gaussian standard deviation in voxels.
        k1, k2: SSIM stabilising constants.
        nonnegative: clamp the contrast-structure term at 0 (``pytorch_msssim``'s ``nonnegative_ssim``).
        window: ``"gaussian"`` (Wang et al.; ``pytorch_msssim``) or ``"uniform"`` (scikit-image's default).
        sample_covariance: unbiased (n − 1) variances and covariance, as scikit-image computes them.
    """
    ndim = _pair(x, x_adv)
    if int(win_size) < 1 or int(win_size) % 2 == 0:
        raise ValueError(f"`win_size` must be a positive odd integer, got {win_size}")
    if min(x.shape[2:]) < win_size:
        raise ValueError(f"`win_size` {win_size} exceeds the smallest spatial size {min(x.shape[2:])}")
    if not float(data_range) > 0:
        raise ValueError(f"`data_range` must be > 0, got {data_range}")
    if window not in ("gaussian", "uniform"):
        raise ValueError(f"`window` must be 'gaussian' or 'uniform', got {window!r}")
    n, c = x.shape[:2]
    if window == "gaussian":
        g = _gaussian(int(win_size), float(sigma), x.dtype, x.device)
    else:
        g = torch.full((int(win_size),), 1.0 / int(win_size), dtype=x.dtype, device=x.device)
    # channels folded into the batch: one filter serves any channel count
    a = x.reshape(n * c, 1, *x.shape[2:])
    b = x_adv.reshape(n * c, 1, *x.shape[2:])
    stats = _blur(torch.cat([a, b, a * a, b * b, a * b]), g, ndim).chunk(5)
    mu_a, mu_b, aa, bb, ab = stats
    c1 = (k1 * data_range) ** 2
    c2 = (k2 * data_range) ** 2
    npix = int(win_size) ** ndim
    norm = npix / (npix - 1) if sample_covariance and npix > 1 else 1.0
    var_a = norm * (aa - mu_a**2)
    var_b = norm * (bb - mu_b**2)
    cov = norm * (ab - mu_a * mu_b)
    cs = (2 * cov + c2) / (var_a + var_b + c2)
    if nonnegative:
        cs = F.relu(cs)
    s = (2 * mu_a * mu_b + c1) / (mu_a**2 + mu_b**2 + c1) * cs
    return s.reshape(n, -1).mean(dim=1)


#: the environment variable naming the LPIPS weights folder when ``weights`` is not given
LPIPS_ENV = "MEDADV_LPIPS_WEIGHTS"
#: per backbone: (LPIPS linear-layer file, torchvision backbone file, its torchvision weights enum, download URL)
LPIPS_FILES: dict[str, tuple[str, str, str, str]] = {
    "alex": ("alex.pth", "alexnet-owt-7be5be79.pth", "torchvision.models.AlexNet_Weights.IMAGENET1K_V1",
             "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth"),
    "vgg": ("vgg.pth", "vgg16-397923af.pth", "torchvision.models.VGG16_Weights.IMAGENET1K_V1",
            "https://download.pytorch.org/models/vgg16-397923af.pth"),
}
# per backbone: the indices in torchvision's ``features`` whose outputs (after ReLU) LPIPS compares, their channels,
# and the smallest image side for which the deepest one is not empty
_TAPS = {"alex": ((1, 4, 7, 9, 11), (64, 192, 384, 256, 256), 31),
         "vgg": ((3, 8, 15, 22, 29), (64, 128, 256, 512, 512), 16)}
# LPIPS's input scaling of images in [-1, 1] (per RGB channel): (t − shift) / scale
_SHIFT = (-0.030, -0.088, -0.188)
_SCALE = (0.458, 0.448, 0.450)


def _missing_weights_message(net: str, folder: Path | None, missing: Sequence[str]) -> str:
    lin, backbone, enum, url = LPIPS_FILES[net]
    where = f"the folder {str(folder)!r}" if folder is not None else "a folder"
    lacking = f" (missing: {', '.join(missing)})" if folder is not None and missing else ""
    return (
        f"LPIPS (net={net!r}) needs two local files in {where}{lacking}; medadv never downloads them (offline):\n"
        f"  1. {lin}: LPIPS v0.1 linear-layer weights (Zhang et al. 2018), shipped in the `lpips` pip package as "
        f"lpips/weights/v0.1/{lin} (also in the GitHub repository richzhang/PerceptualSimilarity at the same path);\n"
        f"  2. {backbone}: torchvision's ImageNet backbone ({enum}), from {url} (torchvision keeps a downloaded "
        f"copy in ~/.cache/torch/hub/checkpoints/).\n"
        f"Put both in one folder and pass lpips(..., weights='/that/folder') or set {LPIPS_ENV}=/that/folder. "
        "Without them use medadv.metrics.image.ssim / psnr."
    )


class _LPIPSNet(nn.Module):
    """Backbone features at LPIPS's layers with the per-channel linear weights (frozen, eval mode)."""

    shift: Tensor
    scale: Tensor

    def __init__(self, net: str, backbone: nn.Sequential, linear: list[Tensor]) -> None:
        super().__init__()
        taps = _TAPS[net][0]
        self.features = backbone[: taps[-1] + 1]
        self.taps = taps
        self.linear = nn.ParameterList([nn.Parameter(w.reshape(1, -1, 1, 1), requires_grad=False) for w in linear])
        self.register_buffer("shift", torch.tensor(_SHIFT).reshape(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor(_SCALE).reshape(1, 3, 1, 1))
        self.requires_grad_(False)
        self.eval()

    def _feats(self, t: Tensor) -> list[Tensor]:
        out = []
        h = (t - self.shift) / self.scale
        for i, layer in enumerate(self.features):
            h = layer(h)
            if i in self.taps:
                out.append(h)
        return out

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        """LPIPS ``(M,)`` of image batches ``(M, 3, H, W)`` in [-1, 1]: per layer, unit-normalise each position's
        channel vector, square the difference, weight the channels (1×1 linear), average over positions; sum."""
        total = a.new_zeros(a.shape[0])
        for fa, fb, w in zip(self._feats(a), self._feats(b), self.linear, strict=True):
            # vector_norm's gradient is 0 (not NaN) where a position's features are all zero (after ReLU)
            na = fa / (torch.linalg.vector_norm(fa, dim=1, keepdim=True) + 1e-10)
            nb = fb / (torch.linalg.vector_norm(fb, dim=1, keepdim=True) + 1e-10)
            total = total + ((na - nb).pow(2) * w).sum(dim=1).mean(dim=(1, 2))
        return total


def _backbone(net: str) -> nn.Sequential:
    """torchvision's AlexNet / VGG-16 ``features`` stack (same layers and indices as ``torchvision.models.alexnet``
    / ``vgg16``, so their checkpoints' ``features.*`` keys load), without the classifier the metric never uses."""
    if net == "vgg":
        from torchvision.models.vgg import cfgs, make_layers

        return make_layers(cfgs["D"], batch_norm=False)
    conv, relu, pool = nn.Conv2d, lambda: nn.ReLU(inplace=True), lambda: nn.MaxPool2d(kernel_size=3, stride=2)
    return nn.Sequential(conv(3, 64, 11, stride=4, padding=2), relu(), pool(), conv(64, 192, 5, padding=2), relu(),
                         pool(), conv(192, 384, 3, padding=1), relu(), conv(384, 256, 3, padding=1), relu(),
                         conv(256, 256, 3, padding=1), relu(), pool())


def _load_state(path: Path, what: str) -> dict[str, Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ValueError(f"could not read the {what} file {str(path)!r} with torch.load(weights_only=True): {err}") \
            from err
    if not isinstance(state, dict):
        raise ValueError(f"the {what} file {str(path)!r} must hold a state dict, got {type(state).__name__}")
    return state


@lru_cache(maxsize=4)
def _lpips_net(net: str, folder: str, stamp: tuple[tuple[int, int], ...], device: torch.device,
               dtype: torch.dtype) -> _LPIPSNet:
    """The LPIPS network of ``folder``'s files on ``device``, cached per (files, modification times, device)."""
    lin_name, backbone_name, _, _ = LPIPS_FILES[net]
    root = Path(folder)
    features = _backbone(net)
    state = _load_state(root / backbone_name, "backbone")
    feats = {k.removeprefix("features."): v for k, v in state.items() if k.startswith("features.")}
    try:
        features.load_state_dict(feats, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{str(root / backbone_name)!r} is not a torchvision {'AlexNet' if net == 'alex' else 'VGG-16'} "
                         f"state dict (keys 'features.<i>.weight' / '.bias'): {err}") from err
    lin_state = _load_state(root / lin_name, "LPIPS linear-layer")
    channels = _TAPS[net][1]
    linear = []
    for i, c in enumerate(channels):
        w = lin_state.get(f"lin{i}.model.1.weight")
        if not isinstance(w, Tensor) or w.numel() != c:
            got = None if not isinstance(w, Tensor) else tuple(w.shape)
            raise ValueError(f"{str(root / lin_name)!r} is not LPIPS v0.1 linear-layer weights for net={net!r}: key "
                             f"'lin{i}.model.1.weight' must hold {c} values (shape (1, {c}, 1, 1)), got {got}")
        linear.append(w.float())
    return _LPIPSNet(net, features, linear).to(device=device, dtype=dtype)


def _lpips_folder(net: str, weights: str | os.PathLike[str] | None) -> Path:
    lin_name, backbone_name, _, _ = LPIPS_FILES[net]
    given = weights if weights is not None else os.environ.get(LPIPS_ENV) or None
    if given is None:
        raise FileNotFoundError(_missing_weights_message(net, None, ()))
    if not isinstance(given, str | os.PathLike):
        raise TypeError(f"`weights` must be a folder path (str or os.PathLike), got {type(given).__name__}")
    folder = Path(given).expanduser()
    missing = [n for n in (lin_name, backbone_name) if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(_missing_weights_message(net, folder, missing))
    return folder


def lpips(
    x: Tensor,
    x_adv: Tensor,
    *,
    weights: str | os.PathLike[str] | None = None,
    net: str = "alex",
    bounds: tuple[float, float] = (0.0, 1.0),
    slice_dim: int = -1,
    similarity: bool = False,
) -> Tensor:
    """Learned Perceptual Image Patch Similarity per sample ``(N,)`` (Zhang et al., CVPR 2018; LPIPS v0.1).

    Both inputs are mapped from ``bounds`` to [-1, 1] and scaled per RGB channel as LPIPS does; the backbone's
    activations at five ReLU layers (AlexNet: relu1-5; VGG-16: relu1_2, 2_2, 3_3, 4_3, 5_3) are unit-normalised
    over channels at each position, their squared difference is weighted per channel by LPIPS's linear layers,
    averaged over positions and summed over layers. 0 for identical inputs, larger for more perceptible changes.
    Differentiable in the inputs (the network is frozen); computed on the inputs' device and dtype.

    Volumes ``(N, C, D, H, W)`` are compared slice by slice along ``slice_dim`` and averaged over the slices, as
    Malik et al. (2024) do on axial slices (they report ``1 − LPIPS_alex``: ``similarity=True``).

    Args:
        x, x_adv: clean and perturbed batches ``(N, C, H, W)`` or ``(N, C, D, H, W)`` with 1 channel (repeated to
            RGB) or 3, in data units within ``bounds``; each image side at least 31 pixels (AlexNet) or 16 (VGG).
        weights: the folder with the two weight files (:data:`LPIPS_FILES`: ``alex.pth`` +
            ``alexnet-owt-7be5be79.pth`` or ``vgg.pth`` + ``vgg16-397923af.pth``); default: the folder in the
            environment variable ``MEDADV_LPIPS_WEIGHTS``. Loaded with ``torch.load(weights_only=True)``.
        net: ``"alex"`` (the LPIPS default; Malik et al.) or ``"vgg"``.
        bounds: ``(lo, hi)`` data range mapped to LPIPS's [-1, 1] input range (data units).
        slice_dim: spatial axis of a volume to slice along (-1: the last, axial in MONAI's (H, W, D) layout);
            ignored for 2-D images.
        similarity: return ``1 − LPIPS`` (Malik et al.'s "LPIPS score", higher is more similar).

    Raises:
        FileNotFoundError: no weights folder given, or a file missing from it (the message names the files, where
            to get them and where to put them).
    """
    if net not in LPIPS_FILES:
        raise ValueError(f"`net` must be 'alex' or 'vgg', got {net!r}")
    ndim = _pair(x, x_adv)
    if ndim not in (2, 3):
        raise ValueError(f"LPIPS compares images (N, C, H, W) or volumes (N, C, D, H, W), got shape {tuple(x.shape)}")
    if x.shape[1] not in (1, 3):
        raise ValueError(f"LPIPS needs 1 (grey, repeated to RGB) or 3 channels, got {x.shape[1]} in shape "
                         f"{tuple(x.shape)}; compare channels one at a time")
    lo, hi = (float(v) for v in bounds)
    if not hi > lo:
        raise ValueError(f"`bounds` must be (lo, hi) with hi > lo, got {bounds}")
    if not isinstance(similarity, bool):
        raise TypeError(f"`similarity` must be True or False, got {similarity!r}")
    n = x.shape[0]
    a, b = x, x_adv
    if ndim == 3:
        if not -3 <= slice_dim <= 2:
            raise ValueError(f"`slice_dim` must be a spatial axis in -3..2, got {slice_dim}")
        axis = 2 + (slice_dim % 3)
        a = a.movedim(axis, 1).flatten(0, 1)  # (N·S, C, h, w), slices of sample i contiguous
        b = b.movedim(axis, 1).flatten(0, 1)
    side = _TAPS[net][2]
    if min(a.shape[-2:]) < side:
        raise ValueError(f"LPIPS with net={net!r} needs images of at least {side}×{side} pixels, got "
                         f"{tuple(a.shape[-2:])} (resample the images, or use ssim / psnr)")
    folder = _lpips_folder(net, weights)
    files = [folder / f for f in LPIPS_FILES[net][:2]]
    stamp = tuple((f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    model = _lpips_net(net, str(folder.resolve()), stamp, a.device, a.dtype)
    scale = 2.0 / (hi - lo)
    ta = ((a - lo) * scale - 1.0).expand(-1, 3, -1, -1)
    tb = ((b - lo) * scale - 1.0).expand(-1, 3, -1, -1)
    d = model(ta, tb).reshape(n, -1).mean(dim=1)
    return 1.0 - d if similarity else d
