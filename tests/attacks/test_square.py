"""Square Attack (Andriushchenko et al., ECCV 2020): the paper's schedule and L2 pattern, the searches' geometry,
robust metrics lowered on every task, the active set (fooled samples stop costing queries, results unchanged),
determinism, and robust accuracy close to pyautoattack's Square at the same budget."""

from __future__ import annotations

import pytest
import torch
from pyautoattack.square import SquareAttack
from torch import nn

from medadv.attacks import Square, SquareDetails, get_attack
from medadv.attacks.square import square_eta, square_p
from medadv.params import InvalidParameterError
from medadv.tasks import MultiLabel, Segmentation
from medadv.threats import L2, Box, Linf


class _Recorder(nn.Module):
    """Records every batch the attack queries the model with."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.inputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs.append(x.detach().clone())
        return self.inner(x)


def _extent(mask: torch.Tensor) -> list[int]:
    """Per axis, the extent of the bounding box of the True elements (0 when none)."""
    out = []
    for a in range(mask.ndim):
        hit = mask.any(dim=tuple(b for b in range(mask.ndim) if b != a)).nonzero()
        out.append(int(hit.max() - hit.min()) + 1 if hit.numel() else 0)
    return out


def _robust(t, res) -> torch.Tensor:
    with torch.no_grad():
        return t.task.robust_metric(t.model(res.x_adv), t.y[: res.x_adv.shape[0]])


def _clean(t, n) -> torch.Tensor:
    with torch.no_grad():
        return t.task.robust_metric(t.model(t.x[:n]), t.y[:n])


# --- the paper's schedule and pattern ------------------------------------------------------------------------------
@pytest.mark.parametrize("queries", [10000, 5000, 1000, 137])
def test_p_schedule_is_the_reference_schedule(queries):
    ref = SquareAttack(None, n_queries=queries, p_init=0.8)
    for i in range(queries):
        assert square_p(i, queries, 0.8) == ref.p_selection(i), i
    assert square_p(0, queries, 0.8) == 0.8 and square_p(queries - 1, queries, 0.8) == 0.8 / 512


@pytest.mark.parametrize("side", [1, 3, 5, 6, 9])
def test_l2_pattern_is_the_papers(side):
    """Both halves of the window hold nested centred squares (weights 1/(k+1)²) of opposite signs, unit norm;
    equal to pyautoattack's ``eta`` (its two axes are its random transposition)."""
    ref = SquareAttack(None, norm="L2", device="cpu")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        want = {tuple(e.flatten().tolist()) for e in (ref.eta(side) for _ in range(20))}
    got = [square_eta(side, 2, a) for a in (0, 1)]
    for g in got:
        assert abs(float(g.norm()) - 1) < 1e-6
        assert any(torch.allclose(g.flatten(), torch.tensor(w), atol=1e-6) for w in want)
    if side > 1:
        assert torch.equal(got[1], got[0].T)  # the other split axis
    # 3-D: cubes, the same construction along the split axis
    e3 = square_eta(5, 3, 2)
    assert e3.shape == (5, 5, 5) and abs(float(e3.norm()) - 1) < 1e-6
    assert (e3[:, :, :2] >= 0).all() and (e3[:, :, 2:] <= 0).all() and e3[2, 2, 3] < e3[0, 0, 3] < 0


