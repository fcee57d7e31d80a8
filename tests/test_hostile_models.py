"""Hostile models: probability outputs and models that do not fit their data (issue 28, item 5 and the
model/input tracebacks).

Generated over what is registered, not hand lists:

* every registered attack x {a multi-label model ending in ``Sigmoid``, a segmentation model ending in
  ``Softmax``, a multi-class classifier ending in ``Softmax``}: with a task that does not declare its ``outputs``
  the attack refuses on its first forward, before any step, in one line naming ``outputs: probabilities``; with
  ``outputs="probabilities"`` declared it runs, and gives what it gives on the logits the probabilities came from
  (the model without its sigmoid; for a softmax, its ``log_softmax``: the logits a softmax keeps, up to a
  per-voxel shift);
* every registered attack x {channel count of the data != the model's, 2-D data into a 3-D model}: one line
  naming ``x`` and what the model takes, no ``RuntimeError``;
* ``evaluate`` on the same faults, and on ``class_names`` of the wrong length.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import medadv  # noqa: F401  (registers every attack)
from medadv.attacks import PGD
from medadv.attacks.base import available_attacks
from medadv.evaluation import evaluate
from medadv.masking import check_probability_outputs
from medadv.tasks import MultiClass, MultiLabel, Regression, Segmentation, Task, get_task
from medadv.tasks.base import LogitsOfProbabilities, tiny_net
from medadv.testing._common import count_forwards
from medadv.testing.attack_checks import AttackCase, Setting, admits, settings
from medadv.threats import Linf

ATTACKS = available_attacks()
KINDS = ("sigmoid-multilabel", "softmax-segmentation", "softmax-multiclass")
_TASK_KIND = {"sigmoid-multilabel": "multilabel", "softmax-segmentation": "segmentation",
              "softmax-multiclass": "multiclass"}


class Ending(nn.Module):
    """``net`` followed by ``final``: a sigmoid, a softmax or log-softmax over the class axis, or nothing."""

    def __init__(self, net: nn.Module, final: str) -> None:
        super().__init__()
        self.net, self.final = net, final

    def forward(self, x: Tensor) -> Tensor:
        z = self.net(x)
        return {"sigmoid": z.sigmoid(), "softmax": z.softmax(dim=1), "log_softmax": z.log_softmax(dim=1),
                "logits": z}[self.final]


def _setting(name: str, kind: str) -> Setting:
    """The task kind's example the attack admits (segmentation: 2-D, else 3-D), else its first one."""
    pool = settings([_TASK_KIND[kind]])
    cls = medadv.attacks.base.attack_class(name)
    return next((s for s in pool if admits(cls, s)), pool[0])


def _final(kind: str) -> str:
    return "sigmoid" if kind == "sigmoid-multilabel" else "softmax"


def _reference(kind: str) -> str:
    """What the declared probabilities are converted back to: the logits themselves (sigmoid), or the
    log-probabilities (softmax: logits up to a per-voxel shift, which no class score, loss or arg-max sees)."""
    return "logits" if kind == "sigmoid-multilabel" else "log_softmax"


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def _refusal(case: AttackCase, task: Task, model: nn.Module, x: Tensor, y: Tensor) -> str | None:
    """The one-line refusal of the attack (built for ``task``) on ``model``, or ``None`` when it runs."""
    try:
        case.build(task=task)(model, x, y)
    except (TypeError, ValueError) as e:
        return _one_line(e)
    return None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ATTACKS)
def test_probability_model_refused_before_work(name: str, kind: str) -> None:
    case = AttackCase(name, _setting(name, kind))
    net = case.model()
    x, y = case.data()
    model = Ending(copy.deepcopy(net), _final(kind))
    # an attack that does not take this setting at all (task kind, spatial rank, label shape) refuses the
    # probabilities for that reason, in one line, as it refuses the logits
    if _refusal(case, case.task, Ending(net, "logits"), x, y) is not None:
        assert _refusal(case, case.task, model, x, y) is not None
        return
    attack = case.build()
    with count_forwards(model) as calls, pytest.raises(ValueError, match="declare `outputs: probabilities`") as info:
        attack(model, x, y)
    assert len(calls) == 1  # the first forward told: no step, no second forward
    assert "outputs=\"probabilities\"" in _one_line(info.value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ATTACKS)
