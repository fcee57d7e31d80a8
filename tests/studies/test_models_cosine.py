"""Cross-model cosine similarity of class-wise vectors (Medi et al., App. B, Fig. 7) in the ``models`` study.

Toy data of tests/studies/conftest.py: c = (0.6, 0.9, 0.2, 0.45), labels (0, 0, 1, 0). A (sum) and B (top-left
pixel) predict (0, 0, 1, 1) clean: recall (2/3, 1), errors (off-diagonal confusion [0→1, 1→0]) = (1, 0). ``Flip``
(A's logits negated) predicts (1, 1, 0, 0): recall (1/3, 0), errors (2, 1). So cos(A, Flip) = (2/9) /
(√13/3 · 1/3) = 2/√13 on recall and 2/√5 on errors; cos(A, B) = 1.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from torch import nn

from medadv import FGSM, Linf, MultiClass
from medadv.studies import models
from medadv.studies.models import cosine
from medadv.tasks import MultiLabel


class Flip(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -self.inner(x)


def test_cosine_matrix_equals_the_hand_computation(toy_pair):
    x, y, a, b = toy_pair
    task = MultiClass()
    r = models({"A": a, "B": b, "Flip": Flip(a)}, task, (x, y), {"fgsm": FGSM(task, Linf(0.25, bounds=(0, 1)))})
    cos = r.meta["cosine"]
    assert cos["conditions"] == ["clean", "fgsm@0.25"] and cos["models"] == ["A", "B", "Flip"]
    assert cos["vectors"]["A"]["clean"] == pytest.approx([2 / 3, 1.0])
    assert cos["vectors"]["Flip"]["clean"] == pytest.approx([1 / 3, 0.0])
    m = cos["recall"]["clean"]
    assert m[0][1] == pytest.approx(1.0) and m[0][0] == pytest.approx(1.0)
    assert m[0][2] == pytest.approx(2 / math.sqrt(13)) and m[2][0] == pytest.approx(m[0][2])
    assert cos["errors"]["clean"][0][2] == pytest.approx(2 / math.sqrt(5))
    pairs = {(row["model_a"], row["model_b"], row["condition"]): row for row in r.meta["cosine_rows"]}
    assert len(pairs) == 3 * 2
    assert pairs[("A", "Flip", "clean")]["recall_cosine"] == pytest.approx(2 / math.sqrt(13))
    # attacked: A's own FGSM examples give (1, 0, 1, 1) → recall (1/3, 1) (see test_transfer_models)
    assert cos["vectors"]["A"]["fgsm@0.25"] == pytest.approx([1 / 3, 1.0])
    assert pairs[("A", "B", "fgsm@0.25")]["recall_cosine"] == pytest.approx(1.0)


def test_cosine_is_undefined_for_a_zero_vector_and_skips_classes_without_support():
    assert cosine(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.5])) is None
    assert cosine(torch.tensor([1.0, math.nan, 0.0]), torch.tensor([2.0, 5.0, 0.0])) == pytest.approx(1.0)
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == pytest.approx(0.0)


def test_multilabel_models_get_per_label_cosines():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(12, 3, generator=g)
    y = (x > 0.5).float()
    task = MultiLabel()

    class Lin(nn.Module):
        def __init__(self, w: torch.Tensor) -> None:
            super().__init__()
            self.w = nn.Parameter(w)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return 20.0 * (t - 0.5) * self.w

    good, bad = Lin(torch.ones(3)), Lin(torch.tensor([1.0, -1.0, 1.0]))  # bad gets label 1 backwards
    r = models({"good": good, "bad": bad}, task, (x, y), [FGSM(task, Linf(0.05, bounds=(0, 1)))])
    cos = r.meta["cosine"]
    sens_bad = cos["vectors"]["bad"]["clean"]
    assert cos["vectors"]["good"]["clean"] == pytest.approx([1.0, 1.0, 1.0]) and sens_bad[1] == pytest.approx(0.0)
    assert cos["recall"]["clean"][0][1] == pytest.approx(2 / math.sqrt(3 * 2))
    assert cos["errors"]["clean"][0][1] is None  # the good model makes no error: its error vector is zero


def test_report_draws_the_cosine_heatmaps(toy_pair, monkeypatch):
    import medadv.report.html as html

    x, y, a, b = toy_pair
    task = MultiClass()
    r = models({"A": a, "Flip": Flip(a)}, task, (x, y), {"fgsm": FGSM(task, Linf(0.25, bounds=(0, 1)))})
    drawn: list[tuple[str, list]] = []
    drawn_by = importlib.import_module("medadv.studies.models")  # the module (the package binds the function)

    real = drawn_by.heatmap
    monkeypatch.setattr(drawn_by, "heatmap", lambda ax, m, *args, **kw: (drawn.append((kw.get("title"), m)),
                                                                       real(ax, m, *args, **kw)))
    sec = html._study_section(r, None)
    assert "Could not draw" not in sec.intro
    titles = [t for t, _ in drawn]
    assert titles == ["clean: per-class recall", "clean: error pattern (off-diagonal confusion)",
                      "fgsm ε=0.25: per-class recall", "fgsm ε=0.25: error pattern (off-diagonal confusion)"]
    assert drawn[0][1][0][1] == pytest.approx(2 / math.sqrt(13))
    assert sum(type(blk).__name__ == "Image" for blk in sec.blocks) == 2
