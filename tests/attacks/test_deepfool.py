"""DeepFool (Moosavi-Dezfooli et al., CVPR 2016): the analytic affine case, torchattacks and ART, the ε cap.

Overshoot conventions of the references (each compared with the matching medadv setting):

* torchattacks ``DeepFool``: ``x_{i+1} = clip(x_i + (1 + η) r_i)`` — medadv's ``overshoot_mode="per_step"``; every
  class is a candidate and the label passed in is the original class. Same algorithm, so the perturbations agree to
  float precision (asserted: per-sample relative L2 difference ≤ 1e-3, the same adversarial labels).
* ART ``DeepFool``: iterates without overshoot, ``x_{i+1} = clip(x_i + r_i)``, then applies ``(1 + η)`` once to the
  total at the end; the original class is the clean prediction. medadv's ``"total"`` mode (the paper's and Foolbox
  3's) iterates at ``x + (1 + η) Σ r`` instead, so the two walk slightly different paths; asserted: the median
  per-sample relative L2 difference ≤ 3 %, every sample within 5 % (measured: at most 1.6 %).

Several samples of the blob data sit near the box's lower bound, where the clip eats part of every step: the iterate
then approaches the decision boundary only asymptotically and ends on a near-tie of two logits (in both medadv and
torchattacks; ART's final overshoot pushes it past). The adversarial labels are compared where the final point is
not on such a tie (top-2 logit gap > 1e-3); there they agree exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from medadv.attacks.base import get_attack
from medadv.attacks.deepfool import DeepFool, DeepFoolDetails
from medadv.params import InvalidParameterError
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import L2, Box, Linf

UNIT = (0.0, 1.0)


def _affine(d: int = 12, k: int = 5, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(d, k)).double().eval()


@pytest.mark.parametrize("norm", ["L2", "Linf"])
@pytest.mark.parametrize("overshoot", [0.02, 0.1])
def test_affine_model_one_step_lands_at_the_analytic_distance(norm, overshoot):
    """On an affine classifier the linearisation is exact: one step lands at (1 + η) times the distance to the
    nearest boundary, ``min_k |f_k − f_y| / ‖w_k − w_y‖_q`` (q = 2 for L2, q = 1, the dual norm, for L∞), and the
    label flips to that boundary's class."""
    model = _affine()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1, 3, 4, generator=g, dtype=torch.float64)
    threat = L2(1e6, bounds=None) if norm == "L2" else Linf(1e6, bounds=None)
    res = DeepFool(MultiClass(), threat, overshoot=overshoot, steps=20)(model, x)
    W, b = model[1].weight.detach(), model[1].bias.detach()
    f = x.flatten(1) @ W.T + b
    y = f.argmax(1)
    q = 2 if norm == "L2" else 1
    dist = torch.full_like(f, float("inf"))
    nearest = torch.zeros_like(y)
    for i in range(x.shape[0]):
        for k in range(W.shape[0]):
            if k != y[i]:
                dist[i, k] = (f[i, k] - f[i, y[i]]).abs() / (W[k] - W[y[i]]).norm(p=q)
        nearest[i] = dist[i].argmin()
    analytic = dist.min(1).values
    got = res.l2 if norm == "L2" else res.linf
    torch.testing.assert_close(got, (1 + overshoot) * analytic, rtol=1e-9, atol=0)
    assert res.fooled.all()
    assert torch.equal(res.logits.argmax(1), nearest)
    assert torch.equal(res.details.iterations, torch.ones(6, dtype=torch.long))
    torch.testing.assert_close(res.details.minimal_norm, got)


def test_matches_torchattacks_deepfool_per_step_overshoot(trained_multiclass):
    torchattacks = pytest.importorskip("torchattacks")
    t = trained_multiclass
    x, y = t.x[:16], t.y[:16]
    ours = DeepFool(t.task, L2(1e3, bounds=UNIT), steps=50, overshoot=0.02, overshoot_mode="per_step",
                    candidates=4)(t.model, x, y)
    ref = torchattacks.DeepFool(t.model, steps=50, overshoot=0.02)(x, y)
    ref_norm = (ref - x).flatten(1).norm(dim=1)
    diff = (ours.x_adv - ref).flatten(1).norm(dim=1) / ref_norm.clamp_min(1e-12)
    moved = ref_norm > 0
    assert int(moved.sum()) >= 12, "most samples are correctly classified, so DeepFool moves them"
    assert float(diff[moved].max()) <= 1e-3, diff
    torch.testing.assert_close(ours.x_adv, ref, atol=1e-5, rtol=0)
    assert torch.equal(ours.x_adv[~moved], x[~moved])  # misclassified samples are returned unchanged by both
    # the same adversarial labels, except where the final point sits on a tie of two logits (within float noise:
    # several samples end on a boundary they cannot cross because the box clips the step)
    with torch.no_grad():
        ref_logits = t.model(ref)
    top2 = ref_logits.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3
    assert int(clear.sum()) >= 4
    assert torch.equal(ours.logits.argmax(1)[clear], ref_logits.argmax(1)[clear])