def test_declared_probabilities_run_on_their_logits(name: str, kind: str) -> None:
    case = AttackCase(name, _setting(name, kind))
    net = case.model()
    declared = case.task.with_outputs("probabilities")
    x, y = case.data()
    if _refusal(case, case.task, Ending(copy.deepcopy(net), _reference(kind)), x, y) is not None:
        assert _refusal(case, declared, Ending(net, _final(kind)), x, y) is not None
        return
    runs = []
    for task, final in ((declared, _final(kind)), (case.task, _reference(kind))):
        model = Ending(copy.deepcopy(net), final)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # attacks drawing from the global RNG draw the same numbers in both runs
            runs.append(case.build(task=task)(model, x, y))
    got, want = runs
    assert torch.equal(got.fooled, want.fooled)
    torch.testing.assert_close(got.x_adv, want.x_adv, atol=1e-4, rtol=0)  # float32 noise of log(softmax)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)


# --- the one conversion, shown on PGD: the adversarial example of the logits ------------------------------------------
def _multilabel_net() -> tuple[nn.Module, Tensor, Tensor]:
    """A linear 4-label classifier of 8x8 images (float64: the two runs compared agree to rounding), a batch and
    its clean prediction as labels; PGD at ε = 0.05 fools some samples, not all."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Flatten(), nn.Linear(64, 4)).double().eval()
    x = torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        y = (net(x) > 0).double()
    return net, x, y


def test_pgd_on_a_sigmoid_model_declared_is_pgd_on_its_logits() -> None:
    net, x, y = _multilabel_net()
    threat = Linf(0.05, bounds=(0.0, 1.0))
    got = PGD(MultiLabel(outputs="probabilities"), threat, steps=10)(Ending(net, "sigmoid"), x, y)
    want = PGD(MultiLabel(), threat, steps=10)(net, x, y)
    assert 0 < int(want.fooled.sum()) < len(x)  # a real attack: some samples fooled, not all
    assert torch.equal(got.fooled, want.fooled)
    torch.testing.assert_close(got.x_adv, want.x_adv, atol=1e-12, rtol=0)
    torch.testing.assert_close(got.logits, want.logits)  # the result's logits are logits, not probabilities
    assert bool((got.logits < 0).any())


def test_pgd_on_a_softmax_segmenter_declared_is_pgd_on_its_logits() -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Conv2d(1, 3, 3, padding=1).double().eval()
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        y = net(x).argmax(1)
    threat = Linf(0.05, bounds=(0.0, 1.0))
    task = Segmentation(3, include_background=True)
    got = PGD(task.with_outputs("probabilities"), threat, steps=10)(Ending(net, "softmax"), x, y)
    want = PGD(task, threat, steps=10)(net, x, y)  # cross-entropy does not see the per-voxel shift of log p
    assert 0 < int(want.fooled.sum()) < len(x)
    assert torch.equal(got.fooled, want.fooled)
    assert torch.equal(got.pred, want.pred)  # the same fooled mask, voxel for voxel
    torch.testing.assert_close(got.x_adv, want.x_adv, atol=1e-9, rtol=0)


def test_the_sigmoid_model_that_reported_fooled_0_875_is_refused() -> None:
    # issue 28 item 5: read as logits, sigmoids of 0.5..1 are all "present" at threshold 0.5 and the attack
    # "fools" samples whose accuracy it never changed; now the first forward refuses
    net, x, y = _multilabel_net()
    with pytest.raises(ValueError, match=r"sigmoid probabilities\): declare `outputs: probabilities` on the task "
                                         r"\(Python: MultiLabel\(\.\.\., outputs=\"probabilities\"\)\)"):
        PGD(MultiLabel(), Linf(0.05, bounds=(0.0, 1.0)), steps=10)(Ending(net, "sigmoid"), x, y)


# --- evaluate: the same refusal before any attack, the same conversion -----------------------------------------------
def test_evaluate_refuses_a_probability_model_before_any_attack() -> None:
    net, x, y = _multilabel_net()
    model = Ending(net, "sigmoid")
    with count_forwards(model) as calls, pytest.raises(ValueError, match="declare `outputs: probabilities`"):
        evaluate(model, MultiLabel(), (x, y), {"a": PGD(MultiLabel(), Linf(0.1, bounds=(0, 1)), steps=3),
                                               "b": PGD(MultiLabel(), Linf(0.2, bounds=(0, 1)), steps=3)})
    assert len(calls) == 1


def test_evaluate_with_declared_probabilities_gives_the_rows_of_the_logits() -> None:
    net, x, y = _multilabel_net()
    declared = MultiLabel(outputs="probabilities")
    got = evaluate(Ending(net, "sigmoid"), declared, (x, y), PGD(declared, Linf(0.05, bounds=(0, 1)), steps=10))
    want = evaluate(net, MultiLabel(), (x, y), PGD(MultiLabel(), Linf(0.05, bounds=(0, 1)), steps=10))
    keys = ("fooled", "changed", "flipped", "clean_exact_match", "adv_exact_match", "adv_label_accuracy")
    assert [[r[k] for k in keys] for r in got.rows] == [[r[k] for k in keys] for r in want.rows]
    assert any(r["fooled"] for r in got.rows)
    assert got.rows[0]["config"] != want.rows[0]["config"]  # the task's `outputs` is in the fingerprint


def test_evaluate_refuses_class_names_of_the_wrong_length_before_any_attack() -> None:
    net, x, y = _multilabel_net()
    attack = PGD(MultiLabel(), Linf(0.1, bounds=(0, 1)), steps=3)
    for names in (["a", "b", "c"], ["a", "b", "c", "d", "e"]):
        with count_forwards(net) as calls, pytest.raises(ValueError, match=f"`class_names` lists {len(names)} "
                                                                          "names, but the model has 4 outputs"):
            evaluate(net, MultiLabel(), (x, y), attack, meta={"classes": names})
        assert len(calls) == 1
    rows = evaluate(net, MultiLabel(), (x, y), attack, meta={"classes": list("abcd")}).rows
    assert len(rows) == len(x)


# --- the option itself ---------------------------------------------------------------------------------------------
def test_outputs_option_is_declared_on_the_task_and_checked() -> None:
    assert MultiClass().outputs == "logits" and MultiClass(outputs="probabilities").outputs == "probabilities"
    assert get_task("multilabel", outputs="probabilities").outputs == "probabilities"
    assert get_task("segmentation", num_classes=2, outputs="probabilities").outputs == "probabilities"
    for bad in ("probs", "softmax", "", 1):
        with pytest.raises(ValueError, match="`outputs` of MultiLabel must be one of 'logits', 'probabilities'"):
            MultiLabel(outputs=bad)  # type: ignore[arg-type]
    with pytest.raises(Exception, match="unknown parameter `outputs` for task 'regression'"):
        get_task("regression", outputs="probabilities")
    # the default leaves the settings (fingerprints of old logs and baselines) as they were
    from medadv.params import object_settings

    assert "outputs" not in object_settings(MultiClass()) and not MultiClass().outputs_declared
    assert object_settings(MultiClass(outputs="probabilities"))["outputs"] == "probabilities"
    task = Segmentation(3)
    declared = task.with_outputs("probabilities")
    assert task.outputs == "logits" and declared.outputs == "probabilities" and declared.num_classes == 3
    assert "outputs='probabilities'" in repr(declared)


def test_declared_logits_are_trusted_and_the_message_says_so() -> None:
    # a logit model whose logits all fall in [0, 1] on a batch (a fresh multi-label head can): the refusal names
    # the way out, and declaring `outputs="logits"` takes it
    net, x, y = _multilabel_net()
    shifted = nn.Sequential(net, nn.Sigmoid(), nn.Identity())  # values in (0, 1), read here as logits on purpose
    threat = Linf(0.05, bounds=(0, 1))
    with pytest.raises(ValueError, match="if these are logits, declare `outputs: logits`"):
        PGD(MultiLabel(), threat, steps=2)(shifted, x, y)
    assert PGD(MultiLabel(outputs="logits"), threat, steps=2)(shifted, x, y).logits.min() >= 0
    # per-class sigmoids on a multi-class head are no proof (fresh classifiers' logits often lie in [0, 1]):
    # not refused, only flagged by the masking check
    mc = nn.Sequential(nn.Flatten(), nn.Linear(64, 3), nn.Sigmoid()).double()
    assert MultiClass().probability_evidence(mc(x)).kind == "bounded"
    PGD(MultiClass(), threat, steps=1)(mc, x, torch.zeros(len(x), dtype=torch.long))


def test_logits_model_keeps_the_model_s_names_and_is_not_applied_twice() -> None:
    net = tiny_net(1, 3, 2, dense=True).eval()
    task = Segmentation(3, outputs="probabilities")
    wrapped = task.logits_model(Ending(net, "softmax"))
    assert isinstance(wrapped, LogitsOfProbabilities)
    assert task.logits_model(wrapped) is wrapped
    assert Segmentation(3).logits_model(net) is net
    assert [n for n, _ in wrapped.named_modules()] == [n for n, _ in Ending(net, "softmax").named_modules()]
    x = torch.rand(2, 1, 8, 8)
    torch.testing.assert_close(wrapped(x).softmax(1), net(x).softmax(1))
    # saturated probabilities give finite logits (clamped to the dtype's epsilon), not -inf
    ml = MultiLabel(outputs="probabilities")
    z = ml.logits_from_outputs(torch.tensor([[0.0, 1.0, 0.5]]))
    assert bool(torch.isfinite(z).all()) and z[0, 0] < -15 and z[0, 1] > 15 and z[0, 2] == 0
    # autocast's bfloat16 probabilities are converted in float32 (bf16's epsilon would cap logits near ±5)
    zb = ml.logits_from_outputs(torch.tensor([[0.0, 1.0]], dtype=torch.bfloat16))
    assert zb.dtype == torch.float32 and zb[0, 1] > 15


def test_config_task_outputs(tmp_path) -> None:
    from medadv.config import ConfigError, build_task

    assert build_task({"type": "multilabel", "outputs": "probabilities"}).outputs == "probabilities"
    assert build_task({"type": "segmentation", "num_classes": 2, "outputs": "probabilities"}).outputs == \
        "probabilities"
    assert build_task({"type": "multiclass"}).outputs == "logits"
    with pytest.raises(ConfigError, match="outputs"):
        build_task({"type": "multiclass", "outputs": "probs"})


def test_masking_flags_with_the_same_rule() -> None:
    # one rule (Task.probability_evidence): the masking check flags what the attacks refuse, and nothing else
    net, x, _ = _multilabel_net()
    with torch.no_grad():
        probs, logits = Ending(net, "sigmoid")(x), net(x)
    task = MultiLabel()
    assert task.probability_evidence(probs) is not None and check_probability_outputs(task, probs) is not None
    assert task.probability_evidence(logits) is None and check_probability_outputs(task, logits) is None
    assert Regression().probability_evidence(probs) is None  # values in [0, 1] are a regression's data
    assert MultiClass().probability_evidence(torch.randn(6, 4).log_softmax(1)) is None  # log p are logits


# --- models that do not fit their data: one line naming `x`, never a RuntimeError from deep inside torch --------------
def _first_setting(name: str) -> Setting:
    """The first registered example (any kind) the attack admits."""
    cls = medadv.attacks.base.attack_class(name)
    return next(s for s in settings() if admits(cls, s))


def _misfit(x: Tensor, fault: str) -> Tensor:
    """``x`` broken one way: one channel more than the model takes, or one spatial axis more or fewer (2-D images
    into a 3-D model, 3-D volumes into a 2-D one)."""
    if fault == "channels":
        return torch.cat([x, x[:, :1]], dim=1)
    if x.ndim == 5:  # 2-D slices into a 3-D model
        return x[:, :, 0].contiguous()
    return x.unsqueeze(2).expand(-1, -1, 4, *x.shape[2:]).contiguous()  # 3-D volumes into a 2-D model


@pytest.mark.parametrize("fault", ["channels", "rank"])
@pytest.mark.parametrize("name", ATTACKS)
def test_data_that_does_not_fit_the_model_is_one_line(name: str, fault: str) -> None:
    case = AttackCase(name, _first_setting(name))
    x, y = case.data()
    bad = _misfit(x, fault)
    with pytest.raises((ValueError, TypeError)) as info:
        case.build()(case.model(), bad, y)
    text = _one_line(info.value)
    assert not isinstance(info.value, RuntimeError)
    assert "x" in text and ("channel" in text or "-D" in text), text  # names the input and what is wrong


def test_the_channel_message_names_both_counts_and_its_advice_works() -> None:
    net = tiny_net(3, 4, 2, dense=False).eval()
    task, threat = MultiClass(), Linf(0.05, bounds=(0, 1))
    x, y = torch.rand(2, 1, 8, 8), torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"`x` of shape \(2, 1, 8, 8\) has 1 channel\(s\) .* first layer \(Conv2d\) "
                                         r"takes 3: data and model disagree; give the data 3 channel\(s\)"):
        PGD(task, threat, steps=1)(net, x, y)
    assert PGD(task, threat, steps=1)(net, x.repeat(1, 3, 1, 1), y).x_adv.shape == (2, 3, 8, 8)  # the advice


def test_2d_data_into_a_3d_model_is_not_told_to_add_a_batch_axis() -> None:
    # the old advice ("no batch dimension: x.unsqueeze(0)") was wrong for a batch of 2-D images, and following
    # it gave a RuntimeError about channels; now both the batch and the advice's result get one line
    net = tiny_net(1, 3, 3, dense=True).eval()
    task, threat = Segmentation(3), Linf(0.05, bounds=(0, 1))
    x, y = torch.rand(2, 1, 8, 8), torch.zeros(2, 8, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"holds 2-D samples \(N, C, H, W\), but the model's first layer \(Conv3d\) "
                                         r"takes 3-D inputs \(N, C, D, H, W\)") as info:
        PGD(task, threat, steps=1)(net, x, y)
    assert "unsqueeze" not in str(info.value)
    with pytest.raises(ValueError, match=r"has 2 channel\(s\) .* takes 1"):
        PGD(task, threat, steps=1)(net, x.unsqueeze(0), y.unsqueeze(0))
    # a real unbatched volume still gets the batch-axis advice, and following it works
    vol = torch.rand(1, 8, 8, 8)
    with pytest.raises(ValueError, match=r"no batch dimension.*unsqueeze\(0\)"):
        PGD(task, threat, steps=1)(net, vol, torch.zeros(8, 8, 8, dtype=torch.long))
    res = PGD(task, threat, steps=1)(net, vol.unsqueeze(0), torch.zeros(1, 8, 8, 8, dtype=torch.long))
    assert res.fooled.shape == (1,)


@pytest.mark.parametrize("fault", ["channels", "rank"])
def test_evaluate_refuses_data_that_does_not_fit_the_model(fault: str) -> None:
    net = tiny_net(1, 4, 2, dense=False).eval()
    x, y = torch.rand(4, 1, 8, 8), torch.arange(4)
    with pytest.raises(ValueError, match="`x` of shape") as info:
        evaluate(net, MultiClass(), (_misfit(x, fault), y), PGD(MultiClass(), Linf(0.05, bounds=(0, 1)), steps=2))
    _one_line(info.value)


# --- the same faults from a config: `medadv evaluate` exits 2 with one line, no traceback -------------------------
_CONFIG = {
    "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 3, "width": 4}},
    "task": {"type": "multiclass"},
    "data": {"source": "npz", "path": "data.npz"},
    "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
    "budgets": [0.05],
    "attacks": [{"name": "fgsm"}],
    "batch_size": 4,
    "output": "out",
}
#: fault -> (what changes in the config, what the one line must say)
_CONFIG_FAULTS = {
    "model-takes-3-channels": ({"model": {"builder": "small_cnn", "kwargs": {"in_channels": 3, "num_outputs": 3,
                                                                             "width": 4}}}, "takes 3"),
    "model-is-3d": ({"model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 3, "width": 4,
                                                                  "ndim": 3}}}, "holds 2-D samples"),
    "class-names-too-few": ({"task": {"type": "multiclass", "class_names": ["a", "b"]}}, "`class_names` lists 2"),
    "class-names-too-many": ({"task": {"type": "multiclass", "class_names": ["a", "b", "c", "d"]}},
                             "`class_names` lists 4"),
    "regression-least-likely": ({"task": {"type": "regression"}, "attacks": [{"name": "pgd", "targeted": True}],
                                 "target": "least_likely"}, "`target: least_likely` needs class scores"),
    "outputs-misspelt": ({"task": {"type": "multiclass", "outputs": "probs"}}, "outputs"),
    "outputs-on-regression": ({"task": {"type": "regression", "outputs": "probabilities"}}, "outputs"),
}


@pytest.mark.parametrize("fault", sorted(_CONFIG_FAULTS))
def test_config_fault_is_one_line(fault: str, tmp_path, capsys) -> None:
    import numpy as np
    import yaml

    from medadv.cli import main

    change, needle = _CONFIG_FAULTS[fault]
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x=rng.random((4, 1, 8, 8), dtype=np.float32), y=rng.integers(0, 3, 4))
    if fault == "regression-least-likely":  # one value per image
        np.savez(tmp_path / "data.npz", x=rng.random((4, 1, 8, 8), dtype=np.float32),
                 y=rng.random((4, 3), dtype=np.float32))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**_CONFIG, **change}))
    capsys.readouterr()
    rc = main(["evaluate", str(path), "--no-progress"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("medadv: error: ")]
    assert rc == 2 and "Traceback" not in err and len(errors) == 1, err
    assert needle in errors[0], errors[0]
    assert not (tmp_path / "out" / "results.json").exists()


@pytest.mark.parametrize("outputs", [None, "probabilities"])
def test_config_of_a_sigmoid_model(outputs: str | None, tmp_path, capsys) -> None:
    """A MONAI classifier ending in a sigmoid (``last_act``) from a config: refused in one line naming the option,
    or evaluated when the task declares ``outputs: probabilities``."""
    import numpy as np
    import yaml

    from medadv.cli import main

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x=rng.random((8, 1, 8, 8), dtype=np.float32),
             y=(rng.random((8, 4)) < 0.5).astype(np.float32))
    task: dict[str, object] = {"type": "multilabel", **({"outputs": outputs} if outputs else {})}
    cfg = {**_CONFIG, "task": task, "model": {"builder": "monai.networks.nets:Classifier", "kwargs": {
        "in_shape": [1, 8, 8], "classes": 4, "channels": [4], "strides": [2], "last_act": "sigmoid"}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    rc = main(["evaluate", str(tmp_path / "config.yaml"), "--no-progress"])
    err = capsys.readouterr().err
    if outputs is None:
        errors = [line for line in err.splitlines() if line.startswith("medadv: error: ")]
        assert rc == 2 and "Traceback" not in err and len(errors) == 1, err
        assert "declare `outputs: probabilities` on the task" in errors[0]
    else:
        assert rc == 0, err
        assert (tmp_path / "out" / "results.json").is_file()
