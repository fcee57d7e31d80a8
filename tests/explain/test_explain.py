"""Differentiable explanations: finite-difference checks of the double-backprop gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv.explain import (
    ClassScores,
    GradCAM,
    Gradient,
    GradientXInput,
    IntegratedGradients,
    SmoothGrad,
    beta_schedule,
    class_maps,
    set_softplus_beta,
    softplus_surrogate,
)


def _net(ndim: int = 2, in_ch: int = 2, out: int = 3) -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Conv2d if ndim == 2 else nn.Conv3d
    pool = nn.AdaptiveAvgPool2d if ndim == 2 else nn.AdaptiveAvgPool3d
    return nn.Sequential(
        conv(in_ch, 4, 3, padding=1), nn.ReLU(), conv(4, 4, 3, padding=1, stride=2), nn.ReLU(),
        pool(1), nn.Flatten(), nn.Linear(4, out),
    ).double().eval()


METHODS = [
    Gradient(),
    GradientXInput(),
    IntegratedGradients(n_steps=4),
    SmoothGrad(n_samples=3, sigma=0.05, seed=1),  # sigma relative to each sample's range
    GradCAM("2"),
]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
@pytest.mark.parametrize("ndim", [2, 3])
def test_double_backprop_matches_finite_differences(method, ndim):
    model = softplus_surrogate(_net(ndim), beta=3.0)
    size = (6, 6) if ndim == 2 else (4, 4, 4)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 2, *size, generator=g, dtype=torch.float64)
    w = torch.rand(2, *size, generator=g, dtype=torch.float64)  # a fixed linear read-out of the map
    v = torch.randn(x.shape, generator=g, dtype=torch.float64)
    target = torch.tensor([0, 2])

    def loss(z, create_graph=False):
        return (method.compute(model, z, target, create_graph=create_graph) * w).sum()

    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(xg, create_graph=True), xg)
    h = 1e-5
    fd = (loss(x + h * v) - loss(x - h * v)) / (2 * h)
    analytic = (grad * v).sum()
    assert analytic.abs() > 1e-8  # the map really depends on x through second-order terms
    torch.testing.assert_close(analytic, fd, rtol=1e-4, atol=1e-9)


def test_maps_are_normalised_and_shaped(trained_seg2d):
    m = Gradient()(trained_seg2d.model, trained_seg2d.x[:3], 1)
    assert m.shape == (3, 32, 32)
    assert (m >= 0).all()
    torch.testing.assert_close(m.flatten(1).sum(1), torch.ones(3))


def test_without_create_graph_the_map_is_detached():
    model = softplus_surrogate(_net(), beta=3.0)
    x = torch.rand(1, 2, 6, 6, dtype=torch.float64, requires_grad=True)
    for method in METHODS:
        assert not method(model, x, 0).requires_grad
        assert method(model, x, 0, create_graph=True).requires_grad
    assert x.requires_grad and x.grad is None


def test_relu_net_has_zero_second_order_gradient_but_surrogate_does_not():
    net = _net()
    x = torch.rand(1, 2, 6, 6, dtype=torch.float64, requires_grad=True)
    (g_relu,) = torch.autograd.grad(Gradient().compute(net, x, torch.tensor([0]), create_graph=True).pow(2).sum(), x,
                                    allow_unused=True)
    assert g_relu is None or g_relu.abs().max() < 1e-12
    smooth = softplus_surrogate(net, beta=5.0)
    (g_sp,) = torch.autograd.grad(Gradient().compute(smooth, x, torch.tensor([0]), create_graph=True).pow(2).sum(), x)
    assert g_sp.abs().max() > 1e-8


def test_captum_default_gradient_is_partial_and_ours_is_full():
    """The trap of toolkits_api.md §5: captum's unpatched InputXGradient differentiates only through × x."""
    from captum.attr import InputXGradient

    model = softplus_surrogate(_net(), beta=3.0)
    x = torch.rand(1, 2, 6, 6, dtype=torch.float64, requires_grad=True)
    raw = InputXGradient(ClassScores(model)).attribute(x, target=0)
    (g_partial,) = torch.autograd.grad(raw.pow(2).sum(), x)
    ours = GradientXInput().attribute(model, x, torch.tensor([0]), create_graph=True)
    torch.testing.assert_close(ours.detach(), raw.detach())  # same map ...
    (g_full,) = torch.autograd.grad(ours.pow(2).sum(), x)
    assert (g_full - g_partial).abs().max() > 1e-3 * g_full.abs().max()  # ... different gradient


