"""Bridges to the established adversarial-ML toolkits (installed as ``medadv.adapters``).

Each submodule imports its toolkit, so import the one you need:

* :mod:`medadv.adapters.art` -- ART estimators for multi-label classifiers and 2-D/3-D segmenters.
* :mod:`medadv.adapters.foolbox` -- Foolbox's own attacks on a task-aware model, with task criteria.
* :mod:`medadv.adapters.torchattacks` -- torchattacks' attacks on medical models, and medadv attacks as
  torchattacks attacks.
* :mod:`medadv.adapters.robustbench` -- the RobustBench zoo loaded offline through RobustBench's own loader.
* :mod:`medadv.adapters.support` -- which toolkit attack applies to which task (the tables behind the
  adapters' refusals and the README's support matrix).

Budgets through the adapters follow medadv's own rule (:func:`medadv.threats.check_budget_scale`, the one
``Linf`` uses), against the data box each adapter knows (ART ``clip_values``, Foolbox ``bounds``, torchattacks'
unit box): an ``eps``/``epsilons`` above half the data range (for L1/L2 budgets, half the box's Lp diagonal) is
refused before the attack does any work, unless the adapter was built with ``allow_large_budgets=True``
(``FastGradientMethod(clf, eps=8)`` on [0, 1] data is 8 meant as 8/255); a positive budget below 0.1 % of the
range (:data:`medadv.threats.MIN_BUDGET_FRACTION`: ``eps=4/255`` given for CT in HU) warns with
:class:`medadv.threats.SmallBudgetWarning`.

The core library never imports these modules.
"""