# --- geometry of the search ------------------------------------------------------------------------------------------
def test_linf_start_is_vertical_stripes_and_queries_change_one_square(trained_multiclass):
    t = trained_multiclass
    x, y = t.x[:6], t.y[:6]
    eps, q = 0.05, 30
    rec = _Recorder(t.model)
    res = Square(t.task, Linf(eps, bounds=(0, 1)), queries=q, seed=1, active_set=False)(rec, x, y)
    clean, start, *proposals = rec.inputs[: 2 + q]
    assert torch.equal(clean, x)
    lo, hi = (x - eps).clamp(0, 1), (x + eps).clamp(0, 1)
    assert bool(((start == lo) | (start == hi)).all())
    # stripes: one sign per column and channel, constant along the height
    up = (start - x) > 0
    unclipped = (x > eps) & (x < 1 - eps)
    sign = torch.where(unclipped, up.float(), torch.nan)
    for col in range(x.shape[-1]):
        s = sign[..., col]
        assert bool(((s == s.nanmean(dim=-1, keepdim=True)) | s.isnan()).all())
    # every query moves the current best inside one window of the scheduled side, and only to x ± ε; the
    # best is replaced when the query is better (fooled first, then a lower margin)
    best = start
    for i, prop in enumerate(proposals):
        assert bool(((prop == lo) | (prop == hi)).all())
        side = min(max(round((square_p(i, q, 0.8) * 256) ** 0.5), 1), 16)
        changed = (prop != best).any(dim=1)
        for k in range(x.shape[0]):
            assert max(_extent(changed[k])) <= side, (i, k)
        with torch.no_grad():
            new, old = t.model(prop), t.model(best)
        f_new, f_old = t.task.fooled(new, y), t.task.fooled(old, y)
        better = (f_new & ~f_old) | ((f_new == f_old) & (t.task.margin(new, y) < t.task.margin(old, y)))
        best = torch.where(better.reshape(-1, 1, 1, 1), prop, best)
    torch.testing.assert_close(res.x_adv, best, atol=1e-7, rtol=0)
    assert res.details.queries.tolist() == [1 + q] * 6


def test_l2_start_and_queries_stay_on_the_sphere(trained_multiclass):
    """L2 (away from the box's faces): the start and every query have norm ε exactly; the result is in the ball."""
    t = trained_multiclass
    x = t.x[:4] * 0.5 + 0.25  # inside the box with room: no clipping
    eps, q = 0.5, 20
    rec = _Recorder(t.model)
    res = Square(t.task, L2(eps, bounds=(0, 1)), queries=q, seed=0, active_set=False)(rec, x, None)
    for z in rec.inputs[1: 2 + q]:
        norms = (z - x).flatten(1).norm(dim=1)
        torch.testing.assert_close(norms, torch.full_like(norms, eps), atol=1e-5, rtol=0)
    assert bool((res.l2 <= eps * (1 + 1e-6)).all()) and bool((res.l2 > 0.99 * eps).all())


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_inside_the_ball_and_a_per_channel_box(trained_seg2d, norm):
    """Two channels with different boxes (one tight around the data): x_adv is inside both, exactly."""
    t = trained_seg2d
    x, y = t.x[:3], t.y[:3]
    lo = torch.tensor([0.0, -0.5]).reshape(2, 1, 1)
    hi = torch.stack([x[:, 0].max(), torch.tensor(2.0)]).reshape(2, 1, 1)  # channel 0 touches its top
    box = Box(lo, hi)
    eps = 0.1 if norm == "Linf" else 2.0
    threat = (Linf if norm == "Linf" else L2)(eps, bounds=box)
    res = Square(t.task, threat, queries=30, seed=0, active_set=False)(t.model, x, y)
    assert bool((res.x_adv >= lo).all()) and bool((res.x_adv <= hi).all())
    box.check_inside(res.x_adv)
    norms = res.linf if norm == "Linf" else res.l2
    assert bool((norms <= eps * (1 + 1e-6)).all()) and bool((norms > 0.5 * eps).all())
    # the box clipped channel 0 at its top and channel 1 nowhere (it has room): the box is per channel
    assert bool((res.x_adv[:, 0] == hi[0]).any())
    assert not bool((res.x_adv[:, 1] == hi[1]).any()) and not bool((res.x_adv[:, 1] == lo[1]).any())


# --- effect on every task -------------------------------------------------------------------------------------------
def test_lowers_accuracy_multiclass(trained_multiclass):
    t = trained_multiclass
    res = Square(t.task, Linf(0.1, bounds=(0, 1)), queries=100, seed=0)(t.model, t.x, t.y)
    clean, adv = _clean(t, len(t.y)).mean(), _robust(t, res).mean()
    assert clean >= 0.8 and adv <= 0.4, (clean, adv)
    assert isinstance(res.details, SquareDetails) and res.details.queries.dtype == torch.long
    # the objective is the margin at the returned point: negative exactly where the class changed
    assert torch.equal(res.details.objective < 0, res.fooled)


