"""``auto`` and ``autoattack`` on binary, 3-class and single-logit classifiers (issue 28, item 1).

Before: both failed on 2- and 3-class models after ~15 model calls ("AutoAttack's apgd-t need(s) at least 4
classes"). Now every class count K >= 2 runs (APGD-T on the targeted CE for K = 2, on a 3-class DLR for K = 3) and
a single sigmoid logit runs as the multi-label task with one label (``autoattack``: as the 2 classes
``[logit(threshold), z]``). Checked here:

* on trained small CNNs (seeded, seconds), ``auto`` fast and standard and ``autoattack`` are at least as strong as
  PGD-100 x 5 restarts at the same ε, for 1 (sigmoid), 2, 3 and 4 outputs; the masking checks stay silent there
  and fire on a model without input gradients;
* generated edge kinds: every member of ``auto`` and of ``autoattack`` alone on every class count, each runs (in
  the ball and box, finite); generated bad inputs per head and attack: one clear line, before any attack work;
* the CLI: ``medadv evaluate`` with ``auto`` on a 2-class model and on a single-logit model exits 0.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from medadv.attacks.auto import COMPONENTS, AutoEvaluation
from medadv.attacks.autoattack import (
    _ATTACKS,
    _VERSION_MEMBERS,
    SMALL_CLASS_LOSSES,
    AutoAttack,
    ce_targeted,
    dlr_targeted_3,
    margin_untargeted,
    run_pyautoattack,
)
from medadv.attacks.pgd import PGD
from medadv.cli import describe_task, main
from medadv.data.synthetic import multiclass_blobs, multilabel_blobs
from medadv.models import fit_supervised, save_checkpoint, small_cnn
from medadv.tasks import MultiClass, MultiLabel, Task
from medadv.threats import L2, Linf

HEADS = (1, 2, 3, 4)  # model outputs: 1 is a single sigmoid logit (multi-label, one label), else K classes
#: per head, an ε (L∞, [0, 1] data) where PGD leaves some but not all of the trained model's samples robust
EPS = {1: 0.03, 2: 0.035, 3: 0.04, 4: 0.04}
N_TEST = 16


def _task(k: int) -> Task:
    return MultiLabel() if k == 1 else MultiClass()


class _Trained:
    def __init__(self, model: nn.Module, task: Task, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model, self.task, self.x, self.y = model, task, x, y


@functools.cache
def _trained(k: int) -> _Trained:
    """A small CNN trained (seeded, ~1 s) on blob images: K classes by blob position, or one label (blob there)."""
    torch.manual_seed(0)
    task = _task(k)
    model = small_cnn(1, k, width=8)
    x, y = (multilabel_blobs(n=128 + N_TEST, num_labels=1, seed=0) if k == 1
            else multiclass_blobs(n=128 + N_TEST, num_classes=k, seed=0))
    fit_supervised(model, task, x[:128], y[:128], epochs=10, lr=1e-2, batch_size=16)
    return _Trained(model.eval(), task, x[128:], y[128:])


def _accuracy(t: _Trained, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float(t.task.robust_metric(t.model(x), t.y).mean())


@functools.cache
def _pgd_accuracy(k: int) -> float:
    t = _trained(k)
    res = PGD(t.task, Linf(EPS[k], bounds=(0.0, 1.0)), steps=100, restarts=5)(t.model, t.x, t.y)
    return _accuracy(t, res.x_adv)


# --- strength on trained models ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["fast", "standard"])
@pytest.mark.parametrize("k", HEADS)
def test_auto_is_at_least_as_strong_as_pgd_100x5(k, version):
    t = _trained(k)
    clean = _accuracy(t, t.x)
    pgd = _pgd_accuracy(k)
    assert clean >= 0.9 and 0.0 < pgd < clean  # the trained model and ε leave something to find
    threat = Linf(EPS[k], bounds=(0.0, 1.0))
    res = AutoEvaluation(t.task, threat, version=version)(t.model, t.x, t.y)
    robust = _accuracy(t, res.x_adv)
    assert robust <= pgd, (k, version, clean, robust, pgd)
    assert float(res.linf.max()) <= EPS[k] + 1e-6
    # the gradient-masking checks ran on the batch and stay silent on an honest trained model
    assert res.details.masking == [], res.details.masking_messages


def test_autoattack_on_a_single_logit_is_at_least_as_strong_as_pgd_100x5():
    """A sigmoid head through its 2-class softmax form (multi-class heads run the same pyautoattack members as
    ``auto`` standard, tested above)."""
    k = 1
    t = _trained(k)
    res = AutoAttack(t.task, Linf(EPS[k], bounds=(0.0, 1.0)))(t.model, t.x, t.y)
    assert _accuracy(t, res.x_adv) <= _pgd_accuracy(k)
    assert float(res.linf.max()) <= EPS[k] + 1e-6


class _NoGradient(nn.Module):
    """A trained model behind input quantisation (``round``: zero input gradient everywhere)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(torch.round(x * 8) / 8)


