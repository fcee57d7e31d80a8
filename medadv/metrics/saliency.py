"""Similarity of saliency maps, and the Prediction-Saliency Correlation (PSC).

Maps are batches ``(N, *spatial)`` (2-D or 3-D); every function returns one value per sample ``(N,)``
unless stated otherwise. Definitions follow Zhang et al., Radiology: AI 2024 (SSIM, MSE and PCC on
per-map min–max normalised maps, JSD, PSC) and Ghorbani et al., AAAI 2019 (top-k intersection, Spearman
rank correlation, centre-of-mass shift).
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .image import ssim

if TYPE_CHECKING:  # type-only: medadv.metrics sits below medadv.tasks (tests/test_layout.py)
    from ..tasks import Task

__all__ = [
    "minmax",
    "map_ssim",
    "map_pearson",
    "map_mse",
    "map_spearman",
    "topk_intersection",
    "center_of_mass",
    "center_of_mass_shift",
    "mass_in_region",
    "jsd",
    "map_jsd",
    "prediction_jsd",
    "psc",
    "fisher_ci",
    "compare_maps",
]


def _check_pair(a: Tensor, b: Tensor) -> None:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("maps must be torch.Tensors")
    if a.shape != b.shape:
        raise ValueError(f"maps must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.ndim < 2:
        raise ValueError(f"maps must be batched (N, *spatial), got shape {tuple(a.shape)}")


def minmax(m: Tensor) -> Tensor:
    """Per-sample min–max scaling to [0, 1]; a constant map becomes all zeros."""
    flat = m.flatten(1).to(torch.float64 if m.dtype == torch.float64 else torch.float32)
    lo = flat.min(dim=1, keepdim=True).values
    span = flat.max(dim=1, keepdim=True).values - lo
    out = torch.where(span > 0, (flat - lo) / span.clamp_min(torch.finfo(flat.dtype).tiny), torch.zeros_like(flat))
    return out.reshape(m.shape)


def map_ssim(a: Tensor, b: Tensor, win_size: int = 7, k1: float = 0.01, k2: float = 0.03) -> Tensor:
    """Mean SSIM of min–max normalised maps, as ``skimage.metrics.structural_similarity`` computes it.

    skimage defaults (Zhang et al.): uniform ``win_size``-wide window, sample covariance, K1 = 0.01,
    K2 = 0.03, the mean taken over positions whose window lies inside the map. The maps are min–max
    scaled first (the paper scales to 0–255 with ``data_range=255``; SSIM is the same on [0, 1]).
    2-D ``(N, H, W)`` or 3-D ``(N, D, H, W)``.
    """
    _check_pair(a, b)
    nd = a.ndim - 1
    if nd not in (2, 3):
        raise ValueError(f"map_ssim needs 2-D or 3-D maps (N, H, W) / (N, D, H, W), got shape {tuple(a.shape)}")
    if win_size < 3 or win_size % 2 == 0 or min(a.shape[1:]) < win_size:
        raise ValueError(f"`win_size` must be odd, >= 3 and <= the map size {tuple(a.shape[1:])}, got {win_size}")
    return ssim(minmax(a).unsqueeze(1), minmax(b).unsqueeze(1), data_range=1.0, win_size=win_size, k1=k1, k2=k2,
                window="uniform", sample_covariance=True)


def map_pearson(a: Tensor, b: Tensor) -> Tensor:
    """Pearson correlation of the flattened maps (NaN where a map is constant)."""
    _check_pair(a, b)
    x, y = a.flatten(1).double(), b.flatten(1).double()
    x, y = x - x.mean(1, keepdim=True), y - y.mean(1, keepdim=True)
    den = x.norm(dim=1) * y.norm(dim=1)
    r = (x * y).sum(1) / den
    return torch.where(den > 0, r, torch.full_like(r, float("nan"))).to(a.dtype)


def map_mse(a: Tensor, b: Tensor, normalize: bool = True) -> Tensor:
    """Mean squared difference of the maps, on min–max normalised maps by default (Zhang et al.)."""
    _check_pair(a, b)
    if normalize:
        a, b = minmax(a), minmax(b)
    return (a - b).pow(2).flatten(1).mean(dim=1)


def _ranks(v: Tensor) -> Tensor:
    """Ranks 1..n with ties averaged (like ``scipy.stats.rankdata``), one row."""
    sorted_v, order = torch.sort(v)
    _, inverse, counts = torch.unique_consecutive(sorted_v, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    avg = ends - (counts.double() - 1) / 2
    ranks = torch.empty_like(avg[inverse])
    ranks[order] = avg[inverse]
    return ranks


def map_spearman(a: Tensor, b: Tensor) -> Tensor:
    """Spearman rank correlation of the flattened maps (ties get average ranks)."""
    _check_pair(a, b)
    ra = torch.stack([_ranks(r) for r in a.flatten(1)])
    rb = torch.stack([_ranks(r) for r in b.flatten(1)])
    return map_pearson(ra, rb).to(a.dtype)


def topk_intersection(a: Tensor, b: Tensor, k: int) -> Tensor:
    """Fraction of the ``k`` largest elements of ``a`` that are also among the ``k`` largest of ``b``."""
    _check_pair(a, b)
    n = a[0].numel()
    if not 1 <= int(k) <= n:
        raise ValueError(f"`k` must be in [1, {n}] (elements per map), got {k}")
    ia = a.flatten(1).topk(int(k), dim=1).indices
    ib = b.flatten(1).topk(int(k), dim=1).indices
    hit = torch.zeros(a.shape[0], n, dtype=torch.bool, device=a.device)
    hit.scatter_(1, ib, True)
    return hit.gather(1, ia).float().mean(dim=1)


def center_of_mass(m: Tensor) -> Tensor:
    """Centre of mass ``(N, ndim)`` of non-negative maps, in element (pixel/voxel) index units."""
    if m.ndim < 2:
        raise ValueError(f"maps must be batched (N, *spatial), got shape {tuple(m.shape)}")
    w = m.clamp_min(0)
    total = w.flatten(1).sum(1).clamp_min(torch.finfo(w.dtype).tiny)
    coords = []
    for d in range(1, m.ndim):
        shape = [1] * m.ndim
        shape[d] = m.shape[d]
        idx = torch.arange(m.shape[d], device=m.device, dtype=w.dtype).reshape(shape)
        coords.append((w * idx).flatten(1).sum(1) / total)
    return torch.stack(coords, dim=1)


def center_of_mass_shift(a: Tensor, b: Tensor) -> Tensor:
    """Euclidean distance between the maps' centres of mass (element units; Ghorbani et al.)."""
    _check_pair(a, b)
    return (center_of_mass(a) - center_of_mass(b)).norm(dim=1)


