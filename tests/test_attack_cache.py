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
    sample_fields: ClassVar[tuple[str, ...]] = ("similarity",)  # per sample, though no table column
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


def test_weights_changed_through_data_are_not_served_stale():
    model, x, y, task = _setup()
    atk = _pgd(task)
    calls = _count(atk)
    with attack_once():
        before = craft(atk, model, x, y)
        model[1].weight.data.mul_(3)  # no version bump
        after = craft(atk, model, x, y)
        assert calls == [4, 4] and not torch.equal(after.logits, before.logits)
        model[1].bias.detach().numpy()[:] = 1.0  # a write through numpy
        craft(atk, model, x, y)
        assert calls == [4, 4, 4]


class _Biased(_Shift):
    """Takes a batch-wide ``bias`` added over the image's last dimension (4 wide, like the batch of 4)."""

    call_args = ("bias",)

    def perturb(self, model, x, y, logits, bias=None):
        x_adv, det, _ = super().perturb(model, x, y, logits)
        return self.box.clip(x_adv + 0.001 * bias), det, None


def test_only_declared_call_arguments_are_per_sample():
    from medadv.attacks.dag import DAG

    assert DAG.per_sample_call_args == ("target_mask",) and Attack.per_sample_call_args == ()
    model, x, y, task = _setup()
    atk = _Biased(task, Box(0.0, 1.0))
    bias = torch.tensor([1.0, 2.0, 3.0, 4.0])  # first dimension 4 = the batch size, by coincidence
    perm = torch.tensor([0, 1, 3, 2])
    with attack_once():
        craft(atk, model, x[:2], y[:2], bias=bias)
        mixed = craft(atk, model, x[perm], y[perm], bias=bias)  # two hits, two crafted with the whole bias
    assert torch.equal(mixed.x_adv, atk(model, x[perm], y[perm], bias=bias).x_adv)


@dataclass
class _TableDetails(AttackDetails):
    columns: ClassVar[tuple[str, ...]] = ("moves",)
    moves: Tensor  # (N,) per sample
    table: Tensor  # (4,) the same for every batch: not per sample, whatever the batch size


class _Table(_Shift):
    def perturb(self, model, x, y, logits):
        x_adv, det, _ = super().perturb(model, x, y, logits)
        return x_adv, _TableDetails(moves=det.moves, table=torch.arange(4.0)), None


def test_an_undeclared_details_field_of_batch_length_is_not_sliced():
    model, x, y, task = _setup()
    atk = _Table(task, Box(0.0, 1.0))
    with attack_once():
        craft(atk, model, x, y)
        back = craft(atk, model, x.flip(0), y.flip(0))
    assert torch.equal(back.details.table, torch.arange(4.0))  # not the samples' slices, reversed


class _TracedWhenAlone(_Shift):
    """Records a trace for a batch of one sample only: that result cannot be split."""

    def perturb(self, model, x, y, logits):
        x_adv, det, _ = super().perturb(model, x, y, logits)
        return x_adv, det, ({"loss": torch.zeros(1, 1)} if x.shape[0] == 1 else None)


def test_a_partial_hit_that_cannot_be_split_is_counted_once_and_then_decided_before_crafting():
    model, x, y, task = _setup()
    atk = _TracedWhenAlone(task, Box(0.0, 1.0))
    calls = _count(atk)
    with attack_once() as cache:
        craft(atk, model, x[:3], y[:3])
        whole = craft(atk, model, x, y)  # x[3] alone records a trace: the whole batch is crafted again
        assert calls == [3, 1, 4] and cache.stats["crafted"] == 3 + 4 and cache.stats["uncached"] == 4
        assert whole.trace is None and torch.equal(whole.x_adv, atk(model, x, y).x_adv)
        calls.clear()
        craft(atk, model, x, y)
        assert calls == [4]  # known now: no sub-batch crafted in vain


def test_a_setting_known_only_by_its_address_is_not_keyed():
    model, x, y, task = _setup()

    class Opaque:
        __slots__ = ()

    class _WithObject(_Shift):
        call_args = ("extra",)

        def perturb(self, model, x, y, logits, extra=None):
            return super().perturb(model, x, y, logits)

    atk = _WithObject(task, Box(0.0, 1.0))
    calls = _count(atk)
    with attack_once() as cache:
        craft(atk, model, x, y, extra=Opaque())
        craft(atk, model, x, y, extra=Opaque())
    assert calls == [4, 4] and cache.stats["uncached"] == 8 and cache.stats["reused"] == 0

    class _OpaqueSetting(_Shift):
        def fingerprint(self):  # a declared setting canonicalised by its repr (with an address)
            return {**super().fingerprint(), "thing": Opaque()}

    odd = _OpaqueSetting(task, Box(0.0, 1.0))
    odd_calls = _count(odd)
    with attack_once() as cache:
        craft(odd, model, x, y)
        craft(odd, model, x, y)
    assert odd_calls == [4, 4] and cache.stats["uncached"] == 8


