"""The adversarial-training loop: PGD-AT raises robust accuracy, resume is exact, all strategies train."""

from __future__ import annotations

import pytest
import torch

from medadv.attacks.pgd import PGD
from medadv.data.synthetic import multiclass_blobs, multilabel_blobs, segmentation_blobs
from medadv.defenses import PGDAT, TRADES, AdversarialTrainer, MAAdvT, MPAdvT, TrainingStrategy
from medadv.models import fit_supervised, small_cnn, small_unet
from medadv.tasks import MultiClass, MultiLabel, Segmentation
from medadv.threats import Linf
from medadv.training import Fitter, GAPTrainer
from medadv.training import fit_supervised as fit_supervised_impl


def _accuracies(model, task, x, y, threat):
    with torch.no_grad():
        clean = float((model(x).argmax(1) == y).float().mean())
    res = PGD(task, threat, steps=10, seed=1)(model, x, y)
    return clean, float((res.logits.argmax(1) == y).float().mean())


def test_short_pgd_at_raises_robust_accuracy_over_natural_training():
    x, y = multiclass_blobs(n=320, num_classes=4, seed=0)
    task, threat = MultiClass(), Linf(0.05, bounds=(0.0, 1.0))
    torch.manual_seed(0)
    natural = small_cnn(1, 4, width=8)
    fit_supervised(natural, task, x[:256], y[:256], epochs=10, batch_size=32, lr=3e-3)
    torch.manual_seed(0)
    robust = small_cnn(1, 4, width=8)
    AdversarialTrainer(robust, task, PGDAT(threat, steps=3), epochs=10, batch_size=32, lr=3e-3).fit(x[:256], y[:256])
    nat_clean, nat_rob = _accuracies(natural, task, x[256:], y[256:], threat)
    at_clean, at_rob = _accuracies(robust, task, x[256:], y[256:], threat)
    assert nat_clean > 0.8 and at_clean > 0.7
    assert at_rob >= nat_rob + 0.3, (nat_rob, at_rob)


class Crash(TrainingStrategy):
    """Wraps a strategy and raises on its ``n``-th batch (a simulated interruption)."""

    def __init__(self, inner: TrainingStrategy, n: int) -> None:
        self.inner, self.n, self.calls, self.name = inner, n, 0, inner.name

    def loss(self, model, x, y, task, generator):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.inner.loss(model, x, y, task, generator)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)


