"""Promptable segmenters: a small point-prompted MONAI UNet, a VISTA3D wrapper, and the adapters to ``model(x)``.

medadv calls every model as ``model(x)``; a promptable segmenter is ``net(image, prompts)``. :class:`Prompted` joins
the two: ``x = [image | prompt code]`` (:mod:`medadv.tasks.promptable` explains why the prompt travels in ``x`` and
why attacks cannot change it), decoded here into :class:`~medadv.tasks.promptable.Prompts` with the code channels
*detached* (no input gradient flows to them). :class:`ImageOnly` lets a conventional segmenter read the same coded
``x`` (it ignores the prompt), so one batch can be fed to both, e.g. in :func:`medadv.studies.transfer` (Malik et
al. 2024, Table 14: adversarial examples crafted on conventional segmenters, transferred to promptable ones).

* :class:`PromptableUNet` — a MONAI UNet whose input is the image plus point heatmaps (a Gaussian of σ voxels per
  click, peak 1; positive and negative clicks in two channels) and, optionally, a box mask: the interactive
  segmentation design of click-map networks, small enough to train in seconds on CPU.
* :class:`PromptableVISTA3D` — MONAI's VISTA3D (He et al. 2024; SAM-style point head after Kirillov et al. 2023) called
  per sample with its clicks and/or class index; :func:`build_vista3d` builds it with random weights or from a
  local checkpoint (``weights_only=True``; nothing is downloaded).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..tasks.promptable import PromptableSegmentation, PromptBox, Prompts

__all__ = ["Prompted", "ImageOnly", "PromptableUNet", "PromptableVISTA3D", "build_vista3d", "point_heatmap"]


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


class PromptableVISTA3D(nn.Module):
    """MONAI's VISTA3D (He et al. 2024) as ``net(image, prompts) -> (N, 2, D, H, W)`` logits.

    VISTA3D segments one image at a time with a list of prompts; this calls it once per sample with that sample's
    clicks (labels 1/0, padding −1) and/or class index, and returns ``[0, z]`` for its one-channel logit ``z``
    (softmax of ``[0, z]`` is VISTA3D's sigmoid). Decoding clicks to coordinates reads them on the host once per
    forward.

    Args:
        vista: a ``monai.networks.nets.VISTA3D`` (:func:`build_vista3d`).
    """

    def __init__(self, vista: nn.Module) -> None:
        super().__init__()
        self.vista = vista

    def forward(self, image: Tensor, prompts: Prompts) -> Tensor:
        if image.ndim != 5:
            raise ValueError(f"VISTA3D segments 3-D volumes (N, C, D, H, W), got {tuple(image.shape)}")
        n = image.shape[0]
        has_points = prompts.positive is not None or prompts.negative is not None
        coords, labels = prompts.point_coords() if has_points else (None, None)
        outs = []
        for i in range(n):
            kw: dict[str, Any] = {}
            if coords is not None and labels is not None and bool((labels[i] >= 0).any()):
                kw["point_coords"], kw["point_labels"] = coords[i:i + 1].to(image.dtype), labels[i:i + 1]
            if prompts.classes is not None:
                kw["class_vector"] = prompts.classes[i:i + 1].reshape(1, 1)
                if "point_coords" in kw:
                    kw["prompt_class"] = kw["class_vector"]
            z = self.vista(image[i:i + 1], **kw)
            outs.append(z.reshape(1, 1, *image.shape[2:]).to(image.dtype))
        z = torch.cat(outs)
        return torch.cat([torch.zeros_like(z), z], dim=1)


def build_vista3d(checkpoint: str | os.PathLike | None = None, *, size: str = "full", in_channels: int = 1,
                  map_location: Any = "cpu") -> PromptableVISTA3D:
    """VISTA3D wrapped for medadv (:class:`PromptableVISTA3D`), random weights or a local checkpoint.

    Args:
        checkpoint: a local state-dict file (``torch.load(..., weights_only=True)``); ``None``: random weights.
            Nothing is downloaded: put MONAI's released ``model.pt`` (the VISTA3D bundle's ``models/model.pt``)
            at this path.
        size: ``"full"`` — the published ``vista3d132`` network (encoder width 48, 132 supported classes);
            ``"tiny"`` — the same architecture at width 8 with two encoder levels (for tests; no weights exist).
        in_channels: image channels.
        map_location: where to load the checkpoint.
    """
    try:
        from monai.networks.nets.segresnet_ds import SegResNetDS2
        from monai.networks.nets.vista3d import VISTA3D, ClassMappingClassify, PointMappingSAM, vista3d132
    except ImportError as e:  # pragma: no cover -- MONAI < 1.4
        raise ImportError(f"VISTA3D needs MONAI >= 1.4 with `monai.networks.nets.vista3d` ({e})") from e
    if size == "full":
        vista = vista3d132(in_channels=in_channels)
    elif size == "tiny":
        encoder = SegResNetDS2(in_channels=in_channels, blocks_down=(1, 1), norm="instance", out_channels=8,
                               init_filters=8, dsdepth=1)
        vista = VISTA3D(image_encoder=encoder, class_head=ClassMappingClassify(n_classes=16, feature_size=8),
                        point_head=PointMappingSAM(feature_size=8, n_classes=16, last_supported=8))
    else:
        raise ValueError(f"`size` must be 'full' or 'tiny', got {size!r}")
    if checkpoint is not None:
        from .io import load_checkpoint

        load_checkpoint(checkpoint, vista, map_location, where="VISTA3D checkpoint (the bundle's models/model.pt)")
    return PromptableVISTA3D(vista).eval()
