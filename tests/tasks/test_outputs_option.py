"""The task option ``outputs`` (issue 28, item 5), over every registered task kind: a kind with class scores reads
its own examples' probabilities (softmax for exclusive classes, sigmoid otherwise) as the logits they came from;
a kind without class scores refuses the option; the shared detection rule finds the probabilities and not the
logits."""

from __future__ import annotations

import pytest
import torch

from medadv.tasks import available_tasks, task_class
from medadv.testing._common import examples_of

KINDS = available_tasks()


def _activation(task, z: torch.Tensor) -> torch.Tensor:
    return z.softmax(dim=1) if task.exclusive_classes else z.sigmoid()


@pytest.mark.parametrize("kind", KINDS)
def test_probabilities_read_as_their_logits_for_every_kind(kind: str) -> None:
    for ex in examples_of(kind):
        task = ex.task
        if not task.class_scores:  # values, not scores: the option is refused in one line
            with pytest.raises((ValueError, TypeError), match="outputs") as info:
                task.with_outputs("probabilities")
            assert "\n" not in str(info.value)
            continue
        declared = task.with_outputs("probabilities")
        with torch.no_grad():
            z = ex.model(ex.x)
            p = _activation(task, z)
            logits = declared.logits_model(torch.nn.Sequential(ex.model, _Act(task)))(ex.x)
        assert torch.equal(declared.predict(logits), task.predict(z)), ex.key
        torch.testing.assert_close(task.loss(logits, ex.y), task.loss(z, ex.y), atol=1e-4, rtol=1e-4)
        assert task.probability_evidence(p) is not None, ex.key  # the rule sees the probabilities ...
        assert task.probability_evidence(logits) is None, ex.key  # ... and not their logits


class _Act(torch.nn.Module):
    def __init__(self, task) -> None:
        super().__init__()
        self.task = task

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return _activation(self.task, z)


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_declared_is_kept_by_with_outputs_and_absent_by_default(kind: str) -> None:
    for ex in examples_of(kind):
        task = ex.task
        assert not task.outputs_declared and task.outputs == "logits"
        declared = task.with_outputs("logits")
        assert declared.outputs_declared and not task.outputs_declared  # a copy; the example's task unchanged
        assert type(declared) is task_class(kind) or isinstance(declared, task_class(kind))