def test_resume_after_interruption_matches_uninterrupted_run(tmp_path):
    x, y = multilabel_blobs(n=64, num_labels=4, seed=1)
    task = MultiLabel()

    def run(strategy, checkpoint=None):
        torch.manual_seed(0)
        model = small_cnn(1, 4, width=4)
        trainer = AdversarialTrainer(model, task, strategy, epochs=3, batch_size=16, lr=1e-2, seed=5,
                                     checkpoint=checkpoint)
        return model, trainer

    def mpadvt():
        return MPAdvT((0.0, 1.0), eps_range=(0.02, 0.08), steps_range=(1, 3), step_size=0.02)

    full, trainer = run(mpadvt())
    history = trainer.fit(x, y)

    ckpt = tmp_path / "at.pt"
    _, crashing = run(Crash(mpadvt(), n=4 + 2), ckpt)  # 4 batches per epoch: dies inside epoch 2
    with pytest.raises(KeyboardInterrupt):
        crashing.fit(x, y)
    assert torch.load(ckpt, weights_only=True)["epoch"] == 1
    strategy = mpadvt()
    resumed, trainer2 = run(strategy, ckpt)
    assert trainer2.fit(x, y) == history
    assert strategy.batches == 12  # the strategy's own counters were restored from the checkpoint too
    for (k, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("task, data", [
    (MultiClass(), lambda: multiclass_blobs(n=64, num_classes=4, seed=2)),
    (MultiLabel(), lambda: multilabel_blobs(n=64, num_labels=4, seed=2)),
])
@pytest.mark.parametrize("make", [
    lambda th: PGDAT(th, steps=2), lambda th: MPAdvT((0.0, 1.0), steps_range=(1, 2)),
    lambda th: MAAdvT(th, steps=2), lambda th: TRADES(th, steps=2),
])
def test_every_strategy_trains_multiclass_and_multilabel(task, data, make):
    x, y = data()
    torch.manual_seed(0)
    model = small_cnn(1, 4, width=4)
    history = AdversarialTrainer(model, task, make(Linf(0.03, bounds=(0.0, 1.0))), epochs=4, batch_size=16,
                                 lr=1e-2).fit(x, y)
    assert history[-1] < history[0]
    assert not model.training


def test_pgd_at_segmentation_trains_on_harder_examples():
    x, y = segmentation_blobs(n=8, num_classes=3, size=16, ndim=2, seed=0)
    task, threat = Segmentation(3), Linf(0.1, bounds=(0.0, 1.0))
    torch.manual_seed(0)
    model = small_unet(1, 3, ndim=2, channels=(4, 8))
    strategy = PGDAT(threat, steps=2)
    model.train()
    g = torch.Generator().manual_seed(0)
    adv_loss = strategy.loss(model, x, y, task, g)
    clean_loss = task.loss(model(x), y).mean()
    assert float(adv_loss.detach()) > float(clean_loss.detach())
    history = AdversarialTrainer(model, task, strategy, epochs=3, batch_size=4, lr=1e-2).fit(x, y)
    assert history[-1] < history[0]


def test_bad_arguments():
    model, task = small_cnn(1, 4, width=4), MultiClass()
    strategy = PGDAT(Linf(0.03, bounds=(0.0, 1.0)))
    with pytest.raises(TypeError, match="strategy"):
        AdversarialTrainer(model, task, "pgd")
    with pytest.raises(ValueError, match="epochs"):
        AdversarialTrainer(model, task, strategy, epochs=0)
    with pytest.raises(ValueError, match="`batch_size` of AdversarialTrainer must be an integer >= 1; got 2.5"):
        AdversarialTrainer(model, task, strategy, batch_size=2.5)
    with pytest.raises(TypeError, match="optimizer"):
        AdversarialTrainer(model, task, strategy, optimizer="adam")
    trainer = AdversarialTrainer(model, task, strategy, epochs=1)
    x = torch.rand(4, 1, 16, 16)
    with pytest.raises(ValueError, match="`y`"):
        trainer.fit(x, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="out of range"):
        trainer.fit(x, torch.full((4,), 9))
    with pytest.raises(ValueError, match="NaN"):
        trainer.fit(torch.full((4, 1, 16, 16), float("nan")), torch.zeros(4, dtype=torch.long))


def _reference_supervised(model, task, x, y, epochs, batch_size, lr, seed):
    """The hand-written loop fit_supervised used before it moved onto the shared loop."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(x.shape[0], generator=gen)
        for i in range(0, x.shape[0], batch_size):
            idx = perm[i:i + batch_size]
            loss = task.loss(model(x[idx]), y[idx]).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()


def test_fit_supervised_on_the_shared_loop_same_weights_and_exact_resume(tmp_path):
    x, y = multiclass_blobs(n=40, num_classes=4, seed=3)
    task = MultiClass()

    def fresh():
        torch.manual_seed(1)
        return small_cnn(1, 4, width=4)

    ref = fresh()
    _reference_supervised(ref, task, x, y, epochs=3, batch_size=16, lr=1e-2, seed=2)
    full = fresh()
    history = fit_supervised(full, task, x, y, epochs=3, batch_size=16, lr=1e-2, seed=2)
    assert fit_supervised is not fit_supervised_impl and len(history) == 3 and not full.training
    for (k, a), b in zip(ref.state_dict().items(), full.state_dict().values(), strict=True):
        assert torch.equal(a, b), k

    ckpt = tmp_path / "sup.pt"
    part = fresh()
    fit_supervised(part, task, x, y, epochs=2, batch_size=16, lr=1e-2, seed=2, checkpoint=ckpt)  # "interrupted"
    resumed = fresh()
    assert fit_supervised(resumed, task, x, y, epochs=3, batch_size=16, lr=1e-2, seed=2, checkpoint=ckpt) == pytest.approx(history)
    for (k, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_one_loop_for_every_trainer():
    assert issubclass(AdversarialTrainer, Fitter) and issubclass(GAPTrainer, Fitter)
    for name in ("run", "_save", "_resume"):  # nobody re-implements the loop, the checkpoint or the resume
        assert getattr(AdversarialTrainer, name) is getattr(Fitter, name)
        assert getattr(GAPTrainer, name) is getattr(Fitter, name)


def test_resume_refuses_a_checkpoint_of_another_strategy(tmp_path):
    x, y = multiclass_blobs(n=16, num_classes=4, seed=0)
    task, ckpt = MultiClass(), tmp_path / "a.pt"
    model = small_cnn(1, 4, width=4)
    AdversarialTrainer(model, task, PGDAT(Linf(0.03, bounds=(0.0, 1.0)), steps=1), epochs=1, batch_size=16,
                       checkpoint=ckpt).fit(x, y)
    with pytest.raises(ValueError, match="strategy 'pgd_at'"):
        AdversarialTrainer(model, task, TRADES(Linf(0.03, bounds=(0.0, 1.0)), steps=1), epochs=2,
                           checkpoint=ckpt).fit(x, y)
