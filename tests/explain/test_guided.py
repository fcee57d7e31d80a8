"""Guided Backprop and Guided Grad-CAM: captum's maps, evaluation-only (refused where a gradient is needed)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from medadv.explain import (
    ClassScores,
    Gradient,
    GuidedBackprop,
    GuidedGradCAM,
    differentiable_gradient_func,
    get_explanation,
    normalize_map,
    softplus_surrogate,
)
from medadv.params import InvalidParameterError


def _net(ndim: int = 2) -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Conv2d if ndim == 2 else nn.Conv3d
    pool = nn.AdaptiveAvgPool2d if ndim == 2 else nn.AdaptiveAvgPool3d
    return nn.Sequential(
        conv(2, 4, 3, padding=1), nn.ReLU(), conv(4, 4, 3, padding=1, stride=2), nn.ReLU(inplace=True),
        pool(1), nn.Flatten(), nn.Linear(4, 3),
    ).double().eval()


def _x(ndim: int = 2) -> torch.Tensor:
    size = (8, 8) if ndim == 2 else (6, 6, 6)
    return torch.rand(2, 2, *size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _captum(cls, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(*args).attribute(**kw)


def test_guided_backprop_is_captums_map_and_not_the_plain_gradient():
    from captum.attr import GuidedBackprop as CaptumGBP

    net, x, t = _net(), _x(), torch.tensor([0, 2])
    ours = GuidedBackprop()(net, x, t)
    ref = normalize_map(_captum(CaptumGBP, ClassScores(net), inputs=x, target=t))
    torch.testing.assert_close(ours, ref)
    assert not torch.allclose(ours, Gradient()(net, x, t))  # the ReLU hooks did change the gradient
    torch.testing.assert_close(ours.flatten(1).sum(1), torch.ones(2, dtype=ours.dtype))


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_guided_gradcam_is_captums_map(ndim, mode):
    from captum.attr import GuidedGradCam as CaptumGGC

    net, x, t = _net(ndim), _x(ndim), torch.tensor([1, 0])
    ours = GuidedGradCAM("2", interpolate_mode=mode)(net, x, t)
    captum_mode = mode if mode == "nearest" else {2: "bilinear", 3: "trilinear"}[ndim]
    ref = normalize_map(_captum(CaptumGGC, ClassScores(net), net[2], inputs=x, target=t, interpolate_mode=captum_mode))
    torch.testing.assert_close(ours, ref)
    assert ours.shape == (2, *x.shape[2:]) and (ours > 0).any()
    assert not torch.allclose(ours, GuidedBackprop()(net, x, t))  # the Grad-CAM factor is applied


def test_guided_maps_refuse_create_graph_and_say_what_to_use_instead():
    net, x = _net(), _x()
    with pytest.raises(InvalidParameterError, match=r"'guided_backprop' is evaluation-only.*attack 'gradient' instead"):
        GuidedBackprop()(net, x, 0, create_graph=True)
    with pytest.raises(InvalidParameterError, match=r"'guided_gradcam' is evaluation-only.*attack 'gradcam' instead"):
        GuidedGradCAM("2").compute(net, x, torch.tensor([0, 0]), create_graph=True)
    with pytest.raises(InvalidParameterError, match="evaluation-only"):
        GuidedBackprop().attribute(net, x.requires_grad_(True), torch.tensor([0, 0]), create_graph=True)
    assert not GuidedBackprop.differentiable and not GuidedGradCAM.differentiable
    assert Gradient.differentiable


def test_why_captums_guided_backprop_is_evaluation_only():
    """The docstring's two facts: zero input gradient on ReLU nets, plain gradient on the softplus surrogate."""
    from captum.attr import GuidedBackprop as CaptumGBP
    from captum.attr import Saliency

    net = _net()
    for p in net.parameters():
        p.requires_grad_(False)
    x = _x().requires_grad_(True)
    gbp = CaptumGBP(ClassScores(net))
    gbp.gradient_func = differentiable_gradient_func(True)  # the double-backprop recipe of the other maps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attr = gbp.attribute(x, target=0)
    assert attr.requires_grad  # the graph is kept ...
    (g,) = torch.autograd.grad(attr.pow(2).sum(), x)
    assert torch.count_nonzero(g) == 0  # ... but the map is piecewise constant in x: no signal for an attack
    smooth = ClassScores(softplus_surrogate(net, beta=5.0))
    xs = x.detach().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        guided_on_surrogate = CaptumGBP(smooth).attribute(xs, target=0)
    plain = Saliency(smooth).attribute(xs, target=0, abs=False)
    torch.testing.assert_close(guided_on_surrogate, plain)  # no nn.ReLU left to hook


def test_models_without_relu_modules_are_refused():
    torch.manual_seed(0)
    leaky = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.LeakyReLU(), nn.Flatten(), nn.Linear(4 * 64, 3)).double()
    for expl in (GuidedBackprop(), GuidedGradCAM("0")):
        with pytest.raises(ValueError, match="nn.ReLU modules.*'gradient' explanation"):
            expl(leaky, _x(), 0)


def test_guided_gradcam_bad_layer_and_registry():
    net, x = _net(), _x()
    with pytest.raises(ValueError, match="not a submodule"):
        GuidedGradCAM("nope")(net, x, 0)
    with pytest.raises(ValueError, match="could not be upsampled"):
        GuidedGradCAM("5")(net, x, 0)  # the flattened output of the pooling layer
    ggc = get_explanation({"name": "guided_gradcam", "layer": "2", "interpolate_mode": "nearest"})
    assert isinstance(ggc, GuidedGradCAM) and ggc.layer == "2" and ggc.interpolate_mode == "nearest"
    again = get_explanation(ggc.config())
    assert again.fingerprint() == ggc.fingerprint() != GuidedGradCAM("2").fingerprint()
    assert isinstance(get_explanation("guided_backprop"), GuidedBackprop)
    with pytest.raises(InvalidParameterError, match="requires `layer`"):
        get_explanation("guided_gradcam")
    with pytest.raises(InvalidParameterError, match="interpolate_mode"):
        GuidedGradCAM("2", interpolate_mode="cubic")
    GuidedBackprop.check_declarations()
    GuidedGradCAM.check_declarations()
