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
