"""ART's own FGSM / PGD on a medical regression model through :class:`ARTRegressor`; other ART attacks refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("art")

from art.attacks.evasion import (  # noqa: E402
    BasicIterativeMethod,
    CarliniL2Method,
    DeepFool,
    FastGradientMethod,
    ProjectedGradientDescent,
    SquareAttack,
)

from medadv.adapters.art_regression import ARTRegressor  # noqa: E402
from medadv.adapters.support import UnsupportedAttackError  # noqa: E402
from medadv.tasks import MultiLabel, Regression  # noqa: E402

EPS = 8 / 255


@pytest.fixture(scope="module")
def setting():
    """The 2-output example regressor of the task kind, with true values a little off its predictions."""
    ex = Regression.example()
    reg = ARTRegressor(ex.model, ex.task, tuple(ex.x.shape[1:]), clip_values=(0.0, 1.0))
    return ex, reg, ex.x.numpy(), ex.y.numpy()


def _moved(ex, x_adv: np.ndarray) -> float:
    with torch.no_grad():
        return float((ex.model(torch.from_numpy(x_adv)) - ex.model(ex.x)).abs().max())


@pytest.mark.parametrize("make", [
    lambda reg: FastGradientMethod(reg, eps=EPS),
    lambda reg: ProjectedGradientDescent(reg, eps=EPS, eps_step=EPS / 4, max_iter=10, verbose=False),
    lambda reg: BasicIterativeMethod(reg, eps=EPS, eps_step=EPS / 4, max_iter=5, verbose=False),
], ids=["fgsm", "pgd", "bim"])
def test_art_gradient_attacks_move_the_output_within_the_ball(setting, make) -> None:
    ex, reg, x, y = setting
    weights = [p.detach().clone() for p in ex.model.parameters()]
    x_adv = make(reg).generate(x, y=y)
    assert np.abs(x_adv - x).max() <= EPS + 1e-6 and x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    with torch.no_grad():
        before = float(ex.task.loss(ex.model(ex.x), ex.y).mean())
        after = float(ex.task.loss(ex.model(torch.from_numpy(x_adv)), ex.y).mean())
    assert after > before and _moved(ex, x_adv) > 0.0
    assert not ex.model.training and all(torch.equal(a, b) for a, b in zip(weights, ex.model.parameters(),
                                                                             strict=True))


def test_art_pgd_moves_more_than_random_noise(setting) -> None:
    ex, reg, x, y = setting
    x_adv = ProjectedGradientDescent(reg, eps=EPS, eps_step=EPS / 4, max_iter=10, verbose=False).generate(x, y=y)
    rng = np.random.default_rng(0)
    noise = np.clip(x + EPS * rng.choice([-1.0, 1.0], size=x.shape), 0.0, 1.0).astype(np.float32)
    assert _moved(ex, x_adv) > 2.0 * _moved(ex, noise)


@pytest.mark.parametrize("make", [
    lambda reg: DeepFool(reg),
    lambda reg: CarliniL2Method(reg),
    lambda reg: SquareAttack(reg, eps=EPS),
], ids=["deepfool", "cw", "square"])
def test_other_art_attacks_are_refused_when_constructed(setting, make) -> None:
    _, reg, _, _ = setting
    with pytest.raises(UnsupportedAttackError, match="does not apply to a regression model.*FastGradientMethod"):
        make(reg)


def test_class_label_settings_and_missing_y_are_refused(setting) -> None:
    _, reg, x, _ = setting
    with pytest.raises(UnsupportedAttackError, match="num_random_init"):
        ProjectedGradientDescent(reg, eps=EPS, num_random_init=2, verbose=False)
    with pytest.raises(UnsupportedAttackError, match="minimal"):
        FastGradientMethod(reg, eps=EPS, minimal=True)
    with pytest.raises(ValueError, match="without y"):
        FastGradientMethod(reg, eps=EPS).generate(x)


def test_class_tasks_are_refused() -> None:
    ex = Regression.example()
    with pytest.raises(TypeError, match="ARTClassifier"):
        ARTRegressor(ex.model, MultiLabel(), tuple(ex.x.shape[1:]))