def test_gradcam_matches_hand_written_double_backprop():
    model = softplus_surrogate(_net(), beta=3.0)
    x = torch.rand(2, 2, 6, 6, dtype=torch.float64, requires_grad=True)
    acts = {}
    h = model[2].register_forward_hook(lambda m, i, o: acts.__setitem__("a", o))
    score = model(x)[:, 1].sum()
    a = acts["a"]
    h.remove()
    (ga,) = torch.autograd.grad(score, a, create_graph=True)
    cam = nn.functional.softplus((ga.mean((2, 3), keepdim=True) * a).sum(1, keepdim=True), beta=3.0)
    cam = nn.functional.interpolate(cam, size=(6, 6), mode="bilinear", align_corners=False)
    ref = cam[:, 0] / cam.sum((1, 2, 3)).reshape(-1, 1, 1)
    ours = GradCAM("2").compute(model, x, torch.tensor([1, 1]), create_graph=True)
    torch.testing.assert_close(ours, ref)
    (g1,) = torch.autograd.grad(ours.pow(2).sum(), x, retain_graph=True)
    (g2,) = torch.autograd.grad(ref.pow(2).sum(), x)
    torch.testing.assert_close(g1, g2)


def test_surrogate_is_a_copy_and_beta_changes():
    net = _net()
    before = [type(m) for m in net.modules()]
    s = softplus_surrogate(net, beta=2.0)
    assert [type(m) for m in net.modules()] == before
    assert not any(isinstance(m, nn.ReLU) for m in s.modules())
    x = torch.rand(1, 2, 6, 6, dtype=torch.float64)
    set_softplus_beta(s, 1e4)  # a very sharp softplus is ReLU to numerical precision
    torch.testing.assert_close(s(x), net(x), rtol=1e-3, atol=1e-3)
    assert all(m.beta == 1e4 for m in s.modules() if isinstance(m, nn.Softplus))
    with pytest.raises(ValueError, match="beta"):
        softplus_surrogate(net, beta=0.0)


def test_surrogate_handles_prelu_and_shared_modules():
    act = nn.ReLU()
    net = nn.Sequential(nn.Conv2d(1, 2, 3), act, nn.Conv2d(2, 2, 3), act, nn.PReLU(), nn.Flatten())
    s = softplus_surrogate(net, beta=1e4)
    assert s[1] is s[3] and isinstance(s[1], nn.Softplus)
    x = torch.randn(1, 1, 7, 7)
    torch.testing.assert_close(s(x), net(x), rtol=1e-3, atol=1e-3)


def test_beta_schedule_is_geometric():
    b = beta_schedule(10, 100, 4)
    assert b[0] == 10 and len(b) == 4
    torch.testing.assert_close(torch.tensor(b[2]), torch.tensor(10 * 10**0.5))


def test_class_maps_multilabel(trained_multilabel):
    maps = class_maps(Gradient(), trained_multilabel.model, trained_multilabel.x[:2])
    assert maps.shape == (2, 4, 16, 16)
    torch.testing.assert_close(maps.flatten(2).sum(2), torch.ones(2, 4))
    assert not torch.allclose(maps[:, 0], maps[:, 1])


def test_bad_inputs_raise():
    net = _net()
    x = torch.rand(1, 2, 6, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="target"):
        Gradient()(net, x, 7)
    with pytest.raises(TypeError, match="target"):
        Gradient()(net, x, 0.5)
    with pytest.raises(ValueError, match="NaN"):
        Gradient()(net, x * float("nan"), 0)
    with pytest.raises(ValueError, match="layer"):
        GradCAM("nope")(net, x, 0)
    with pytest.raises(ValueError, match="n_steps"):
        IntegratedGradients(n_steps=0)


