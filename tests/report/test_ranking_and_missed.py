"""Issue 28 item 7: the report ranks only attacks of one budget and norm whose perturbations stayed in their
ε-ball, marks the others, and counts the structures a prediction missed (which HD95 means leave out)."""

from __future__ import annotations

import re

import torch

from medadv.attacks import FGSM
from medadv.evaluation import evaluate
from medadv.report.html import render_html_report
from medadv.report.markdown import write_report
from medadv.results import Results
from medadv.tasks import Segmentation
from medadv.threats import Linf


def _rows(attack: str, budget: float | None, linf: float, adv: float, n: int = 2) -> list[dict]:
    return [{"sample": i, "attack": attack, "budget": budget, "linf": linf, "l2": 3 * linf, "fooled": adv < 0.5,
             "clean_mean_dice": 0.8, "adv_mean_dice": adv} for i in range(n)]


def _vafa_like() -> Results:
    """HU data: PGD and FGSM at ε = 8 HU; an attack whose renormalisation left the ball (L∞ 4052 HU) at the same
    budget; a quantisation attack with no ε-ball; PGD at a smaller budget; the lowest Dice is the artefacts'."""
    rows = (_rows("pgd@8", 8.0, 8.0, 0.5) + _rows("fgsm@8", 8.0, 7.9, 0.6) + _rows("renorm@8", 8.0, 4052.0, 0.0)
            + _rows("vafa", None, 4052.0, 0.0) + _rows("pgd@2", 2.0, 2.0, 0.7))
    return Results(rows, {"task": "Segmentation(num_classes=3)", "norms": {"pgd@8": "Linf", "fgsm@8": "Linf",
                                                                          "renorm@8": "Linf", "vafa": None,
                                                                          "pgd@2": "Linf"}})


def test_ball_check_marks_out_of_ball_and_non_lp_attacks():
    res = _vafa_like()
    check = res.ball_check()
    assert check[("pgd@8", 8.0)]["status"] == "in" and check[("fgsm@8", 8.0)]["status"] == "in"
    assert check[("renorm@8", 8.0)] == {"norm": "Linf", "max_norm": 4052.0, "status": "out"}
    assert check[("vafa", None)]["status"] == "no ball"
    assert Results.ball_note(check[("renorm@8", 8.0)], 8.0) == "OUT of the ε-ball (max L∞ 4052 > ε 8)"
    # an L2 attack is checked in L2: its L∞ below ε says nothing
    l2 = Results(_rows("pgd@1", 1.0, 0.5, 0.5), {"norms": {"pgd@1": "L2"}})
    assert l2.ball_check()[("pgd@1", 1.0)]["status"] == "out"
    # a rounding excess is not an exit (float32 on HU data)
    near = Results(_rows("pgd@8", 8.0, 8.0 * (1 + 1e-5), 0.5), {"norms": {"pgd@8": "Linf"}})
    assert near.ball_check()[("pgd@8", 8.0)]["status"] == "in"


def test_html_headline_ranks_only_in_ball_attacks_of_one_budget(tmp_path):
    res = _vafa_like()
    html = render_html_report(res)
    findings = html.split('id="findings"')[1].split("</section>")[0]
    # the headline names its budget and norm and is the strongest in-ball attack there, not an artefact
    assert "Strongest attack at ε = 8 (L∞, 2 attacks at this budget): <b>pgd</b> (mean Dice 0.500)" in findings
    assert "Strongest attack: <b>vafa" not in html and "Strongest attack: <b>renorm" not in html
    assert "OUT of the ε-ball (max L∞ 4052 &gt; ε 8): not ranked" in findings
    assert "no ε-ball (not an Lp threat): not ranked" in findings.split("<b>vafa</b>")[1]
    # the summary table marks them too
    summary = html.split('id="summary"')[1]
    assert "OUT of the ε-ball (max L∞ 4052 &gt; ε 8)" in summary and "no ε-ball (not an Lp threat)" in summary
    md = write_report(res, tmp_path).read_text()
    assert "| OUT of the ε-ball (max L∞ 4052 &gt; ε 8) |" in md and "| no ε-ball (not an Lp threat) |" in md