@pytest.mark.parametrize("loss", ["margin", "min-margin", "ce"])
def test_lowers_exact_match_multilabel(trained_multilabel, loss):
    t = trained_multilabel
    x, y = t.x[:16], t.y[:16]
    res = Square(t.task, Linf(0.1, bounds=(0, 1)), queries=60, loss=loss, seed=0)(t.model, x, y)
    clean, adv = _clean(t, 16).mean(), _robust(t, res).mean()
    assert adv < clean - 0.3, (loss, clean, adv)
    if loss == "min-margin":  # a sample is fooled iff its weakest label's margin is negative
        assert torch.equal(res.details.objective < 0, res.fooled)


def test_lowers_mean_dice_seg2d_l2(trained_seg2d):
    t = trained_seg2d
    x, y = t.x[:4], t.y[:4]
    res = Square(t.task, L2(3.0, bounds=(0, 1)), queries=60, seed=0, active_set=False)(t.model, x, y)
    clean, adv = _clean(t, 4), _robust(t, res)
    assert bool((adv <= clean).all()) and adv.mean() < clean.mean() - 0.05, (clean, adv)


def test_lowers_mean_dice_seg3d_cubes(trained_seg3d):
    t = trained_seg3d
    x, y = t.x[:2], t.y[:2]
    rec = _Recorder(t.model)
    res = Square(t.task, Linf(0.2, bounds=(0, 1)), queries=40, seed=0, active_set=False)(rec, x, y)
    clean, adv = _clean(t, 2), _robust(t, res)
    assert adv.mean() < clean.mean() - 0.1, (clean, adv)
    # the second query (p = 0.8/8 of the volume at 40 queries: a 7-voxel cube) changes one cube of the best,
    # which is the start or the first query
    start, first, second = rec.inputs[1:4]
    for k in range(2):
        ext = min((_extent((second[k] != b[k]).any(dim=0)) for b in (start, first)), key=max)
        assert max(ext) <= 7 and len(ext) == 3


def test_targeted_reaches_the_target(trained_multiclass):
    t = trained_multiclass
    x = t.x[:16]
    with torch.no_grad():
        pred = t.model(x).argmax(1)
    target = (pred + 1) % 4
    res = Square(t.task, Linf(0.15, bounds=(0, 1)), queries=150, targeted=True, seed=0)(t.model, x, target)
    with torch.no_grad():
        hit = t.model(res.x_adv).argmax(1) == target
    assert torch.equal(hit, res.fooled) and hit.float().mean() >= 0.5
    # the objective is the negative target margin: below 0 exactly where the target was reached
    assert torch.equal(res.details.objective < 0, hit)


# --- the active set --------------------------------------------------------------------------------------------------
def test_already_fooled_samples_spend_no_queries(trained_multiclass):
    t = trained_multiclass
    with torch.no_grad():
        wrong = t.model(t.x).argmax(1) != t.y
    assert 0 < int(wrong.sum()) < len(t.y)
    q = 40
    res = Square(t.task, Linf(0.03, bounds=(0, 1)), queries=q, restarts=2, seed=0)(t.model, t.x, t.y)
    queries = res.details.queries
    assert bool((queries[wrong] == 0).all()) and torch.equal(res.x_adv[wrong], t.x[wrong])
    # fooled during the first restart: never queried again; never fooled: both restarts' whole budget
    fooled_now = res.fooled & ~wrong
    assert bool((queries[fooled_now] >= 1).all()) and bool((queries[fooled_now] <= 2 * (q + 1)).all())
    robust = ~res.fooled
    assert robust.any() and bool((queries[robust] == 2 * (q + 1)).all())
    first = Square(t.task, Linf(0.03, bounds=(0, 1)), queries=q, restarts=1, seed=0)(t.model, t.x, t.y)
    by_first = first.fooled & ~wrong
    assert torch.equal(queries[by_first], first.details.queries[by_first])  # no second-restart query


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_compaction_and_active_set_do_not_change_results(trained_multiclass, norm):
    """check_every only decides when the fooled samples leave the batch: identical results and query counts.
    Without the active set every sample keeps searching: the never-fooled ones end exactly where they did."""
    t = trained_multiclass
    x, y = t.x[:16], t.y[:16]
    threat = Linf(0.04, bounds=(0, 1)) if norm == "Linf" else L2(1.0, bounds=(0, 1))
    runs = [Square(t.task, threat, queries=50, seed=4, check_every=k)(t.model, x, y) for k in (1, 7, 1000)]
    for other in runs[1:]:
        torch.testing.assert_close(other.x_adv, runs[0].x_adv, atol=1e-6, rtol=0)
        assert torch.equal(other.details.queries, runs[0].details.queries)
        assert torch.equal(other.fooled, runs[0].fooled)
    fooled = runs[0].fooled
    assert 0 < int(fooled.sum()) < len(y), "need fooled and robust samples to compare"
    everyone = Square(t.task, threat, queries=50, seed=4, active_set=False)(t.model, x, y)
    torch.testing.assert_close(everyone.x_adv[~fooled], runs[0].x_adv[~fooled], atol=1e-6, rtol=0)
    assert bool((everyone.details.queries == 51).all())
    assert bool((runs[0].details.queries[fooled] < 51).all())


