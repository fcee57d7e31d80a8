"""Surface distances per class, batched on the tensor's device: Hausdorff (HD, HD95) and ASSD.

The definitions are MONAI's (``compute_hausdorff_distance(include_background=True, percentile=...)`` and
``compute_average_surface_distance(symmetric=True)``), so the values match it:

* the surface (edge) of a binary map is its foreground voxels that binary erosion removes, with SciPy's
  default structuring element (the cross: face neighbours only) and everything outside the image counted as
  background, so foreground touching the image border is surface;
* the directed distances go from every surface voxel of one map to the nearest surface voxel of the other,
  Euclidean, with the voxel spacing applied per axis;
* HD at percentile ``p`` is ``max(P_p(d(pred -> y)), P_p(d(y -> pred)))``, each percentile taken on its own
  direction with linear interpolation (``torch.quantile``); ASSD is the mean of both directions' distances
  concatenated.

Three routes compute the nearest-surface distances, all exact: on the device, a dense Euclidean distance
transform (one linear scan along the longest axis, then brute-force min-plus along the others, cost
``voxels x (sum of the other axes)``) or chunked brute-force pairwise distances between surface voxels (cost
``|surface(pred)| x |surface(y)|``), chosen per class by the smaller cost; on the CPU, SciPy's KD-tree over
the surface voxels (MONAI's own CPU algorithm, much faster than brute force on CPU cores). Surface voxels
shared by both maps are at distance 0 and are not searched for.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["surface_distance_per_class", "SURFACE_METRICS", "SURFACE_BACKENDS"]

SURFACE_METRICS = ("hd", "assd")
SURFACE_BACKENDS = ("auto", "torch", "edt", "cdist", "scipy")

# the largest float32 block one step of the torch routes materialises (2**25 floats = 128 MiB)
_BLOCK = 2**25

SpacingArg = float | Sequence[float] | Sequence[Sequence[float]] | Tensor | np.ndarray | None


def surface_distance_per_class(
    pred: Tensor,
    y: Tensor,
    num_classes: int,
    spacing: SpacingArg = None,
    mask: Tensor | None = None,
    *,
    metric: str = "hd",
    percentile: float | None = 95.0,
    backend: str = "auto",
) -> Tensor:
    """Surface distance ``(N, C)`` between label maps per class: HD / HD95 or ASSD, float32 on ``pred``'s device.

    Args:
        pred: predicted label map ``(N, H, W)`` or ``(N, D, H, W)`` (integer class indices).
        y: reference label map, same shape (and device) as ``pred``.
        num_classes: classes ``0 .. num_classes - 1`` are scored (background included).
        spacing: voxel size per spatial axis; distances come out in its units (mm when the spacing is in
            mm; voxels when None). A scalar (isotropic), one value per spatial axis, or one per-axis sequence
            per sample (``N`` rows: per-case spacing read from image headers). A flat sequence of numbers is
            always per axis.
        mask: bool map like ``y`` of the voxels to score (ignore_index): voxels outside it belong to no class
            in either map, so a class's surface runs along the mask's border.
        metric: ``"hd"`` (Hausdorff distance at ``percentile``) or ``"assd"`` (average symmetric surface
            distance; ``percentile`` unused).
        percentile: in ``(0, 100]``; ``95`` gives HD95, ``100`` or None the maximum (classic HD).
        backend: ``"torch"`` computes on ``pred``'s device, per class the cheaper exact route of a dense
            distance transform (``"edt"``) and brute-force pairwise distances (``"cdist"``), which can also
            be forced; ``"scipy"`` uses a KD-tree on the CPU (MONAI's CPU algorithm, with
            ``torch.get_num_threads()`` workers); ``"auto"``: ``"torch"`` for CUDA tensors, ``"scipy"``
            otherwise. All give the same values (to float32 rounding).

    Returns:
        ``(N, num_classes)`` float32; NaN where the class is absent from the label or the prediction
        (the distance is undefined there; MONAI returns inf or nan).

    The surfaces are extracted on the device for all classes at once (in chunks of classes for large
    inputs). The routes then need the number of surface voxels of every map and the bounding box of each
    class's surfaces on the host, to choose a route and size their blocks: this is the one device->host
    synchronisation per chunk of classes (the rest is kernel launches and small host->device index copies).
    Memory is bounded: no block larger than ``2**25`` float32 (128 MiB) is formed.
    """
    _check_maps(pred, y, num_classes, mask)
    if metric not in SURFACE_METRICS:
        raise ValueError(f"`metric` must be one of {SURFACE_METRICS}, got {metric!r}")
    if backend not in SURFACE_BACKENDS:
        raise ValueError(f"`backend` must be one of {SURFACE_BACKENDS}, got {backend!r}")
    if percentile is not None:
        if isinstance(percentile, bool) or not isinstance(percentile, numbers.Real) or not 0 < percentile <= 100:
            raise ValueError(f"`percentile` must be a number in (0, 100] or None, got {percentile!r}")
    num_classes, n, ndim = int(num_classes), pred.shape[0], pred.ndim - 1
    sp = _spacing_table(spacing, n, ndim)  # (N, ndim) float64, host
    if backend == "auto":
        backend = "torch" if pred.device.type == "cuda" else "scipy"
    q = 1.0 if percentile is None else float(percentile) / 100.0

    device = pred.device
    with torch.no_grad():
        y = y.to(device)
        spd = sp.to(device=device, dtype=torch.float32)  # the spacing table, once on the device
        valid = None if mask is None else mask.to(device=device, dtype=torch.bool)
        spatial = tuple(pred.shape[1:])
        voxels = math.prod(spatial)
        # classes per chunk: the one-hot maps and their erosion stay within a few blocks of bytes
        per_chunk = max(1, _BLOCK // max(1, n * voxels))
        dists: list[Tensor] = []
        segs: list[Tensor] = []
        counts = torch.zeros(n, num_classes, 2, dtype=torch.long)
        for c0 in range(0, num_classes, per_chunk):
            classes = torch.arange(c0, min(num_classes, c0 + per_chunk), device=device)
            shape = (1, -1) + (1,) * ndim
            maps = torch.stack([pred.unsqueeze(1) == classes.view(shape), y.unsqueeze(1) == classes.view(shape)])
            if valid is not None:
                maps &= valid.unsqueeze(0).unsqueeze(2)
            edges = _surface(maps, ndim)  # (2, N, Cc, *spatial): [pred, y]
            del maps
            nc = edges.shape[2]
            # one host transfer: surface sizes and, per class, the bounding box of both surfaces over the batch
            cnt = edges.flatten(3).sum(-1)  # (2, N, Cc)
            shared = (edges[0] & edges[1]).flatten(2).sum(-1)  # (N, Cc): surface voxels of both maps
            anyc = edges.any(0).any(0)  # (Cc, *spatial)
            proj = [anyc.movedim(1 + k, 1).flatten(2).any(2) for k in range(ndim)]  # (Cc, S_k) each
            host = torch.cat([cnt.flatten(), shared.flatten()] + [p.flatten().long() for p in proj]).cpu()
            cnt_h = host[: cnt.numel()].view(2, n, nc)
            shared_h = host[cnt.numel(): cnt.numel() + shared.numel()].view(n, nc)
            off = cnt.numel() + shared.numel()
            boxes: list[list[tuple[int, int]]] = [[] for _ in range(nc)]
            for s_k in spatial:
                pk = host[off: off + nc * s_k].view(nc, s_k).bool()
                off += nc * s_k
                for j in range(nc):
                    idx = pk[j].nonzero()
                    boxes[j].append((int(idx[0]), int(idx[-1]) + 1) if idx.numel() else (0, 0))
            counts[:, c0: c0 + nc, 0] = cnt_h[0]
            counts[:, c0: c0 + nc, 1] = cnt_h[1]
            for j in range(nc):
                c = c0 + j
                both = [b for b in range(n) if cnt_h[0, b, j] > 0 and cnt_h[1, b, j] > 0]
                if not both:
                    continue
                na = [int(cnt_h[0, b, j]) for b in both]
                nb = [int(cnt_h[1, b, j]) for b in both]
                ns = [int(shared_h[b, j]) for b in both]
                route = backend
                if route == "torch":
                    box = [hi - lo for lo, hi in boxes[j]]
                    # memory passes: min-plus ~2 per (voxel, line position); brute force ~3 per (pair, axis)
                    cost_edt = 2 * len(both) * math.prod(box) * 2 * (sum(box) - max(box) + 1)
                    pairs = sum(a * b - s * (a + b) for a, b, s in zip(na, nb, ns, strict=True))
                    cost_cdist = 2 * pairs * 3 * ndim
                    route = "edt" if cost_edt < cost_cdist else "cdist"
                ep, ey = edges[0, :, j], edges[1, :, j]
                if route == "edt":
                    d, s = _route_edt(ep, ey, both, na, nb, boxes[j], spd, c, num_classes)
                elif route == "cdist":
                    d, s = _route_cdist(ep, ey, both, na, nb, ns, spd, c, num_classes)
                else:
                    d, s = _route_kdtree(ep, ey, both, sp, c, num_classes)
                dists.append(d.to(device))
                segs.append(s.to(device))
            del edges
        return _reduce(dists, segs, counts, metric, q, device)


# ------------------------------------------------------------------------------------------- validation
def _check_maps(pred: Tensor, y: Tensor, num_classes: int, mask: Tensor | None) -> None:
    if not isinstance(pred, Tensor) or not isinstance(y, Tensor):
        raise ValueError(f"`pred` and `y` must be tensors, got {type(pred).__name__} and {type(y).__name__}")
    if pred.shape != y.shape:
        raise ValueError(f"`pred` {tuple(pred.shape)} and `y` {tuple(y.shape)} must both be (N, *spatial) label maps")
    if pred.ndim not in (3, 4):
        raise ValueError(f"`pred` and `y` must be (N, H, W) or (N, D, H, W) label maps, got {tuple(pred.shape)}")
    if pred.is_floating_point() or pred.is_complex() or y.is_floating_point() or y.is_complex():
        for name, t in (("pred", pred), ("y", y)):
            if t.is_complex() or (t.is_floating_point() and not bool((t == t.round()).all())):
                raise ValueError(f"`{name}` must hold integer class indices")
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise ValueError(f"`num_classes` must be an int >= 1, got {num_classes!r}")
    if mask is not None and (not isinstance(mask, Tensor) or mask.shape != y.shape):
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"`mask` must be a bool tensor shaped like `y` {tuple(y.shape)}, got {shape}")


def _spacing_table(spacing: Any, n: int, ndim: int) -> Tensor:
    """``spacing`` as an ``(N, ndim)`` float64 host tensor; ValueError naming it when malformed."""
    if spacing is None:
        return torch.ones(n, ndim, dtype=torch.float64)
    if isinstance(spacing, Tensor):
        spacing = spacing.detach().cpu().numpy()
    try:
        arr = np.asarray(spacing, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`spacing` must be a number, {ndim} per-axis numbers or {n} rows of {ndim} "
                         f"numbers, got {spacing!r}") from err
    if arr.ndim == 0:
        arr = np.full((n, ndim), float(arr))
    elif arr.ndim == 1:
        if arr.shape[0] != ndim:
            raise ValueError(f"`spacing` per axis must have {ndim} values (one per spatial axis), got {arr.shape[0]}")
        arr = np.broadcast_to(arr, (n, ndim))
    elif arr.ndim == 2:
        if arr.shape != (n, ndim):
            raise ValueError(f"`spacing` per sample must be {n} rows (one per sample) of {ndim} values, "
                             f"got shape {arr.shape}")
    else:
        raise ValueError(f"`spacing` must be a number, {ndim} per-axis numbers or {n} rows of {ndim} numbers, "
                         f"got an array of shape {arr.shape}")
    if not (np.isfinite(arr).all() and (arr > 0).all()):
        raise ValueError(f"`spacing` must be finite and > 0, got {spacing!r}")
    return torch.from_numpy(np.array(arr, dtype=np.float64))


# --------------------------------------------------------------------------------------------- surfaces
def _surface(maps: Tensor, ndim: int) -> Tensor:
    """Surface voxels of bool maps (last ``ndim`` axes spatial): foreground minus its cross erosion.

    Outside the image counts as background (SciPy's ``binary_erosion`` default ``border_value=0``).
    """
    padded = torch.nn.functional.pad(maps, (1, 1) * ndim)
    inner = [slice(None)] * (maps.ndim - ndim)
    eroded = maps.clone()
    for k in range(ndim):
        for sl in (slice(0, -2), slice(2, None)):
            idx = [slice(1, -1)] * ndim
            idx[k] = sl
            eroded &= padded[tuple(inner + idx)]
    return maps & ~eroded


# ------------------------------------------------------------------------------------------------ routes
def _seg_ids(both: list[int], c: int, num_classes: int, direction: int) -> list[int]:
    return [(b * num_classes + c) * 2 + direction for b in both]


def _repeat(ids: list[int], sizes: list[int], device: torch.device) -> Tensor:
    return torch.repeat_interleave(torch.tensor(ids, device=device), torch.tensor(sizes, device=device),
                                   output_size=sum(sizes))


def _route_edt(ep: Tensor, ey: Tensor, both: list[int], na: list[int], nb: list[int],
               box: list[tuple[int, int]], spd: Tensor, c: int, num_classes: int) -> tuple[Tensor, Tensor]:
    """Distances through dense exact distance transforms of the surfaces, cropped to the class's box.

    Samples go in groups of about ``_BLOCK / 4`` voxels (the transform holds ~20 bytes per voxel); a single
    sample larger than that goes alone.
    """
    device = ep.device
    crop = (slice(None),) + tuple(slice(lo, hi) for lo, hi in box)
    per = max(1, (_BLOCK // 4) // max(1, math.prod(hi - lo for lo, hi in box)))
    ds: list[Tensor] = []
    segs: list[Tensor] = []
    for g0 in range(0, len(both), per):
        group, gna, gnb = both[g0: g0 + per], na[g0: g0 + per], nb[g0: g0 + per]
        sel = torch.tensor(group, device=device)
        p, t, spc = ep[sel][crop], ey[sel][crop], spd[sel]
        # transform of y's surface, read at pred's surface (pred -> y), and the other way round
        d2 = _edt_sq(torch.cat([t, p]), torch.cat([spc, spc]))
        queries = torch.cat([p, t]).flatten()
        ds.append(d2.flatten()[torch.nonzero_static(queries, size=sum(gna) + sum(gnb))[:, 0]].sqrt())
        ids = _seg_ids(group, c, num_classes, 0) + _seg_ids(group, c, num_classes, 1)
        segs.append(_repeat(ids, gna + gnb, device))
    return torch.cat(ds), torch.cat(segs)


def _edt_sq(features: Tensor, spacing: Tensor) -> Tensor:
    """Exact squared Euclidean distance ``(V, *S)`` to the nearest True voxel of each volume (inf if none).

    ``spacing`` is ``(V, ndim)``. A linear two-sided scan along the longest axis, then brute-force min-plus
    (``g'(p) = min_q g(q) + s^2 (p - q)^2``, exact by separability) along the others, chunked.
    """
    nvol, ndim = features.shape[0], features.ndim - 1
    dims = features.shape[1:]
    scan = max(range(ndim), key=lambda k: dims[k])
    f = features.movedim(1 + scan, -1)
    n = f.shape[-1]
    ar = torch.arange(n, device=f.device, dtype=torch.int32)
    big = 2 * n + 1
    left = torch.cummax(torch.where(f, ar, -big), dim=-1).values
    right = torch.cummin(torch.where(f, ar, big).flip(-1), dim=-1).values.flip(-1)
    dist = torch.minimum(ar - left, right - ar)
    w = (spacing[:, scan] ** 2).view((nvol,) + (1,) * ndim)
    g = dist.to(torch.float32).square() * w
    g = torch.where(dist < n, g, torch.full_like(g, math.inf)).movedim(-1, 1 + scan)
    for k in range(ndim):
        if k != scan:
            g = _minplus(g, k, spacing[:, k] ** 2)
    return g


def _minplus(g: Tensor, axis: int, w: Tensor) -> Tensor:
    """``out(p) = min_q g(q) + w (p - q)^2`` along spatial ``axis``; ``w`` per volume."""
    h = g.movedim(1 + axis, -1).contiguous()
    shape = h.shape
    nvol, n = shape[0], shape[-1]
    h = h.reshape(nvol, -1, n)
    lines = h.shape[1]
    ar = torch.arange(n, device=g.device, dtype=torch.float32)
    off = (ar[:, None] - ar[None, :]).square()  # (p, q)
    flat = h.reshape(-1, n)
    wl = w.to(torch.float32).repeat_interleave(lines)
    out = torch.empty_like(flat)
    rows = max(1, _BLOCK // (n * n))
    for r0 in range(0, flat.shape[0], rows):
        r1 = min(flat.shape[0], r0 + rows)
        blk = torch.addcmul(flat[r0:r1, None, :], wl[r0:r1, None, None], off)  # (rows, p, q)
        out[r0:r1] = blk.amin(-1)
    return out.view(shape).movedim(-1, 1 + axis)


def _route_cdist(ep: Tensor, ey: Tensor, both: list[int], na: list[int], nb: list[int], ns: list[int],
                 spd: Tensor, c: int, num_classes: int) -> tuple[Tensor, Tensor]:
    """Distances by brute force between surface voxel coordinates, chunked (exact: no matmul expansion).

    A surface voxel shared by both maps is at distance 0; only the others (``ns`` shared per sample) are
    searched for.
    """
    device = ep.device
    fwd: list[Tensor] = []
    bwd: list[Tensor] = []
    for i, b in enumerate(both):
        s, p, t = spd[b], ep[b], ey[b]
        cp = torch.nonzero_static(p, size=na[i]).to(torch.float32) * s
        cy = torch.nonzero_static(t, size=nb[i]).to(torch.float32) * s
        qp = torch.nonzero_static(p & ~t, size=na[i] - ns[i]).to(torch.float32) * s
        qy = torch.nonzero_static(t & ~p, size=nb[i] - ns[i]).to(torch.float32) * s
        zero = torch.zeros(ns[i], device=device)
        fwd.append(torch.cat([_nearest(qp, cy), zero]))
        bwd.append(torch.cat([_nearest(qy, cp), zero]))
    seg = _repeat(_seg_ids(both, c, num_classes, 0) + _seg_ids(both, c, num_classes, 1), na + nb, device)
    return torch.cat(fwd + bwd), seg


def _nearest(a: Tensor, b: Tensor) -> Tensor:
    """Distance from each row of ``a`` to the nearest row of ``b`` (coordinates), in ``_BLOCK``-float blocks.

    Exact differences per axis (no ``|a|^2 + |b|^2 - 2ab`` expansion, whose float32 cancellation or TF32
    matmul would cost far more than 1e-3).
    """
    cols = min(b.shape[0], _BLOCK)
    rows = max(1, _BLOCK // cols)
    best = torch.full((a.shape[0],), math.inf, device=a.device)
    for c0 in range(0, b.shape[0], cols):
        bb = b[c0: c0 + cols]
        for r0 in range(0, a.shape[0], rows):
            aa = a[r0: r0 + rows]
            d2 = (aa[:, 0, None] - bb[None, :, 0]).square_()
            for k in range(1, a.shape[1]):
                d2 += (aa[:, k, None] - bb[None, :, k]).square_()
            torch.minimum(best[r0: r0 + rows], d2.amin(1), out=best[r0: r0 + rows])
    return best.sqrt()


def _route_kdtree(ep: Tensor, ey: Tensor, both: list[int], sp: Tensor, c: int,
                  num_classes: int) -> tuple[Tensor, Tensor]:
    """Distances with SciPy's KD-tree over the surface voxels, on the CPU (float64, then float32)."""
    from scipy.spatial import cKDTree

    ep_h, ey_h = ep.cpu().numpy(), ey.cpu().numpy()
    workers = max(1, torch.get_num_threads())  # the CPU parallelism torch is allowed
    fwd: list[np.ndarray] = []
    bwd: list[np.ndarray] = []
    for b in both:
        s, p, t = sp[b].numpy(), ep_h[b], ey_h[b]
        cp = np.argwhere(p).astype(np.float64) * s
        cy = np.argwhere(t).astype(np.float64) * s
        zero = np.zeros(int(np.count_nonzero(p & t)))  # shared surface voxels: distance 0, not searched
        fwd.append(np.concatenate([cKDTree(cy, leafsize=32).query(np.argwhere(p & ~t) * s, k=1,
                                                                   workers=workers)[0], zero]))
        bwd.append(np.concatenate([cKDTree(cp, leafsize=32).query(np.argwhere(t & ~p) * s, k=1,
                                                                   workers=workers)[0], zero]))
    d = torch.from_numpy(np.concatenate(fwd + bwd).astype(np.float32))
    sizes = [len(x) for x in fwd + bwd]
    seg = _repeat(_seg_ids(both, c, num_classes, 0) + _seg_ids(both, c, num_classes, 1), sizes,
                  torch.device("cpu"))
    return d, seg


# ---------------------------------------------------------------------------------------------- reduce
def _reduce(dists: list[Tensor], segs: list[Tensor], counts: Tensor, metric: str, q: float,
            device: torch.device) -> Tensor:
    """Per (sample, class): HD at quantile ``q`` (max of both directions) or ASSD; NaN if a map is empty."""
    n, nc = counts.shape[:2]
    nseg = n * nc * 2
    present = (counts > 0).all(-1).to(device)  # (N, C)
    nan = torch.full((n, nc), math.nan, device=device)
    if not dists:
        return nan
    d = torch.cat(dists).to(torch.float32)
    seg = torch.cat(segs).long()
    size = torch.bincount(seg, minlength=nseg)
    if metric == "assd":
        tot = torch.zeros(nseg, dtype=torch.float64, device=device).index_add_(0, seg, d.double())
        tot, size2 = tot.view(n, nc, 2).sum(-1), size.view(n, nc, 2).sum(-1)
        res = (tot / size2.clamp(min=1)).to(torch.float32)
        return torch.where(present, res, nan)
    if q >= 1.0:
        per = torch.full((nseg,), -math.inf, device=device).scatter_reduce(0, seg, d, "amax")
    else:
        # sort by value, then (stably) by segment: each segment's distances come out contiguous and sorted
        vals, order = torch.sort(d, stable=True)
        _, order2 = torch.sort(seg[order], stable=True)
        vals = vals[order2]
        start = torch.cumsum(size, 0) - size
        # the rank in float32 as torch.quantile computes it on float32 input (MONAI's call), so the
        # interpolation weight matches it bit for bit even for large surfaces
        rank = torch.tensor(q, dtype=torch.float32, device=device) * (size - 1).clamp(min=0).to(torch.float32)
        lo = rank.long()
        hi = torch.minimum(lo + 1, (size - 1).clamp(min=0))
        w = rank - lo.to(torch.float32)
        last = vals.numel() - 1
        v_lo = vals[(start + lo).clamp(max=last)]
        v_hi = vals[(start + hi).clamp(max=last)]
        per = torch.lerp(v_lo, v_hi, w)
    res = per.view(n, nc, 2).amax(-1)
    return torch.where(present, res, nan)