@pytest.mark.parametrize("k", HEADS)
def test_auto_masking_checks_fire_on_every_head(k):
    t = _trained(k)
    model = _NoGradient(t.model).eval()
    threat = Linf(EPS[k], bounds=(0.0, 1.0))
    res = AutoEvaluation(t.task, threat, version="custom", attacks=[COMPONENTS[t.task.name][0]], steps=5)(
        model, t.x[:4], t.y[:4])
    assert "zero_gradients" in res.details.masking


# --- the losses below 4 classes -----------------------------------------------------------------------------------------
def test_small_class_losses_are_defined_and_not_degenerate():
    g = torch.Generator().manual_seed(0)
    z3 = torch.randn(64, 3, generator=g, requires_grad=True)
    y3, t3 = z3.argmax(1), z3.argmin(1)  # the lowest class as target: z_π1 − z_π3 would be the numerator itself
    loss = dlr_targeted_3(z3, y3, t3)
    (grad,) = torch.autograd.grad(loss.sum(), z3)
    assert bool(torch.isfinite(loss).all()) and bool((grad.abs().sum(1) > 0).all())
    # invariant to shifting and rescaling the logits, as DLR
    assert torch.allclose(dlr_targeted_3(3 * z3 + 5, y3, t3), loss, atol=1e-5)
    z2 = torch.randn(64, 2, generator=g, requires_grad=True)
    y2 = z2.argmax(1)
    for value in (ce_targeted(z2, 1 - y2), margin_untargeted(z2, y2)):
        (grad,) = torch.autograd.grad(value.sum(), z2)
        assert bool((grad.abs().sum(1) > 0).all())
    assert set(SMALL_CLASS_LOSSES) == {2, 3}


def test_tasks_params_say_which_members_and_losses():
    text = describe_task("multiclass")
    assert "K = 2" in text and "K = 3" in text and "targeted CE" in text and "multilabel task with one label" in text
    assert "single-logit sigmoid head" in describe_task("multilabel")


# --- generated edge kinds: every member alone on every head ------------------------------------------------------------
def _tiny(k: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Softplus(), nn.Linear(8, k)).eval()


