"""Tasks: what a model's output means, one class per task kind, registered by name.

=================  ========================  =========================  ======================
task kind          logits                    ``y``                      element grid ``E``
=================  ========================  =========================  ======================
``multiclass``     ``(N, K)``                ``(N,)`` int64             ``(N,)``
``multilabel``     ``(N, L)``                ``(N, L)`` float 0/1       ``(N, L)``
``segmentation``   ``(N, C, *spatial)``      ``(N, *spatial)`` int      ``(N, *spatial)``
``regression``     ``(N, K[, *spatial])``    float, the output's shape  the output's shape
=================  ========================  =========================  ======================

:func:`available_tasks` lists every registered kind (``medadv tasks`` shows them); a kind is a :class:`Task`
subclass decorated with :func:`register_task`; what it declares is grouped by consumer in ``Task.traits``
(:class:`TaskTraits`: outputs, labels, metrics, attacks, report, certify, toolkits; see :mod:`medadv.tasks.base`).
"""

from __future__ import annotations

from .base import (
    AttackTraits,
    CertifyTraits,
    LabelTraits,
    MetricTraits,
    Outcome,
    OutputTraits,
    ReportTraits,
    Task,
    TaskExample,
    TaskTraits,
    ToolkitTraits,
    available_tasks,
    get_task,
    headline_columns,
    lower_is_better,
    register_task,
    registered_task_classes,
    robust_metric_columns,
    task_class,
    task_family,
)
from .classification import MultiClass, MultiLabel
from .segmentation import Segmentation

# isort: split
# registered after the built-in kinds (available_tasks() lists them first)
from .regression import Regression

# isort: split
from .promptable import PromptableSegmentation

__all__ = ["Task", "Outcome", "TaskExample", "MultiClass", "MultiLabel", "Segmentation", "Regression",
           "PromptableSegmentation", "register_task",
           "task_class", "get_task", "available_tasks", "registered_task_classes", "task_family",
           "headline_columns", "lower_is_better", "robust_metric_columns",
           # the trait groups a kind declares (Task.traits)
           "TaskTraits", "OutputTraits", "LabelTraits", "MetricTraits", "AttackTraits", "ReportTraits",
           "CertifyTraits", "ToolkitTraits"]