def mass_in_region(m: Tensor, region: Tensor) -> Tensor:
    """Share of each map's mass inside a region, ``(N,)`` in [0, 1]: ``Σ_region |m| / Σ |m|``.

    The relevance test's success measure (how much of the explanation an attacker moved into the target
    square), unlike SSIM to the target it does not ask the map to be uniform inside the region. A map that
    spreads its mass evenly scores the region's area fraction.

    Args:
        m: maps ``(N, *spatial)`` (absolute values are used; medadv's maps are already non-negative).
        region: ``(*spatial)`` or ``(N, *spatial)``; a boolean mask, or weights whose positive entries
            form the region (e.g. the attack's ``target_map``).

    All-zero maps give NaN (no mass to locate).
    """
    if not isinstance(m, Tensor) or not isinstance(region, Tensor):
        raise TypeError("`m` and `region` must be torch.Tensors")
    if m.ndim < 2:
        raise ValueError(f"maps must be batched (N, *spatial), got shape {tuple(m.shape)}")
    spatial = tuple(m.shape[1:])
    if tuple(region.shape) != spatial and tuple(region.shape) != tuple(m.shape):
        raise ValueError(f"`region` must have shape {spatial} or {tuple(m.shape)}, got {tuple(region.shape)}")
    inside = (region > 0) if region.dtype != torch.bool else region
    a = m.abs()
    total = a.flatten(1).sum(1)
    share = (a * inside.to(device=a.device, dtype=a.dtype)).flatten(1).sum(1) / total.clamp_min(torch.finfo(a.dtype).tiny)
    return torch.where(total > 0, share, torch.full_like(share, float("nan")))


