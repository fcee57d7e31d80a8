"""evaluate() on the device of ``pytest --device`` (default CPU): metrics batched on the device, the clean forward
shared with the attacks, one host copy per batch, and the resume checksum computed where the data are."""

from __future__ import annotations

import copy

import pytest
import torch
from monai.metrics import compute_dice
from torch import Tensor, nn

from medadv.attacks import FGSM, PGD
from medadv.evaluation import _device_checksum, _sample_hashes, evaluate, sample_rows
from medadv.tasks import Segmentation
from medadv.threats import Linf

N = 4  # samples per test (the smallest fixture holds 4)
KINDS = ["trained_multiclass", "trained_multilabel", "trained_seg2d", "trained_seg3d"]
FLOAT_COLUMNS = ("linf", "l2", "clean_mean_dice", "adv_mean_dice", "clean_pixel_accuracy", "adv_pixel_accuracy",
                 "changed_fraction", "clean_label_accuracy", "adv_label_accuracy", "flip_rate")


class _Counting(nn.Module):
    """Counts the samples the model is run on (forward passes × batch size)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.samples = inner, 0

    def forward(self, x: Tensor) -> Tensor:
        self.samples += x.shape[0]
        return self.inner(x)


def _on(t, device):
    return copy.deepcopy(t.model).to(device), t.x[:N].to(device), t.y[:N].to(device)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_on_the_device_match_the_cpu_and_the_definitions(kind, device, request):
    t = request.getfixturevalue(kind)
    model, x, y = _on(t, device)
    atk = PGD(t.task, Linf(0.05, bounds=(0, 1)), steps=3, random_start=False)
    on_device = evaluate(model, t.task, [(x[:2], y[:2]), (x[2:], y[2:])], atk).rows
    on_cpu = evaluate(t.model, t.task, [(t.x[:2], t.y[:2]), (t.x[2:N], t.y[2:N])], atk).rows
    assert len(on_device) == len(on_cpu) == N
    for a, b in zip(on_device, on_cpu, strict=True):
        assert set(a) == set(b)
        for k in a:
            if k in FLOAT_COLUMNS:
                assert a[k] == pytest.approx(b[k], abs=1e-4), k
            elif k not in ("clean_scores", "adv_scores", "clean_dice", "adv_dice"):
                assert a[k] == b[k], k
    # the columns mean what they say: recomputed here from the attack's output, on the CPU
    res = atk(t.model, t.x[:N], t.y[:N])
    pred = t.task.predict(res.logits)
    for i, row in enumerate(on_cpu):
        if isinstance(t.task, Segmentation):
            oh = torch.nn.functional.one_hot
            dice = compute_dice(oh(pred[i:i + 1], 3).movedim(-1, 1), oh(t.y[i:i + 1], 3).movedim(-1, 1),
                                include_background=False, ignore_empty=False)
            present = [c for c in (1, 2) if bool((pred[i] == c).any() | (t.y[i] == c).any())]
            expect = float(dice[0, [c - 1 for c in present]].mean()) if present else 1.0
            assert row["adv_mean_dice"] == pytest.approx(expect, abs=1e-5)
            assert row["adv_pixel_accuracy"] == pytest.approx(float((pred[i] == t.y[i]).float().mean()), abs=1e-6)
        elif pred.is_floating_point():  # multi-label
            assert row["adv_exact_match"] == bool((pred[i] == t.y[i]).all())
            assert row["adv_pred"] == pred[i].tolist()
        else:
            assert row["adv_correct"] == bool(pred[i] == t.y[i]) and row["adv_pred"] == int(pred[i])
        assert row["fooled"] == bool(res.fooled[i])


@pytest.mark.parametrize("kind", KINDS)
def test_the_clean_forward_is_shared_with_an_attack_that_starts_at_x(kind, device, request):
    t = request.getfixturevalue(kind)
    inner, x, y = _on(t, device)
    model = _Counting(inner)
    rows = evaluate(model, t.task, (x, y), FGSM(t.task, Linf(0.05, bounds=(0, 1)))).rows
    # FGSM: its first step is at x (the clean forward), then the final forward; no third pass over the batch
    assert model.samples == 2 * x.shape[0]
    with torch.no_grad():
        clean = inner(x)
    res = FGSM(t.task, Linf(0.05, bounds=(0, 1)))(inner, x, y)
    expect = sample_rows(t.task, y, clean, res.logits)
    for row, ref in zip(rows, expect, strict=True):
        assert {k: row[k] for k in ref} == ref
    # a random start is not the clean input: evaluate() runs the clean forward itself, once for every attack
    model.samples = 0
    pgd = PGD(t.task, Linf(0.05, bounds=(0, 1)), steps=2)
    evaluate(model, t.task, (x, y), {"a": pgd, "b": pgd.set_params(steps=1)})
    assert model.samples == (1 + (2 + 1) + (1 + 1)) * x.shape[0]


def test_the_clean_logits_of_the_attack_equal_a_separate_clean_forward(trained_seg3d, device):
    t = trained_seg3d
    model, x, y = _on(t, device)
    res = FGSM(t.task, Linf(0.05, bounds=(0, 1)))(model, x, y)
    with torch.no_grad():
        assert torch.equal(res.clean_logits, model(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.uint8, torch.bool])
def test_the_device_checksum_sees_every_single_change(dtype, device):
    g = torch.Generator().manual_seed(0)
    values = torch.rand(3, 2, 5, 7, generator=g)
    base = ((values > 0.5) if dtype == torch.bool else (values * 100).to(dtype)).to(device)
    ref = _device_checksum(base)
    assert ref.shape == (3, 2) and torch.equal(ref, _device_checksum(base.clone()))
    flat = base.reshape(3, -1)
    for pos in torch.randperm(flat.shape[1], generator=g)[:20].tolist():
        changed = flat.clone()
        changed[1, pos] = (~changed[1, pos]) if dtype == torch.bool else changed[1, pos] + 1
        sums = _device_checksum(changed.reshape(base.shape))
        assert not torch.equal(sums[1], ref[1]), pos
        assert torch.equal(sums[[0, 2]], ref[[0, 2]])  # per sample: the other samples keep theirs
    # a permutation of the same values (a transposed image) is a different sample
    assert not torch.equal(_device_checksum(base.transpose(2, 3).contiguous().reshape(base.shape)), ref)


def test_device_tensors_are_hashed_without_copying_the_voxels(device):
    x = torch.rand(2, 1, 6, 6, device=device)
    y = torch.randint(0, 3, (2, 6, 6), device=device)
    h = _sample_hashes(x, y)
    assert len(h) == 2 and h[0] != h[1] and h == _sample_hashes(x.clone(), y.clone())
    x2 = x.clone()
    x2[1, 0, 3, 3] += 1e-3
    assert _sample_hashes(x2, y)[0] == h[0] and _sample_hashes(x2, y)[1] != h[1]


def test_one_host_wait_per_batch_whatever_its_size(cuda_device, trained_seg3d):
    """On a GPU the number of synchronisations per batch does not grow with the batch: the metrics of all samples
    are computed on the device and copied once (no per-sample or per-column reads)."""
    import warnings

    t = trained_seg3d
    model = copy.deepcopy(t.model).to(cuda_device)
    atk = PGD(t.task, Linf(0.05, bounds=(0, 1)), steps=2, random_start=False)

    def syncs(n: int) -> int:
        x, y = t.x[:n].to(cuda_device), t.y[:n].to(cuda_device)
        evaluate(model, t.task, (x, y), atk)  # warm-up
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                evaluate(model, t.task, (x, y), atk)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in seen)

    assert syncs(1) == syncs(4)
