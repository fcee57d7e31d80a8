"""Saliency maps, captum-based where captum allows it: differentiable ones (double backprop) for attacks,
and evaluation-only ones (Guided Backprop, Guided Grad-CAM, XRAI: ``Explanation.differentiable`` is False).

captum is imported when a captum-based map is first computed, not by ``import medadv``.
"""

from .base import (
    ClassScores,
    Explanation,
    as_target,
    available_explanations,
    class_maps,
    explanation_class,
    get_explanation,
    normalize_map,
    register_explanation,
)
from .gradcam import GradCAM
from .gradient import Gradient, GradientXInput, IntegratedGradients, differentiable_gradient_func
from .guided import GuidedBackprop, GuidedGradCAM
from .smoothgrad import SmoothGrad
from .surrogate import beta_schedule, set_softplus_beta, softplus_surrogate
from .xrai import XRAI, xrai_rank, xrai_segments

__all__ = [
    "Explanation",
    "ClassScores",
    "normalize_map",
    "class_maps",
    "as_target",
    "register_explanation",
    "explanation_class",
    "get_explanation",
    "available_explanations",
    "Gradient",
    "GradientXInput",
    "IntegratedGradients",
    "GradCAM",
    "GuidedBackprop",
    "GuidedGradCAM",
    "SmoothGrad",
    "XRAI",
    "xrai_segments",
    "xrai_rank",
    "softplus_surrogate",
    "set_softplus_beta",
    "beta_schedule",
    "differentiable_gradient_func",
]
