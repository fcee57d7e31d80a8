import json

pytest_plugins = ["pytester"]

TEST_FILE = '''
import torch
from medadv import PGD, Linf
from medadv.data.synthetic import multiclass_blobs
from medadv.models import fit_supervised, small_cnn
from medadv.tasks import MultiClass

def test_robust(robustness):
    torch.manual_seed(0)
    x, y = multiclass_blobs(n=96, num_classes=3, size=12)
    task = MultiClass()
    model = small_cnn(1, 3, width=4)
    fit_supervised(model, task, x[:64], y[:64], epochs=8)
    robustness.check("cnn-pgd", model, task, (x[64:], y[64:]),
                     PGD(task, Linf(EPS, bounds=(0.0, 1.0)), steps=3), min_value=MIN, max_drop=0.0)
'''


def test_plugin_records_then_enforces_baseline(pytester):
    pytester.makepyfile(test_model=TEST_FILE.replace("EPS", "0.5").replace("MIN", "0.0"))
    first = pytester.runpytest_subprocess()
    first.assert_outcomes(failed=1)  # no baseline yet: a clear failure, not a silent pass
    assert "no baseline" in first.stdout.str()
    pytester.runpytest_subprocess("--medadv-update-baselines").assert_outcomes(passed=1)
    assert (pytester.path / "robustness_baselines.json").is_file()
    # issue 28 item 6: the test's ε lowered and the old baseline kept is refused, not compared
    pytester.makepyfile(test_model=TEST_FILE.replace("EPS", "0.01").replace("MIN", "0.0"))
    weaker = pytester.runpytest_subprocess()
    weaker.assert_outcomes(failed=1)
    assert "budget 0.5 (now 0.01)" in weaker.stdout.str()
    # and a hard minimum fails even when baselines are being recorded
    pytester.makepyfile(test_model=TEST_FILE.replace("EPS", "0.5").replace("MIN", "0.99"))
    res = pytester.runpytest_subprocess("--medadv-update-baselines")
    res.assert_outcomes(failed=1)
    assert "below the required minimum" in res.stdout.str()


def test_measure_passes_the_target_of_a_targeted_attack(tmp_path):
    import pytest
    import torch
    from torch import nn

    from medadv.attacks import DAG
    from medadv.tasks import Segmentation
    from medadv.testing import RobustnessCheck
    from medadv.threats import Box

    torch.manual_seed(0)
    model = nn.Conv2d(1, 3, 3, padding=1).eval()
    x, y = torch.rand(2, 1, 8, 8), torch.randint(0, 3, (2, 8, 8))
    task = Segmentation(3)
    check = RobustnessCheck(tmp_path / "b.json", update=True)
    dag = DAG(task, Box(0.0, 1.0), steps=3)
    with pytest.raises(ValueError, match="target_fn"):
        check.measure(model, task, (x, y), dag)
    # an attack-specific column as the metric: DAG's share of the target region reached
    value = check.check("dag", model, task, (x, y), dag, metric="attack_fooled_fraction",
                        target_fn=lambda x, y, logits: torch.zeros_like(y))
    assert 0.0 <= value <= 1.0


def _setup(tmp_path, update: bool, eps: float = 0.5):
    import torch
    from torch import nn

    from medadv import PGD, Linf
    from medadv.tasks import MultiClass
    from medadv.testing import RobustnessCheck

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    task = MultiClass()
    data = (torch.rand(4, 1, 4, 4), torch.tensor([0, 1, 2, 0]))
    return RobustnessCheck(tmp_path / "b.json", update), model, task, data, PGD(task, Linf(eps, bounds=(0, 1)),
                                                                                steps=1)


