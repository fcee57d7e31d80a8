"""medadv.models.io: short, file-naming checkpoint errors that never pass on torch's ``weights_only=False`` advice."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medadv.models import small_cnn
from medadv.models.io import (
    CheckpointError,
    load_checkpoint,
    load_state_dict,
    parse_load_error,
    read_checkpoint,
)


@pytest.mark.parametrize("damage", ["truncated", "text", "empty", "zip_tail"])
def test_corrupt_or_truncated_file_names_it_and_says_not_a_valid_checkpoint(tmp_path, damage):
    good = tmp_path / "good.pt"
    torch.save(small_cnn(1, 3, width=4).state_dict(), good)
    data = good.read_bytes()
    bad = tmp_path / "weights.pt"
    bad.write_bytes({"truncated": data[: len(data) // 2], "text": b"version https://git-lfs.github.com/spec/v1\n",
                     "empty": b"", "zip_tail": data[:-200]}[damage])
    # torch's own error advises weights_only=False (which runs the file's code)
    with pytest.raises(Exception) as torch_err:
        torch.load(bad, weights_only=True)
    for call in (lambda: load_checkpoint(bad, small_cnn(1, 3, width=4)), lambda: read_checkpoint(bad)):
        with pytest.raises(CheckpointError) as err:
            call()
        msg = str(err.value)
        assert msg.startswith(f"checkpoint: cannot read {bad}: ") and msg.endswith("not a valid PyTorch checkpoint")
        assert "weights_only=False" not in msg and "\n" not in msg
        assert err.value.__cause__ is None and err.value.__suppress_context__
    assert type(torch_err.value).__name__ in msg  # the kind of failure is kept, torch's text is not


def test_wrong_architecture_lists_first_keys_with_counts(tmp_path):
    # a 30-layer MLP's weights for a small CNN: torch's message names every key
    torch.save(nn.ModuleDict({"mlp": nn.Sequential(*[nn.Linear(4, 4) for _ in range(30)])}).state_dict(),
               tmp_path / "mlp.pt")
    model = small_cnn(1, 3, width=4)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path / "mlp.pt", model)
    lines = str(err.value).splitlines()
    own = list(model.state_dict())
    assert lines[0] == f"checkpoint: {tmp_path / 'mlp.pt'} does not fit the model (Sequential, strict loading):"
    assert lines[1] == f"{len(own)} key(s) of the model missing in the checkpoint: {', '.join(own[:10])}" + (
        f" ... and {len(own) - 10} more" if len(own) > 10 else "")
    assert lines[2].startswith("60 unexpected key(s) in the checkpoint: mlp.0.weight, mlp.0.bias, mlp.1.weight, ")
    assert lines[2].endswith("... and 50 more") and len(lines) == 3
    with pytest.raises(RuntimeError) as torch_err:
        model.load_state_dict(torch.load(tmp_path / "mlp.pt", weights_only=True))
    assert len(str(torch_err.value)) > len(str(err.value))
    # nothing was loaded: the model keeps its weights
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError):
        load_state_dict(model, {**model.state_dict(), "extra": torch.zeros(1)})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_torch_load_error_is_parsed_into_the_same_short_form():
    # for loaders medadv does not control (RobustBench): torch's strict-loading message, shortened
    model = small_cnn(1, 3, width=4)
    state = model.state_dict()
    keys = list(state)
    broken = {k: v for k, v in state.items() if k != keys[0]}
    broken["junk.weight"] = torch.zeros(1)
    broken[keys[2]] = torch.zeros(7, 7)
    with pytest.raises(RuntimeError) as err:
        model.load_state_dict(broken)
    missing, unexpected, shapes = parse_load_error(str(err.value))
    assert missing == [keys[0]] and unexpected == ["junk.weight"]
    assert shapes == [f"{keys[2]} (checkpoint (7, 7), model ({', '.join(map(str, state[keys[2]].shape))}))"]
    assert parse_load_error("CUDA out of memory") is None
