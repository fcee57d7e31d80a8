"""What the attack and task checks share: the error they raise, model state snapshots, forward counting."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..tasks import Task, TaskExample, task_class

__all__ = ["ConformanceError", "model_state", "state_problems", "prepare_model", "count_forwards", "examples_of",
           "example_prototypes"]


class ConformanceError(AssertionError):
    """A conformance property failed: the message reads ``check_x(<subject>): [<setting>: ]<property>: <what>``.

    An ``AssertionError``, so pytest shows it as a failed check (the scikit-learn ``check_estimator`` habit).
    """


def model_state(model: nn.Module) -> dict[str, Any]:
    """Everything an attack must leave as it found it: modes, requires_grad, .grad, weights, buffers."""
    return {
        "modes": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def state_problems(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What changed between two :func:`model_state` snapshots, in words (empty: nothing)."""
    out = []
    if after["modes"] != before["modes"]:
        out.append("train/eval flags of the submodules changed")
    if after["requires_grad"] != before["requires_grad"]:
        out.append("requires_grad flags changed")
    if not all(a is None for a in after["grads"]):
        out.append("gradients left on the model's parameters")
    changed = [k for k, v in before["state"].items() if not torch.equal(v, after["state"][k])]
    if changed:
        out.append(f"weights or buffers changed (BatchNorm statistics?): {changed}")
    return out


def prepare_model(model: nn.Module) -> nn.Module:
    """A model as a caller may hand it over mid-training: train mode (BatchNorm would update its running
    statistics, dropout would fire) with its last submodule in eval mode and its first parameter frozen; every
    flag must come back exactly so."""
    model.train()
    modules = list(model.modules())
    if len(modules) > 1:
        modules[-1].eval()
    first = next(model.parameters(), None)
    if first is not None:
        first.requires_grad_(False)
    return model


@contextmanager
def count_forwards(model: nn.Module) -> Iterator[list[int]]:
    """Count the calls of ``model`` (its top-level forward) while the block runs: ``len(calls)``."""
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


_EXAMPLES: dict[tuple[type[Task], int], list[TaskExample]] = {}


def example_prototypes(kind: str | type[Task], seed: int = 0) -> list[TaskExample]:
    """The examples of a kind, built once per class and seed without touching torch's global RNG (the example
    models seed it). Shared: read them, copy them (:func:`examples_of`) to use them."""
    cls = task_class(kind) if isinstance(kind, str) else kind
    key = (cls, seed)
    if key not in _EXAMPLES:
        with torch.random.fork_rng(devices=[]):
            _EXAMPLES[key] = list(cls.examples(seed))
    return _EXAMPLES[key]


def examples_of(kind: str | type[Task], seed: int = 0, *, fresh: bool = False) -> list[TaskExample]:
    """``examples()`` of a registered kind (by name) or a Task class, built without touching torch's global RNG.
    Each call returns its own copies (models, tensors, tasks); ``fresh``: built again rather than copied."""
    if fresh:
        cls = task_class(kind) if isinstance(kind, str) else kind
        with torch.random.fork_rng(devices=[]):
            return list(cls.examples(seed))
    return copy.deepcopy(example_prototypes(kind, seed))
