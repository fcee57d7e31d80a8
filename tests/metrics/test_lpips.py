"""LPIPS on local weight files (Zhang et al. 2018): the metric's properties with a randomly initialised AlexNet
backbone and random linear weights written to temporary files, volumes slice by slice, and the errors that name
the files to supply. With the ``lpips`` package importable, the values are compared with it on the same weights."""

from __future__ import annotations

import pytest
import torch

from medadv.metrics.image import LPIPS_ENV, _backbone, lpips

CHANNELS = (64, 192, 384, 256, 256)


@pytest.fixture
def weights(tmp_path):
    torch.manual_seed(0)
    feats = _backbone("alex")  # the same layers and keys as torchvision.models.alexnet().features
    torch.save({f"features.{k}": v for k, v in feats.state_dict().items()}, tmp_path / "alexnet-owt-7be5be79.pth")
    g = torch.Generator().manual_seed(1)
    torch.save({f"lin{i}.model.1.weight": torch.rand(1, c, 1, 1, generator=g) for i, c in enumerate(CHANNELS)},
               tmp_path / "alex.pth")
    return tmp_path


def _images(n=3, size=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    centres = torch.rand(n, 2, generator=g) - 0.5
    img = torch.exp(-((xx - centres[:, :1, None]) ** 2 + (yy - centres[:, 1:, None]) ** 2) / 0.2)
    noise = torch.randn(n, 1, size, size, generator=g)
    return img.unsqueeze(1), noise


def test_zero_symmetric_and_growing_with_the_perturbation(weights):
    x, noise = _images()
    x0 = x.clone()
    assert torch.equal(lpips(x, x, weights=weights), torch.zeros(3))
    d = [lpips(x, (x + s * noise).clamp(0, 1), weights=weights) for s in (0.02, 0.1, 0.3)]
    assert (d[0] > 0).all() and (d[1] > d[0]).all() and (d[2] > d[1]).all()
    xa = (x + 0.1 * noise).clamp(0, 1)
    torch.testing.assert_close(lpips(xa, x, weights=weights), d[1])
    torch.testing.assert_close(lpips(x, xa, weights=weights, similarity=True), 1 - d[1])
    assert torch.equal(x, x0)  # inputs untouched
    # differentiable in the input, finite gradient (an attack or a VAFA-style loss can use it)
    xr = xa.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(lpips(x, xr, weights=weights).sum(), xr)
    assert torch.isfinite(g).all() and g.abs().sum() > 0
    # `bounds` maps the data range to [-1, 1]: the same images in HU-like units give the same values
    torch.testing.assert_close(lpips(x * 1000 - 500, xa * 1000 - 500, weights=weights, bounds=(-500, 500)), d[1],
                               rtol=1e-4, atol=1e-6)


def test_volumes_are_compared_slice_by_slice_and_env_var(weights, monkeypatch):
    x, noise = _images(n=4, size=32)
    vol = x.reshape(2, 2, 1, 32, 32).permute(0, 2, 3, 4, 1).contiguous()  # (N=2, C=1, H, W, D=2)
    adv = (vol + 0.1 * noise.reshape(2, 2, 1, 32, 32).permute(0, 2, 3, 4, 1)).clamp(0, 1)
    per_slice = torch.stack([lpips(vol[..., k], adv[..., k], weights=weights) for k in range(2)], 1)
    torch.testing.assert_close(lpips(vol, adv, weights=weights), per_slice.mean(1))
    monkeypatch.setenv(LPIPS_ENV, str(weights))
    torch.testing.assert_close(lpips(vol, adv), per_slice.mean(1))


def test_missing_files_are_named(tmp_path, weights, monkeypatch):
    monkeypatch.delenv(LPIPS_ENV, raising=False)
    x = torch.rand(1, 1, 32, 32)
    with pytest.raises(FileNotFoundError) as err:
        lpips(x, x)
    text = str(err.value)
    for needle in ("alex.pth", "lpips/weights/v0.1", "alexnet-owt-7be5be79.pth", "AlexNet_Weights.IMAGENET1K_V1",
                   "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth", LPIPS_ENV, "weights=", "offline"):
        assert needle in text, needle
    only_linear = tmp_path / "only"
    only_linear.mkdir()
    (only_linear / "alex.pth").write_bytes((weights / "alex.pth").read_bytes())
    with pytest.raises(FileNotFoundError, match=r"missing: alexnet-owt-7be5be79\.pth\)"):
        lpips(x, x, weights=only_linear)
    with pytest.raises(FileNotFoundError, match=r"vgg\.pth, vgg16-397923af\.pth"):
        lpips(x, x, weights=weights, net="vgg")


def test_bad_files_and_inputs(tmp_path, weights):
    x = torch.rand(1, 1, 32, 32)
    torch.save({"lin0.model.1.weight": torch.rand(1, 3, 1, 1)}, tmp_path / "alex.pth")  # wrong channels
    with pytest.raises(ValueError, match=r"lin0\.model\.1\.weight.*64 values"):
        lpips(x, x + 0.01, weights=tmp_path)
    with pytest.raises(ValueError, match="at least 31"):
        lpips(torch.rand(1, 1, 16, 16), torch.rand(1, 1, 16, 16), weights=weights)
    with pytest.raises(ValueError, match="channels"):
        lpips(torch.rand(1, 2, 32, 32), torch.rand(1, 2, 32, 32), weights=weights)
    with pytest.raises(ValueError, match="net"):
        lpips(x, x, weights=weights, net="squeeze")
    with pytest.raises(ValueError, match="bounds"):
        lpips(x, x, weights=weights, bounds=(1.0, 0.0))