def test_no_host_sync_between_compactions(trained_seg2d, forbid_host_sync):
    t = trained_seg2d
    x, y = t.x[:2], t.y[:2]
    with torch.no_grad():
        logits = t.model(x)
    for threat in (Linf(0.05, bounds=(0, 1)), L2(1.0, bounds=(0, 1))):
        atk = Square(t.task, threat, queries=8, check_every=100, seed=0)
        monkeypatch = forbid_host_sync()
        x_adv, details, _ = atk.perturb(t.model, x, y, logits)
        monkeypatch.undo()
        assert x_adv.shape == x.shape and details.queries.shape == (2,)


# --- contract ---------------------------------------------------------------------------------------------------------
def test_same_seed_same_tensor_other_seed_other_tensor(trained_multilabel):
    t = trained_multilabel
    x, y = t.x[:6], t.y[:6]
    for threat in (Linf(0.05, bounds=(0, 1)), L2(0.5, bounds=(0, 1))):
        a, b, c = (Square(t.task, threat, queries=20, seed=s)(t.model, x, y) for s in (3, 3, 4))
        assert torch.equal(a.x_adv, b.x_adv) and torch.equal(a.details.queries, b.details.queries)
        assert not torch.equal(a.x_adv, c.x_adv)


def test_min_margin_is_refused_for_segmentation():
    with pytest.raises(InvalidParameterError, match=r"min-margin.*one voxel.*loss='margin'"):
        Square(Segmentation(3), Linf(0.1, bounds=(0, 1)), loss="min-margin")
    with pytest.raises(InvalidParameterError, match=r"`loss` of Square must be one of .*did you mean 'margin'"):
        get_attack("square", MultiLabel(), Linf(0.1, bounds=(0, 1)), loss="margn")
    with pytest.raises(InvalidParameterError, match=r"`p_init` of Square must be"):
        Square(MultiLabel(), Linf(0.1, bounds=(0, 1)), p_init=0.0)
    atk = get_attack("square", MultiLabel(), L2(1.0, bounds=(0, 1)), loss="min-margin", queries=10)
    assert atk.get_params()["loss"] == "min-margin" and atk.queries == 10


# --- the reference ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm,eps", [("Linf", 0.05), ("L2", 0.5)])
def test_robust_accuracy_close_to_pyautoattack(trained_multiclass, norm, eps):
    """Not the same random stream (pyautoattack: one window for the whole batch, the global RNG), so not the
    same tensors; the same search, so about the same robust accuracy at the same budget (pooled over three
    seeds: one run of 32 samples varies by a few samples from seed to seed)."""
    t = trained_multiclass
    q, seeds = 100, (0, 1, 2)
    threat = (Linf if norm == "Linf" else L2)(eps, bounds=(0, 1))
    ours, ref = [], []
    for seed in seeds:
        ours.append((~Square(t.task, threat, queries=q, seed=seed)(t.model, t.x, t.y).fooled).float().mean())
        with torch.random.fork_rng():
            x_ref = SquareAttack(t.model, norm=norm, n_queries=q, eps=eps, p_init=0.8, seed=seed,
                                 device="cpu").perturb(t.x, t.y)
        with torch.no_grad():
            ref.append((t.model(x_ref).argmax(1) == t.y).float().mean())
    acc_ours, acc_ref = float(torch.stack(ours).mean()), float(torch.stack(ref).mean())
    with torch.no_grad():
        clean = float((t.model(t.x).argmax(1) == t.y).float().mean())
    assert acc_ref < clean - 0.05  # the budget is large enough to tell attacks apart
    assert abs(acc_ours - acc_ref) <= 0.07, (acc_ours, acc_ref)
