"""The toolkit hook points the adapters rely on: a toolkit update that moves one fails here, by name."""

from __future__ import annotations

import inspect


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_art_hooks():
    from art.attacks.evasion.projected_gradient_descent.projected_gradient_descent import (
        ProjectedGradientDescent,
    )
    from art.estimators.classification import PyTorchClassifier
    from art.estimators.pytorch import PyTorchEstimator

    assert PyTorchEstimator.__abstractmethods__ <= {"get_activations", "input_shape", "loss_gradient",
                                                    "predict", "fit"}
    assert _params(PyTorchClassifier.reduce_labels)[:2] == ["self", "y"]
    assert "estimator" in _params(ProjectedGradientDescent.__init__)


def test_foolbox_hooks():
    import foolbox as fb
    from foolbox.attacks.gradient_descent_base import BaseGradientDescent

    assert _params(BaseGradientDescent.get_loss_fn) == ["self", "model", "labels"]
    assert {"criterion", "epsilons"} <= set(_params(fb.attacks.base.Attack.__call__))
    assert hasattr(fb.criteria.TargetedMisclassification(__import__("torch").zeros(1)), "target_classes")


def test_torchattacks_hooks():
    from torchattacks.attack import Attack

    for name in ("get_logits", "normalize", "inverse_normalize", "_set_normalization_applied",
                 "set_normalization_used", "get_target_label", "set_mode_targeted_by_label", "save"):
        assert callable(getattr(Attack, name, None)), name


def test_robustbench_and_autoattack_hooks():
    from medadv.adapters.robustbench import import_robustbench

    import_robustbench()
    import pyautoattack
    from robustbench.utils import load_model

    assert _params(load_model)[:4] == ["model_name", "model_dir", "dataset", "threat_model"]
    assert {"attacks", "device", "eps", "norm", "seed", "version"} <= set(_params(pyautoattack.AutoAttack.__init__))
    assert "batch_size" in _params(pyautoattack.AutoAttack.run_standard_evaluation)