def test_gradcam_3d_per_class_maps_on_monai_unet(trained_seg3d):
    """Per-class Grad-CAM maps of a 3-D MONAI segmenter, differentiable through its PReLU surrogate."""
    t = trained_seg3d
    cam = GradCAM("model.1.submodule")
    maps = class_maps(cam, t.model, t.x[:1], classes=[1, 2])
    assert maps.shape == (1, 2, 16, 16, 16)
    assert not torch.allclose(maps[:, 0], maps[:, 1])
    smooth = softplus_surrogate(t.model, beta=10.0)
    x = t.x[:1].clone().requires_grad_(True)
    (g,) = torch.autograd.grad(cam.compute(smooth, x, torch.tensor([1]), create_graph=True).pow(2).sum(), x)
    assert torch.isfinite(g).all() and g.abs().max() > 0


def test_set_softplus_beta_leaves_the_models_own_softplus_alone():
    from torch import nn

    from medadv.explain import set_softplus_beta, softplus_surrogate

    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.Softplus(beta=1.0))
    s = softplus_surrogate(m, 10.0)
    set_softplus_beta(s, 50.0)
    assert s[1].beta == 50.0 and s[3].beta == 1.0


# --- attack mode at the entry points (issue 13 §8) ------------------------------------------------------------------
class _TrainModeNet(nn.Module):
    """BatchNorm (running statistics) and dropout: both change the output in train mode."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5),
                                      nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))

    def forward(self, x):
        return self.head(self.features(x))


@pytest.mark.parametrize("method", [Gradient(), GradientXInput(), IntegratedGradients(n_steps=3),
                                    SmoothGrad(n_samples=2), GradCAM("features.4")], ids=lambda m: m.name)
def test_entry_points_run_a_train_mode_model_in_eval_mode_and_restore_it(method):
    net = _TrainModeNet()
    with torch.no_grad():  # non-trivial running statistics
        net.features[1].running_mean.uniform_(-0.5, 0.5)
        net.features[1].running_var.uniform_(0.5, 2.0)
    net.train()
    net.head[2].weight.requires_grad_(False)  # a mixed requires_grad pattern must come back as it was
    state = {k: v.clone() for k, v in net.state_dict().items()}
    flags = [p.requires_grad for p in net.parameters()]
    x = torch.rand(2, 2, 6, 6, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0, 2])

    maps = [method(net, x, t), method.compute(net, x, t), class_maps(method, net, x, classes=[0, 2])[:, 0]]
    assert all(m.training for m in net.modules())
    assert [p.requires_grad for p in net.parameters()] == flags
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())  # BN statistics untouched
    assert all(p.grad is None for p in net.parameters())
    ref = method.map(net.eval(), x, t)  # the eval-mode map
    torch.testing.assert_close(maps[0], ref)
    torch.testing.assert_close(maps[1], ref)
    torch.testing.assert_close(maps[2][0], ref[0])
    # in train mode (dropout, batch statistics) the map would differ: the test above is not vacuous
    assert not torch.allclose(method.map(net.train(), x, t), ref)


# --- declared parameters and the registry -----------------------------------------------------------------------------
def test_registry_builds_by_name_and_mapping_with_did_you_mean():
    from medadv.explain import available_explanations, get_explanation
    from medadv.params import InvalidParameterError

    assert available_explanations() == ["gradcam", "gradient", "gradient_x_input", "guided_backprop", "guided_gradcam",
                                       "integrated_gradients", "smoothgrad", "xrai"]
    assert isinstance(get_explanation("Gradient"), Gradient)
    cam = get_explanation({"name": "gradcam", "layer": "features.denseblock4"})
    assert isinstance(cam, GradCAM) and cam.layer == "features.denseblock4"
    sg = get_explanation("smoothgrad", n_samples=4, sigma=0.1)
    assert (sg.n_samples, sg.sigma, sg.relative) == (4, 0.1, True)
    for e in (cam, sg, IntegratedGradients(n_steps=3, method="gausslegendre"), Gradient()):
        again = get_explanation(e.config())
        assert type(again) is type(e) and again.get_params() == e.get_params()
        assert again.fingerprint() == e.fingerprint()
    assert GradCAM("a").fingerprint() != GradCAM("b").fingerprint()
    with pytest.raises(InvalidParameterError, match="did you mean 'gradcam'"):
        get_explanation("grad_cam")
    with pytest.raises(InvalidParameterError, match="requires `layer`"):
        get_explanation("gradcam")
    with pytest.raises(InvalidParameterError, match="did you mean 'n_samples'"):
        get_explanation({"name": "smoothgrad", "nsamples": 3})
    with pytest.raises(InvalidParameterError, match="needs a `name`"):
        get_explanation({"layer": "x"})


def test_explanation_params_are_declared_and_validated():
    from medadv.params import InvalidParameterError

    for cls in (Gradient, GradientXInput, IntegratedGradients, SmoothGrad, GradCAM):
        cls.check_declarations()
    with pytest.raises(InvalidParameterError, match="`n_steps` of IntegratedGradients must be an integer >= 1; got 2.5"):
        IntegratedGradients(n_steps=2.5)
    with pytest.raises(InvalidParameterError, match="did you mean 'riemann_left'"):
        IntegratedGradients(method="riemann_lft")
    with pytest.raises(InvalidParameterError, match="sigma"):
        SmoothGrad(sigma=-0.1)
    with pytest.raises(InvalidParameterError, match="layer"):
        GradCAM("")
    assert repr(SmoothGrad(n_samples=4)) == "SmoothGrad(n_samples=4)"


def test_smoothgrad_sigma_is_relative_to_each_samples_range():
    net = _net()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 2, 6, 6, generator=g, dtype=torch.float64)
    x[1] *= 0.3  # a second sample with a smaller range
    t = torch.tensor([0, 1])
    span = x.flatten(1).amax(1) - x.flatten(1).amin(1)
    rel = SmoothGrad(n_samples=3, sigma=0.2, seed=1).compute(net, x, t)
    for i in range(2):
        absolute = SmoothGrad(n_samples=3, sigma=0.2 * float(span[i]), relative=False, seed=1).compute(net, x, t)
        torch.testing.assert_close(rel[i], absolute[i])
    assert not torch.allclose(rel, SmoothGrad(n_samples=3, sigma=0.2, relative=False, seed=1).compute(net, x, t))

    # unit-free: the same data in other units (x 1000, e.g. a different intensity scale) gives the same map
    class Rescale(nn.Module):
        def forward(self, z):
            return z / 1000.0

    scaled = nn.Sequential(Rescale(), net)
    torch.testing.assert_close(SmoothGrad(n_samples=3, sigma=0.2, seed=1).compute(scaled, x * 1000.0, t), rel)


def test_import_medadv_does_not_import_captum():
    import subprocess
    import sys

    code = ("import sys, medadv, medadv.explain; assert 'captum' not in sys.modules, 'captum imported'; "
            "import torch; medadv.explain.Gradient().compute(torch.nn.Sequential(torch.nn.Flatten(), "
            "torch.nn.Linear(4, 2)), torch.rand(1, 1, 2, 2), torch.tensor([0])); assert 'captum' in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_explanations_give_the_attacks_clear_errors():
    from medadv.explain import Gradient
    from medadv.models import small_cnn

    model = small_cnn(1, 4).eval()
    with pytest.raises(ValueError, match=r"has no batch dimension.*x.unsqueeze\(0\)"):
        Gradient()(model, torch.rand(1, 16, 16), 0)
    with pytest.raises(ValueError, match="`x` is on the meta device"):
        Gradient()(model, torch.rand(2, 1, 16, 16, device="meta"), 0)
    with pytest.raises(ValueError, match="`model` has parameters on the meta device"):
        Gradient()(small_cnn(1, 4).to("meta"), torch.rand(2, 1, 16, 16), 0)
