"""The attack-once cache: a sample crafted once is served again, bit for bit; only what is missing is crafted."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import Tensor, nn

import medadv.evaluation as evaluation
from medadv.attack_cache import DEFAULT_MAX_BYTES, AttackCache, active_cache, attack_once, craft
from medadv.attacks import PGD
from medadv.attacks.base import Attack, AttackDetails, AttackResult
from medadv.evaluation import detail_rows, evaluate
from medadv.tasks import MultiClass
from medadv.threats import Box, Linf


@dataclass
class _Details(AttackDetails):
    columns: ClassVar[tuple[str, ...]] = ("moves", "per_class")
    moves: Tensor  # (N,) per sample
    per_class: Tensor  # (N, 2) per sample
    similarity: dict  # name -> (N,) per sample
    kind: str  # a batch constant


class _Shift(Attack):
    """A test attack whose output is a function of each sample alone (not of its batch), with typed details."""

    threat_kind = "box"

    def perturb(self, model, x, y, logits):
        total = x.reshape(x.shape[0], -1).sum(dim=1)
        det = _Details(moves=(total * 100).round().long(), per_class=torch.stack([total, -total], dim=1),
                       similarity={"ssim": total / 10}, kind="shift")
        return self.box.clip(x + 0.01 * (y.float().reshape(-1, 1, 1, 1) + 1)), det, None


class _Traced(_Shift):
    """Records a trace: its result cannot be split per sample, so it is never cached."""

    def perturb(self, model, x, y, logits):
        x_adv, det, _ = super().perturb(model, x, y, logits)
        return x_adv, det, {"loss": torch.zeros(3, x.shape[0])}


def _setup() -> tuple[nn.Module, Tensor, Tensor, MultiClass]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()
    g = torch.Generator().manual_seed(0)
    return model, torch.rand(4, 1, 4, 4, generator=g), torch.tensor([0, 1, 2, 0]), MultiClass()


def _count(attack: Attack) -> list[int]:
    """The batch sizes the attack is asked to perturb (what is really crafted)."""
    calls: list[int] = []
    orig = attack.perturb
    attack.perturb = lambda *a, **k: calls.append(a[1].shape[0]) or orig(*a, **k)  # type: ignore[method-assign,func-returns-value]
    return calls


def _pgd(task: MultiClass, eps: float = 0.1) -> PGD:
    return PGD(task, Linf(eps, bounds=(0.0, 1.0)), steps=2, step_size=0.05)


def test_a_second_evaluate_crafts_nothing_and_returns_identical_rows(monkeypatch):
    model, x, y, task = _setup()
    data = [(x[:2], y[:2]), (x[2:], y[2:])]
    crafted: list[AttackResult] = []

    def recording(*args, **kwargs):
        res = craft(*args, **kwargs)
        crafted.append(res)
        return res

    monkeypatch.setattr(evaluation, "craft", recording)
    pgd, shift = _pgd(task), _Shift(task, Box(0.0, 1.0))
    with attack_once() as cache:
        first = evaluate(model, task, data, {"pgd": pgd, "shift": shift}, seed=1)
        assert cache.stats["crafted"] == 8 and cache.stats["reused"] == 0
        calls = _count(pgd) + _count(shift)
        again = evaluate(model, task, data, {"pgd": pgd, "shift": shift}, seed=1)
        assert calls == [] and cache.stats["crafted"] == 8 and cache.stats["reused"] == 8
        assert again.rows == first.rows
        assert any(k.startswith("attack_") for k in again.rows[-1])  # the details columns came back too
        # a study reading the same batch gets, bit for bit, what evaluate crafted
        study = craft(pgd, model, x[:2], y[:2])
        assert torch.equal(study.x_adv, crafted[0].x_adv) and torch.equal(study.logits, crafted[0].logits)
        assert cache.stats["crafted"] == 8
    # the cache made by attack_once is gone with its block
    assert active_cache() is None and len(cache) == 0


def test_the_first_run_through_an_empty_cache_equals_a_run_without_one():
    model, x, y, task = _setup()
    data = [(x[:2], y[:2]), (x[2:], y[2:])]
    plain = evaluate(model, task, data, {"pgd": _pgd(task)}, seed=1)
    with attack_once():
        cached = evaluate(model, task, data, {"pgd": _pgd(task)}, seed=1)
    assert cached.rows == plain.rows


def test_a_partial_hit_crafts_only_the_missing_samples_in_the_callers_order():
    model, x, y, task = _setup()
    atk = _pgd(task)
    calls = _count(atk)
    with attack_once() as cache:
        head = craft(atk, model, x[:2], y[:2])
        full = craft(atk, model, x, y)
        assert calls == [2, 2]  # only x[2:] was crafted the second time
        assert cache.stats == {**cache.stats, "crafted": 4, "reused": 2}
        assert torch.equal(full.x_adv[:2], head.x_adv) and torch.equal(full.fooled[:2], head.fooled)
        tail = atk(model, x[2:], y[2:])  # the missing samples crafted as one batch
        assert torch.equal(full.x_adv[2:], tail.x_adv) and torch.equal(full.logits[2:], tail.logits)
        # every sample cached: any order is served from the cache, sample by sample
        order = torch.tensor([3, 0, 2])
        picked = craft(atk, model, x[order], y[order])
        assert calls == [2, 2, 2]
        assert torch.equal(picked.x_adv, full.x_adv[order]) and torch.equal(picked.l2, full.l2[order])
        assert torch.equal(picked.y, full.y[order])


def test_changed_weights_budget_target_or_input_miss():
    model, x, y, task = _setup()
    atk = _pgd(task)
    calls = _count(atk)
    with attack_once():
        before = craft(atk, model, x, y)
        w0 = model[1].weight.detach().clone()
        with torch.no_grad():
            model[1].weight.add_(0.5)  # an in-place update: the weights hash is recomputed
        craft(atk, model, x, y)
        assert calls == [4, 4]
        with torch.no_grad():
            model[1].weight.copy_(w0)  # the same weights again: served
        assert torch.equal(craft(atk, model, x, y).x_adv, before.x_adv) and calls == [4, 4]
        other = _pgd(task, eps=0.2)
        other_calls = _count(other)
        craft(other, model, x, y)
        assert other_calls == [4]  # another budget
        target = y.clone()
        target[1] = 2
        craft(atk, model, x, target)
        assert calls == [4, 4, 1]  # another target for one sample
        moved = x.clone()
        moved[3] += 0.001
        craft(atk, model, moved, y)
        assert calls == [4, 4, 1, 1]  # another input for one sample


def test_spilled_entries_round_trip_exactly_and_only_under_spill_dir(tmp_path, monkeypatch):
    model, x, y, task = _setup()
    work, spill = tmp_path / "cwd", tmp_path / "spill"
    work.mkdir()
    monkeypatch.chdir(work)
    loads: list[dict] = []
    load = torch.load

    def watched(*args, **kwargs):
        loads.append(kwargs)
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", watched)
    atk = _Shift(task, Box(0.0, 1.0))
    calls = _count(atk)
    cache = AttackCache(max_bytes=200, spill_dir=spill)  # room for about one sample: the rest spill
    with attack_once(cache):
        first = craft(atk, model, x, y)
        assert cache.stats["spilled"] >= 3 and cache.nbytes <= 200
        files = sorted(spill.iterdir())
        assert len(files) == cache.stats["spilled"] and all(f.suffix == ".pt" for f in files)
        again = craft(atk, model, x, y)
    assert calls == [4]
    assert loads and all(kw.get("weights_only") is True for kw in loads)
    for a, b in [(first.x_adv, again.x_adv), (first.logits, again.logits), (first.fooled, again.fooled),
                 (first.details.per_class, again.details.per_class)]:
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert detail_rows(again.details, 4) == detail_rows(first.details, 4)
    assert list(work.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "spill"]
    cache.clear()  # the given cache is kept past the block; clear() deletes its files
    assert list(spill.iterdir()) == []


def test_without_a_spill_dir_the_oldest_are_dropped_and_crafted_again():
    model, x, y, task = _setup()
    atk = _Shift(task, Box(0.0, 1.0))
    calls = _count(atk)
    with attack_once(AttackCache(max_bytes=0)) as cache:
        first = craft(atk, model, x, y)
        again = craft(atk, model, x, y)
    assert calls == [4, 4] and cache.stats["evicted"] == 8 and len(cache) == 0
    assert torch.equal(first.x_adv, again.x_adv)  # correct, just not once


def test_without_an_active_cache_craft_is_the_attack_call():
    model, x, y, task = _setup()
    atk = _pgd(task)
    calls = _count(atk)
    assert active_cache() is None
    a = craft(atk, model, x, y)
    b = craft(atk, model, x, y)
    assert calls == [4, 4] and torch.equal(a.x_adv, atk(model, x, y).x_adv)
    with attack_once() as outer:
        with attack_once() as inner:
            assert active_cache() is inner
        assert active_cache() is outer
    assert active_cache() is None and torch.equal(a.x_adv, b.x_adv)


def test_the_callers_tensors_are_unchanged_and_results_do_not_alias_the_cache():
    model, x, y, task = _setup()
    x0, y0 = x.clone(), y.clone()
    atk = _Shift(task, Box(0.0, 1.0))
    with attack_once():
        first = craft(atk, model, x, y)
        kept = first.x_adv.clone()
        first.x_adv.zero_()  # the caller may write into its result
        first.details.moves.zero_()
        again = craft(atk, model, x, y)
        assert torch.equal(again.x_adv, kept) and bool((again.details.moves != 0).any())
        again.x_adv.add_(1.0)
        assert torch.equal(craft(atk, model, x, y).x_adv, kept)
    assert torch.equal(x, x0) and torch.equal(y, y0)


def test_details_are_put_back_together_per_sample():
    model, x, y, task = _setup()
    atk = _Shift(task, Box(0.0, 1.0))
    whole = atk(model, x, y)
    with attack_once():
        craft(atk, model, x[[1, 3]], y[[1, 3]])
        mixed = craft(atk, model, x, y)  # samples 1, 3 from the cache, 0, 2 crafted
    assert type(mixed.details) is _Details and mixed.details.kind == "shift"
    assert detail_rows(mixed.details, 4) == detail_rows(whole.details, 4)
    assert torch.equal(mixed.details.similarity["ssim"], whole.details.similarity["ssim"])
    assert mixed.rows() == whole.rows()


def test_a_result_that_cannot_be_split_is_crafted_as_today():
    model, x, y, task = _setup()
    atk = _Traced(task, Box(0.0, 1.0))
    calls = _count(atk)
    with attack_once() as cache:
        res = craft(atk, model, x, y)
        craft(atk, model, x, y)
    assert calls == [4, 4] and res.trace is not None
    assert cache.stats["uncached"] == 8 and cache.stats["reused"] == 0


def test_bad_arguments_are_refused_naming_them(tmp_path):
    with pytest.raises(ValueError, match="`max_bytes`"):
        AttackCache(max_bytes=-1)
    with pytest.raises(ValueError, match="`max_bytes`"):
        AttackCache(max_bytes=True)
    with pytest.raises(TypeError, match="`spill_dir`"):
        AttackCache(spill_dir=3)  # type: ignore[arg-type]
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="`spill_dir`"):
        AttackCache(spill_dir=tmp_path / "file")
    with pytest.raises(TypeError, match="`cache`"):
        with attack_once("cache"):  # type: ignore[arg-type]
            pass
    assert AttackCache().max_bytes == DEFAULT_MAX_BYTES == 1 << 30


def test_on_the_model_device_a_second_evaluate_crafts_nothing_and_spills_back_exactly(device, trained_seg3d,
                                                                                    tmp_path, monkeypatch):
    """``pytest --device cuda``: keys hashed on the device, entries kept there, spilled and read back bit for bit."""
    t = trained_seg3d
    model, x, y = copy.deepcopy(t.model).to(device), t.x[:4].to(device), t.y[:4].to(device)
    x0 = x.clone()
    atk = PGD(t.task, Linf(0.05, bounds=(0, 1)), steps=2)
    data = [(x[:2], y[:2]), (x[2:], y[2:])]
    crafted: list[AttackResult] = []

    def recording(*args, **kwargs):
        crafted.append(craft(*args, **kwargs))
        return crafted[-1]

    monkeypatch.setattr(evaluation, "craft", recording)
    one_sample = 16 ** 3 * 4 * (1 + 2 * 3)  # about x_adv and two logits of one volume: the rest spill
    cache = AttackCache(max_bytes=one_sample, spill_dir=tmp_path / "spill")
    with attack_once(cache):
        first = evaluate(model, t.task, data, atk, seed=0)
        assert cache.stats["spilled"] >= 2 and cache.nbytes <= one_sample
        calls = _count(atk)
        again = evaluate(model, t.task, data, atk, seed=0)
        served = craft(atk, model, x, y)
    assert calls == [] and cache.stats["crafted"] == 4 and cache.stats["reused"] == 8
    assert again.rows == first.rows
    assert served.x_adv.device == x.device and served.logits.device == x.device
    for i in range(2):  # what evaluate crafted per batch, bit for bit
        assert torch.equal(served.x_adv[2 * i:2 * i + 2], crafted[i].x_adv)
        assert torch.equal(served.logits[2 * i:2 * i + 2], crafted[i].logits)
    assert torch.equal(x, x0)
    cache.clear()


class _ThroughCraft:
    """An attack seen through :func:`craft`: what a study or the report's cases get once their call site is
    ``craft(atk, model, x, target)`` instead of ``atk(model, x, target)``."""

    always_targeted = False

    def __init__(self, attack: Attack) -> None:
        self._attack = attack

    def __getattr__(self, name: str):
        return getattr(self._attack, name)

    def __call__(self, model, x, y=None, **kwargs):
        return craft(self._attack, model, x, y, **kwargs)


def test_studies_and_report_cases_reading_the_cache_craft_nothing():
    from medadv.report.cases import worst_cases
    from medadv.studies._common import attacked_batches

    model, x, y, task = _setup()
    pgd = _pgd(task)
    calls = _count(pgd)
    data = [(x[:2], y[:2]), (x[2:], y[2:])]
    with attack_once() as cache:
        res = evaluate(model, task, data, {"pgd": pgd}, seed=2)
        assert calls == [2, 2]
        cases = worst_cases(model, task, data, {"pgd": _ThroughCraft(pgd)}, res, k=2, seed=2)
        batches = list(attacked_batches(model, task, (x, y), [("pgd", _ThroughCraft(pgd))]))  # type: ignore[list-item]
    assert calls == [2, 2] and len(cases) == 2 and cache.stats["reused"] == 4 + 4
    study = batches[0].attacked[0].result  # one batch of 4: evaluate's two batches of 2, bit for bit
    crafted = [pgd(model, x[:2], y[:2]), pgd(model, x[2:], y[2:])]  # the attack's own seed: evaluate's tensors
    assert torch.equal(study.x_adv, torch.cat([r.x_adv for r in crafted]))
