"""Gradient-based maps through captum: gradient, gradient×input, integrated gradients.

captum's ``compute_gradients`` calls ``torch.autograd.grad`` without ``create_graph``. For attacks we
swap the attribution object's ``gradient_func`` for one with ``create_graph=True`` (the workaround of
captum#652). Without it, Saliency is detached and InputXGradient / IntegratedGradients keep only the
first-order path through the ``× x`` factor, a silently wrong gradient (toolkits_api.md §5).

captum is imported when a map is first computed, not when medadv is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import AnyOf, Instance, Int, Options, Real
from .base import ClassScores, Explanation, register_explanation

__all__ = ["Gradient", "GradientXInput", "IntegratedGradients", "differentiable_gradient_func"]


def differentiable_gradient_func(create_graph: bool) -> Callable[..., tuple[Tensor, ...]]:
    """A drop-in for captum's ``compute_gradients`` that can keep the graph (double backprop)."""

    def gradient_func(forward_fn, inputs, target_ind=None, additional_forward_args=None):
        from captum._utils.common import _run_forward

        with torch.enable_grad():
            out = _run_forward(forward_fn, inputs, target_ind, additional_forward_args)
            # summing the per-sample scores gives each sample its own gradient (samples are independent)
            return torch.autograd.grad(out.sum(), inputs, create_graph=create_graph)

    return gradient_func


def _captum(cls: Any, model: nn.Module, create_graph: bool, **kw: Any) -> Any:
    method = cls(ClassScores(model), **kw)
    method.gradient_func = differentiable_gradient_func(create_graph)
    return method


@register_explanation("gradient")
class Gradient(Explanation):
    """Vanilla gradient saliency |∂f_c/∂x| (Simonyan et al., ICLR-W 2014), via captum ``Saliency``.

    No parameters.
    """

    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        from captum.attr import Saliency

        return _captum(Saliency, model, create_graph).attribute(x, target=target, abs=False)


@register_explanation("gradient_x_input")
class GradientXInput(Explanation):
    """Gradient × input x ⊙ ∂f_c/∂x (Shrikumar et al., 2016), via captum ``InputXGradient``. No parameters."""

    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        from captum.attr import InputXGradient

        return _captum(InputXGradient, model, create_graph).attribute(x, target=target)


#: captum's integration rules
IG_METHODS = ("riemann_right", "riemann_left", "riemann_middle", "riemann_trapezoid", "gausslegendre")


@register_explanation("integrated_gradients")
class IntegratedGradients(Explanation):
    """Integrated gradients (Sundararajan et al., ICML 2017), via captum ``IntegratedGradients``.

    (x − b) ⊙ (1/n) Σ_{k=1..n} ∇f_c(b + (k/n)(x − b)): the right Riemann sum with α_k = k/n, as in
    Zhang et al.'s code, multiplied by the input difference (standard IG; spec 002 ambiguity A8).

    Args:
        n_steps: number of interpolation points n (default 10, Zhang et al.).
        baseline: reference input b in data units, a number or a tensor broadcastable to ``x``
            (default 0: black for [0, 1] images; give the data's background value otherwise).
        method: captum integration rule (``"riemann_right"`` default; ``"riemann_left"``,
            ``"riemann_middle"``, ``"riemann_trapezoid"``, ``"gausslegendre"``).
    """

    params: ClassVar[dict[str, Any]] = {
        "n_steps": Int(low=1),
        "baseline": AnyOf(Real(), Instance(Tensor, text="a tensor broadcastable to x")),
        "method": Options(*IG_METHODS),
    }
    n_steps: int
    baseline: float | Tensor
    method: str

    def __init__(self, n_steps: int = 10, baseline: float | Tensor = 0.0, method: str = "riemann_right") -> None:
        self._init_params(locals())

    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        from captum.attr import IntegratedGradients as _CaptumIG

        b = self.baseline
        b = b.to(device=x.device, dtype=x.dtype).expand_as(x) if isinstance(b, Tensor) else float(b)
        ig = _captum(_CaptumIG, model, create_graph)
        return ig.attribute(x, baselines=b, target=target, n_steps=self.n_steps, method=self.method,
                            internal_batch_size=None)