def test_matches_art_deepfool_overshoot_on_the_total(trained_multiclass):
    art_est = pytest.importorskip("art.estimators.classification")
    from art.attacks.evasion import DeepFool as ArtDeepFool

    t = trained_multiclass
    x = t.x[:16]
    clf = art_est.PyTorchClassifier(model=t.model, loss=nn.CrossEntropyLoss(), input_shape=tuple(x.shape[1:]),
                                    nb_classes=4, clip_values=UNIT)
    ref = torch.from_numpy(ArtDeepFool(clf, max_iter=100, epsilon=0.02, nb_grads=4, batch_size=16,
                                       verbose=False).generate(x.numpy()))
    ours = DeepFool(t.task, L2(1e3, bounds=UNIT), steps=100, overshoot=0.02, candidates=4)(t.model, x)
    n_ours, n_ref = ours.l2, (ref - x).flatten(1).norm(dim=1)
    assert (n_ref > 0).all()
    rel = (n_ours - n_ref).abs() / n_ref
    assert float(rel.median()) <= 0.03 and float(rel.max()) <= 0.05, rel
    # the same adversarial labels where medadv's final point is not on a tie of two logits (see the module
    # docstring: box-clipped iterates reach the boundary only asymptotically, ART's final overshoot then pushes past)
    top2 = ours.logits.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3
    assert int(clear.sum()) >= 4
    with torch.no_grad():
        assert torch.equal(ours.logits.argmax(1)[clear], t.model(ref).argmax(1)[clear])


def test_eps_caps_the_minimal_perturbation(trained_multiclass):
    t = trained_multiclass
    x, y = t.x[:16], t.y[:16]
    free = DeepFool(t.task, L2(1e3, bounds=UNIT))(t.model, x, y)
    eps = float(free.l2[free.l2 > 0].median())
    capped = DeepFool(t.task, L2(eps, bounds=UNIT))(t.model, x, y)
    assert (capped.l2 <= eps * (1 + 1e-5)).all()
    assert capped.x_adv.min() >= 0 and capped.x_adv.max() <= 1
    # the search is the same, the cap only cuts what is longer than ε
    torch.testing.assert_close(capped.details.minimal_norm, free.l2)
    short = free.l2 <= eps
    torch.testing.assert_close(capped.x_adv[short], free.x_adv[short])
    assert capped.fooled.sum() < free.fooled.sum()  # control: the cap costs successes
    assert isinstance(capped.details, DeepFoolDetails)
    assert set(capped.rows()[0]) == {"iterations", "minimal_norm"}


def test_linf_variant_moves_less_in_linf_than_l2_variant(trained_multiclass):
    t = trained_multiclass
    x, y = t.x[:16], t.y[:16]
    r2 = DeepFool(t.task, L2(1e3, bounds=UNIT))(t.model, x, y)
    ri = DeepFool(t.task, Linf(0.5, bounds=UNIT))(t.model, x, y)
    both = r2.fooled & ri.fooled
    assert int(both.sum()) >= 8
    assert float(ri.linf[both].median()) < float(r2.linf[both].median())
    assert float(r2.l2[both].median()) < float(ri.l2[both].median())


def test_refusals_name_what_to_use_instead():
    with pytest.raises(TypeError, match="apgd"):
        DeepFool(MultiLabel(), L2(1.0, bounds=UNIT))
    with pytest.raises(TypeError, match="apgd"):
        DeepFool(Segmentation(3), L2(1.0, bounds=UNIT))
    with pytest.raises(InvalidParameterError, match="targeted.*untargeted"):
        DeepFool(MultiClass(), L2(1.0, bounds=UNIT), targeted=True)
    with pytest.raises(TypeError, match="norm ball"):
        DeepFool(MultiClass(), Box(0, 1))
    with pytest.raises(InvalidParameterError, match="candidates"):
        get_attack("deepfool", MultiClass(), L2(1.0, bounds=UNIT), candidates=1)


def test_no_host_sync_in_the_loop(trained_multiclass, forbid_host_sync):
    t = trained_multiclass
    atk = DeepFool(t.task, L2(1e3, bounds=UNIT), steps=5)
    x, y = t.x[:8], t.y[:8]
    with torch.no_grad():
        logits = t.model(x)
    monkeypatch = forbid_host_sync()
    try:
        x_adv, details, _ = atk.perturb(t.model, x, y, logits)
    finally:
        monkeypatch.undo()
    assert np.isfinite(x_adv.numpy()).all() and (details.iterations <= 5).all()