def test_check_refuses_a_baseline_of_other_settings(tmp_path):
    """Issue 28 item 6: the baseline stores the attack's settings and the metric with the value; a test whose ε,
    parameters, task or metric differ fails naming each difference and how to re-record."""
    import pytest

    from medadv.attacks import FGSM
    from medadv.tasks import Segmentation
    from medadv.threats import L2, Linf

    check, model, task, data, atk = _setup(tmp_path, update=True)
    value = check.check("b", model, task, data, atk)
    stored = json.loads((tmp_path / "b.json").read_text())["b"]
    assert stored["value"] == value and stored["metric"] == "adv_correct"
    assert stored["settings"]["budget"] == "0.5" and stored["settings"]["norm"] == "Linf"
    check.update = False
    assert check.check("b", model, task, data, atk) == value  # the same settings: compared and passed
    variants = {
        "budget 0.5 (now 0.01)": {"attack": type(atk)(task, Linf(0.01, bounds=(0, 1)), steps=1)},
        "norm Linf (now L2)": {"attack": type(atk)(task, L2(0.5, bounds=(0, 1)), steps=1)},
        "parameters": {"attack": atk.set_params(steps=2)},
        "attack medadv.attacks.pgd.PGD (now medadv.attacks.fgsm.FGSM)": {"attack": FGSM(task, atk.threat)},
        "target untargeted (now targeted by": {"attack": type(atk)(task, atk.threat, steps=1, targeted=True),
                                               "target_fn": lambda x, y, logits: y},
        "task {": {"task": Segmentation(3), "attack": type(atk)(Segmentation(3), atk.threat, steps=1),
                   "metric": "adv_correct"},
        "metric adv_correct (now fooled)": {"metric": "fooled"},
        "bounds": {"attack": type(atk)(task, Linf(0.5, bounds=(0, 2)), steps=1)},
    }
    for needle, change in variants.items():
        args = {"attack": atk, "task": task, **change}
        with pytest.raises(pytest.fail.Exception, match="recorded under other settings") as err:
            check.check("b", model, args["task"], data, args["attack"], metric=args.get("metric"),
                        target_fn=args.get("target_fn"))
        assert needle in str(err.value) and "--medadv-update-baselines" in str(err.value), (needle, err.value)


def test_plugin_refuses_a_bare_number_baseline_and_names_the_metric(tmp_path):
    """Baselines of the first format (a bare number) have unknown settings: refused with the command that
    re-records them; a regression message names the metric it compared."""
    import pytest

    check, model, task, data, atk = _setup(tmp_path, update=False)
    (tmp_path / "b.json").write_text('{"b": 0.99}')
    with pytest.raises(pytest.fail.Exception, match="bare number .*--medadv-update-baselines"):
        check.check("b", model, task, data, atk)
    check.update = True
    check.check("b", model, task, data, atk)
    stored = json.loads((tmp_path / "b.json").read_text())
    stored["b"]["value"] = 1.5  # as if the model had been better when it was recorded
    (tmp_path / "b.json").write_text(json.dumps(stored))
    check.update = False
    with pytest.raises(pytest.fail.Exception, match=r"robustness 'b' \(adv_correct\) regressed: adv_correct "):
        check.check("b", model, task, data, atk)


def test_check_refuses_bad_arguments_before_work(tmp_path):
    import pytest
    import torch
    from torch import nn

    from medadv import PGD, Linf
    from medadv.tasks import MultiClass
    from medadv.testing import RobustnessCheck

    class Boom(nn.Module):  # any forward pass would fail the test: the refusals come first
        def forward(self, x):
            raise AssertionError("the model ran")

    check = RobustnessCheck(tmp_path / "b.json", update=False)
    task = MultiClass()
    atk = PGD(task, Linf(0.1, bounds=(0.0, 1.0)), steps=1)
    data = (torch.rand(2, 1, 4, 4), torch.tensor([0, 1]))
    for kwargs, err, text in (({"name": ""}, TypeError, "`name`"), ({"max_drop": -0.1}, ValueError, "`max_drop`"),
                              ({"max_drop": float("nan")}, TypeError, "`max_drop`"),
                              ({"min_value": "0.5"}, TypeError, "`min_value`"), ({"metric": 3}, TypeError, "`metric`")):
        args = {"name": "x", **kwargs}
        with pytest.raises(err, match=text):
            check.check(args.pop("name"), Boom(), task, data, atk, **args)
