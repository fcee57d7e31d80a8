"""Clear errors through an attack for inputs medadv cannot use (issue 13, section 8).

Each case used to fail deep inside torch (``'list' object has no attribute 'max'``, a matrix-shape
mismatch, ``Cannot copy out of meta tensor``); now the first line says what is wrong and how to fix it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv.attacks.pgd import PGD
from medadv.models import small_cnn, small_unet
from medadv.runtime import attack_mode, check_input, check_model, forward_tensor, make_generator, model_device
from medadv.tasks import MultiClass, Segmentation
from medadv.threats import Box, Linf

THREAT = Linf(0.03, bounds=(0.0, 1.0))


class DeepSupervision(nn.Module):
    """A network whose forward returns a list of heads (MONAI deep supervision style)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = small_cnn(1, 4, width=8)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        z = self.net(x)
        return [z, 0.5 * z]


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return small_cnn(1, 4, width=8).eval()


def test_model_returning_a_list_gets_one_clear_error():
    x = torch.rand(2, 1, 16, 16)
    for y in (None, torch.tensor([0, 1])):  # y=None used to fail with "'list' object has no attribute 'max'"
        with pytest.raises(TypeError, match=r"returned a list, not one tensor of logits.*deep supervision"):
            PGD(MultiClass(), THREAT, steps=2)(DeepSupervision(), x, y)


def test_input_without_batch_dimension_gets_one_clear_error(cnn):
    torch.manual_seed(0)
    unet = small_unet(1, 3, ndim=3, channels=(8, 16)).eval()
    cases = [
        (cnn, MultiClass(), torch.rand(1, 16, 16), None),
        (cnn, MultiClass(), torch.rand(1, 16, 16), torch.tensor([1])),
        (unet, Segmentation(3), torch.rand(1, 16, 16, 16), None),
        (unet, Segmentation(3), torch.rand(1, 16, 16, 16), torch.zeros(1, 16, 16, dtype=torch.long)),
    ]
    for model, task, x, y in cases:
        with pytest.raises(ValueError, match=r"no batch dimension.*unsqueeze\(0\)"):
            PGD(task, THREAT, steps=2)(model, x, y)
    with pytest.raises(ValueError, match="batch-first"):  # a single row: not even (C, ...)
        PGD(MultiClass(), THREAT, steps=2)(cnn, torch.rand(16))


def test_meta_device_tensors_and_models_get_one_clear_error(cnn):
    x, y = torch.rand(2, 1, 16, 16), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="`model` has parameters on the meta device"):
        PGD(MultiClass(), THREAT, steps=2)(small_cnn(1, 4, width=8).to("meta"), x, y)
    with pytest.raises(ValueError, match="`x` is on the meta device"):
        PGD(MultiClass(), THREAT, steps=2)(cnn, x.to("meta"), y)
    with pytest.raises(ValueError, match="`y` is on the meta device"):
        PGD(MultiClass(), THREAT, steps=2)(cnn, x, y.to("meta"))


def test_runtime_helpers(cnn):
    # attack_mode: eval + frozen inside, every submodule's own flag and requires_grad restored after
    cnn.train()
    first = next(cnn.children())
    first.eval()
    flags = [p.requires_grad for p in cnn.parameters()]
    with attack_mode(cnn):
        assert not any(m.training for m in cnn.modules())
        assert not any(p.requires_grad for p in cnn.parameters())
    assert cnn.training and not first.training
    assert [p.requires_grad for p in cnn.parameters()] == flags
    cnn.eval()
    # check_input / check_model / forward_tensor / make_generator / model_device
    with pytest.raises(TypeError, match="floating-point"):
        check_input(torch.zeros(2, 1, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN or Inf"):
        check_input(torch.full((2, 1, 4, 4), float("nan")))
    with pytest.raises(ValueError, match="outside the declared bounds"):
        check_input(torch.full((2, 1, 4, 4), 2.0), Box(0.0, 1.0))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        check_model(lambda x: x)
    assert forward_tensor(cnn, torch.rand(2, 1, 16, 16)).shape == (2, 4)
    assert make_generator(None, torch.device("cpu")) is None
    g1, g2 = make_generator(5, torch.device("cpu")), make_generator(5, torch.device("cpu"))
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))
    assert model_device(nn.Identity(), torch.device("meta")) == torch.device("meta")
