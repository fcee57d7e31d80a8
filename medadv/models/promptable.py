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

import os
from typing import Any

import torch
from torch import Tensor, nn

from ..tasks.promptable import Prompts

# the adapters and the small UNet live with the task kind (its examples build them): re-exported here
from ..tasks.promptable_nets import ImageOnly, PromptableUNet, Prompted, point_heatmap

__all__ = ["Prompted", "ImageOnly", "PromptableUNet", "PromptableVISTA3D", "build_vista3d", "point_heatmap"]


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
