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
    pytester.makepyfile(test_model=TEST_FILE.replace("EPS", "0.0").replace("MIN", "0.0"))
    first = pytester.runpytest_subprocess()
    first.assert_outcomes(failed=1)  # no baseline yet: a clear failure, not a silent pass
    assert "no baseline" in first.stdout.str()
    pytester.runpytest_subprocess("--medadv-update-baselines").assert_outcomes(passed=1)
    assert (pytester.path / "robustness_baselines.json").is_file()
    # a stronger attack lowers the metric below the recorded baseline: regression detected
    pytester.makepyfile(test_model=TEST_FILE.replace("EPS", "0.5").replace("MIN", "0.0"))
    worse = pytester.runpytest_subprocess()
    worse.assert_outcomes(failed=1)
    assert "regressed" in worse.stdout.str()
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
