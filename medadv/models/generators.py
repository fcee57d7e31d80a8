"""Perturbation generators for GAP (generative adversarial perturbations), 2-D and 3-D.

Two families, as in Poursaeed et al. (CVPR 2018) and Xu et al. (MedIA 2021):

* :class:`ResnetGenerator`: a 7-wide stem, ``n_down`` stride-2 convolutions, ``n_blocks`` residual
  blocks, ``n_down`` transposed convolutions and a 7-wide head (Johnson et al.'s transformer net,
  Poursaeed's classification generator).
* :class:`UnetGenerator`: ``depth`` stride-2 4-wide convolutions with LeakyReLU(0.2), mirrored by
  transposed convolutions with skip concatenations (the pix2pix U-Net that Xu et al. use).

Both end in ``tanh`` (output in (-1, 1); GAP rescales it to the budget), take any spatial size (the
input is padded to a multiple of ``2**n_down`` / ``2**depth`` and the output cropped back) and any
number of channels. Weights start from N(0, 0.02), norm scales from N(1, 0.02) (pix2pix/GAP init),
drawn from a seeded generator so that a seed fixes the network.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..params import Int, Real, look_up_option

__all__ = ["ResnetGenerator", "UnetGenerator", "build_generator", "init_weights", "generator_from_checkpoint"]


_POSITIVE = Int(low=1)
_NDIM = Int(low=2, high=3)
_NORMS = ("batch", "instance", "none")


def _positive(owner: str, **kw: int) -> list[int]:
    """The integer arguments, each checked to be >= 1 (errors name the argument and the class)."""
    return [_POSITIVE.check(v, name, owner) for name, v in kw.items()]


def _norm(kind: str, channels: int, ndim: int) -> nn.Module:
    if kind == "batch":
        return (nn.BatchNorm2d if ndim == 2 else nn.BatchNorm3d)(channels)
    if kind == "instance":
        return (nn.InstanceNorm2d if ndim == 2 else nn.InstanceNorm3d)(channels, affine=True)
    return nn.Identity()


def _conv(ndim: int) -> type[nn.Module]:
    return nn.Conv2d if ndim == 2 else nn.Conv3d


def _convt(ndim: int) -> type[nn.Module]:
    return nn.ConvTranspose2d if ndim == 2 else nn.ConvTranspose3d


def init_weights(module: nn.Module, seed: int | None = 0) -> nn.Module:
    """GAP/pix2pix initialisation: conv weights N(0, 0.02), norm scales N(1, 0.02), biases 0."""
    gen = None if seed is None else torch.Generator().manual_seed(int(seed))
    for m in module.modules():
        if isinstance(m, nn.Conv2d | nn.Conv3d | nn.ConvTranspose2d | nn.ConvTranspose3d):
            with torch.no_grad():
                w = torch.empty(m.weight.shape).normal_(0.0, 0.02, generator=gen)
                m.weight.copy_(w)
                if m.bias is not None:
                    m.bias.zero_()
        elif isinstance(m, nn.modules.batchnorm._BatchNorm | nn.modules.instancenorm._InstanceNorm):
            if m.weight is not None:
                with torch.no_grad():
                    m.weight.copy_(torch.empty(m.weight.shape).normal_(1.0, 0.02, generator=gen))
                    m.bias.zero_()
    return module


class _PadToMultiple(nn.Module):
    """Wraps a body whose spatial sizes must be multiples of ``multiple``: pad, run, crop back."""

    def __init__(self, multiple: int) -> None:
        super().__init__()
        self.multiple = multiple

    def run(self, body: nn.Module, x: Tensor) -> Tensor:
        spatial = x.shape[2:]
        pads: list[int] = []
        for s in reversed(spatial):  # F.pad lists the last dim first
            pads += [0, (-s) % self.multiple]
        xp = F.pad(x, pads, mode="replicate") if any(pads) else x
        out = body(xp)
        return out[(..., *[slice(0, s) for s in spatial])]


class ResnetGenerator(_PadToMultiple):
    """ResNet-style generator (Poursaeed et al.'s classification generator), 2-D or 3-D.

    Args:
        in_channels: channels of the generator input (the image, or the universal noise).
        out_channels: channels of the perturbation (default: ``in_channels``).
        ngf: width of the first layer; doubles at each downsampling.
        n_blocks: residual blocks at the bottleneck (6 in Poursaeed's classification setting).
        n_down: stride-2 downsamplings (2 in the reference).
        ndim: spatial dimensions, 2 or 3.
        norm: ``"batch"`` (reference), ``"instance"`` or ``"none"``.
        seed: seed of the weight initialisation.
    """

    def __init__(self, in_channels: int = 1, out_channels: int | None = None, *, ngf: int = 16, n_blocks: int = 2,
                 n_down: int = 2, ndim: int = 2, norm: str = "batch", seed: int | None = 0) -> None:
        out_channels = in_channels if out_channels is None else out_channels
        in_channels, out_channels, ngf, n_blocks, n_down = _positive(
            "ResnetGenerator", in_channels=in_channels, out_channels=out_channels, ngf=ngf, n_blocks=n_blocks,
            n_down=n_down)
        ndim = _NDIM.check(ndim, "ndim", "ResnetGenerator")
        norm = look_up_option(norm, _NORMS, argument="norm", owner="ResnetGenerator")
        super().__init__(2**n_down)
        conv, convt = _conv(ndim), _convt(ndim)
        act = nn.ReLU
        layers: list[nn.Module] = [conv(in_channels, ngf, 7, padding=3, padding_mode="replicate"),
                                   _norm(norm, ngf, ndim), act()]
        ch = ngf
        for _ in range(n_down):
            layers += [conv(ch, 2 * ch, 3, stride=2, padding=1), _norm(norm, 2 * ch, ndim), act()]
            ch *= 2
        layers += [_ResBlock(ch, ndim, norm) for _ in range(n_blocks)]
        for _ in range(n_down):
            layers += [convt(ch, ch // 2, 3, stride=2, padding=1, output_padding=1), _norm(norm, ch // 2, ndim), act()]
            ch //= 2
        layers += [conv(ch, out_channels, 7, padding=3, padding_mode="replicate"), nn.Tanh()]
        self.body = nn.Sequential(*layers)
        self.config: dict[str, Any] = dict(kind="resnet", in_channels=in_channels, out_channels=out_channels, ngf=ngf,
                                           n_blocks=n_blocks, n_down=n_down, ndim=ndim, norm=norm)
        init_weights(self, seed)

    def forward(self, x: Tensor) -> Tensor:
        return self.run(self.body, x)


class _ResBlock(nn.Module):
    def __init__(self, ch: int, ndim: int, norm: str) -> None:
        super().__init__()
        conv = _conv(ndim)
        self.body = nn.Sequential(conv(ch, ch, 3, padding=1, padding_mode="replicate"), _norm(norm, ch, ndim), nn.ReLU(),
                                  conv(ch, ch, 3, padding=1, padding_mode="replicate"), _norm(norm, ch, ndim))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


class _UnetLevel(nn.Module):
    """One U-Net level: down conv, inner level (or nothing at the bottom), up conv, skip concat."""

    def __init__(self, outer: int, inner: int, ndim: int, norm: str, sub: nn.Module | None,
                 outermost: bool, out_channels: int, dropout: float) -> None:
        super().__init__()
        conv, convt = _conv(ndim), _convt(ndim)
        self.outermost = outermost
        down: list[nn.Module] = [] if outermost else [nn.LeakyReLU(0.2)]
        down.append(conv(outer, inner, 4, stride=2, padding=1))
        if not outermost and sub is not None:
            down.append(_norm(norm, inner, ndim))
        up_in = inner if sub is None else 2 * inner
        up: list[nn.Module] = [nn.ReLU()]
        if outermost:
            up += [convt(up_in, out_channels, 4, stride=2, padding=1), nn.Tanh()]
        else:
            up += [convt(up_in, outer, 4, stride=2, padding=1), _norm(norm, outer, ndim)]
            if dropout > 0:
                up.append(nn.Dropout(dropout))
        self.down, self.sub, self.up = nn.Sequential(*down), sub, nn.Sequential(*up)

    def forward(self, x: Tensor) -> Tensor:
        h = self.down(x)
        if self.sub is not None:
            h = self.sub(h)
        h = self.up(h)
        return h if self.outermost else torch.cat([x, h], dim=1)


class UnetGenerator(_PadToMultiple):
    """U-Net generator (pix2pix; the GAP generator of Xu et al.), 2-D or 3-D.

    Args:
        in_channels: channels of the generator input.
        out_channels: channels of the perturbation (default: ``in_channels``).
        ngf: width of the first level; doubles per level up to ``8 * ngf`` (64 in the reference).
        depth: number of stride-2 levels (6 for 224x224 in the reference); inputs are padded to a
            multiple of ``2**depth``.
        ndim: spatial dimensions, 2 or 3.
        norm: ``"batch"`` (reference), ``"instance"`` or ``"none"``.
        dropout: dropout in the decoder blocks below the top level (reference 0.5);
            default 0 so that a seeded run is deterministic without tracking dropout RNG.
        seed: seed of the weight initialisation.
    """

    def __init__(self, in_channels: int = 1, out_channels: int | None = None, *, ngf: int = 16, depth: int = 3,
                 ndim: int = 2, norm: str = "batch", dropout: float = 0.0, seed: int | None = 0) -> None:
        out_channels = in_channels if out_channels is None else out_channels
        in_channels, out_channels, ngf, depth = _positive(
            "UnetGenerator", in_channels=in_channels, out_channels=out_channels, ngf=ngf, depth=depth)
        ndim = _NDIM.check(ndim, "ndim", "UnetGenerator")
        norm = look_up_option(norm, _NORMS, argument="norm", owner="UnetGenerator")
        dropout = Real(low=0, high=1, high_open=True).check(dropout, "dropout", "UnetGenerator")
        super().__init__(2**depth)
        widths = [in_channels] + [ngf * min(2**i, 8) for i in range(depth)]
        level: nn.Module | None = None
        for i in range(depth, 0, -1):  # build from the bottom up
            level = _UnetLevel(widths[i - 1], widths[i], ndim, norm, level, outermost=(i == 1),
                               out_channels=out_channels, dropout=dropout if i > 1 else 0.0)
        assert level is not None  # depth >= 1
        self.body: nn.Module = level
        self.config: dict[str, Any] = dict(kind="unet", in_channels=in_channels, out_channels=out_channels, ngf=ngf,
                                           depth=depth, ndim=ndim, norm=norm, dropout=float(dropout))
        init_weights(self, seed)

    def forward(self, x: Tensor) -> Tensor:
        return self.run(self.body, x)


def build_generator(kind: str = "unet", **kwargs: Any) -> nn.Module:
    """Build a generator from its ``config`` dict (``kind`` = ``"unet"`` or ``"resnet"``, plus its arguments).

    Unknown architecture names get the closest valid one in the error; the arguments are those of
    :class:`UnetGenerator` / :class:`ResnetGenerator`.
    """
    kind = look_up_option(kind, ("unet", "resnet"), argument="kind", owner="build_generator")
    return UnetGenerator(**kwargs) if kind == "unet" else ResnetGenerator(**kwargs)


def generator_from_checkpoint(payload: Any, path: Any) -> nn.Module:
    """The generator of a GAPTrainer checkpoint's ``payload`` (read from ``path``), its best weights loaded.

    A file that is not one is a ``ValueError`` of one line saying what the file holds instead (a network's state
    dict belongs in ``model.checkpoint``), and weights that do not fit the architecture the checkpoint names list
    the mismatching keys briefly (:func:`medadv.models.io.load_state_dict`), never torch's whole message."""
    from collections.abc import Mapping

    from .io import STATE_DICT_KEYS, load_state_dict

    if not isinstance(payload, Mapping):
        raise ValueError(f"{path} holds a {type(payload).__name__}, not a GAP checkpoint (a mapping with "
                         "'generator_config', 'gap' and the generator's weights, as medadv.GAPTrainer writes)")
    if "generator_config" not in payload or "gap" not in payload:
        tensors = any(isinstance(v, Tensor) for v in payload.values()) or any(
            isinstance(payload.get(k), Mapping) for k in STATE_DICT_KEYS)
        what = ("the weights of a network (a state dict): give them as `model.checkpoint`" if tensors else
                f"keys {', '.join(map(repr, list(payload)[:8])) or 'none'}")
        raise ValueError(f"{path} is not a GAP checkpoint: it has no 'generator_config' and 'gap' entries (it holds "
                         f"{what}); a GAP generator is trained and written by medadv.GAPTrainer")
    config = payload["generator_config"]
    if not isinstance(config, Mapping):
        raise ValueError(f"{path}: 'generator_config' is a {type(config).__name__}, not a mapping of build_generator "
                         "arguments")
    with torch.random.fork_rng(devices=[]):  # its initial weights are overwritten: leave the caller's RNG alone
        gen = build_generator(**dict(config))
    state = payload.get("best_state") or payload.get("state_dict")
    if not isinstance(state, Mapping):
        raise ValueError(f"{path} has no generator weights ('best_state' or 'state_dict')")
    load_state_dict(gen, state, source=f"the GAP checkpoint {path}")
    return gen
