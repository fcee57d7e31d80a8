"""Similarity of a perturbed input to the clean one: MSE, PSNR and SSIM (2-D and 3-D), per sample.

All functions take batches ``(N, C, *spatial)`` with 1, 2 or 3 spatial dims, stay on the tensors'
device, are differentiable (VAFA uses SSIM as a loss term) and return one value per sample ``(N,)``.

SSIM follows Wang et al. (2004) with a separable Gaussian window applied without padding ("valid"
convolution), constants ``K1 = 0.01``, ``K2 = 0.03`` and the mean over channels and positions — the
convention of ``pytorch_msssim.ssim`` that VAFA's authors use (window 11, σ 1.5 by default; VAFA uses
window 3). In 3-D the window is a 3-D Gaussian, not per-slice 2-D SSIM.

LPIPS is not provided: it needs pretrained AlexNet/VGG weights plus LPIPS's calibrated linear layers,
which cannot be obtained offline in this project. :func:`lpips` raises and says so rather than
returning a stand-in number.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["mse", "psnr", "ssim", "lpips"]


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


def lpips(*args: object, **kwargs: object) -> Tensor:
    """Not available: LPIPS needs pretrained network weights that cannot be had offline.

    LPIPS (Zhang et al., CVPR 2018) compares deep features of an ImageNet-pretrained AlexNet/VGG
    with learned per-channel weights; Malik et al. report ``1 - LPIPS_alex`` per axial slice. Neither
    the backbone weights nor the LPIPS layers ship with any package installed here, and medadv never
    downloads at run time. A randomly initialised network would give a number that means nothing, so
    this function raises instead. Use :func:`ssim` / :func:`psnr`, or compute LPIPS with the ``lpips``
    package on a machine where its weights are available.
    """
    raise NotImplementedError(
        "LPIPS needs pretrained AlexNet/VGG weights and LPIPS's linear layers, which cannot be obtained "
        "offline; medadv does not fake it. Use medadv.metrics.image.ssim/psnr instead."
    )