def test_global_rng_attacks_are_keyed_by_evaluates_seed():
    from medadv.attack_cache import seed_tag

    model, x, y, task = _setup()
    atk = PGD(task, Linf(0.1, bounds=(0.0, 1.0)), steps=2, step_size=0.05, seed=None)  # the global RNG
    own = _pgd(task)  # its own seed: the global seeding does not matter
    calls, own_calls = _count(atk), _count(own)
    data = [(x[:2], y[:2]), (x[2:], y[2:])]
    with attack_once():
        first = evaluate(model, task, data, {"pgd": atk, "own": own}, seed=0)
        second = evaluate(model, task, data, {"pgd": atk, "own": own}, seed=1)
        assert calls == [2, 2, 2, 2] and own_calls == [2, 2]  # another seed: other examples
        plain = evaluate(model, task, data, {"pgd": atk}, seed=1)
        assert len(calls) == 4 and plain.rows == [r for r in second.rows if r["attack"] == "pgd"]
        with seed_tag(0):  # a study in a run under the run's seed reads back evaluate's examples
            craft(atk, model, x, y)
        assert len(calls) == 4
        craft(atk, model, x, y)  # no seed tag: not evaluate's seeding
        assert calls[4:] == [4]
    assert [r for r in first.rows if r["attack"] == "own"] != []
    with pytest.raises(TypeError, match="`seed`"):
        with seed_tag("0"):  # type: ignore[arg-type]
            pass


def test_a_link_at_the_spill_folder_is_refused_and_its_entries_dropped(tmp_path):
    model, x, y, task = _setup()
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / ".attack_cache").symlink_to(elsewhere, target_is_directory=True)
    atk = _Shift(task, Box(0.0, 1.0))
    cache = AttackCache(max_bytes=0, spill_dir=out / ".attack_cache", root=out)
    with attack_once(cache):
        res = craft(atk, model, x, y)  # the attack's result is returned, the spill refused
    assert torch.equal(res.x_adv, atk(model, x, y).x_adv)
    assert list(elsewhere.iterdir()) == [] and cache.stats["evicted"] == 4 and cache.stats["spilled"] == 0
    assert len(cache) == 0
    with pytest.raises(ValueError, match="`spill_dir`"):
        AttackCache(spill_dir=tmp_path / "other", root=out)
    with pytest.raises(TypeError, match="`root`"):
        AttackCache(spill_dir=out / "c", root=3)  # type: ignore[arg-type]


def test_a_failed_spill_write_drops_the_entry_and_the_run_goes_on(tmp_path, monkeypatch):
    import errno

    model, x, y, task = _setup()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    atk = _Shift(task, Box(0.0, 1.0))
    calls = _count(atk)
    cache = AttackCache(max_bytes=200, spill_dir=tmp_path / "spill")
    with attack_once(cache):
        first = craft(atk, model, x, y)
        again = craft(atk, model, x, y)
    assert cache.stats["evicted"] >= 3 and cache.stats["spilled"] == 0 and len(calls) == 2
    assert torch.equal(first.x_adv, again.x_adv)
    assert [p for p in (tmp_path / "spill").rglob("*") if p.is_file()] == []
    cache.clear()


def test_a_spilled_file_replaced_by_a_link_is_not_read(tmp_path):
    model, x, y, task = _setup()
    atk = _Shift(task, Box(0.0, 1.0))
    calls = _count(atk)
    spill = tmp_path / "out" / ".attack_cache"
    cache = AttackCache(max_bytes=0, spill_dir=spill, root=tmp_path / "out")
    with attack_once(cache):
        first = craft(atk, model, x, y)
        planted = tmp_path / "planted"
        spill.rename(planted)  # the folder swapped for a link to a copy: its files are not read back
        spill.symlink_to(planted, target_is_directory=True)
        again = craft(atk, model, x, y)
    assert calls == [4, 4] and torch.equal(first.x_adv, again.x_adv)


def test_check_study_inside_a_run_crafts_without_the_cache(monkeypatch):
    import medadv.testing.study_checks as study_checks
    from medadv.testing import check_study

    seen: list[object] = []
    real = study_checks._run

    def watched(*args, **kwargs):
        seen.append(active_cache())
        return real(*args, **kwargs)

    monkeypatch.setattr(study_checks, "_run", watched)
    with attack_once() as cache:
        check_study("classwise", kinds=["multiclass"], properties=["runs", "determinism"])
        assert active_cache() is cache
    assert seen and all(s is None for s in seen) and cache.stats["reused"] == 0