def jsd(p: Tensor, q: Tensor, dim: int = -1) -> Tensor:
    """Jensen–Shannon divergence (natural log, in [0, ln 2]) between distributions along ``dim``.

    As in Zhang et al.'s code: ½KL(p‖m) + ½KL(q‖m), m = ½(p + q), log m clamped at 1e-7, 0·log 0 = 0.
    """
    if p.shape != q.shape:
        raise ValueError(f"`p` and `q` must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    m = 0.5 * (p + q)
    log_m = m.clamp(1e-7, 1.0).log()

    def kl(a: Tensor) -> Tensor:
        return torch.where(a > 0, a * (a.clamp_min(1e-30).log() - log_m), torch.zeros_like(a)).sum(dim)

    return 0.5 * kl(p) + 0.5 * kl(q)


def map_jsd(a: Tensor, b: Tensor) -> Tensor:
    """JSD between maps seen as distributions over pixels: shifted to be >= 0 and L1-normalised."""
    _check_pair(a, b)

    def dist(m: Tensor) -> Tensor:
        f = m.flatten(1)
        f = f - f.min(dim=1, keepdim=True).values.clamp(max=0)
        return f / f.sum(dim=1, keepdim=True).clamp_min(torch.finfo(f.dtype).tiny)

    return jsd(dist(a), dist(b))


def prediction_jsd(task: Task, logits_a: Tensor, logits_b: Tensor, label: int | Tensor | None = None) -> Tensor:
    """JSD between the predictive distributions of two outputs, ``(N,)``.

    Multi-class: the softmax vectors. Multi-label: the Bernoulli ``[p, 1 − p]`` of ``label`` (an int, or one
    label per sample ``(N,)``; Zhang et al.'s binary JSD), or the mean over labels when ``label`` is None.
    Segmentation: mean over voxels.
    """
    if logits_a.shape != logits_b.shape:
        raise ValueError(f"logits must have the same shape, got {tuple(logits_a.shape)} and {tuple(logits_b.shape)}")
    ya = task.predict(logits_a)
    pa, _ = task.distributions(logits_a, ya)
    pb, _ = task.distributions(logits_b, ya)
    if label is not None:
        if pa.ndim != 3:
            raise ValueError("`label` applies to multi-label outputs (N, L) only")
        if isinstance(label, Tensor):
            idx = label.to(device=pa.device, dtype=torch.long).reshape(-1, 1, 1).expand(-1, 2, 1)
            pa, pb = pa.gather(2, idx)[..., 0], pb.gather(2, idx)[..., 0]
        else:
            pa, pb = pa[:, :, label], pb[:, :, label]
    d = jsd(pa, pb, dim=1)
    return d.flatten(1).mean(dim=1) if d.ndim > 1 else d


def psc(d_pred: Tensor, d_sal: Tensor, min_std: float = 1e-12) -> float:
    """Prediction-Saliency Correlation (Zhang et al.): Pearson r across images of d_pred and d_sal.

    ``d_pred`` is the per-image prediction change and ``d_sal`` the map change, both usually JSDs
    (:func:`prediction_jsd`, :func:`map_jsd`). NaN entries of ``d_sal`` are replaced by their mean (as in
    the reference code). Returns NaN, with a warning, when either vector is (nearly) constant: the
    correlation is undefined there, not low. Report the means and standard deviations alongside.
    """
    if d_pred.ndim != 1 or d_pred.shape != d_sal.shape:
        raise ValueError(f"`d_pred` and `d_sal` must be 1-D of equal length, got {tuple(d_pred.shape)}, {tuple(d_sal.shape)}")
    if d_pred.numel() < 3:
        raise ValueError(f"PSC needs at least 3 images, got {d_pred.numel()}")
    x, y = d_pred.double(), d_sal.double()
    y = torch.where(torch.isnan(y), y.nanmean(), y)
    if float(x.std()) < min_std or float(y.std()) < min_std:
        warnings.warn("PSC is undefined: d_pred or d_sal is (nearly) constant across images", stacklevel=2)
        return float("nan")
    return float(map_pearson(x[None], y[None])[0])


def fisher_ci(r: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Fisher-z confidence interval of a Pearson correlation over ``n`` pairs (untruncated)."""
    if n < 4:
        raise ValueError(f"`n` must be >= 4 for a Fisher-z interval, got {n}")
    if math.isnan(r):
        return float("nan"), float("nan")
    z = math.atanh(max(min(r, 1 - 1e-15), -1 + 1e-15))
    q = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(0.5 + level / 2)).item()
    half = q / math.sqrt(n - 3)
    return math.tanh(z - half), math.tanh(z + half)


def compare_maps(a: Tensor, b: Tensor, k: int | None = None) -> dict[str, Tensor]:
    """All per-sample similarities of two map batches (``k`` for top-k: default 5% of the elements)."""
    _check_pair(a, b)
    k = max(1, a[0].numel() // 20) if k is None else k
    out = {
        "pearson": map_pearson(a, b),
        "spearman": map_spearman(a, b),
        "mse": map_mse(a, b),
        "topk": topk_intersection(a, b, k),
        "com_shift": center_of_mass_shift(a, b),
        "jsd": map_jsd(a, b),
    }
    if a.ndim in (3, 4) and min(a.shape[1:]) >= 7:
        out = {"ssim": map_ssim(a, b), **out}
    return out
