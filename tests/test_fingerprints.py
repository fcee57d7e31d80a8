"""Fingerprints: the strings of earlier releases (old logs resume), and a model hashed once until it changes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import medadv.evaluation as evaluation
import medadv.fingerprints as fp
from medadv.params import object_settings, stable_hash
from medadv.tasks import MultiClass


def _model() -> nn.Module:
    linear = nn.Linear(4, 3)
    with torch.no_grad():  # fixed values: the hashes below do not depend on torch's initialisation
        linear.weight.copy_(torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7)
        linear.bias.copy_(torch.tensor([0.5, -1.0, 2.0]))
    return nn.Sequential(linear, nn.BatchNorm1d(3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(12, dtype=torch.float32).reshape(3, 4) / 11, torch.tensor([0, 2, 1])


def test_the_hashes_are_those_of_earlier_releases():
    """Rows logged by earlier releases carry these strings: a change would stop old logs from resuming."""
    x, y = _data()
    assert fp.weights_hash(_model()) == "446307afb605d249"
    assert fp.sample_hashes(x, y) == ["a8fba5c19349291a", "b99638dbfa3fcf0a", "5d02285d2ab8370e"]
    assert fp.sample_hashes(x, y, [b"a", b"b", b"c"])[0] == "afa3498a8de6982c"
    assert fp.device_checksum(x).tolist()[0] == [3720837029, 3097879777]


def test_the_row_fingerprint_is_the_documented_payload():
    class _Attack:
        targeted = True

        def fingerprint(self) -> str:
            return "attack-settings"

    def target(x, y, logits):
        return y

    task = MultiClass()
    got = fp.row_fingerprint("w", task, _Attack(), True, (1, 2), target, seed=3, save=True)
    name = f"{target.__module__}.{target.__qualname__}"
    assert got == stable_hash({"model": "w", "task": object_settings(task), "attack": "attack-settings",
                               "hd95": True, "spacing": [1, 2], "target_fn": name, "seed": 3,
                               "save_adversarial": True})
    # unset seed and save leave the payload of releases without them
    assert fp.row_fingerprint("w", task, _Attack(), False, None, None) == stable_hash(
        {"model": "w", "task": object_settings(task), "attack": "attack-settings", "hd95": False, "spacing": None,
         "target_fn": None})


def test_evaluation_keeps_its_private_names():
    assert evaluation._weights_hash is fp.weights_hash and evaluation._fingerprint is fp.row_fingerprint
    assert evaluation._sample_hashes is fp.sample_hashes and evaluation._device_checksum is fp.device_checksum


def test_a_model_is_hashed_once_until_its_parameters_change(monkeypatch):
    calls: list[int] = []
    real = fp.weights_hash
    monkeypatch.setattr(fp, "weights_hash", lambda m: calls.append(1) or real(m))
    model = _model()
    first = fp.model_fingerprint(model)
    assert fp.model_fingerprint(model) == first and len(calls) == 1
    with torch.no_grad():
        model[0].weight[0, 0] += 1.0  # in place: the version counter moves
    changed = fp.model_fingerprint(model)
    assert changed != first and len(calls) == 2
    model[0].bias = nn.Parameter(model[0].bias.detach() + 1)  # replaced
    assert fp.model_fingerprint(model) not in (first, changed) and len(calls) == 3
    model.train()  # the mode is not a weight: still the same
    fp.model_fingerprint(model)
    assert len(calls) == 3


def test_equal_weights_in_another_architecture_differ():
    a = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    b = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
    b.load_state_dict(a.state_dict())
    assert fp.weights_hash(a) == fp.weights_hash(b)  # the row fingerprint's weights alone cannot tell
    assert fp.model_fingerprint(a) != fp.model_fingerprint(b)


def test_per_sample_hashes_check_their_arguments():
    x, y = _data()
    assert fp.per_sample_hashes(x, y) == fp.sample_hashes(x, y)
    assert fp.per_sample_hashes(x) != fp.per_sample_hashes(x, y)
    with pytest.raises(ValueError, match="`tensors`"):
        fp.per_sample_hashes(x, y[:2])
    with pytest.raises(TypeError, match="`tensors`"):
        fp.per_sample_hashes(x, [0, 1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`extras`"):
        fp.per_sample_hashes(x, extras=[b"a"])
    with pytest.raises(TypeError, match="`model`"):
        fp.model_fingerprint("model")  # type: ignore[arg-type]


def test_weight_writes_that_skip_the_version_counter_change_the_fingerprint(monkeypatch):
    model = _model()
    first = fp.model_fingerprint(model)
    version = model[0].weight._version
    model[0].weight.data.mul_(2)  # through .data: the parameter's version counter does not move
    assert model[0].weight._version == version
    second = fp.model_fingerprint(model)
    assert second != first
    model[0].bias.detach().numpy()[0] = 7.0  # through numpy: no version counter at all
    third = fp.model_fingerprint(model)
    assert third not in (first, second)
    model[1].running_mean.data.copy_(torch.ones(3))  # a buffer, through .data
    assert fp.model_fingerprint(model) not in (first, second, third)
    # unchanged content: the memo answers without the full hash
    calls: list[int] = []
    real = fp.weights_hash
    monkeypatch.setattr(fp, "weights_hash", lambda m: calls.append(1) or real(m))
    fp.model_fingerprint(model)
    fp.model_fingerprint(model)
    assert calls == []


class _Scaled(nn.Module):
    """Equal weights, behaviour set by a plain attribute."""

    def __init__(self, inner: nn.Module, scale: float) -> None:
        super().__init__()
        self.inner = inner
        self.scale = scale
        self.register_buffer("offset", torch.zeros(3), persistent=False)

    def forward(self, x):
        return self.inner(x) * self.scale + self.offset


def test_same_weights_with_other_attributes_buffers_or_hooks_differ_but_weights_hash_does_not():
    from medadv.models.sliding import SlidingWindow

    net = nn.Conv2d(1, 2, 3, padding=1)
    a, b = SlidingWindow(net, (8, 8)), SlidingWindow(net, (16, 16))
    assert fp.weights_hash(a) == fp.weights_hash(b)
    assert fp.model_fingerprint(a) != fp.model_fingerprint(b)
    b.roi_size = (8, 8)  # changed on the same object: seen on the next call
    assert fp.model_fingerprint(a) == fp.model_fingerprint(b)

    m = _Scaled(_model()[0], 1.0)
    base = fp.model_fingerprint(m)
    m.scale = 2.0
    scaled = fp.model_fingerprint(m)
    assert scaled != base
    m.scale = 1.0
    assert fp.model_fingerprint(m) == base
    m.offset.add_(1)  # a non-persistent buffer: not in state_dict, still behaviour
    assert "offset" not in m.state_dict() and fp.model_fingerprint(m) != base
    m.offset.sub_(1)
    assert fp.model_fingerprint(m) == base
    handle = m.register_forward_hook(lambda mod, args, out: out * 0)
    assert fp.model_fingerprint(m) != base
    handle.remove()
    pre = m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    assert fp.model_fingerprint(m) != base
    pre.remove()
    m.train()  # the mode is not behaviour an attack sees (attacks run in eval mode)
    assert fp.model_fingerprint(m) == base
    assert fp.weights_hash(m) == fp.weights_hash(_Scaled(_model()[0], 5.0))
