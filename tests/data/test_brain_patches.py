"""Real brain-MRI patches: Colin27 + AAL macro-regions (mricron-data) and the nilearn MNI152 fallback."""

from __future__ import annotations

import pytest
import torch

from medadv.data import brain_patches as bp

HAS_MRICRON = (bp.MRICRON_DIR / "ch2bet.nii.gz").is_file()


def _check(d, n_labels):
    assert d.x.dtype == torch.float32 and d.x.ndim == 4 and d.x.shape[1:] == (1, 32, 32)
    assert float(d.x.min()) >= 0.0 and float(d.x.max()) <= 1.0
    assert d.y.shape == (len(d), n_labels) and set(d.y.unique().tolist()) <= {0.0, 1.0}
    prevalence = d.y.mean(0)
    assert bool((prevalence > 0.05).all() and (prevalence < 0.95).all()), prevalence  # every label informative
    assert float(d.y.sum(1).mean()) > 1.5  # genuinely multi-label
    # patches are crops of brain anatomy, not blank background
    tissue = (d.x > 0.05).float().mean(dim=(1, 2, 3))
    assert float(tissue.min()) > 0.05 and float(tissue.mean()) > 0.4


@pytest.mark.skipif(not HAS_MRICRON, reason="Debian package mricron-data not installed (apt-get install mricron-data)")
def test_colin27_aal_patches():
    d = bp.brain_patches(source="mricron")
    assert d.source == "mricron:colin27+aal" and d.label_names == tuple(bp.AAL_MACRO_REGIONS)
    _check(d, 8)
    # anatomy check: cerebellum patches come from inferior slices, frontal ones include superior slices
    z = d.slice_index.float()
    cereb, frontal = d.y[:, d.label_names.index("cerebellum")] == 1, d.y[:, d.label_names.index("frontal")] == 1
    assert float(z[cereb].mean()) < float(z[frontal].mean()) - 20
    assert bp.brain_patches().source == d.source  # "auto" prefers the Debian package


def test_nilearn_mni152_fallback():
    d = bp.brain_patches(source="nilearn")
    assert d.source == "nilearn:mni152+tissue-hemisphere" and d.label_names == bp.TISSUE_LABELS
    _check(d, 5)


def test_auto_falls_back_when_mricron_is_absent(monkeypatch, tmp_path):
    monkeypatch.setattr(bp, "MRICRON_DIR", tmp_path)
    assert bp.brain_patches(crops_per_slice=2).source.startswith("nilearn:")
    with pytest.raises(FileNotFoundError, match="mricron-data"):
        bp.brain_patches(source="mricron")


def test_splits_are_disjoint_by_slice_and_deterministic():
    tr = bp.brain_patches(source="nilearn", split="train")
    te = bp.brain_patches(source="nilearn", split="test")
    assert len(te) > 0.1 * (len(tr) + len(te))
    assert not set(tr.slice_index.tolist()) & set(te.slice_index.tolist())
    again = bp.brain_patches(source="nilearn", split="test")
    assert torch.equal(te.x, again.x) and torch.equal(te.y, again.y)
    other = bp.brain_patches(source="nilearn", split="test", seed=1)
    assert not torch.equal(te.x, other.x)
    assert bp.brain_patches(source="nilearn", patch=32, downsample=1, crops_per_slice=1).x.shape[-1] == 32


@pytest.mark.parametrize("kwargs, match", [
    (dict(source="web"), "source"), (dict(split="val"), "split"), (dict(patch=0), "patch"),
    (dict(patch=63, downsample=2), "multiple"), (dict(min_brain=1.5), "min_brain"), (dict(patch=1000), "exceeds"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bp.brain_patches(**kwargs)
