"""Guided Backprop and Guided Grad-CAM via captum: evaluation-only explanations.

Both maps come from captum (``GuidedBackprop``, ``GuidedGradCam``) and are post-processed like every
other map (abs, sum over channels, L1). They cannot drive the saliency attacks, which differentiate the
map w.r.t. the input (:meth:`~medadv.explain.Explanation.require_differentiable` refuses them):

* captum's guided backprop replaces the input gradient of every ``nn.ReLU`` *module* by its positive
  part with a backward hook. On a ReLU network the result depends on the input only through the ReLU
  on/off pattern (the weights are constants), so it is piecewise constant in ``x``: double backprop
  runs (with captum's ``gradient_func`` swapped for one with ``create_graph=True``) but returns exactly
  zero. The softplus surrogate the attacks use for second-order signal has no ``nn.ReLU`` left, so the
  hooks attach nowhere and captum silently returns the plain gradient — an attack would then move the
  vanilla-gradient map, not the guided one. Both facts are checked in ``tests/explain``.
* captum's ``GuidedGradCam`` multiplies that guided map by a ReLU-ed, upsampled Grad-CAM computed
  without ``grad_kwargs`` (its channel weights are detached): the product's input gradient is zero or
  partial.

Zhang et al. (2024) never attack these maps either: they evaluate Guided Grad-CAM on the images attacked
through Grad-CAM (transfer). Do the same: attack ``"gradient"`` / ``"gradcam"`` and evaluate
``"guided_backprop"`` / ``"guided_gradcam"`` on the returned images.

captum hooks ``nn.ReLU`` modules only: rectifiers applied functionally (``F.relu`` in ``forward``, e.g.
after ``norm5`` in torchvision's DenseNet) keep their ordinary gradient, and a model with no ``nn.ReLU``
module at all (LeakyReLU/PReLU/softplus networks) is refused, since its "guided" map would silently be
the plain gradient. captum is imported when a map is first computed.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from torch import Tensor, nn

from ..params import Bool, Options
from .base import ClassScores, Explanation, LayerName, register_explanation
from .gradcam import _resolve_layer

__all__ = ["GuidedBackprop", "GuidedGradCAM"]

_BECAUSE_GBP = (
    "captum's guided backprop rewrites nn.ReLU gradients with hooks, so on a ReLU network the map is piecewise "
    "constant in the input (its input gradient is exactly zero), and on the softplus surrogate there is no "
    "nn.ReLU to hook (the map silently becomes the plain gradient)"
)


#: captum warns on every call that it sets (and removes) backward hooks on ReLU modules
_HOOK_WARNING = "Setting backward hooks on ReLU activations"


def _require_relu_modules(model: nn.Module, what: str) -> None:
    if not any(isinstance(m, nn.ReLU) for m in model.modules()):
        raise ValueError(
            f"{what} rewrites the gradients of nn.ReLU modules and the model has none (rectifiers applied "
            "functionally, LeakyReLU/PReLU or smooth activations are not hooked by captum): its map would be the "
            "plain gradient; use the 'gradient' explanation for this model")


@register_explanation("guided_backprop")
class GuidedBackprop(Explanation):
    """Guided backpropagation (Springenberg et al., ICLR-W 2015), via captum ``GuidedBackprop``.

    The gradient of the class score in which every ``nn.ReLU`` passes back only positive gradients.
    Evaluation-only (see the module docstring): attacks refuse it; attack ``"gradient"`` and evaluate
    this map on the attacked images. No parameters.
    """

    differentiable = False
    not_differentiable_because = _BECAUSE_GBP
    attack_instead = "gradient"

    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        """captum's guided-backprop attribution, same shape as ``x``."""
        from captum.attr import GuidedBackprop as _CaptumGBP

        if create_graph:
            self.require_differentiable("create_graph=True")
        _require_relu_modules(model, "guided backprop")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_HOOK_WARNING)
            out: Tensor = _CaptumGBP(ClassScores(model)).attribute(x, target=target)
        return out


@register_explanation("guided_gradcam")
class GuidedGradCAM(Explanation):
    """Guided Grad-CAM (Selvaraju et al., ICCV 2017), via captum ``GuidedGradCam``.

    Guided backprop times the ReLU-ed Grad-CAM of ``layer`` upsampled to the input grid; then abs, sum
    over channels and L1-normalisation as for every map (captum's raw product and Zhang et al.'s product
    of two normalised maps agree after the final normalisation). Evaluation-only (see the module
    docstring): attacks refuse it; attack ``{name: gradcam, layer: ...}`` with the same layer and
    evaluate this map on the attacked images (Zhang et al.'s transfer protocol).

    Args:
        layer: dotted submodule name of a convolutional layer with the input's spatial rank (as for
            :class:`~medadv.explain.GradCAM`, e.g. ``"features.norm5"`` for torchvision DenseNet-121).
        attribute_to_layer_input: use the layer's input instead of its output.
        interpolate_mode: how Grad-CAM is upsampled: ``"linear"`` (default: bilinear for 2-D, trilinear
            for 3-D, as :class:`~medadv.explain.GradCAM` and Zhang et al.) or ``"nearest"`` (captum's
            default).
    """

    params: ClassVar[dict[str, Any]] = {
        "layer": LayerName(),
        "attribute_to_layer_input": Bool(),
        "interpolate_mode": Options("linear", "nearest"),
    }
    differentiable = False
    not_differentiable_because = (
        "it multiplies guided backprop (" + _BECAUSE_GBP + ") by a Grad-CAM whose channel weights captum detaches")
    attack_instead = "gradcam"
    layer: str
    attribute_to_layer_input: bool
    interpolate_mode: str

    def __init__(self, layer: str, attribute_to_layer_input: bool = False, interpolate_mode: str = "linear") -> None:
        self._init_params(locals())

    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        """captum's Guided Grad-CAM attribution, same shape as ``x``."""
        from captum.attr import GuidedGradCam as _CaptumGGC

        if create_graph:
            self.require_differentiable("create_graph=True")
        _require_relu_modules(model, "Guided Grad-CAM")
        layer = _resolve_layer(model, self.layer)
        mode = self.interpolate_mode
        if mode == "linear":
            mode = {1: "linear", 2: "bilinear", 3: "trilinear"}.get(x.ndim - 2, "linear")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_HOOK_WARNING)
            # captum returns an empty tensor (with a warning) when Grad-CAM cannot be upsampled to x
            warnings.filterwarnings("ignore", message="Couldn't appropriately interpolate GradCAM")
            out: Tensor = _CaptumGGC(ClassScores(model), layer).attribute(
                x, target=target, interpolate_mode=mode, attribute_to_layer_input=self.attribute_to_layer_input)
        if out.shape != x.shape:
            raise ValueError(
                f"Guided Grad-CAM layer {self.layer!r} could not be upsampled to the input {tuple(x.shape)}; it must "
                f"be a convolutional layer with the input's spatial rank ({x.ndim - 2}-D)")
        return out
