"""Differentiable saliency maps (double backprop), captum-based where captum allows it."""

from .base import ClassScores, Explanation, as_target, class_maps, normalize_map
from .gradcam import GradCAM
from .gradient import Gradient, GradientXInput, IntegratedGradients, differentiable_gradient_func
from .smoothgrad import SmoothGrad
from .surrogate import beta_schedule, set_softplus_beta, softplus_surrogate

__all__ = [
    "Explanation",
    "ClassScores",
    "normalize_map",
    "class_maps",
    "as_target",
    "Gradient",
    "GradientXInput",
    "IntegratedGradients",
    "GradCAM",
    "SmoothGrad",
    "softplus_surrogate",
    "set_softplus_beta",
    "beta_schedule",
    "differentiable_gradient_func",
]
