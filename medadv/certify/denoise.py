"""Denoised smoothing (Salman, Sun, Yang, Kapoor & Kolter, NeurIPS 2020): a Gaussian denoiser before the model.

Randomized smoothing needs a base model that is accurate on noisy inputs. Instead of retraining the model with
noise, a denoiser ``D`` trained to map ``x + δ`` (``δ ~ N(0, σ² I)``) back to ``x`` (MSE, the paper's
"MSE objective") is put in front of it, and the smoothing certifies ``f ∘ D``: ``RandomizedSmoothing(task,
sigma).certify(Denoised(denoiser, model), x)``.

:class:`DnCNN` is a small residual DnCNN (Zhang, Zuo, Chen, Meng & Zhang, IEEE TIP 2017: conv–(conv–BN–ReLU)×d–conv
predicting the noise, subtracted from the input), 2-D or 3-D; :func:`fit_denoiser` trains any denoiser on medadv's
shared fitting loop (seeded, resumable).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..params import Int, InvalidParameterError, Real
from ..runtime import check_input, check_model, model_device
from ..training.loop import Fitter, draw_seed

__all__ = ["DnCNN", "Denoised", "DenoiserFitter", "fit_denoiser"]


class DnCNN(nn.Module):
    """Residual DnCNN denoiser: ``D(x) = x − net(x)``, ``net`` = conv–ReLU, ``depth − 2`` × conv–BN–ReLU, conv.

    Args:
        channels: input (= output) channels.
        ndim: 2 (images) or 3 (volumes).
        depth: convolution layers (>= 2; Zhang et al. use 17 for natural images, a small default here).
        width: feature channels.
    """

    def __init__(self, channels: int = 1, *, ndim: int = 2, depth: int = 5, width: int = 32) -> None:
        super().__init__()
        channels = Int(low=1).check(channels, "channels", "DnCNN")
        if isinstance(ndim, bool) or ndim not in (2, 3):
            raise InvalidParameterError(f"`ndim` of DnCNN must be 2 or 3, got {ndim!r}")
        depth = Int(low=2).check(depth, "depth", "DnCNN")
        width = Int(low=1).check(width, "width", "DnCNN")
        conv = nn.Conv2d if ndim == 2 else nn.Conv3d
        norm = nn.BatchNorm2d if ndim == 2 else nn.BatchNorm3d
        layers: list[nn.Module] = [conv(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [conv(width, width, 3, padding=1, bias=False), norm(width), nn.ReLU(inplace=True)]
        layers.append(conv(width, channels, 3, padding=1))
        self.net = nn.Sequential(*layers)
        self.ndim = ndim

    def forward(self, x: Tensor) -> Tensor:
        return x - self.net(x)


class Denoised(nn.Module):
    """``model(denoiser(x))`` as one ``nn.Module`` (what denoised smoothing certifies)."""

    def __init__(self, denoiser: nn.Module, model: nn.Module) -> None:
        super().__init__()
        self.denoiser = check_model(denoiser, "denoiser")
        self.model = check_model(model, "model")

    def forward(self, x: Tensor) -> Tensor:
        return self.model(self.denoiser(x))


class DenoiserFitter(Fitter):
    """Minimise ``‖D(x + δ) − x‖²`` (mean over elements), ``δ ~ N(0, σ² I)`` fresh every batch (see :func:`fit_denoiser`).

    The noise of each batch is drawn on the device from a generator seeded by the loop's seeded generator, so a
    run is reproducible and resumes exactly.
    """

    desc = "denoiser"

    def __init__(self, denoiser: nn.Module, sigma: float, optimizer: torch.optim.Optimizer, *, epochs: int,
                 batch_size: int, seed: int = 0, checkpoint: str | os.PathLike | None = None,
                 progress: bool = False) -> None:
        super().__init__(denoiser, optimizer, epochs=epochs, batch_size=batch_size, seed=seed, checkpoint=checkpoint,
                         progress=progress)
        self.denoiser = denoiser
        self.sigma: float = Real(low=0.0, low_open=True).check(sigma, "sigma", type(self).__name__)

    def batch_loss(self, x: Tensor, y: Tensor | None, generator: torch.Generator) -> Tensor:
        g = torch.Generator(device=x.device).manual_seed(draw_seed(generator))
        noisy = x + self.sigma * torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype)
        return F.mse_loss(self.denoiser(noisy), x)


def fit_denoiser(denoiser: nn.Module, x: Tensor, sigma: float, *, epochs: int = 20, batch_size: int = 32,
                 lr: float = 1e-3, seed: int = 0, checkpoint: str | os.PathLike | None = None,
                 progress: bool = False) -> list[float]:
    """Train ``denoiser`` in place on clean images ``x`` ``(N, C, *spatial)`` (no labels) for noise ``sigma``.

    Args:
        denoiser: e.g. :class:`DnCNN`; any module mapping ``(N, C, *spatial)`` to the same shape.
        x: clean training inputs in the data's units (the same data the model sees).
        sigma: the noise standard deviation the smoothing will use (data units, > 0).
        epochs, batch_size, lr, seed, checkpoint, progress: as :func:`~medadv.training.fit_supervised` (Adam).

    Returns the mean MSE of every epoch; the denoiser is left in eval mode.
    """
    check_model(denoiser, "denoiser")
    check_input(x)
    lr = Real(low=0.0, low_open=True).check(lr, "lr", "fit_denoiser")
    opt = torch.optim.Adam(denoiser.parameters(), lr=lr)
    fitter = DenoiserFitter(denoiser, sigma, opt, epochs=epochs, batch_size=batch_size, seed=seed,
                            checkpoint=checkpoint, progress=progress)
    return fitter.run(x, None, model_device(denoiser, x.device))
