"""The ``gap`` study's ``cases:``: figures of GAP examples in its own report section (Xu et al. 2021; issue 32
item 3b)."""

from __future__ import annotations

import base64

import pytest
import torch
from torch import nn

import medadv.report.cases as cases_module
from medadv.data.synthetic import multiclass_blobs
from medadv.models import fit_supervised
from medadv.studies import gap, run_study
from medadv.tasks import MultiClass

OPTS = {"generator": {"name": "resnet", "ngf": 4}, "epochs": 1, "max_batches": 1, "batch_size": 16,
        "loss": "neg_true_logprob", "bounds": [0.0, 1.0]}


@pytest.fixture(scope="module")
def setup():
    x, y = multiclass_blobs(n=64, num_classes=3, seed=1)
    task = MultiClass()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), 3))
    fit_supervised(model, task, x, y, epochs=1, lr=3e-3, batch_size=16)
    return task, model.eval(), x, y


def test_a_case_of_the_largest_budget_on_held_out_data_shows_in_the_html(setup, monkeypatch):
    from medadv.report.html import render_html_report

    task, model, x, y = setup
    seen = []
    real = cases_module.make_cases

    def spy(task, x, x_adv, *args, **kwargs):
        seen.append((x.clone(), x_adv.clone(), kwargs.get("title")))
        return real(task, x, x_adv, *args, **kwargs)

    monkeypatch.setattr(cases_module, "make_cases", spy)
    r = run_study("gap", {**OPTS, "budgets": [8 / 255, 51 / 255], "cases": 1}, model, task, (x, y), None)
    # one call: the largest budget, the first batch of the validation split (the second half of the data)
    assert len(seen) == 1
    xs, x_adv, title = seen[0]
    assert title == "GAP L∞ 51/255 · val."
    assert torch.equal(xs, x[32:48])
    assert float((x_adv - xs).abs().max()) <= 51 / 255 + 1e-6 and not torch.equal(x_adv, xs)

    figures = r.meta["cases"]
    assert len(figures) == 1 and figures[0]["title"].startswith("GAP L∞ 51/255 · val. · sample ")
    assert base64.b64decode(figures[0]["png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert figures[0]["width"] > 0 and figures[0]["height"] > 0
    html = render_html_report(None, studies=[r])
    assert f'alt="case: {figures[0]["title"]}"' in html and figures[0]["png"] in html
    assert "Could not draw" not in html


def test_no_cases_by_default_and_bad_counts_are_refused(setup):
    task, model, x, y = setup
    r = gap(model, task, (x[:32], y[:32]), budgets=[0.1], bounds=(0.0, 1.0), generator=OPTS["generator"],
            epochs=1, max_batches=1)
    assert "cases" not in r.meta
    with pytest.raises(ValueError, match="`cases` must be an int >= 0"):
        gap(model, task, (x, y), budgets=[0.1], bounds=(0.0, 1.0), cases=-1)
    with pytest.raises(ValueError, match="`cases` must be an int >= 0"):
        gap(model, task, (x, y), budgets=[0.1], bounds=(0.0, 1.0), cases=True)
    with pytest.raises(Exception, match="cases"):
        run_study("gap", {**OPTS, "budgets": [0.1], "cases": 9}, model, task, (x, y), None)
