"""The small promptable networks that go with :class:`~medadv.tasks.PromptableSegmentation`: the ``model(x)``
adapters of a ``net(image, prompts)`` (:class:`Prompted`, :class:`ImageOnly`) and the point-prompted UNet of the
kind's examples (:class:`PromptableUNet`).

They live with the task kind because the kind's :meth:`~medadv.tasks.PromptableSegmentation.examples` build them and
:class:`Prompted` decodes the kind's prompt code: :mod:`medadv.tasks` sits below :mod:`medadv.models` (no import
cycle between them). :mod:`medadv.models.promptable` re-exports every name, next to the VISTA3D wrapper.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .promptable import PromptableSegmentation, PromptBox, Prompts

__all__ = ["Prompted", "ImageOnly", "PromptableUNet", "point_heatmap"]


class Prompted(nn.Module):
    """``net(image, prompts)`` as ``model(x)`` for ``x = [image | prompt code]``.

    The code channels are detached and decoded by threshold (:meth:`PromptableSegmentation.decode`): the input
    gradient on them is exactly zero (every attack also holds them at their clean values:
    :func:`medadv.attacks.base.hold_fixed_channels`).

    Args:
        net: a module called as ``net(image, prompts)`` returning ``(N, 2, *spatial)`` logits.
        task: the :class:`~medadv.tasks.PromptableSegmentation` giving the layout of ``x``.
        box: the :class:`~medadv.tasks.promptable.PromptBox` giving the code's two values.
    """

    def __init__(self, net: nn.Module, task: PromptableSegmentation, box: PromptBox) -> None:
        super().__init__()
        if not isinstance(box, PromptBox):
            raise TypeError(f"`box` must be a PromptBox (task.box(lo, hi)), got {box!r}")
        if box.image_channels != task.image_channels or box.code_channels != task.code_channels:
            raise ValueError(f"`box` {box!r} does not fit the layout of {task!r}")
        self.net, self.task, self.box = net, task, box

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 3 or x.shape[1] != self.box.channels:
            raise ValueError(f"`x` must be (N, {self.task.image_channels} image + {self.task.code_channels} prompt-code "
                             f"channels, *spatial), got {tuple(x.shape)}")
        return self.net(self.task.image(x), self.task.decode(x.detach(), self.box))


class ImageOnly(nn.Module):
    """A conventional segmenter that reads the image channels of a coded ``x`` and ignores the prompt.

    Args:
        net: ``net(image) -> logits``.
        image_channels: how many leading channels of ``x`` are the image.
    """

    def __init__(self, net: nn.Module, image_channels: int) -> None:
        super().__init__()
        self.net, self.image_channels = net, int(image_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x[:, :self.image_channels])


def point_heatmap(points: Tensor, sigma: float) -> Tensor:
    """Gaussian heatmaps of click maps: ``points (N, *spatial)`` bool → ``(N, *spatial)`` float in [0, 1], each click
    a Gaussian of standard deviation ``sigma`` voxels with peak 1 (overlaps capped at 1)."""
    nd = points.ndim - 1
    r = max(1, math.ceil(3 * sigma))
    ax = torch.arange(-r, r + 1, dtype=torch.float32, device=points.device)
    g = torch.exp(-(ax ** 2) / (2 * sigma ** 2))
    out = points.unsqueeze(1).float()
    conv = F.conv2d if nd == 2 else F.conv3d
    for d in range(nd):  # separable: one 1-D pass per axis
        shape = [1, 1] + [1] * nd
        shape[2 + d] = 2 * r + 1
        pad = [0] * nd
        pad[d] = r
        out = conv(out, g.reshape(shape), padding=tuple(pad))
    return out.squeeze(1).clamp(max=1.0)


class PromptableUNet(nn.Module):
    """A point- (and box-) prompted MONAI UNet: ``net(image, prompts) -> (N, 2, *spatial)`` logits.

    Input channels: the image, a positive and a negative click heatmap (:func:`point_heatmap`), with points the image
    intensity under the positive clicks (the heatmap-weighted mean per image channel, spread over the grid: what the
    clicked structure looks like, for a network whose receptive field does not reach the click), and with a box prompt
    the box mask. Class prompts are not supported (use :class:`PromptableVISTA3D`).

    Args:
        image_channels: image channels.
        prompts: prompt kinds, ``("points",)``, ``("box",)`` or ``("points", "box")``.
        ndim: 2 or 3 spatial dims.
        channels: UNet feature channels per level.
        sigma: click heatmap width in voxels.
        seed: seed of the initial weights.
    """

    def __init__(self, image_channels: int = 1, prompts: tuple[str, ...] = ("points",), *, ndim: int = 2,
                 channels: tuple[int, ...] = (16, 32, 64), sigma: float = 2.0, seed: int | None = 0) -> None:
        super().__init__()
        from monai.networks.nets import UNet

        kinds = tuple(prompts)
        if "class" in kinds or not kinds or not set(kinds) <= {"points", "box"}:
            raise ValueError(f"PromptableUNet takes points and/or box prompts, got {prompts!r} (class prompts: "
                             "PromptableVISTA3D)")
        if ndim not in (2, 3):
            raise ValueError(f"`ndim` must be 2 or 3, got {ndim}")
        self.prompts, self.sigma = kinds, float(sigma)
        extra = (2 + int(image_channels)) * ("points" in kinds) + ("box" in kinds)
        if seed is not None:
            torch.manual_seed(seed)
        self.unet = UNet(spatial_dims=ndim, in_channels=int(image_channels) + extra, out_channels=2,
                         channels=tuple(channels), strides=(2,) * (len(channels) - 1), num_res_units=1)

    def forward(self, image: Tensor, prompts: Prompts) -> Tensor:
        maps = [image]
        if "points" in self.prompts:
            heat = [torch.zeros_like(image[:, :1]) if m is None else point_heatmap(m, self.sigma).to(image.dtype).unsqueeze(1)
                    for m in (prompts.positive, prompts.negative)]
            dims = tuple(range(2, image.ndim))
            w = heat[0] / heat[0].sum(dim=dims, keepdim=True).clamp_min(1e-6)
            maps += heat + [(image * w).sum(dim=dims, keepdim=True).expand_as(image)]
        if "box" in self.prompts:
            if prompts.box is None:
                raise ValueError("this PromptableUNet takes a box prompt")
            maps.append(prompts.box.to(image.dtype).unsqueeze(1))
        return self.unet(torch.cat(maps, dim=1))
