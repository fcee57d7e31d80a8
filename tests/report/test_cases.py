"""Case figures: the right samples, the right slices, the right panels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medadv.attacks import PGD
from medadv.evaluation import evaluate
from medadv.report.cases import (
    Case,
    SaliencyPair,
    damage,
    make_cases,
    most_changed_voxel,
    plot_case,
    select_cases,
    volume_axis_names,
    worst_cases,
)
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import Linf


def _volume_case(change_at=(5, 9, 2), lone=(12, 1, 13), label=True):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 16, 16, 16, generator=g)
    clean = torch.zeros(16, 16, 16, dtype=torch.long)
    adv = clean.clone()
    i, j, k = change_at
    adv[i - 1 : i + 2, j - 1 : j + 2, k - 1 : k + 2] = 2  # a changed 3x3x3 region ...
    adv[lone] = 1  # ... beats a lone flipped voxel
    delta = torch.zeros_like(x)
    delta[0, lone] = 0.5  # and the largest perturbation elsewhere does not matter when predictions changed
    return Case(x, x + delta, clean, adv, "segmentation", label=clean if label else None,
                class_names=["bg", "a", "b"], title="t", note="n", axis_names=("sagittal", "coronal", "axial"))


def test_most_changed_voxel_is_the_centre_of_the_changed_region():
    assert most_changed_voxel(_volume_case()) == (5, 9, 2)
    # a change touching the border: the nearest voxel at least 16/8 = 2 voxels inside
    assert most_changed_voxel(_volume_case(change_at=(1, 14, 7))) == (2, 13, 7)
    # of two equal changed regions, the one away from the border wins
    case = _volume_case(change_at=(8, 8, 8))
    case.adv[0:3, 0:3, 0:3] = 2
    assert most_changed_voxel(case) == (8, 8, 8)


def test_most_changed_voxel_falls_back_to_the_perturbation():
    x = torch.zeros(2, 8, 8, 8)
    delta = torch.zeros_like(x)
    delta[:, 3:6, 1:4, 4:7] = 0.01  # a patch of small changes on both channels ...
    delta[0, 0, 7, 0] = 0.02  # ... beats a single larger one
    same = torch.zeros(8, 8, 8, dtype=torch.long)
    assert most_changed_voxel(Case(x, x + delta, same, same, "segmentation")) == (4, 2, 5)


def test_volume_figure_shows_the_three_orthogonal_slices_through_that_voxel():
    case = _volume_case()
    fig = plot_case(case)
    c = (5, 9, 2)
    # 3 slices x (clean image, attacked image, perturbation, clean, attacked, truth)
    axes = np.array(fig.axes).reshape(3, 6)
    vol = case.x[0].numpy()
    delta = case.delta[0].numpy()
    for r, plane in enumerate((vol[c[0]], vol[:, c[1]], vol[:, :, c[2]])):
        np.testing.assert_allclose(axes[r][0].images[0].get_array(), plane.T)  # origin lower, 2nd axis up
        rest = [a for a in range(3) if a != r]
        assert axes[r][0].lines[0].get_xdata()[0] == c[rest[0]]  # the crosshair sits on the voxel
        assert axes[r][0].lines[1].get_ydata()[0] == c[rest[1]]
        assert axes[r][0].get_ylabel() == f"{case.axis_names[r]} = {c[r]}"
    np.testing.assert_allclose(axes[0][2].images[0].get_array(), delta[c[0]].T)
    np.testing.assert_allclose(axes[0][1].images[0].get_array(), case.x_adv[0, c[0]].numpy().T)  # attacked image
    adv_overlay = np.ma.getdata(axes[1][4].images[1].get_array())  # the attacked labels over the image
    np.testing.assert_array_equal(adv_overlay, case.adv[:, c[1]].numpy().T)
    assert [a.get_title() for a in axes[0]][3:] == ["clean prediction", "attacked prediction", "ground truth"]
    lim = float(case.delta.abs().max())
    assert axes[0][2].images[0].get_clim() == (-lim, lim)  # the perturbation is stretched to its full range
    assert "t\nn" in fig._suptitle.get_text()


def test_classification_case_shows_the_probabilities(trained_multiclass):
    t = trained_multiclass
    logits = t.model(t.x).detach()
    adv_logits = logits.clone()
    adv_logits[3] = adv_logits[3].flip(0)  # sample 3 changes its prediction (if its top class is not central)
    cases = make_cases(MultiClass(), t.x, t.x + 0.01, logits, adv_logits, t.y, k=1, class_names=list("ABCD"))
    assert len(cases) == 1 and cases[0].title == "sample 3"
    fig = plot_case(cases[0])
    assert len(fig.axes) == 5  # clean image, attacked image, perturbation, clean, attacked
    bars = [p.get_width() for p in fig.axes[3].patches]
    np.testing.assert_allclose(bars, logits[3].softmax(0).numpy(), rtol=1e-5)  # one bar per class, in order
    pred = "ABCD"[int(logits[3].argmax())]
    assert fig.axes[3].get_title().endswith(f"→ {pred}")
    assert fig.axes[0].get_title().startswith("clean image")
    assert fig.axes[0].get_title().endswith(f"\ntrue: {'ABCD'[int(t.y[3])]}")


def test_select_cases_picks_the_samples_the_attack_changed_most(trained_seg2d):
    t = trained_seg2d
    atk = PGD(t.task, Linf(0.08, bounds=(float(t.x.min()), float(t.x.max()))), steps=3)
    cases = select_cases(t.model, t.task, t.x, t.y, atk, k=3)
    fractions = [float((c.clean != c.adv).double().mean()) for c in cases]
    assert fractions == sorted(fractions, reverse=True) and fractions[0] > 0
    assert all(c.title.startswith("pgd ε=0.08 · sample ") and "Dice" in c.note for c in cases)
    fig = plot_case(cases[0])
    assert len(fig.axes) == 6  # clean/attacked image, perturbation, clean, attacked, ground truth
    assert len(fig.legends) == 1 and [t.get_text() for t in fig.legends[0].texts] == ["1", "2"]


def test_multilabel_case_and_saliency_pair(trained_multilabel):
    t = trained_multilabel
    logits = t.model(t.x[:4]).detach()
    case = make_cases(MultiLabel(), t.x[:4], t.x[:4], logits, -logits, t.y[:4], k=1)[0]
    assert case.note.startswith("label accuracy")
    fig = plot_case(case)
    assert "positive:" in fig.axes[4].get_title()
    pair = SaliencyPair(t.x[:2], t.x[:2] + 0.01, torch.rand(2, 16, 16), torch.rand(2, 16, 16), title="maps")
    assert len(pair.figure().axes) == 2 * 4


def test_bad_cases_are_refused():
    x = torch.zeros(1, 8, 8)
    with pytest.raises(ValueError, match="kind"):
        Case(x, x, torch.tensor(0), torch.tensor(1), "detection")
    with pytest.raises(ValueError, match="shape"):
        Case(x, torch.zeros(1, 8, 9), torch.tensor(0), torch.tensor(1), "multiclass")
    with pytest.raises(ValueError, match="label maps"):
        Case(x, x, torch.zeros(4, 4), torch.zeros(4, 4), "segmentation")
    with pytest.raises(TypeError, match="medadv Task"):
        make_cases(object(), x[None], x[None], torch.zeros(1, 2), torch.zeros(1, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="saliency"):
        SaliencyPair.from_result(x, type("R", (), {"extras": {}})())


def test_segmentation_cases_from_tensors_rank_by_changed_voxels():
    task = Segmentation(2)
    x = torch.zeros(3, 1, 6, 6)
    clean = torch.zeros(3, 2, 6, 6)
    clean[:, 0] = 1.0
    adv = clean.clone()
    adv[2, 1, :3] = 5.0  # sample 2: 18 voxels flip
    adv[0, 1, :1] = 5.0  # sample 0: 6 voxels
    cases = make_cases(task, x, x, clean, adv, torch.zeros(3, 6, 6, dtype=torch.long), k=2, title="A")
    assert [c.title for c in cases] == ["A · sample 2", "A · sample 0"]
    assert cases[0].note.endswith("50.0% of voxels changed")


# --- worst_cases: the samples evaluate() scored worst, attacked again under its seed --------------------------------
def _batches(x, y, size=2):
    return [(x[i : i + size], y[i : i + size]) for i in range(0, x.shape[0], size)]


def test_worst_cases_redraw_what_evaluate_measured(trained_seg3d):
    t = trained_seg3d
    box = (float(t.x.min()), float(t.x.max()))
    # two small steps from a random start drawn from the global RNG (no own seed): the adversarial example
    # depends on evaluate's per-batch seed
    attacks = {f"pgd@{e:.6g}": PGD(t.task, Linf(e, bounds=box), steps=2, step_size=e / 4, seed=None)
               for e in (4 / 255, 16 / 255)}
    data = _batches(t.x, t.y)
    res = evaluate(t.model, t.task, data, attacks, seed=7, hd95=True)
    names = ["background", "organ A", "organ B"]
    cases = worst_cases(t.model, t.task, data, attacks, res, k=2, seed=7, class_names=names)
    rows = sorted((r for r in res.rows if r["attack"] == "pgd@0.0627451"), key=lambda r: r["sample"])
    worst = sorted(rows, key=lambda r: damage(t.task, r), reverse=True)[:2]  # the largest budget only
    assert worst[0]["clean_mean_dice"] - worst[0]["adv_mean_dice"] == max(
        r["clean_mean_dice"] - r["adv_mean_dice"] for r in rows)
    assert [c.title for c in cases] == [f"pgd ε=0.06275 (16/255) · case {r['sample']}" for r in worst]
    for case, row in zip(cases, worst, strict=True):
        assert case.kind == "map" and case.class_names == names
        assert torch.equal(case.x, t.x[row["sample"]]) and torch.equal(case.label, t.y[row["sample"]])
        # the same adversarial example as the table's: its Dice per class is the row's
        onehot = torch.nn.functional.one_hot(case.adv[None].long(), 3).movedim(-1, 1).double() * 1e3
        dice = t.task.metrics(onehot, case.label[None])["dice"][0].tolist()
        assert dice == pytest.approx(row["adv_dice"], abs=1e-6, nan_ok=True)
        assert "re-attacked" not in case.note and "mean HD95" in case.note
        assert case.axis_names == ("axis 0", "axis 1", "axis 2")  # tensors: no affine, no anatomical names
    # another seed: another adversarial example, and a case whose metric is not the table's says so
    other = worst_cases(t.model, t.task, data, attacks, res, k=2, seed=8)
    assert not torch.equal(other[0].x_adv, cases[0].x_adv)
    for case, row in zip(other, worst, strict=True):
        onehot = torch.nn.functional.one_hot(case.adv[None].long(), 3).movedim(-1, 1).double() * 1e3
        again = float(t.task.metrics(onehot, case.label[None])["mean_dice"][0])
        assert ("re-attacked" in case.note) == (abs(again - row["adv_mean_dice"]) > 1e-4)
    # only the strongest setting; none at all
    (strongest,) = worst_cases(t.model, t.task, data, attacks, res, k=1, seed=7, strongest_only=True)
    assert strongest.title == cases[0].title
    assert worst_cases(t.model, t.task, data, attacks, res, k=0) == []
    # data in another order than evaluate saw: the rows' samples are not these, so nothing is drawn
    shuffled = _batches(t.x.flip(0), t.y.flip(0))
    with pytest.warns(RuntimeWarning, match="is not the data of its row"):
        assert worst_cases(t.model, t.task, shuffled, attacks, res, k=2, seed=7) == []


def test_worst_cases_of_classifiers_draw_scores_and_label_names(trained_multilabel, trained_multiclass):
    import matplotlib.pyplot as plt

    for t, names in ((trained_multilabel, ["effusion", "edema", "nodule", "mass"]),
                     (trained_multiclass, ["cat", "dog", "bird", "deer"])):
        attacks = {"pgd@0.1": PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=3)}
        data = _batches(t.x, t.y, 8)
        res = evaluate(t.model, t.task, data, attacks, seed=1)
        (case,) = worst_cases(t.model, t.task, data, attacks, res, k=1, seed=1, class_names=names)
        best = max(damage(t.task, r) for r in res.rows)
        row = next(r for r in res.rows if damage(t.task, r) == best)
        assert case.title.endswith(f"case {row['sample']}") and torch.equal(case.x, t.x[row["sample"]])
        assert case.adv.tolist() == row["adv_pred"]
        fig = plot_case(case)
        ticks = {tick.get_text().removesuffix(" ✓") for ax in fig.axes for tick in ax.get_yticklabels()}
        assert set(names) <= ticks  # the score bars are labelled with the names
        plt.close(fig)


def test_volume_axis_names_follow_the_affine():
    ras = torch.diag(torch.tensor([2.0, 2.0, 2.0, 1.0]))
    assert volume_axis_names(ras) == ("sagittal", "coronal", "axial")
    assert volume_axis_names(torch.diag(torch.tensor([-1.0, -1.0, 3.0, 1.0]))) == ("sagittal", "coronal", "axial")
    permuted = torch.eye(4)
    permuted[:3, :3] = torch.tensor([[0.0, 0.0, 2.0], [2.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    assert volume_axis_names(permuted) == ("coronal", "axial", "sagittal")
    oblique = torch.eye(4)
    oblique[:3, :3] = torch.tensor([[1.0, 0.9, 0.0], [0.2, 0.3, 0.0], [0.0, 0.0, 1.0]])
    assert volume_axis_names(oblique) is None and volume_axis_names(None) is None
