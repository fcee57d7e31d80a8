"""Batched surface distances (HD, HD95, ASSD) against MONAI's reference, every route forced on CPU tensors."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from medadv.metrics import surface as surface_mod
from medadv.metrics import surface_distance_per_class
from medadv.metrics.segmentation import hd95_per_class

ROUTES = ["edt", "cdist", "scipy"]  # "torch" picks one of the first two, "auto" on CPU is "scipy"
ATOL = 1e-3


def _blobs(n, c, shape, seed, k=5):
    """Label maps of smooth random blobs (argmax of smoothed noise)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, *shape, generator=g)
    pool = F.avg_pool3d if len(shape) == 3 else F.avg_pool2d
    return pool(x, k, stride=1, padding=k // 2).argmax(1)


def _pair(n, c, shape, seed):
    y = _blobs(n, c, shape, seed)
    pred = torch.where(_blobs(n, 2, shape, seed + 1) == 1, y, _blobs(n, c, shape, seed + 2))
    return pred, y


def _monai(pred, y, num_classes, spacing=None, mask=None, metric="hd", percentile=95):
    from monai.metrics import compute_average_surface_distance, compute_hausdorff_distance
    from monai.networks.utils import one_hot

    op, oy = one_hot(pred.unsqueeze(1), num_classes), one_hot(y.unsqueeze(1), num_classes)
    if mask is not None:
        op, oy = op * mask.unsqueeze(1), oy * mask.unsqueeze(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if metric == "hd":
            r = compute_hausdorff_distance(op, oy, include_background=True, percentile=percentile, spacing=spacing)
        else:
            r = compute_average_surface_distance(op, oy, include_background=True, symmetric=True, spacing=spacing)
    return torch.where(torch.isfinite(r), r, torch.full_like(r, float("nan")))


def _close(got, ref):
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    diff = (got - ref).abs().nan_to_num(0.0).max().item()
    assert diff <= ATOL, diff


@pytest.mark.parametrize("metric", ["hd", "assd"])
@pytest.mark.parametrize("shape,spacing", [
    ((12, 14, 10), None),
    ((12, 14, 10), [1.0, 0.7, 2.5]),  # anisotropic
    ((30, 26), 0.8),  # 2-D, scalar spacing
    ((12, 10, 14), [[1.0, 1.0, 3.0], [0.5, 2.0, 1.2]]),  # one spacing per sample
])
def test_random_masks_match_monai(metric, shape, spacing):
    pred, y = _pair(2, 3, shape, seed=len(shape))
    pred[0][pred[0] == 2] = 1  # class 2 in the label only (sample 0)
    y[1][y[1] == 2] = 0  # class 2 in the prediction only (sample 1)
    ref = _monai(pred, y, 4, spacing, metric=metric)  # class 3: in neither
    for route in ROUTES + (["torch", "auto"] if spacing is None else []):
        got = surface_distance_per_class(pred, y, 4, spacing, metric=metric, backend=route)
        _close(got, ref)
    assert torch.isnan(got[:, 2:]).all() and not torch.isnan(got[:, :2]).any()


@pytest.mark.parametrize("percentile", [None, 100.0, 50.0, 99.0])
def test_percentiles_and_max_match_monai(percentile):
    pred, y = _pair(2, 3, (20, 22), seed=7)
    ref = _monai(pred, y, 3, [1.3, 0.6], percentile=percentile)
    for route in ("edt", "cdist", "scipy"):
        _close(surface_distance_per_class(pred, y, 3, [1.3, 0.6], percentile=percentile, backend=route), ref)


def test_ignore_mask_matches_monai_and_hd95_per_class():
    pred, y = _pair(2, 3, (12, 14, 10), seed=11)
    mask = _blobs(2, 2, (12, 14, 10), seed=12) == 1
    y = torch.where(mask, y, torch.full_like(y, 255))  # ignored voxels hold any value
    ref = _monai(torch.where(mask, pred, 0), torch.where(mask, y, 0), 3, [1.0, 2.0, 1.5], mask=mask)
    for route in ("edt", "cdist", "scipy"):
        _close(surface_distance_per_class(pred, y, 3, [1.0, 2.0, 1.5], mask=mask, backend=route), ref)
    _close(hd95_per_class(pred, y, 3, [1.0, 2.0, 1.5], mask=mask), ref)


def test_real_mni152_tissue_map_matches_monai():
    from medadv.data.mni152 import load_tissue_map

    try:
        _, lab = load_tissue_map(2)
    except (FileNotFoundError, ImportError) as err:
        pytest.skip(f"MNI152 template unavailable: {err}")
    y = lab[36:60, 40:64, 66:86].unsqueeze(0)  # a 24x24x20 crop across the top of the brain at 2 mm
    # a plausible bad prediction: the label shifted by one voxel and one tissue eroded by a 3^3 minimum
    grey = (y == 1).float().unsqueeze(1)
    eroded = -F.max_pool3d(-grey, 3, stride=1, padding=1)[:, 0] > 0
    pred = torch.roll(torch.where((y == 1) & ~eroded, torch.full_like(y, 3), y), 1, dims=2)
    spacing = [2.0, 2.0, 2.0]
    for metric in ("hd", "assd"):
        ref = _monai(pred, y, 4, spacing, metric=metric)
        assert not torch.isnan(ref).any()
        for route in ("edt", "cdist", "scipy"):
            _close(surface_distance_per_class(pred, y, 4, spacing, metric=metric, backend=route), ref)


def test_hand_computed_and_units():
    y = torch.zeros(1, 8, 8, 8, dtype=torch.long)
    y[0, 2:4, 2:4, 2:4] = 1
    pred = torch.roll(y, shifts=1, dims=1)
    for route in ("edt", "cdist", "scipy"):
        vox = surface_distance_per_class(pred, y, 3, backend=route)
        mm = surface_distance_per_class(pred, y, 3, [2.0, 5.0, 5.0], backend=route)
        assert vox[0, 1].item() == pytest.approx(1.0) and mm[0, 1].item() == pytest.approx(2.0)
        assert torch.isnan(vox[0, 2]) and torch.isnan(mm[0, 2])
        # foreground touching the image border is surface (outside counts as background)
        full = torch.ones(1, 5, 5, dtype=torch.long)
        assert surface_distance_per_class(full, full, 2, backend=route)[0, 1].item() == 0.0


def test_empty_maps_and_single_voxels():
    y = torch.zeros(2, 9, 9, dtype=torch.long)
    pred = torch.zeros_like(y)
    y[1, 0, 0], pred[1, 8, 8] = 1, 1  # one voxel each, far apart
    for route in ("edt", "cdist", "scipy"):
        for metric in ("hd", "assd"):
            got = surface_distance_per_class(pred, y, 2, metric=metric, backend=route)
            _close(got, _monai(pred, y, 2, metric=metric))
            assert torch.isnan(got[0, 1]) and got[1, 1].item() == pytest.approx(8 * 2**0.5)


@pytest.mark.parametrize("route", ["edt", "cdist"])
def test_chunked_paths_agree(route, monkeypatch):
    pred, y = _pair(2, 3, (6, 7, 8), seed=5)
    whole = surface_distance_per_class(pred, y, 3, [1.0, 1.5, 0.5], backend=route)
    monkeypatch.setattr(surface_mod, "_BLOCK", 700)  # one class per chunk, a few lines or rows per block
    _close(surface_distance_per_class(pred, y, 3, [1.0, 1.5, 0.5], backend=route), whole)


def test_nearest_tiles_both_point_sets(monkeypatch):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 50, (90, 3), generator=g).float(), torch.randint(0, 50, (70, 3), generator=g).float()
    monkeypatch.setattr(surface_mod, "_BLOCK", 32)  # blocks of 32 of b's points, one row of a at a time
    assert torch.allclose(surface_mod._nearest(a, b), torch.cdist(a, b).amin(1), atol=1e-4)


def test_spacing_forms_are_equivalent():
    import numpy as np

    pred, y = _pair(2, 3, (12, 10), seed=3)
    ref = surface_distance_per_class(pred, y, 3, [[1.5, 0.5], [1.5, 0.5]], backend="edt")
    for sp in ((1.5, 0.5), np.array([1.5, 0.5]), torch.tensor([1.5, 0.5]), torch.tensor([[1.5, 0.5]] * 2),
               [np.array([1.5, 0.5])] * 2):
        assert torch.equal(surface_distance_per_class(pred, y, 3, sp, backend="edt"), ref)
    assert torch.equal(surface_distance_per_class(pred, y, 3, 2, backend="edt"),
                       surface_distance_per_class(pred, y, 3, [2.0, 2.0], backend="edt"))


def test_inputs_not_modified():
    pred, y = _pair(2, 3, (10, 12, 8), seed=9)
    mask = _blobs(2, 2, (10, 12, 8), seed=10) == 1
    spacing = [[1.0, 2.0, 1.0], [0.5, 0.5, 1.0]]
    copies = [t.clone() for t in (pred, y, mask)]
    for route in ("edt", "cdist", "scipy"):
        surface_distance_per_class(pred, y, 3, spacing, mask=mask, backend=route)
    for t, c in zip((pred, y, mask), copies, strict=True):
        assert torch.equal(t, c)
    assert spacing == [[1.0, 2.0, 1.0], [0.5, 0.5, 1.0]]


@pytest.mark.parametrize("kwargs,match", [
    ({"y": torch.zeros(2, 6, 7, dtype=torch.long)}, "pred"),
    ({"pred": torch.zeros(2, 6, dtype=torch.long), "y": torch.zeros(2, 6, dtype=torch.long)}, "pred"),
    ({"pred": torch.zeros(1, 2, 3, 4, 5, dtype=torch.long), "y": torch.zeros(1, 2, 3, 4, 5, dtype=torch.long)},
     "pred"),
    ({"spacing": [1.0, 1.0, 1.0]}, "spacing"),
    ({"spacing": [[1.0, 1.0]] * 3}, "spacing"),
    ({"spacing": [1.0, -1.0]}, "spacing"),
    ({"spacing": 0.0}, "spacing"),
    ({"spacing": [1.0, float("nan")]}, "spacing"),
    ({"spacing": "1mm"}, "spacing"),
    ({"metric": "hd95"}, "metric"),
    ({"backend": "cuda"}, "backend"),
    ({"percentile": 0}, "percentile"),
    ({"percentile": 101}, "percentile"),
    ({"num_classes": 0}, "num_classes"),
    ({"mask": torch.ones(2, 6, 5, dtype=torch.bool)}, "mask"),
    ({"pred": torch.full((2, 6, 6), 0.5)}, "pred"),
])
def test_bad_input_is_a_value_error_naming_the_argument(kwargs, match):
    args = {"pred": torch.zeros(2, 6, 6, dtype=torch.long), "y": torch.zeros(2, 6, 6, dtype=torch.long),
            "num_classes": 2}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        surface_distance_per_class(**args)
