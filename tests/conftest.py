"""Shared fixtures: small models trained once per session on synthetic data (seconds on 2 CPU cores)."""

from __future__ import annotations

import pytest
import torch

from medadv.data.synthetic import multiclass_blobs, multilabel_blobs, segmentation_blobs
from medadv.models import fit_supervised, small_cnn, small_unet
from medadv.tasks import MultiClass, MultiLabel, Segmentation

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


class Trained:
    """A trained model with its task and held-out data."""

    def __init__(self, model, task, x, y):
        self.model, self.task, self.x, self.y = model, task, x, y


def _train(make_model, task, data_fn, n_train, n_test, epochs, lr, batch_size=16, **kw):
    # seed before building: the weights must not depend on which tests ran first
    torch.manual_seed(0)
    model = make_model()
    x, y = data_fn(n=n_train + n_test, seed=0, **kw)
    fit_supervised(model, task, x[:n_train], y[:n_train], epochs=epochs, lr=lr, batch_size=batch_size)
    return Trained(model.eval(), task, x[n_train:], y[n_train:])


@pytest.fixture(scope="session")
def trained_multiclass():
    """4-class 2-D CNN on 16x16 blob images (MultiClass)."""
    return _train(lambda: small_cnn(1, 4, width=8), MultiClass(), multiclass_blobs, 256, 32, 15, 1e-2, num_classes=4)


@pytest.fixture(scope="session")
def trained_multilabel():
    """4-label 2-D CNN on 16x16 blob images (MultiLabel, threshold 0.5)."""
    return _train(lambda: small_cnn(1, 4, width=8), MultiLabel(), multilabel_blobs, 256, 32, 15, 1e-2, num_labels=4)


@pytest.fixture(scope="session")
def trained_seg3d():
    """MONAI UNet, 3 classes, 1 channel, 16^3 volumes (Segmentation, 3-D)."""
    return _train(lambda: small_unet(1, 3, ndim=3, channels=(8, 16)), Segmentation(3), segmentation_blobs,
                  32, 4, 40, 2e-2, batch_size=8, num_classes=3, size=16, ndim=3)


@pytest.fixture(scope="session")
def trained_seg2d():
    """MONAI UNet, 3 classes, 2 channels, 32x32 images (Segmentation, 2-D)."""
    return _train(lambda: small_unet(2, 3, ndim=2, channels=(8, 16)), Segmentation(3), segmentation_blobs,
                  48, 8, 15, 1e-2, num_classes=3, size=32, ndim=2, channels=2)


@pytest.fixture
def forbid_host_sync(monkeypatch):
    """Call it to make every device-to-host read (``.item()``, ``bool(t)``, ``.tolist()``, ...) raise; returns
    ``monkeypatch`` so the test can ``undo()`` once the code under test has run."""

    def install():
        def sync(*args, **kwargs):
            raise AssertionError("host synchronisation inside the attack loop")

        for name in ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__"):
            monkeypatch.setattr(torch.Tensor, name, sync)
        with pytest.raises(AssertionError, match="host synchronisation"):
            bool(torch.tensor(True))  # the trap works
        return monkeypatch

    return install
