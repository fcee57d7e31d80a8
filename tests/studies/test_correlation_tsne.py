"""Xu et al.'s Fig. 7 groups in the correlation study: train / clean / noisy / adversarial, embedded jointly by PCA
and t-SNE, with centroid distances, kNN separability and the kNN label probe; the config's ``train:`` source."""

from __future__ import annotations

import pytest
import torch

from medadv import PGD, Linf
from medadv.data.synthetic import multiclass_blobs
from medadv.studies import correlation, run_study
from medadv.studies.correlation import knn_probe, knn_separability, matched_noise, tsne_2d
from medadv.threats import Box


def test_knn_separability_and_probe_by_hand():
    a = torch.tensor([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1]])
    assert knn_separability(a, a + 10.0, k=3) == 1.0  # far apart: every neighbour of the same group
    mixed = knn_separability(a, a + 0.01, k=1)  # each point's nearest is its twin of the other group
    assert mixed == 0.0
    ref = torch.tensor([[0.0], [0.2], [5.0], [5.2]])
    q = torch.tensor([[0.1], [5.1], [4.9]])
    # labels read off the two nearest references: a, b, b; truth a, b, a -> 2 of 3
    assert knn_probe(ref, ["a", "a", "b", "b"], q, ["a", "b", "a"], k=2) == pytest.approx(2 / 3)


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_matched_noise_has_the_perturbations_norm(norm):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 8, 8, generator=g)
    x_adv = x + 0.05 * torch.randn(3, 1, 8, 8, generator=g) * torch.tensor([1.0, 2.0, 3.0]).reshape(3, 1, 1, 1)
    before = x.clone()
    xn = matched_noise(x, x_adv, Box.unbounded(), norm=norm, generator=torch.Generator().manual_seed(1))
    p = 2 if norm == "l2" else float("inf")
    assert (xn - x).flatten(1).norm(p=p, dim=1).tolist() == pytest.approx((x_adv - x).flatten(1).norm(p=p, dim=1).tolist())
    assert torch.equal(x, before) and not torch.allclose(xn - x, x_adv - x)
    clipped = matched_noise(x, x_adv, Box(0.0, 1.0), norm=norm, generator=torch.Generator().manual_seed(1))
    assert float(clipped.min()) >= 0.0 and float(clipped.max()) <= 1.0
    # the norm is matched after the clipping (the scale is searched for), not before
    assert (clipped - x).flatten(1).norm(p=p, dim=1).tolist() == pytest.approx(
        (x_adv - x).flatten(1).norm(p=p, dim=1).tolist(), rel=1e-3)


def test_tsne_is_seeded_and_refuses_too_few_points():
    f = torch.randn(40, 6, generator=torch.Generator().manual_seed(0))
    a, b = tsne_2d(f, seed=3), tsne_2d(f, seed=3)
    assert a.shape == (40, 2) and torch.equal(a, b)
    # neighbourhoods survive: two separated clusters stay apart (control: their labels shuffled do not)
    two = torch.cat([f[:20], f[20:] + 8.0])
    emb = tsne_2d(two, seed=0)
    assert knn_separability(emb[:20], emb[20:]) == 1.0
    assert knn_separability(emb[::2], emb[1::2]) < 0.8
    with pytest.raises(ValueError, match="embedding: \\[pca\\]"):
        tsne_2d(f[:5])


def test_four_groups_adversarial_moves_more_than_noise_of_the_same_norm(trained_multiclass):
    t = trained_multiclass
    x_train, y_train = multiclass_blobs(n=64, num_classes=4, seed=0)  # the fixture's first training samples
    atk = PGD(t.task, Linf(0.15, bounds=(0.0, 1.0)), steps=5)
    kw = dict(layer="4", train_data=(x_train, y_train), seed=0)
    r = correlation(t.model, t.task, (t.x, t.y), {"pgd": atk}, **kw)
    emb = r.meta["embeddings"]
    assert list(emb) == ["pca", "tsne"]
    for method in ("pca", "tsne"):
        sizes = {g: len(p) for g, p in emb[method]["groups"].items()}
        assert sizes == {"train": 64, "clean": 32, "noisy": 32, "adv": 32}
        assert emb[method]["labels"]["train"] == [str(v) for v in y_train.tolist()]
    assert len(emb["pca"]["explained"]) == 2
    # seeded: the same noise and the same t-SNE
    again = correlation(t.model, t.task, (t.x, t.y), {"pgd": atk}, **kw)
    assert again.meta["embeddings"] == emb and again.rows == r.rows
    # the noisy control has the perturbation's L2 norm (after the box clipping)
    noise = r.meta["noise"]
    assert noise["match"] == "l2" and noise["noise_norm"] == pytest.approx(noise["adv_norm"], rel=1e-3)
    sep = {(s["space"], s["pair"]): s for s in r.meta["separation"]}
    for space in ("features", "pca", "tsne"):
        adv, noisy = sep[(space, "clean|adv")], sep[(space, "clean|noisy")]
        assert adv["centroid_distance"] > noisy["centroid_distance"], space
    assert sep[("features", "clean|adv")]["knn_separability"] > sep[("features", "clean|noisy")]["knn_separability"]
    assert r.rows[0]["feature_shift"] > r.rows[0]["noise_shift"] > 0.0
    # the probe against the training features: attacked samples land among another class
    probe = {(p["space"], p["group"]): p["knn_label_accuracy"] for p in r.meta["probe"]}
    assert probe[("features", "clean")] > probe[("features", "adv")]
    assert probe[("features", "noisy")] > probe[("features", "adv")]
    # the legacy single embedding is the first method's clean and adversarial points
    assert r.meta["embedding"]["clean"] == emb["pca"]["groups"]["clean"]


def test_the_config_builds_the_train_group_from_a_source(trained_multiclass):
    t = trained_multiclass
    atk = {"fgsm": PGD(t.task, Linf(0.1, bounds=(0.0, 1.0)), steps=1)}
    spec = {"train": {"source": "synthetic", "n": 40, "kwargs": {"kind": "multiclass_blobs", "num_classes": 4}},
            "embedding": ["pca"], "max_points": 16, "noise": "linf"}
    r = run_study("correlation", spec, t.model, t.task, (t.x, t.y), atk)
    groups = r.meta["embeddings"]["pca"]["groups"]
    assert list(r.meta["embeddings"]) == ["pca"] and [len(groups[g]) for g in groups] == [16, 16, 16, 16]
    from medadv.report.html import render_html_report

    html = render_html_report(None, studies=[r])
    assert "Could not draw" not in html and "PCA and t-SNE of the features" in html and "knn_separability" in html
    assert r.meta["noise"]["match"] == "linf" and {p["space"] for p in r.meta["probe"]} == {"features", "pca"}
    # a relative path starts at the config's folder (`base_dir`)
    import tempfile
    from pathlib import Path

    import numpy as np

    folder = Path(tempfile.mkdtemp())
    np.savez(folder / "train.npz", x=t.x.numpy(), y=t.y.numpy())
    r2 = run_study("correlation", {"train": {"source": "npz", "path": "train.npz"}, "embedding": ["pca"]}, t.model,
                   t.task, (t.x, t.y), atk, base_dir=str(folder))
    assert "train" in r2.meta["embeddings"]["pca"]["groups"]
    with pytest.raises(Exception, match="train.npz"):
        run_study("correlation", {"train": {"source": "npz", "path": "train.npz"}}, t.model, t.task, (t.x, t.y), atk)
    with pytest.raises(Exception, match="embedding"):
        run_study("correlation", {"embedding": ["umap"]}, t.model, t.task, (t.x, t.y), atk)
