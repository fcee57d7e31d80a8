"""Softplus surrogate of a piecewise-linear network, for second-order gradients.

For ReLU networks the input Hessian is zero almost everywhere, so the gradient of a gradient-based map
w.r.t. the input vanishes (Ghorbani et al., AAAI 2019; Dombrowski et al., NeurIPS 2019). Explanation
attacks therefore differentiate a copy in which every rectifier is replaced by softplus with
sharpness β (softplus_β → ReLU as β → ∞), usually with β grown geometrically during the attack, and
evaluate the result on the original network.
"""

from __future__ import annotations

import copy

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


class _SurrogateSoftplus(nn.Softplus):
    """A Softplus that replaced a ReLU (so β changes never touch the model's own Softplus layers)."""


def _smooth(m: nn.Module, beta: float) -> nn.Module | None:
    if isinstance(m, nn.ReLU):
        return _SurrogateSoftplus(beta=beta)
    if isinstance(m, nn.LeakyReLU):
        return _SoftLeaky(m.negative_slope, beta)
    if isinstance(m, nn.PReLU):
        return _SoftLeaky(m.weight.detach().clone(), beta)
    return None


def softplus_surrogate(model: nn.Module, beta: float) -> nn.Module:
    """A deep copy of ``model`` with ReLU → Softplus(β) and LeakyReLU/PReLU → their softplus analogue.

    The caller's model is not modified. Modules used several times (a shared ``self.relu``) map to one
    replacement. Functional rectifiers (``F.relu`` inside ``forward``, e.g. after ``norm5`` in
    torchvision's DenseNet) cannot be reached and stay piecewise linear; the other layers still give
    the map its curvature.

    Args:
        model: the network to smooth.
        beta: softplus sharpness β > 0 (larger: closer to ReLU).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    _check_beta(beta)
    twin = copy.deepcopy(model)
    done: dict[int, nn.Module] = {}
    for parent in list(twin.modules()):
        # _modules, not named_children(): the latter skips a module registered twice under one parent
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) not in done:
                new = _smooth(child, beta)
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
        if isinstance(m, (_SurrogateSoftplus, _SoftLeaky)):
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
