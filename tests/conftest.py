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


# --- no network in the test suite ---------------------------------------------------------------------------------
# medadv downloads nothing, and the tests prove it: any connection to, or name lookup of, a host other than this
# machine raises. Loopback and UNIX sockets stay open (gloo rendezvous on localhost in the distributed tests, the
# browser test's headless Chromium). Self-contained on purpose (it does not use medadv.offline, which it checks).
def _suite_is_local(host) -> bool:
    import ipaddress

    if host in (None, "", "localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(scope="session", autouse=True)
def _no_network():
    import socket

    real_connect, real_connect_ex, real_getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def refuse(what):
        raise RuntimeError(f"the test suite has no network: {what} refused (medadv must not download)")

    def allowed(sock, address) -> bool:
        if sock.family == getattr(socket, "AF_UNIX", None):
            return True
        return isinstance(address, tuple) and _suite_is_local(address[0])

    def connect(self, address):
        if not allowed(self, address):
            refuse(f"connect to {address!r}")
        return real_connect(self, address)

    def connect_ex(self, address):
        if not allowed(self, address):
            refuse(f"connect to {address!r}")
        return real_connect_ex(self, address)

    def getaddrinfo(host, port, *args, **kwargs):
        if not _suite_is_local(host):
            refuse(f"name lookup of {host!r}")
        return real_getaddrinfo(host, port, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = real_connect, real_connect_ex, real_getaddrinfo


# --- the device the suite runs on: `pytest --device cuda` on a machine with a GPU ---------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", default="cpu", choices=("cpu", "cuda"),
                     help="device for the device-aware tests (conformance suite, evaluate/config, benchmark "
                          "smoke): cpu (default) or cuda")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--device") == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device of ``--device`` (default CPU): device-aware tests put their models and data there."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture
def cuda_device(device: torch.device) -> torch.device:
    """The CUDA device of ``pytest --device cuda``; tests that only mean something on a GPU skip without it."""
    if device.type != "cuda":
        pytest.skip("CUDA-only check: run `pytest --device cuda` on a machine with a GPU (CI has none)")
    return device
