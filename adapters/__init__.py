"""Bridges to the established adversarial-ML toolkits (installed as ``medadv.adapters``).

Each submodule imports its toolkit, so import the one you need:

* :mod:`medadv.adapters.art` -- ART estimators for multi-label classifiers and 2-D/3-D segmenters.
* :mod:`medadv.adapters.foolbox` -- Foolbox's own attacks on a task-aware model, with task criteria.
* :mod:`medadv.adapters.torchattacks` -- torchattacks' attacks on medical models, and medadv attacks as
  torchattacks attacks.
* :mod:`medadv.adapters.robustbench` -- the RobustBench zoo loaded offline through RobustBench's own loader.
* :mod:`medadv.adapters.support` -- which toolkit attack applies to which task (the tables behind the
  adapters' refusals and the README's support matrix).

The core library never imports these modules.
"""
