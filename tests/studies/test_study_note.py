"""A study entry's ``note:`` (a recipe's reading of its numbers against the paper's) reaches the report, escaped."""

from __future__ import annotations

import pytest
import torch

from medadv import FGSM, Linf, MultiClass
from medadv.config_schema import ConfigError
from medadv.models import small_cnn
from medadv.report import write_html_report
from medadv.studies import run_study, validate_study


def test_the_note_is_kept_in_the_result_and_shown_escaped_under_the_heading(tmp_path):
    torch.manual_seed(0)
    task = MultiClass()
    model = small_cnn(1, 3).eval()
    x, y = torch.rand(4, 1, 16, 16), torch.tensor([0, 1, 2, 0])
    note = "The paper's <b>AUC</b> collapses; here it does not & why"
    res = run_study("models", {"note": note, "title": "Table 1"}, {"a": model, "b": small_cnn(1, 3).eval()}, task,
                    (x, y), {"fgsm": FGSM(task, Linf(0.03, bounds=(0.0, 1.0)))})
    assert res.meta["note"] == note
    html = write_html_report(None, tmp_path, studies=[res], title="t").read_text()
    assert "The paper&#39;s &lt;b&gt;AUC&lt;/b&gt; collapses; here it does not &amp; why" in html
    assert "<b>AUC</b>" not in html
    # without a note nothing is added
    plain = run_study("models", {"title": "Table 1"}, {"a": model, "b": small_cnn(1, 3).eval()}, task, (x, y),
                      {"fgsm": FGSM(task, Linf(0.03, bounds=(0.0, 1.0)))})
    assert "note" not in plain.meta


def test_an_empty_or_non_text_note_is_refused_before_any_work():
    with pytest.raises(ConfigError, match="note"):
        validate_study({"study": "models", "note": ""})
    with pytest.raises(ConfigError, match="note"):
        validate_study({"study": "models", "note": 3})
