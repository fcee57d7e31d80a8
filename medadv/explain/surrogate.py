"""Softplus surrogate of a piecewise-linear network, for second-order gradients.

For ReLU networks the input Hessian is zero almost everywhere, so the gradient of a gradient-based map
w.r.t. the input vanishes (Ghorbani et al., AAAI 2019; Dombrowski et al., NeurIPS 2019). Explanation
attacks therefore differentiate a copy in which every rectifier is replaced by softplus with
sharpness β (softplus_β → ReLU as β → ∞), usually with β grown geometrically during the attack, and
evaluate the result on the original network.

Max pooling is piecewise linear too: it routes the whole gradient of a window through its largest input,
so which pixels a gradient map lights up is decided by argmax switches that a softplus swap leaves
untouched. ``smooth_pools=True`` also replaces max pools by a log-mean-exp pool of the same sharpness β
(→ max pooling as β → ∞, → average pooling as β → 0).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["softplus_surrogate", "set_softplus_beta", "beta_schedule", "BETA_ATTR"]

#: attribute set on a surrogate: its current β (Grad-CAM uses it for its own rectifier)
BETA_ATTR = "medadv_softplus_beta"


class _SoftLeaky(nn.Module):
    """Smooth leaky/parametric ReLU: softplus_β(x) − a·softplus_β(−x) (equals max(x,0) + a·min(x,0) as β→∞)."""

    def __init__(self, slope: Tensor | float, beta: float) -> None:
        super().__init__()
        if isinstance(slope, Tensor):
            self.register_buffer("slope", slope)  # follows .to(device)
        else:
            self.slope = float(slope)
        self.beta = float(beta)

    def forward(self, x: Tensor) -> Tensor:
        a = self.slope
        if isinstance(a, Tensor) and a.numel() > 1:  # PReLU with one slope per channel
            a = a.reshape(1, -1, *([1] * (x.ndim - 2)))
        return F.softplus(x, beta=self.beta) - a * F.softplus(-x, beta=self.beta)


def _as_tuple(v: int | tuple[int, ...], nd: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, tuple) else (int(v),) * nd


def _lme(x: Tensor, dim: int, beta: float) -> Tensor:
    """log-mean-exp of ``x`` over ``dim`` at sharpness ``beta``: (1/β)·log mean exp(β·x) (−inf entries ignored)."""
    return (torch.logsumexp(beta * x, dim=dim) - math.log(x.shape[dim])) / beta


class _SoftMaxPool(nn.Module):
    """Log-mean-exp pooling over max-pool windows: (1/β)·log mean_window exp(β·x), → max pooling as β → ∞.

    The log-mean-exp of a box is separable (nested over the spatial dims), so it is applied one dim at a
    time. Windows follow the replaced pool exactly: kernel, stride, padding (ignored entries), dilation,
    ceil mode, or the adaptive windows ``[floor(i·L/out), ceil((i+1)·L/out))``.
    """

    def __init__(self, pool: nn.Module, beta: float) -> None:
        super().__init__()
        self.nd = 3 if isinstance(pool, (nn.MaxPool3d, nn.AdaptiveMaxPool3d)) else 2
        self.adaptive = isinstance(pool, (nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d))
        if self.adaptive:
            self.output_size = _as_tuple(pool.output_size, self.nd)  # type: ignore[arg-type]
        else:
            self.kernel = _as_tuple(pool.kernel_size, self.nd)  # type: ignore[arg-type]
            self.stride = _as_tuple(pool.stride or pool.kernel_size, self.nd)  # type: ignore[arg-type]
            self.padding = _as_tuple(pool.padding, self.nd)  # type: ignore[arg-type]
            self.dilation = _as_tuple(pool.dilation, self.nd)  # type: ignore[arg-type]
            self.ceil_mode = bool(pool.ceil_mode)
        self.beta = float(beta)

    def _pool_dim(self, x: Tensor, d: int, i: int) -> Tensor:
        length = x.shape[d]
        if self.adaptive:
            out = self.output_size[i]
            out = length if out is None else out
            parts = [_lme(x.narrow(d, (j * length) // out, -(-(j + 1) * length // out) - (j * length) // out), d,
                          self.beta) for j in range(out)]
            return torch.stack(parts, dim=d)
        k, s, p, dil = self.kernel[i], self.stride[i], self.padding[i], self.dilation[i]
        span = dil * (k - 1) + 1
        num = length + 2 * p - span
        out = (-(-num // s) if self.ceil_mode else num // s) + 1
        if self.ceil_mode and (out - 1) * s >= length + p:
            out -= 1
        right = max(0, (out - 1) * s + span - length - p)
        if p or right:
            pad = [0, 0] * (x.ndim - 1 - d) + [p, right]
            x = F.pad(x, pad, value=float("-inf"))
        w = x.unfold(d, span, s)[..., ::dil]  # (..., out, ...) with the window last
        return _lme(w, -1, self.beta)

    def forward(self, x: Tensor) -> Tensor:
        for i in range(self.nd):
            x = self._pool_dim(x, x.ndim - self.nd + i, i)
        return x


_MAX_POOLS = (nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)


class _SurrogateSoftplus(nn.Softplus):
    """A Softplus that replaced a ReLU (so β changes never touch the model's own Softplus layers)."""


def _smooth(m: nn.Module, beta: float, pools: bool) -> nn.Module | None:
    if pools and isinstance(m, _MAX_POOLS) and not getattr(m, "return_indices", False):
        return _SoftMaxPool(m, beta)
    if isinstance(m, nn.ReLU):
        return _SurrogateSoftplus(beta=beta)
    if isinstance(m, nn.LeakyReLU):
        return _SoftLeaky(m.negative_slope, beta)
    if isinstance(m, nn.PReLU):
        return _SoftLeaky(m.weight.detach().clone(), beta)
    return None


def softplus_surrogate(model: nn.Module, beta: float, smooth_pools: bool = False) -> nn.Module:
    """A deep copy of ``model`` with ReLU → Softplus(β) and LeakyReLU/PReLU → their softplus analogue.

    The caller's model is not modified. Modules used several times (a shared ``self.relu``) map to one
    replacement. Functional rectifiers (``F.relu`` inside ``forward``, e.g. after ``norm5`` in
    torchvision's DenseNet) cannot be reached and stay piecewise linear; the other layers still give
    the map its curvature.

    Args:
        model: the network to smooth.
        beta: softplus sharpness β > 0 (larger: closer to ReLU), in inverse activation units.
        smooth_pools: also replace ``nn.MaxPool2d/3d`` and ``nn.AdaptiveMaxPool2d/3d`` (not those with
            ``return_indices``) by log-mean-exp pools over the same windows with the same β,
            ``(1/β)·log mean exp(β·x)``; :func:`set_softplus_beta` changes both. Functional
            ``F.max_pool2d`` calls cannot be reached and stay hard.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    _check_beta(beta)
    if not isinstance(smooth_pools, bool):
        raise TypeError(f"`smooth_pools` must be a bool, got {type(smooth_pools).__name__}")
    twin = copy.deepcopy(model)
    done: dict[int, nn.Module] = {}
    for parent in list(twin.modules()):
        # _modules, not named_children(): the latter skips a module registered twice under one parent
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) not in done:
                new = _smooth(child, beta, smooth_pools)
                if new is None:
                    continue
                done[id(child)] = new
            setattr(parent, name, done[id(child)])
    setattr(twin, BETA_ATTR, float(beta))
    return twin


def set_softplus_beta(surrogate: nn.Module, beta: float) -> None:
    """Change β of a surrogate made by :func:`softplus_surrogate` in place (cheap: no copy)."""
    if not hasattr(surrogate, BETA_ATTR):
        raise ValueError("`surrogate` was not made by softplus_surrogate()")
    _check_beta(beta)
    for m in surrogate.modules():
        if isinstance(m, (_SurrogateSoftplus, _SoftLeaky, _SoftMaxPool)):
            m.beta = float(beta)
    setattr(surrogate, BETA_ATTR, float(beta))


def beta_schedule(start: float, end: float, steps: int) -> list[float]:
    """Geometric β growth of Dombrowski et al.: β_i = start·(end/start)^(i/steps), i = 0..steps−1."""
    _check_beta(start)
    _check_beta(end)
    if int(steps) < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps}")
    return [float(start) * (float(end) / float(start)) ** (i / int(steps)) for i in range(int(steps))]


def _check_beta(beta: float) -> None:
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise TypeError(f"`beta` must be a number, got {type(beta).__name__}") from None
    if not b > 0 or b == float("inf"):
        raise ValueError(f"`beta` must be a finite number > 0, got {beta}")