def test_no_strongest_attack_without_two_comparable_attacks():
    rows = _rows("pgd@8", 8.0, 8.0, 0.5) + _rows("vafa", None, 4052.0, 0.0)
    html = render_html_report(Results(rows, {"norms": {"pgd@8": "Linf", "vafa": None}}))
    assert "Strongest attack" not in html


def _never_class_2() -> torch.nn.Module:
    """A 1x1 convolution that predicts class 1 where x > 0.5, else 0: class 2 is never predicted."""
    net = torch.nn.Conv2d(1, 3, 1)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([0.0, 20.0, 0.0]).reshape(3, 1, 1, 1))
        net.bias.copy_(torch.tensor([0.0, -10.0, -100.0]))
    return net.eval()


def test_a_structure_missed_in_every_case_is_counted_not_dropped(tmp_path):
    torch.manual_seed(0)
    x = torch.zeros(4, 1, 8, 8)
    x[:, :, :4] = 1.0  # class 1 (predicted) in the top half
    y = torch.zeros(4, 8, 8, dtype=torch.long)
    y[:, :4] = 1
    y[:, 6:, 6:] = 2  # a small lesion in every case, never predicted
    task = Segmentation(3)
    res = evaluate(_never_class_2(), task, (x, y), {"fgsm@0.01": FGSM(task, Linf(0.01, bounds=(0.0, 1.0)))},
                   hd95=True, meta={"classes": ["background", "organ", "lesion"]})
    row = res.rows[0]
    assert row["adv_missed"] == [False, False, True] and row["clean_missed"] == [False, False, True]
    assert row["adv_absent"] == [False, False, False] and row["adv_hd95"][2] is None  # HD95 cannot count it
    html = render_html_report(res)
    per_class = html.split('id="per-class"')[1].split("</section>")[0]
    heads = re.findall(r"<th[^>]*>(.*?)</th>", per_class)
    table = [dict(zip(heads, re.findall(r"<td[^>]*>(.*?)</td>", tr), strict=True))
             for tr in re.findall(r"<tr><td.*?</tr>", per_class)]
    lesion = next(r for r in table if r["class"] == "lesion")
    assert lesion["missed"] == "4 / 4 of 4" and lesion["absent"] == "0 / 0 of 4"  # clean / attacked of the cases
    assert next(r for r in table if r["class"] == "organ")["missed"] == "0 / 0 of 4"
    assert "missed</i> counts the cases where the class is in the reference and missing" in per_class
    assert "a structure missed in every case has no bar at all" in per_class
    summary = html.split('id="summary"')[1].split("</section>")[0]
    assert '<th class="" title="missed">missed</th>' in summary
    md = write_report(res, tmp_path).read_text()
    assert "| missed |" in md.replace("| missed | absent |", "| missed |") and "| 4 / 4 |" in md


def test_the_hd95_figure_says_where_a_structure_was_missed(monkeypatch):
    import matplotlib.figure
    import matplotlib.text

    drawn: list[str] = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):
        drawn.extend(t.get_text() for t in fig.findobj(matplotlib.text.Text))
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    x = torch.zeros(4, 1, 8, 8)
    x[:, :, :4] = 1.0
    y = torch.zeros(4, 8, 8, dtype=torch.long)
    y[:, :4] = 1
    y[:, 6:, 6:] = 2
    task = Segmentation(3)
    res = evaluate(_never_class_2(), task, (x, y), {"fgsm@0.01": FGSM(task, Linf(0.01, bounds=(0.0, 1.0)))},
                   hd95=True)
    render_html_report(res)
    assert "missed 4/4" in drawn
