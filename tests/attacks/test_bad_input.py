"""Bad input gets a clear ValueError/TypeError naming the argument, never a silent fix or a deep stack."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv.attacks.base import attack_class, available_attacks, get_attack
from medadv.attacks.fgsm import FGSM
from medadv.attacks.gradient import GradientAttack
from medadv.attacks.pgd import PGD
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import L2, Linf

# every registered attack of the gradient family (a new one is covered without editing this file)
GRADIENT_FAMILY = [attack_class(n) for n in available_attacks() if issubclass(attack_class(n), GradientAttack)]


def _cls_model(out: int = 3, channels: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, out))


def _seg_model(classes: int = 3, ndim: int = 2) -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Conv2d if ndim == 2 else nn.Conv3d
    return conv(1, classes, 3, padding=1)


def _atk(cls, task, eps=0.1, bounds=(0.0, 1.0), **kw):
    kw = {} if cls is FGSM else {"steps": 2, **kw}
    return cls(task, Linf(eps, bounds=bounds), **kw)


@pytest.fixture
def mc():
    return _cls_model(3), torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 1])


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input(cls, bad, mc):
    model, x, y = mc
    x = x.clone()
    x[1, 0, 2, 3] = bad
    with pytest.raises(ValueError, match=r"`x` contains NaN or Inf"):
        _atk(cls, MultiClass(), bounds=None)(model, x, y)


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
def test_empty_batch(cls, mc):
    model, _, _ = mc
    with pytest.raises(ValueError, match=r"`x` is an empty batch"):
        _atk(cls, MultiClass())(model, torch.rand(0, 1, 8, 8), torch.zeros(0, dtype=torch.long))


def test_x_type_dtype_and_rank(mc):
    model, x, y = mc
    atk = _atk(PGD, MultiClass())
    with pytest.raises(TypeError, match=r"`x` must be a torch.Tensor"):
        atk(model, x.numpy(), y)
    with pytest.raises(TypeError, match=r"`x` must be a floating-point tensor"):
        atk(model, (x * 255).to(torch.uint8), y)
    with pytest.raises(ValueError, match=r"`x` must be batch-first"):
        atk(model, x[0, 0, 0], y)


def test_model_type(mc):
    _, x, y = mc
    with pytest.raises(TypeError, match=r"`model` must be a torch.nn.Module"):
        _atk(PGD, MultiClass())(lambda t: t, x, y)


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
def test_input_outside_bounds(cls, mc):
    model, x, y = mc
    with pytest.raises(ValueError, match=r"`x` has values in .* outside the declared bounds"):
        _atk(cls, MultiClass())(model, x * 2.0 + 0.5, y)
    # HU-valued CT declared as [0, 1] is refused rather than clipped
    with pytest.raises(ValueError, match=r"outside the declared bounds"):
        _atk(cls, MultiClass())(model, x * 1000.0 - 1000.0, y)


def test_per_channel_bounds_outside_and_misshaped():
    model = _cls_model(3, channels=2)
    x = torch.rand(2, 2, 8, 8)
    lo, hi = torch.tensor([0.0, 0.5]).reshape(2, 1, 1), torch.tensor([1.0, 2.0]).reshape(2, 1, 1)
    with pytest.raises(ValueError, match=r"outside the declared bounds"):
        PGD(MultiClass(), Linf(0.1, bounds=(lo, hi)), steps=1)(model, x, torch.tensor([0, 1]))
    lo5 = torch.zeros(1, 2, 1, 1, 1)
    with pytest.raises(ValueError, match=r"`bounds` tensors of shape \(1, 2, 1, 1, 1\) do not broadcast"):
        PGD(MultiClass(), Linf(0.1, bounds=(lo5, lo5 + 1)), steps=1)(model, x, torch.tensor([0, 1]))


@pytest.mark.parametrize("eps", [-0.1, float("nan"), float("inf")])
@pytest.mark.parametrize("threat", [Linf, L2])
def test_bad_eps(threat, eps):
    with pytest.raises(ValueError, match=r"`eps` must be a finite number >= 0"):
        threat(eps, bounds=(0, 1))


def test_bad_eps_type_and_bounds():
    with pytest.raises(TypeError, match=r"`eps` must be a number"):
        Linf("big", bounds=(0, 1))
    with pytest.raises(ValueError, match=r"`bounds` must satisfy lo < hi"):
        Linf(0.1, bounds=(1, 0))
    with pytest.raises(TypeError, match=r"`bounds` must be a \(lo, hi\) pair"):
        Linf(0.1, bounds=(0, 1, 2))
    with pytest.raises(ValueError, match=r"`bounds` hi must be finite"):
        Linf(0.1, bounds=(0, float("inf")))
    with pytest.raises(TypeError, match=r"bounds"):
        Linf(0.1)  # bounds are required: medadv never assumes [0, 1]


def test_bad_hyper_parameters():
    task, threat = MultiClass(), Linf(0.1, bounds=(0, 1))
    with pytest.raises(ValueError, match=r"`steps` of PGD must be an integer >= 1; got 0"):
        PGD(task, threat, steps=0)
    with pytest.raises(ValueError, match=r"`restarts` of PGD must be an integer >= 1"):
        PGD(task, threat, restarts=0)
    with pytest.raises(ValueError, match=r"`check_every` of PGD must be an integer >= 1"):
        PGD(task, threat, check_every=0)
    with pytest.raises(ValueError, match=r"`step_size` of PGD must be None or a finite number >= 0; got -1.0"):
        PGD(task, threat, step_size=-1.0)
    with pytest.raises(TypeError, match=r"`threat` of PGD must be a Linf or L2 threat with bounds, got None"):
        PGD(task, None)
    with pytest.raises(TypeError, match=r"`task` must be a medadv Task"):
        PGD("multiclass", threat)
    with pytest.raises(TypeError, match=r"`threat` of PGD must be a Linf or L2 threat"):
        PGD(task, 0.1)
    with pytest.raises(ValueError, match=r"unknown attack 'pgdd'; did you mean 'pgd'\?"):
        get_attack("pgdd", task=task, threat=threat)


# --- labels ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
def test_multiclass_labels(cls, mc):
    model, x, y = mc
    atk = _atk(cls, MultiClass())
    with pytest.raises(ValueError, match=r"`y` must have shape \(4,\)"):
        atk(model, x, y[:3])
    with pytest.raises(ValueError, match=r"`y` must have shape \(4,\)"):
        atk(model, x, y.reshape(4, 1))
    with pytest.raises(TypeError, match=r"`y` must hold integer class indices"):
        atk(model, x, y.float())
    with pytest.raises(ValueError, match=r"`y` has labels out of range \[0, 2\]"):
        atk(model, x, torch.tensor([0, 1, 3, 1]))
    with pytest.raises(ValueError, match=r"`y` has labels out of range"):
        atk(model, x, torch.tensor([0, -1, 2, 1]))
    with pytest.raises(TypeError, match=r"`y` must be a torch.Tensor"):
        atk(model, x, [0, 1, 2, 1])


def test_targeted_needs_target(mc):
    model, x, _ = mc
    with pytest.raises(ValueError, match=r"`y` \(the target\) is required for a targeted attack"):
        PGD(MultiClass(), Linf(0.1, bounds=(0, 1)), steps=1, targeted=True)(model, x)


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
def test_multilabel_labels(cls):
    model, x = _cls_model(5), torch.rand(3, 1, 8, 8)
    atk = _atk(cls, MultiLabel())
    with pytest.raises(ValueError, match=r"`y` must be multi-hot with shape \(3, 5\)"):
        atk(model, x, torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"`y` must be multi-hot with shape \(3, 5\)"):
        atk(model, x, torch.zeros(3, dtype=torch.long))  # class indices passed to a multi-label task
    with pytest.raises(ValueError, match=r"`y` must contain only 0 and 1"):
        atk(model, x, torch.full((3, 5), 0.5))
    with pytest.raises(ValueError, match=r"`y` contains NaN or Inf"):
        atk(model, x, torch.full((3, 5), float("nan")))


@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
@pytest.mark.parametrize("ndim", [2, 3])
def test_segmentation_labels(cls, ndim):
    model = _seg_model(3, ndim)
    x = torch.rand(2, 1, *([6] * ndim))
    atk = _atk(cls, Segmentation(3))
    good = torch.zeros(2, *([6] * ndim), dtype=torch.long)
    with pytest.raises(TypeError, match=r"`y` must be an integer label map"):
        atk(model, x, good.float())
    with pytest.raises(ValueError, match=r"`y` must have shape"):
        atk(model, x, good[:, :5])
    with pytest.raises(ValueError, match=r"`y` must have shape"):
        atk(model, x, good.unsqueeze(1))  # channel dim left in
    bad = good.clone()
    bad[0, 0] = 3
    with pytest.raises(ValueError, match=r"`y` has labels out of range \[0, 2\]"):
        atk(model, x, bad)
    # ignore_index is allowed, any other out-of-range value is not
    ig = good.clone()
    ig[0, 0] = 255
    _atk(cls, Segmentation(3, ignore_index=255))(model, x, ig)
    with pytest.raises(ValueError, match=r"\(ignore_index=255\)"):
        _atk(cls, Segmentation(3, ignore_index=255))(model, x, bad)


# --- model output that does not fit the task ------------------------------------------------------------------
@pytest.mark.parametrize("cls", GRADIENT_FAMILY)
def test_model_output_does_not_fit_task(cls):
    x = torch.rand(2, 1, 6, 6)
    with pytest.raises(ValueError, match=r"model output must be \(N, 3, \*spatial\)"):
        _atk(cls, Segmentation(3))(_cls_model(3), x, None)  # classifier given to a segmentation task
    with pytest.raises(ValueError, match=r"model output must be \(N, 3, \*spatial\)"):
        _atk(cls, Segmentation(3))(_seg_model(4), x, None)  # wrong number of classes
    with pytest.raises(ValueError, match=r"model output must be \(N, K\) logits"):
        _atk(cls, MultiClass())(_seg_model(3), x, None)
    with pytest.raises(ValueError, match=r"model output must be \(N, K\) logits with K >= 2"):
        _atk(cls, MultiClass())(_cls_model(1), x, None)
    with pytest.raises(ValueError, match=r"model output must be \(N, L\) logits"):
        _atk(cls, MultiLabel())(_seg_model(3), x, None)


def test_model_output_non_finite():
    class NaNNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(36, 3)

        def forward(self, x):
            return self.lin(x.flatten(1)) * float("nan")

    with pytest.raises(ValueError, match=r"`model output` contains NaN or Inf"):
        _atk(PGD, MultiClass())(NaNNet(), torch.rand(2, 1, 6, 6), None)


def test_bad_task_arguments():
    with pytest.raises(ValueError, match=r"`threshold` must be in \(0, 1\)"):
        MultiLabel(threshold=1.0)
    with pytest.raises(ValueError, match=r"`num_classes` must be >= 2"):
        Segmentation(1)
    with pytest.raises(ValueError, match=r"`loss` must be one of"):
        Segmentation(3, loss="focal")
    with pytest.raises(ValueError, match=r"`dice_threshold` must be in \[0, 1\]"):
        Segmentation(3, dice_threshold=1.5)
    with pytest.raises(ValueError, match=r"`target_fraction` must be in \(0, 1\]"):
        Segmentation(3, target_fraction=0.0)


def test_non_finite_step_size_and_fractional_steps_are_rejected():
    task, threat = MultiClass(), Linf(0.1, bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="step_size"):
        PGD(task, threat, steps=2, step_size=float("nan"))
    with pytest.raises(ValueError, match="steps"):
        PGD(task, threat, steps=2.5)


def test_model_returning_a_tuple_gets_a_clear_error():
    class TupleNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            return (self.lin(x.flatten(1)),)

    with pytest.raises(TypeError, match="the model returned a tuple, not one tensor of logits"):
        PGD(MultiClass(), Linf(0.1, bounds=(0.0, 1.0)), steps=1)(TupleNet(), torch.rand(2, 1, 2, 2), torch.tensor([0, 1]))


def test_dtype_mismatch_and_inference_mode_are_clear_errors():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    atk = PGD(MultiClass(), Linf(0.1, bounds=(0.0, 1.0)), steps=1)
    with pytest.raises(TypeError, match="`x` has dtype torch.float64"):
        atk(model, torch.rand(2, 1, 2, 2, dtype=torch.float64), torch.tensor([0, 1]))
    with torch.inference_mode(), pytest.raises(RuntimeError, match="inference_mode"):
        atk(model, torch.rand(2, 1, 2, 2), torch.tensor([0, 1]))