def _batch(k: int, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return x, _task(k).predict(model(x)).to(torch.long if k > 1 else torch.float32)


def _in_ball(x_adv: torch.Tensor, x: torch.Tensor, threat) -> None:
    assert x_adv.shape == x.shape and x_adv.dtype == x.dtype and bool(torch.isfinite(x_adv).all())
    assert float(x_adv.min()) >= 0.0 and float(x_adv.max()) <= 1.0
    assert bool((threat.norm(x_adv - x) <= threat.eps * (1 + 1e-5) + 1e-6).all())


AUTO_MEMBER_KINDS = [(k, m) for k in HEADS for m in COMPONENTS[_task(k).name]]


@pytest.mark.parametrize("norm", ["Linf", "L2"])
@pytest.mark.parametrize("k,member", AUTO_MEMBER_KINDS, ids=[f"{k}out-{m}" for k, m in AUTO_MEMBER_KINDS])
def test_every_auto_member_runs_on_every_head(k, member, norm):
    model = _tiny(k)
    x, y = _batch(k, model)
    threat = Linf(0.01, bounds=(0.0, 1.0)) if norm == "Linf" else L2(0.05, bounds=(0.0, 1.0))
    res = AutoEvaluation(_task(k), threat, version="custom", attacks=[member], steps=5, queries=20, targets=9,
                         checks=False)(model, x, y)
    _in_ball(res.x_adv, x, threat)


AA_MEMBER_KINDS = [(k, m) for k in HEADS for m in _ATTACKS]


@pytest.mark.parametrize("k,member", AA_MEMBER_KINDS, ids=[f"{k}out-{m}" for k, m in AA_MEMBER_KINDS])
def test_every_autoattack_member_runs_on_every_head(k, member, caplog):
    """Each pyautoattack member alone (5 APGD steps, 20 Square queries) at a budget that fools nothing, so it
    runs every target class; a single logit goes through the task's 2-class softmax form."""
    task: Any = _task(k)
    model = _tiny(k)
    x, y = _batch(k, model)
    threat = Linf(0.002, bounds=(0.0, 1.0))
    with caplog.at_level(logging.WARNING):
        x_adv = run_pyautoattack(nn.Sequential(model, _SoftmaxOf(task)), x, task.softmax_labels(y), None, threat,
                                 version="custom", attacks=[member], seed=0, steps=5, targets=9, queries=20)
    _in_ball(x_adv, x, threat)
    # no "not possible to use the DLR loss" (void now) nor "points with zero gradient" (a degenerate loss)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "DLR loss" not in said and "zero gradient" not in said, said


class _SoftmaxOf(nn.Module):
    def __init__(self, task: Any) -> None:
        super().__init__()
        self.task = task

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.task.softmax_logits(z)


@pytest.mark.parametrize("version", [v for v in _VERSION_MEMBERS if v != "rand"])
@pytest.mark.parametrize("k", HEADS)
def test_autoattack_versions_run_on_every_head(k, version):
    model = _tiny(k)
    x, y = _batch(k, model)
    threat = Linf(0.3, bounds=(0.0, 1.0))  # large: most members' paths are short, what is checked is that they run
    res = AutoAttack(_task(k), threat, version=version)(model, x, y)
    _in_ball(res.x_adv, x, threat)


# --- generated bad inputs: one clear line, before any attack work ------------------------------------------------------
class _Counting(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(x)


class _Squeezed(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)[:, 0]


def _bad(fault: str, k: int) -> tuple[Task, nn.Module, torch.Tensor, torch.Tensor, str]:
    """A bad input for head ``k``: (task, model, x, y, what the one-line message must name)."""
    model = _tiny(k)
    x, y = _batch(k, model)
    task = _task(k)
    if fault == "label_out_of_range":
        return task, model, x, (torch.full_like(y, k) if k > 1 else torch.full_like(y, 2.0)), "`y`"
    if fault == "labels_of_another_shape":
        return task, model, x, (y[:, None] if k > 1 else y[:, 0]), "`y`"
    if fault == "single_logit_as_multiclass":
        return MultiClass(), _tiny(1), x, torch.zeros(4, dtype=torch.long), "multilabel task with one label"
    if fault == "flat_single_logit":
        return MultiLabel(), _Squeezed(_tiny(1)), x, torch.zeros(4, 1), "unsqueeze"
    if fault == "nan_input":
        x = x.clone()
        x[0, 0, 0, 0] = float("nan")
        return task, model, x, y, "NaN"
    raise AssertionError(fault)


FAULTS = ("label_out_of_range", "labels_of_another_shape", "single_logit_as_multiclass", "flat_single_logit",
          "nan_input")
ATTACKS = {"auto-fast": lambda task, threat: AutoEvaluation(task, threat, version="fast"),
           "auto-standard": lambda task, threat: AutoEvaluation(task, threat),
           "autoattack": lambda task, threat: AutoAttack(task, threat)}
BAD_KINDS = [(a, f, k) for a in ATTACKS for f in FAULTS for k in ((1, 2, 3) if f in FAULTS[:2] else (2,))]


@pytest.mark.parametrize("attack,fault,k", BAD_KINDS, ids=[f"{a}-{f}-{k}out" for a, f, k in BAD_KINDS])
def test_bad_input_is_one_clear_line_before_any_work(attack, fault, k):
    task, model, x, y, names = _bad(fault, k)
    counting = _Counting(model)
    with pytest.raises((ValueError, TypeError)) as err:
        ATTACKS[attack](task, Linf(0.03, bounds=(0.0, 1.0)))(counting, x, y)
    message = str(err.value)
    assert names in message and "\n" not in message, message
    assert counting.calls <= 1  # at most the forward that checks the output and labels


@pytest.mark.parametrize("labels", [2, 3])
def test_autoattack_refuses_several_labels_before_any_forward(labels):
    model = _Counting(_tiny(labels))
    x = torch.rand(4, 1, 8, 8)
    with pytest.raises(ValueError, match=r"one label, shape \(N, 1\)") as err:
        AutoAttack(MultiLabel(), Linf(0.03, bounds=(0.0, 1.0)))(model, x, torch.zeros(4, labels))
    assert "\n" not in str(err.value) and model.calls == 0


def test_single_logit_softmax_form_is_the_same_decision():
    task = MultiLabel(threshold=0.3)
    z = torch.randn(32, 1, generator=torch.Generator().manual_seed(0))
    y = (torch.rand(32, 1, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    two = task.softmax_logits(z)
    assert torch.equal(two.argmax(1).float(), task.predict(z)[:, 0])
    assert torch.allclose(MultiClass().element_margin(two, task.softmax_labels(y)), task.element_margin(z, y)[:, 0])
    assert torch.allclose(MultiClass().element_loss(two, task.softmax_labels(y)),
                          MultiLabel().element_loss(z - torch.logit(torch.tensor(0.3)), y)[:, 0], atol=1e-6)


# --- the CLI ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2])
def test_cli_evaluate_auto_on_binary_models_exits_0(k, tmp_path, capsys):
    t = _trained(k)
    save_checkpoint(tmp_path / "cnn.pt", t.model)
    # a single logit's labels as a data file holds them: a vector (N,) of 0/1 (read as one label, (N, 1))
    np.savez(tmp_path / "data.npz", x=t.x[:8].numpy(), y=t.y[:8].reshape(-1).numpy())
    cfg = {
        "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": k, "width": 8},
                  "checkpoint": "cnn.pt"},
        "task": {"type": "multilabel" if k == 1 else "multiclass"},
        "data": {"source": "npz", "path": "data.npz"},
        "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
        "budgets": [EPS[k]],
        "attacks": [{"name": "auto", "version": "fast"}],
        "batch_size": 8,
        "output": "out",
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["evaluate", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 0, capsys.readouterr().err
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert len(rows) == 8
    column = "exact_match" if k == 1 else "correct"
    assert sum(r[f"adv_{column}"] for r in rows) < sum(r[f"clean_{column}"] for r in rows)
