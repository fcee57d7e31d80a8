"""The torchattacks support matrix as a test: every attack torchattacks exports, on every task kind.

The attack classes are discovered from ``torchattacks.__all__`` at test time, so a torchattacks release that
adds one fails here until it is classified in ``SUPPORT`` (or ``EXCLUDED``). Each ``ok`` cell runs the
toolkit's own attack through ``TorchattacksModel.attack`` with a tiny budget and checks that the result is
inside the data box (and the ε ball for bounded attacks) and lowers the task metric; each refused cell checks
that the refusal names the attack, says what to use instead, and comes before the model is called.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torchattacks
from torch import nn

from medadv.adapters.support import TASK_KINDS, UnsupportedAttackError
from medadv.adapters.torchattacks import EXCLUDED, SUPPORT, TorchattacksModel

ATTACKS = sorted(n for n in torchattacks.__all__
                 if isinstance(getattr(torchattacks, n), type)
                 and issubclass(getattr(torchattacks, n), torchattacks.attack.Attack))
E = 0.15  # L∞ budget in the unit box (614 HU on the CT volumes)
#: unit-box L2 radius per kind (about E times the square root of the number of input elements / 8)
L2 = {"multiclass": 2.0, "multilabel": 2.0, "seg2d": 5.0, "seg3d": 6.0}
#: attacks with a fixed 3-channel kernel: checked on an RGB view of the model (and refused on its own input)
RGB = ("TIFGSM", "PIFGSM", "PIFGSMPP")


def test_every_exported_attack_is_classified():
    assert len(ATTACKS) >= 39
    missing = [n for n in ATTACKS if n not in SUPPORT and n not in EXCLUDED]
    assert not missing, f"classify these torchattacks attacks in adapters/torchattacks_support.py: {missing}"
    assert set(SUPPORT) <= set(ATTACKS) and not set(SUPPORT) & set(EXCLUDED)
    for name, row in SUPPORT.items():
        assert set(row) == set(TASK_KINDS), name
        for cell in row.values():
            assert cell.status == "ok" or " use " in f" {cell.reason}", (name, cell.reason)


class _RGB(nn.Module):
    """An RGB view of a model trained on fewer channels: it sees the first ``c`` channels (grey: their mean)."""

    def __init__(self, model: nn.Module, channels: int) -> None:
        super().__init__()
        self.model, self.c = model, channels

    def forward(self, x):
        return self.model(x.mean(1, keepdim=True) if self.c == 1 else x[:, :self.c])


def _rgb(x, channels):
    return x.repeat(1, 3, *[1] * (x.ndim - 2)) if channels == 1 else torch.cat((x, x[:, :1]), dim=1)


def _build(name, w, kind, data):
    """The attack with a tiny budget, and its bound: ("linf" | "l2", unit-box radius) or None."""
    seg = kind.startswith("seg")
    A = getattr(torchattacks, name)
    pgd = {"eps": E, "alpha": E / 4, "steps": 5}
    l2 = L2[kind]
    if name == "VANILA":
        return A(w), ("linf", 0.0)
    if name == "GN":
        return A(w, std=0.2), None
    if name == "FGSM":
        return A(w, eps=E), ("linf", E)
    if name == "FFGSM":
        return A(w, eps=E, alpha=1.25 * E), ("linf", E)
    if name in ("BIM", "PGD", "RFGSM", "EOTPGD", "MIFGSM", "NIFGSM", "UPGD", "TPGD", "DIFGSM", "TIFGSM", "Jitter"):
        return A(w, **pgd), ("linf", E)
    if name == "SINIFGSM":
        return A(w, eps=E, alpha=E / 4, steps=4, m=2), ("linf", E)
    if name in ("VMIFGSM", "VNIFGSM"):
        return A(w, eps=E, alpha=E / 4, steps=4, N=1), ("linf", E)
    if name in ("PIFGSM", "PIFGSMPP"):
        return A(w, max_epsilon=E, num_iter_set=5), ("linf", E)
    if name == "PGDL2":
        return A(w, eps=l2, alpha=l2 / 4, steps=5), ("l2", l2)
    if name == "PGDRS":
        return A(w, eps=E, alpha=E / 3, steps=3, noise_sd=0.05, noise_batch_size=2), ("linf", E)
    if name == "PGDRSL2":
        return A(w, eps=l2, alpha=l2 / 3, steps=3, noise_sd=0.05, noise_batch_size=2), ("l2", l2)
    if name == "APGD":
        return A(w, eps=E, steps=5), ("linf", E)
    if name == "APGDT":
        return A(w, eps=E, steps=5, n_classes=4), ("linf", E)
    if name == "AutoAttack":
        return A(w, eps=E, n_classes=4, seed=0), ("linf", E)
    if name == "SPSA":
        eps = 0.3 if seg else E
        return A(w, eps=eps, lr=0.1 if seg else 0.05, nb_iter=4, nb_sample=8 if seg else 16,
                 max_batch_size=8 if seg else 16), ("linf", eps)
    if name == "JSMA":
        return A(w), None
    if name in ("EADL1", "EADEN"):
        # on segmentation a result counts only where the task's (hard) Dice test says fooled, not the soft Dice
        return A(w, binary_search_steps=1, max_iterations=30 if seg else 10, initial_const=300.0 if seg else 10.0,
                 lr=0.05), None
    if name == "CW":
        return (A(w, c=300.0, steps=10, lr=0.1) if seg else A(w, c=5.0, steps=15, lr=0.05)), None
    if name == "DeepFool":
        return A(w, steps=8), None
    if name == "SparseFool":
        atk = A(w, steps=2)
        atk.deepfool.steps = 10  # its inner DeepFool (50 steps by default)
        return atk, None
    if name == "OnePixel":
        return A(w, pixels=5, steps=5, popsize=10), None
    if name == "Pixle":
        return A(w, restarts=5, max_iterations=10), None
    if name == "FAB":
        eps = 0.3 if seg else E
        # segmentation: success is the task's hard Dice test, which takes FAB's bolder steps to reach
        kw = {"steps": 10, "alpha_max": 0.3, "eta": 1.2, "beta": 0.5} if seg else {"steps": 5}
        return A(w, eps=eps, n_classes=4, **kw), ("linf", eps)
    if name == "Square":
        eps = 0.3 if seg else E
        return A(w, eps=eps, n_queries=100), ("linf", eps)
    if name == "MultiAttack":
        return A([torchattacks.FGSM(w, eps=E), torchattacks.PGD(w, **pgd)]), ("linf", E)
    if name == "LGV":
        x, y = data
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(w.encode(x[:16]), w.labels(y[:16])),
                                             batch_size=8)
        return A(w, loader, lr=0.01, epochs=1, nb_models_epoch=1, verbose=False, **pgd), ("linf", E)
    raise AssertionError(f"no budget for torchattacks {name}: add one to _build")


def _metric(t, kind, logits, y):
    if kind == "multiclass":
        return (logits.argmax(1) == y).float().mean()
    return t.task.metrics(logits, y)["label_accuracy" if kind == "multilabel" else "mean_dice"].mean()


@pytest.fixture
def trained(trained_multiclass, trained_multilabel, trained_seg2d, trained_seg3d):
    """The four trained models by kind (all built in the first cell's set-up, not inside a cell)."""
    return {"multiclass": trained_multiclass, "multilabel": trained_multilabel, "seg2d": trained_seg2d,
            "seg3d": trained_seg3d}


@pytest.mark.parametrize("kind", TASK_KINDS)
@pytest.mark.parametrize("name", ATTACKS)
def test_cell(name, kind, trained, hu):
    t = trained[kind]
    cell = SUPPORT[name][kind]
    # the task-margin attacks run one sample at a time: fewer samples keep the matrix fast
    margin = kind != "multiclass" and cell.status == "ok" and cell.note.startswith(("task margin", "members"))
    n = (1 if kind.startswith("seg") else 2) if margin else (2 if kind.startswith("seg") else 4)
    x, y, model, bounds = t.x[:n], t.y[:n], t.model, (0.0, 1.0)
    if kind == "seg3d":  # CT in Hounsfield units
        wrap, to_hu, bounds = hu
        model, x = wrap(t.model), to_hu(x)
    if name in RGB and cell.status == "ok":
        # its kernel is 3-channel: refused on the model's own 1- or 2-channel input, before any work...
        w = TorchattacksModel(model, t.task, bounds=bounds)
        atk, _ = _build(name, w, kind, (x, y))
        with pytest.raises(UnsupportedAttackError, match=rf"torchattacks {name}: .*3-channel.* use "):
            w.attack(atk, x, y)
        # ... and checked on an RGB view of the same model
        model, x = _RGB(model, x.shape[1]).eval(), _rgb(x, x.shape[1])
    w = TorchattacksModel(model, t.task, bounds=bounds)
    scale = bounds[1] - bounds[0]
    # torchattacks draws from torch's, numpy's (OnePixel, Pixle) and Python's (LGV) global generators
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    atk, bound = _build(name, w, kind, (t.x if kind != "seg3d" else hu[1](t.x), t.y))
    calls = []
    hook = t.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        if cell.status == "refused":
            with pytest.raises(UnsupportedAttackError) as err:
                w.attack(atk, x, y)
            msg = str(err.value)
            assert msg.startswith(f"torchattacks {name} does not apply to a ") and " use " in msg, msg
            assert not calls, "refused after the model was called"
            return
        x_adv = w.attack(atk, x, y)
    finally:
        hook.remove()
    assert calls or name in ("VANILA", "GN", "LGV")  # LGV attacks copies of the model (its surrogates)
    assert x_adv.shape == x.shape and x_adv.dtype == x.dtype and torch.isfinite(x_adv).all()
    assert x_adv.min() >= bounds[0] and x_adv.max() <= bounds[1]
    d = (x_adv - x).reshape(n, -1)
    if bound is not None:
        norm, radius = bound
        size = d.abs().amax(1) if norm == "linf" else d.norm(dim=1)
        assert (size <= radius * scale * (1 + 1e-4) + 1e-6).all(), (size / scale, radius)
    if name == "VANILA":
        assert torch.equal(x_adv, x)  # the clean baseline: nothing to lower
        return
    if name == "GN":
        # the noise baseline: Gaussian noise of std 0.2 of the data range, clipped to the box
        unclipped = ((x_adv > bounds[0]) & (x_adv < bounds[1])).reshape(n, -1)
        assert (d != 0).float().mean() > 0.5 and float(d.abs().max() / scale) > 0.4
        assert 0.1 < float(d[unclipped].std() / scale) < 0.25
        return
    with torch.no_grad():
        clean, adv = _metric(t, kind, model(x), y), _metric(t, kind, model(x_adv), y)
    assert adv < clean - 0.1, f"{name} on {kind}: metric {float(clean):.3f} -> {float(adv):.3f}"


def test_refused_message_names_what_to_use(trained_multilabel):
    # the README example of a refusal: the reason names the alternative
    t = trained_multilabel
    w = TorchattacksModel(t.model, t.task, bounds=(0.0, 1.0))
    with pytest.raises(UnsupportedAttackError, match=r"^torchattacks AutoAttack does not apply to a multi-label "
                                                     r"model: .* use MultiAttack\(\[APGD"):
        w.attack(torchattacks.AutoAttack(w, n_classes=4), t.x[:2], t.y[:2])
    assert math.isfinite(E)
