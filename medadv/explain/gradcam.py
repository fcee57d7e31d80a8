"""Grad-CAM for 2-D and 3-D layers via captum ``LayerGradCam`` with ``grad_kwargs={"create_graph": True}``.

Without ``grad_kwargs`` captum's map keeps a graph only through the layer activations, with the channel
weights detached: a partial, silently wrong gradient (toolkits_api.md §5). captum is imported when a map
is first computed.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from ..params import Bool
from .base import ClassScores, Explanation, LayerName, register_explanation
from .surrogate import BETA_ATTR

__all__ = ["GradCAM"]


def _resolve_layer(model: nn.Module, layer: str) -> nn.Module:
    modules = dict(model.named_modules())
    if layer == "auto":  # the last convolution: one setting for models whose layer names differ
        convs = [m for m in modules.values() if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d)]
        if not convs:
            raise ValueError("`layer: auto` found no convolution in the model: name the layer "
                             f"(e.g. {list(modules)[1:6]})")
        return convs[-1]
    if layer not in modules:
        raise ValueError(f"`layer` {layer!r} is not a submodule of the model; e.g. {list(modules)[1:6]}")
    return modules[layer]


@register_explanation("gradcam")
class GradCAM(Explanation):
    """Grad-CAM (Selvaraju et al., ICCV 2017) of a convolutional layer, upsampled to the input grid.

    map = act(Σ_k w_k A_k), w_k = spatial mean of ∂f_c/∂A_k, then bilinear (2-D) or trilinear (3-D)
    upsampling to the input size (``align_corners=False``), abs and L1 normalisation.

    ``act`` is ReLU on an ordinary model. On a softplus surrogate (:func:`softplus_surrogate`) it is the
    surrogate's softplus with the current β, so the map's own rectifier is smooth too (Zhang et al.'s
    code does the same).

    Args:
        layer: dotted name of the layer in the model (``model.named_modules()``), e.g.
            ``"features.norm5"`` for torchvision DenseNet-121 or ``"model.1.submodule"`` for MONAI. A
            name (not a module object) so the same explanation works on a deep-copied surrogate and can be
            written in a config (``{name: gradcam, layer: features.denseblock4}``); ``"auto"``: the model's last
            convolution (the same setting for models with different layer names).
        attribute_to_layer_input: use the layer's input instead of its output.
    """

    params: ClassVar[dict[str, Any]] = {"layer": LayerName(), "attribute_to_layer_input": Bool()}
    layer: str
    attribute_to_layer_input: bool

    def __init__(self, layer: str, attribute_to_layer_input: bool = False) -> None:
        self._init_params(locals())

    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        """Upsampled Grad-CAM map ``(N, 1, *spatial)`` (non-negative)."""
        from captum.attr import LayerGradCam

        layer = _resolve_layer(model, self.layer)
        cam = LayerGradCam(ClassScores(model), layer).attribute(
            x, target=target, relu_attributions=False,
            attribute_to_layer_input=self.attribute_to_layer_input,
            grad_kwargs={"create_graph": create_graph},
        )
        if cam.ndim != x.ndim:
            raise ValueError(
                f"Grad-CAM layer {self.layer!r} has output shape {tuple(cam.shape)}; it must be a convolutional "
                f"layer with the input's spatial rank ({x.ndim - 2}-D)"
            )
        beta = getattr(model, BETA_ATTR, None)
        cam = F.relu(cam) if beta is None else F.softplus(cam, beta=beta)
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[x.ndim - 2]
        return F.interpolate(cam, size=tuple(x.shape[2:]), mode=mode, align_corners=False)
