"""Promptable segmentation (SAM-style, VISTA3D-style): :class:`PromptableSegmentation`.

A promptable segmenter is called as ``model(image, prompts)``: points with labels (positive / negative clicks), a
box, or a class index select *which* structure to segment, and the output is the mask logits of that one structure
(Kirillov et al. 2023, "Segment Anything"; He et al. 2024, "VISTA3D: a unified segmentation foundation model for 3D
medical imaging").

How prompts travel with the sample
----------------------------------
Everything in medadv calls ``model(x)``: attacks, the engine (which runs hooks on *subsets* of the batch — the
active set, restarts, ``ctx.index``), evaluation, the studies, the adapters. A wrapper that stored per-sample prompts
next to the model would pair the wrong prompts with the rows of a subset, and labels never reach the model. So the
prompt is part of the *input*: ``x = [image | prompt code]`` along the channel axis,
``(N, C_image + C_code, *spatial)``. Whatever slices, reorders, subsets, shards or batches ``x`` moves the prompt
with its image, and every existing call site keeps working. The code channels are binary maps on the image grid:

* ``"points"``: two channels, the positive and the negative clicks (one voxel each);
* ``"box"``: one channel, the box as a filled mask;
* ``"class"``: one channel, one voxel set at the flat index equal to the class index.

The code is *not* part of the search set, under every norm and budget:

1. **Every attack holds it.** The task declares its code channels (:meth:`PromptableSegmentation.fixed_input_channels`)
   and :func:`medadv.attacks.base.hold_fixed_channels` keeps them at their clean values: the engine applies it to
   every start, gradient and projected iterate (an L2 step's length goes to the image channels only), and
   ``Attack.__call__`` to every attack's ``x_adv``. So the code of ``x_adv`` is the clean one bit for bit, for L∞
   budgets beyond half the data range and L2 budgets of any size alike, and the norms of ``x_adv − x`` count image
   channels only. Attacks that transform every channel (VAFA's DCT quantisation, GAP's generator) are refused.
2. **The data box pins it.** :class:`PromptBox` is a :class:`~medadv.threats.Box` whose code channels may only hold
   the two code values ``lo``/``hi`` (the data range's ends): its ``clip`` snaps each code voxel to the nearer of the
   two, so the iterates inside a random-search attack stay valid codes too.
3. **The model does not differentiate it.** :class:`~medadv.models.promptable.Prompted` (the wrapper that turns
   ``model(image, prompts)`` into ``model(x)``) detaches the code channels and decodes them by thresholding, so the
   input gradient on them is exactly zero.
4. **Nothing is lost silently.** :meth:`PromptBox.check_inside` refuses an ``x`` whose code channels hold other
   values (every attack checks its input against the box before any work), the code has a fixed layout
   (:meth:`PromptableSegmentation.encode` / :meth:`~PromptableSegmentation.decode`), and ``encode`` writes the box's
   two values exactly, so its output always passes the box's own check.

Prompts are therefore fixed during a fixed-prompt attack (PGD, APGD, ``auto``, ... on ``x``) and never perturbed;
the caller's tensors are never written. The prompt-agnostic attack (:mod:`medadv.attacks.prompt_agnostic`) replaces
the code channels of its own copies with prompts drawn per step (:meth:`PromptableSegmentation.draw_prompts`) and
ascends the expected loss over them.

Labels ``y`` are the mask of the prompted structure, ``(N, *spatial)`` in {0, 1}: a two-class segmentation, so
Dice, CosPGD/SegPGD weightings, DAG targets and reports are :class:`~medadv.tasks.Segmentation`'s. One result row is
one (image, prompt) pair: ``clean_mean_dice``/``adv_mean_dice`` are per-prompt Dice.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..params import Int
from ..threats import BoundValue, Box
from .base import TaskExample, register_task
from .segmentation import Segmentation

__all__ = ["PromptableSegmentation", "PromptBox", "Prompts", "PROMPT_KINDS", "code_range"]

#: prompt kinds and the number of code channels each takes, in code order
PROMPT_KINDS: dict[str, int] = {"points": 2, "box": 1, "class": 1}
#: the largest channel count / voxel distance a parameter may hold (int32: larger than any grid)
_MAX_COUNT = 2**31 - 1


@dataclass
class Prompts:
    """The prompts of a batch, as dense maps on the image grid (``None``: that kind is not given).

    Attributes:
        positive: ``(N, *spatial)`` bool, positive clicks (foreground of the wanted structure).
        negative: ``(N, *spatial)`` bool, negative clicks (not the wanted structure).
        box: ``(N, *spatial)`` bool, a filled box around the wanted structure.
        classes: ``(N,)`` int64 class index (VISTA3D's label index).
    """

    positive: Tensor | None = None
    negative: Tensor | None = None
    box: Tensor | None = None
    classes: Tensor | None = None

    @staticmethod
    def from_points(coords: Tensor, labels: Tensor, spatial: Sequence[int]) -> Prompts:
        """Clicks from coordinates: ``coords (N, P, ndim)`` integer voxel indices inside the grid ``spatial``,
        ``labels (N, P)`` 1 positive, 0 negative, −1 padding (VISTA3D's convention). Anything else is refused
        (a negative index would silently wrap to the far side of the grid)."""
        spatial = _grid(spatial)
        coords, labels = _as_index_tensor(coords, "coords"), _as_index_tensor(labels, "labels")
        if coords.ndim != 3 or coords.shape[2] != len(spatial) or tuple(labels.shape) != tuple(coords.shape[:2]):
            raise ValueError(f"`coords` must be (N, P, {len(spatial)}) voxel indices and `labels` (N, P), got "
                             f"{tuple(coords.shape)} and {tuple(labels.shape)}")
        if not bool(((labels == -1) | (labels == 0) | (labels == 1)).all()):
            raise ValueError(f"`labels` must hold 1 (positive), 0 (negative) or -1 (padding), got values "
                             f"{sorted(set(labels.unique().tolist()))}")
        used = (labels >= 0).unsqueeze(-1)
        size = torch.tensor(spatial, device=coords.device)
        if bool((used & ((coords < 0) | (coords >= size))).any()):
            raise ValueError(f"`coords` must be voxel indices inside the grid {tuple(spatial)} (0 <= index < size), "
                             f"got values in [{int(coords.min())}, {int(coords.max())}]")
        n = coords.shape[0]
        pos = torch.zeros(n, *spatial, dtype=torch.bool, device=coords.device)
        neg = torch.zeros_like(pos)
        for i in range(n):
            for c, lab in zip(coords[i].tolist(), labels[i].tolist(), strict=True):
                if lab < 0:
                    continue
                (pos if lab > 0 else neg)[(i, *[int(v) for v in c])] = True
        return Prompts(positive=pos, negative=neg)

    @staticmethod
    def from_boxes(boxes: Tensor, spatial: Sequence[int]) -> Prompts:
        """A box per sample: ``boxes (N, 2 ndim)`` as ``(start_0, …, start_{d-1}, stop_0, …)`` integer voxel
        indices, stop exclusive, ``0 <= start < stop <= size`` on every axis (an empty or out-of-grid box is
        refused, not cropped)."""
        spatial = _grid(spatial)
        nd = len(spatial)
        boxes = _as_index_tensor(boxes, "boxes")
        if boxes.ndim != 2 or boxes.shape[1] != 2 * nd:
            raise ValueError(f"`boxes` must be (N, {2 * nd}) as (start_0, ..., stop_0, ...) voxel indices for a "
                             f"{nd}-D grid, got shape {tuple(boxes.shape)}")
        size = torch.tensor(spatial, device=boxes.device)
        start, stop = boxes[:, :nd], boxes[:, nd:]
        if bool(((start < 0) | (stop > size) | (start >= stop)).any()):
            raise ValueError(f"`boxes` must satisfy 0 <= start < stop <= size on every axis of the grid "
                             f"{tuple(spatial)} (stop exclusive), got {boxes.tolist()[:4]}")
        return Prompts(box=_box_mask(boxes, spatial))

    def point_coords(self) -> tuple[Tensor, Tensor]:
        """``(coords (N, P, ndim) int64, labels (N, P))`` of the clicks, padded with label −1 (one host sync)."""
        maps = [(m, lab) for m, lab in ((self.positive, 1), (self.negative, 0)) if m is not None]
        if not maps:
            raise ValueError("these prompts have no points")
        n, nd = maps[0][0].shape[0], maps[0][0].ndim - 1
        per: list[list[tuple[list[int], int]]] = [[] for _ in range(n)]
        for m, lab in maps:
            for row in m.nonzero().tolist():
                per[row[0]].append((row[1:], lab))
        p = max(1, max(len(r) for r in per))
        device = maps[0][0].device
        coords = torch.zeros(n, p, nd, dtype=torch.long, device=device)
        labels = torch.full((n, p), -1, dtype=torch.long, device=device)
        for i, r in enumerate(per):
            for j, (c, lab) in enumerate(r):
                coords[i, j] = torch.tensor(c, device=device)
                labels[i, j] = lab
        return coords, labels


class PromptBox(Box):
    """The data box of a promptable input ``[image | prompt code]``: the image channels in ``[lo, hi]``, the code
    channels pinned to the two values ``{lo, hi}`` (module docstring: why this makes the prompt unattackable).

    Args:
        lo, hi: the image's data range, scalars or per-channel tensors ``(C_image, 1, ...)`` (data units).
        image_channels: ``C_image``, the leading channels of ``x`` that are the image.
        code_channels: the trailing channels that hold the prompt code.
    """

    def __init__(self, lo: BoundValue, hi: BoundValue, *, image_channels: int, code_channels: int) -> None:
        if int(image_channels) < 1 or int(code_channels) < 1:
            raise ValueError(f"`image_channels` and `code_channels` must be >= 1, got {image_channels}, {code_channels}")
        self.image_channels, self.code_channels = int(image_channels), int(code_channels)
        if isinstance(lo, Tensor) or isinstance(hi, Tensor):
            lo_t, hi_t = torch.as_tensor(lo, dtype=torch.float32), torch.as_tensor(hi, dtype=torch.float32)
            lo_t, hi_t = torch.broadcast_tensors(lo_t, hi_t)
            if lo_t.ndim < 2 or lo_t.shape[0] != self.image_channels:
                raise ValueError(f"per-channel bounds must have shape ({image_channels}, 1, ...), got {tuple(lo_t.shape)}")
            code_lo, code_hi = float(lo_t.min()), float(hi_t.max())
            pad = (self.code_channels,) + tuple(lo_t.shape[1:])
            lo = torch.cat([lo_t, torch.full(pad, code_lo)])
            hi = torch.cat([hi_t, torch.full(pad, code_hi)])
        else:
            code_lo, code_hi = float(lo), float(hi)
        super().__init__(lo, hi)
        self.code_lo, self.code_hi = code_lo, code_hi

    @property
    def channels(self) -> int:
        return self.image_channels + self.code_channels

    def snap(self, code: Tensor) -> Tensor:
        """Code channels to the nearer of ``lo``/``hi`` (the projection onto the code set); a new tensor."""
        mid = 0.5 * (self.code_lo + self.code_hi)
        return torch.where(code >= mid, torch.full_like(code, self.code_hi), torch.full_like(code, self.code_lo))

    def clip(self, x: Tensor) -> Tensor:
        out = super().clip(x)
        if out.ndim < 2 or out.shape[1] != self.channels:
            return out  # not a promptable batch (check_inside refuses it at the attack's entry)
        c = self.image_channels
        return torch.cat([out[:, :c], self.snap(out[:, c:])], dim=1)

    def check_inside(self, x: Tensor, name: str = "x") -> None:
        if x.ndim < 3 or x.shape[1] != self.channels:
            raise ValueError(f"`{name}` must be (N, {self.image_channels} image + {self.code_channels} prompt-code "
                             f"channels, *spatial), got shape {tuple(x.shape)}; build it with "
                             "PromptableSegmentation.encode(image, prompts, box)")
        super().check_inside(x, name)
        code = x[:, self.image_channels:]
        if not bool(((code == self.code_lo) | (code == self.code_hi)).all()):
            raise ValueError(f"the prompt-code channels of `{name}` must hold only {self.code_lo:g} or {self.code_hi:g} "
                             "(the prompt was altered or not encoded); build `x` with PromptableSegmentation.encode")

    def describe(self) -> str:
        return f"{super().describe()} + {self.code_channels} prompt-code channel(s)"

    def fingerprint(self) -> str:
        from ..params import stable_hash

        return stable_hash({"box": super().fingerprint(), "image_channels": self.image_channels,
                            "code_channels": self.code_channels})

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __repr__(self) -> str:
        return f"PromptBox{self.describe()}"


def code_range(box: Box) -> tuple[float, float]:
    """The two values of the prompt code under ``box``: a :class:`PromptBox`'s, else the ends of a bounded box's range
    (a plain :class:`~medadv.threats.Box` over a coded ``x``, e.g. the same data rescaled to Hounsfield units)."""
    if isinstance(box, PromptBox):
        return box.code_lo, box.code_hi
    if not isinstance(box, Box) or box.bounds is None:
        raise ValueError(f"prompt codes need a bounded box (PromptableSegmentation.box(lo, hi)), got {box!r}")
    lo, hi = box.bounds
    return float(torch.as_tensor(lo).min()), float(torch.as_tensor(hi).max())


@register_task("promptable-segmentation")
class PromptableSegmentation(Segmentation):
    """Segmentation of the structure a prompt selects: ``x = [image | prompt code]``, logits ``(N, 2, *spatial)``
    (background, prompted structure), ``y`` the structure's mask ``(N, *spatial)`` in {0, 1}.

    The input layout and why the prompt cannot be attacked are in the module docstring. Metrics, losses and the
    ``fooled`` test are :class:`~medadv.tasks.Segmentation`'s with two classes: one row is one (image, prompt) pair, so
    its ``mean_dice`` (the headline) is the per-prompt Dice of the prompted structure.

    Args:
        image_channels: ``C_image``, the leading image channels of ``x``.
        prompts: the prompt kinds the code holds, any of ``"points"`` (2 channels), ``"box"`` (1), ``"class"`` (1),
            in this order.
        include_background, ignore_index, loss, dice_threshold, target_fraction, squared_pred: see
            :class:`~medadv.tasks.Segmentation`.
        jitter: how far (voxels) :meth:`draw_prompts` moves each side of a drawn box from the structure's bounding
            box (at random, inwards or outwards), as in SAM's and VISTA3D's box-prompt training.
    """

    traits = Segmentation.traits.but(
        report={"title": "promptable segmentation (points / box / class prompts, 2-D / 3-D)",
                "shapes": "x (N, C_image + C_code, *spatial) with the prompt code; logits (N, 2, *spatial); "
                          "y (N, *spatial) in {0, 1}"},
        certify={"family": None},  # smoothing would noise the prompt code too: not SegCertify's setting
        # the adapters take the model (its own support_column), but no toolkit table has a column for it: every
        # toolkit attack perturbs the prompt code, so each is refused with the reason (support_column)
        toolkits={"support_columns": {}},
    )

    def __init__(
        self,
        image_channels: int = 1,
        prompts: tuple[str, ...] = ("points",),
        include_background: bool = False,
        ignore_index: int | None = None,
        loss: str = "ce",
        dice_threshold: float = 0.5,
        target_fraction: float = 0.99,
        squared_pred: bool = False,
        jitter: int = 2,
    ) -> None:
        super().__init__(2, include_background=include_background, ignore_index=ignore_index, loss=loss,
                         dice_threshold=dice_threshold, target_fraction=target_fraction, squared_pred=squared_pred)
        owner = type(self).__name__
        # strict integers: 2.5 channels or voxels is a mistake, never a silent 2; the upper bound keeps 1e308 (an
        # integral float) from becoming a 300-digit count that fails later inside torch
        self.image_channels = Int(low=1, high=_MAX_COUNT).check(image_channels, "image_channels", owner)
        self.jitter = Int(low=0, high=_MAX_COUNT).check(jitter, "jitter", owner)
        kinds = (prompts,) if isinstance(prompts, str) else tuple(prompts) if isinstance(prompts, Sequence) else None
        if kinds is None or not kinds or any(not isinstance(k, str) or k not in PROMPT_KINDS for k in kinds) \
                or len(set(kinds)) != len(kinds):
            raise ValueError(f"`prompts` must be distinct kinds among {list(PROMPT_KINDS)}, got {prompts!r}")
        self.prompts = tuple(k for k in PROMPT_KINDS if k in kinds)  # code order

    # --- the input layout ---------------------------------------------------------------------------------------------
    @property
    def code_channels(self) -> int:
        """How many code channels follow the image channels."""
        return sum(PROMPT_KINDS[k] for k in self.prompts)

    def _offsets(self) -> dict[str, int]:
        out, at = {}, 0
        for k in self.prompts:
            out[k] = at
            at += PROMPT_KINDS[k]
        return out

    def box(self, lo: BoundValue, hi: BoundValue) -> PromptBox:
        """The :class:`PromptBox` of this layout for an image range ``[lo, hi]`` (data units)."""
        return PromptBox(lo, hi, image_channels=self.image_channels, code_channels=self.code_channels)

    def input_box(self, lo: Any, hi: Any) -> PromptBox:
        """A config's data box: the :class:`PromptBox` that pins the prompt-code channels."""
        if lo is None or hi is None:
            raise ValueError("a promptable segmentation task needs finite `threat.bounds` (the image range): the "
                             "prompt code is pinned to the range's two ends")
        return self.box(lo, hi)

    def support_column(self, spatial_dims: int | None = None) -> str:
        """This kind's own column, which no toolkit's support table has: the toolkits' attacks (ART, Foolbox,
        torchattacks through the adapters) perturb every input channel, prompt code included (even a small
        torchattacks PGD leaves code voxels between the two code values), so the adapters refuse them before any
        work and point to medadv's attacks, which hold the code."""
        return self.name

    def fixed_input_channels(self) -> int:
        """The code channels: no attack may move them (:func:`medadv.attacks.base.hold_fixed_channels`)."""
        return self.code_channels

    def image(self, x: Tensor) -> Tensor:
        """The image channels of ``x``."""
        return x[:, :self.image_channels]

    def encode(self, image: Tensor, prompts: Prompts, box: Box) -> Tensor:
        """``x = [image | code]`` (a new tensor) for ``image (N, C_image, *spatial)`` (floating point, data units)
        and ``prompts``; every kind of :attr:`prompts` must be given (``"points"``: at least one of
        positive/negative). Maps must be binary (bool, or 0/1 numbers) on the image grid; class indices integers in
        ``[0, voxels)``. Anything else is refused (``ValueError``/``TypeError``), never rounded or reshaped.

        The code voxels are exactly ``box``'s two code values in ``image``'s dtype (:func:`code_range`), so the
        result always passes ``box.check_inside`` whatever decimals the box has (an affine map
        ``m * (hi - lo) + lo`` rounds: ``0.1 + 1 * 0.6`` is ``0.70000005`` in float32, outside a box ending at 0.7).
        """
        return self._encode(image, prompts, box, trusted=False)

    def _encode(self, image: Tensor, prompts: Prompts, box: Box, *, trusted: bool) -> Tensor:
        """:meth:`encode`; ``trusted``: the class indices were made here (:meth:`draw_prompts`, in an attack's step
        loop), so their range check, one host sync, is skipped."""
        if not isinstance(image, Tensor):
            raise TypeError(f"`image` must be a torch.Tensor (N, {self.image_channels}, *spatial), got "
                            f"{type(image).__name__}")
        if not image.is_floating_point():
            raise TypeError(f"`image` must be a floating-point tensor (data units), got dtype {image.dtype}: the "
                            "prompt code's values would be rounded to integers")
        if image.ndim not in (4, 5) or image.shape[1] != self.image_channels:
            raise ValueError(f"`image` must be (N, {self.image_channels}, *spatial) with 2 or 3 spatial dims, got "
                             f"{tuple(image.shape)}")
        if not isinstance(prompts, Prompts):
            raise TypeError(f"`prompts` must be a medadv Prompts (Prompts.from_points / from_boxes), got "
                            f"{type(prompts).__name__}")
        n, spatial = image.shape[0], tuple(image.shape[2:])
        maps: list[Tensor] = []
        for k in self.prompts:
            if k == "points":
                if prompts.positive is None and prompts.negative is None:
                    raise ValueError("this task's prompts include points: give `positive` and/or `negative` clicks")
                empty = torch.zeros(n, *spatial, dtype=torch.bool, device=image.device)
                maps += [empty if m is None else _binary_map(m, f"prompts.{name}", n, spatial, image.device)
                         for m, name in ((prompts.positive, "positive"), (prompts.negative, "negative"))]
            elif k == "box":
                if prompts.box is None:
                    raise ValueError("this task's prompts include a box: give `box` (Prompts.from_boxes)")
                maps.append(_binary_map(prompts.box, "prompts.box", n, spatial, image.device))
            else:
                if prompts.classes is None:
                    raise ValueError("this task's prompts include a class index: give `classes`")
                voxels = math.prod(spatial)
                cls = _class_indices(prompts.classes, n, voxels, check=not trusted).to(image.device)
                flat = torch.zeros(n, voxels, dtype=torch.bool, device=image.device)
                maps.append(flat.scatter(1, cls.unsqueeze(1), True).reshape(n, *spatial))
        code = torch.stack(maps, dim=1)
        lo, hi = code_range(box)
        # torch.where over the two constants, not arithmetic: each code voxel is bit-for-bit the value the box
        # compares it with (see the docstring)
        code = torch.where(code, torch.full_like(code, hi, dtype=image.dtype),
                           torch.full_like(code, lo, dtype=image.dtype))
        return torch.cat([image, code], dim=1)

    def decode(self, x: Tensor, box: Box) -> Prompts:
        """The :class:`Prompts` a coded ``x`` holds (no host sync: dense maps; class indices by arg-max)."""
        lo, hi = code_range(box)
        b = x[:, self.image_channels:] >= 0.5 * (lo + hi)
        off = self._offsets()
        out = Prompts()
        if "points" in off:
            out.positive, out.negative = b[:, off["points"]], b[:, off["points"] + 1]
        if "box" in off:
            out.box = b[:, off["box"]]
        if "class" in off:
            out.classes = b[:, off["class"]].reshape(x.shape[0], -1).float().argmax(dim=1)
        return out

    def with_code(self, x: Tensor, code_x: Tensor) -> Tensor:
        """``x``'s image with the code channels of ``code_x`` (a new tensor, differentiable in ``x``'s image)."""
        c = self.image_channels
        return torch.cat([x[:, :c], code_x[:, c:].to(x.dtype)], dim=1)

    # --- random prompts (the prompt-agnostic attack, training) -----------------------------------------------------------
    def draw_prompts(self, x: Tensor, y: Tensor, k: int, box: Box,
                     generator: torch.Generator | None = None) -> Tensor:
        """``k`` random prompts per sample for the structure ``y`` marks, as coded inputs ``(k·N, C, *spatial)``
        (draw-major: row ``j·N + i`` is draw ``j`` of sample ``i``; image channels are ``x``'s).

        Points: one positive click uniform over the structure's voxels (any voxel when ``y`` is empty). Box: the
        structure's bounding box, each side moved by up to :attr:`jitter` voxels. Class: the sample's own class.
        On the device, no host sync.
        """
        n, spatial = x.shape[0], tuple(x.shape[2:])
        fg = (self.safe_labels(y) > 0).reshape(n, -1).to(x.dtype)
        xr = x.repeat(k, *([1] * (x.ndim - 1)))
        own = self.decode(x, box)
        prompts = Prompts()
        if "points" in self.prompts:
            w = fg + (fg.sum(dim=1, keepdim=True) == 0).to(fg.dtype)  # empty structure: uniform
            idx = torch.multinomial(w, k, replacement=True, generator=generator)  # (n, k)
            flat = torch.zeros(k * n, w.shape[1], dtype=torch.bool, device=x.device)
            flat = flat.scatter(1, idx.t().reshape(-1, 1), True)
            prompts.positive = flat.reshape(k * n, *spatial)
            prompts.negative = torch.zeros_like(prompts.positive)
        if "box" in self.prompts:
            prompts.box = self._jittered_boxes(fg.reshape(n, *spatial) > 0, k, generator)
        if "class" in self.prompts:
            assert own.classes is not None
            prompts.classes = own.classes.repeat(k)
        return self._encode(xr[:, :self.image_channels], prompts, box, trusted=True)

    def _jittered_boxes(self, fg: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
        n, spatial = fg.shape[0], fg.shape[1:]
        nd = len(spatial)
        starts, stops = [], []
        for d in range(nd):
            present = fg.movedim(d + 1, 1).reshape(n, spatial[d], -1).any(dim=2)  # (n, size_d)
            ar = torch.arange(spatial[d], device=fg.device)
            any_ = present.any(dim=1)
            lo = torch.where(present, ar, spatial[d]).amin(dim=1)
            hi = torch.where(present, ar, -1).amax(dim=1) + 1
            starts.append(torch.where(any_, lo, torch.zeros_like(lo)))
            stops.append(torch.where(any_, hi, torch.full_like(hi, spatial[d])))
        b = torch.stack(starts + stops, dim=1).repeat(k, 1)  # (k n, 2 nd)
        j = self.jitter
        if j:
            move = torch.randint(-j, j + 1, b.shape, generator=generator, device=fg.device)
            b = b + move
        size = torch.tensor(list(spatial) * 2, device=fg.device)
        b = torch.minimum(b.clamp_min(0), size)
        b[:, nd:] = torch.maximum(b[:, nd:], b[:, :nd] + 1).clamp(max=size[:nd])
        b[:, :nd] = torch.minimum(b[:, :nd], b[:, nd:] - 1)
        return _box_mask(b, spatial)  # valid by construction: no checks (no host sync in an attack's step loop)

    @classmethod
    def config_schema(cls) -> type:
        return super(Segmentation, cls).config_schema()  # from the signature (Task's default), not Segmentation's

    @classmethod
    def examples(cls, seed: int = 0) -> list[TaskExample]:
        """A small untrained promptable 2-D UNet (one click per prompt; a point-heatmap input channel) on a random
        image in [0, 1], and a 3-D one with a box prompt; each ``y`` is a random blob the prompt points into."""
        from .promptable_nets import PromptableUNet, Prompted

        out = []
        for key, ndim, kinds in (("promptable2d", 2, ("points",)), ("promptable3d", 3, ("points", "box"))):
            g = torch.Generator().manual_seed(seed)
            task = cls(1, kinds)
            box = task.box(0.0, 1.0)
            size = (16,) * ndim if ndim == 2 else (8,) * ndim
            image = torch.rand(3, 1, *size, generator=g)
            y = (torch.rand(3, *size, generator=g) > 0.6).long()
            y.reshape(3, -1)[:, 0] = 1  # never empty
            x = task.draw_prompts(task.encode(image, _blank(task, image), box), y, 1, box, g)
            net = PromptableUNet(1, kinds, ndim=ndim, channels=(4, 8), seed=seed)
            out.append(TaskExample(key, task, Prompted(net, task, box).eval(), x, y, box=box,
                                   target=torch.zeros_like(y), eps={"Linf": 0.1, "L2": 0.5}))
        return out

    def __repr__(self) -> str:
        return (f"PromptableSegmentation(image_channels={self.image_channels}, prompts={self.prompts!r}, "
                f"include_background={self.include_background}, ignore_index={self.ignore_index}, "
                f"loss={self.loss_name!r})")


def _blank(task: PromptableSegmentation, image: Tensor) -> Prompts:
    """Empty prompts of every kind the task's code holds (a placeholder before :meth:`draw_prompts`)."""
    n, spatial = image.shape[0], image.shape[2:]
    z = torch.zeros(n, *spatial, dtype=torch.bool, device=image.device)
    return Prompts(positive=z, negative=z, box=z, classes=torch.ones(n, dtype=torch.long, device=image.device))


def _grid(spatial: Sequence[int]) -> tuple[int, ...]:
    """The grid ``spatial`` as positive ints (2 or 3 axes)."""
    try:
        out = tuple(operator.index(s) for s in spatial)
    except TypeError:
        raise TypeError(f"`spatial` must be the grid size as 2 or 3 integers, got {spatial!r}") from None
    if len(out) not in (2, 3) or min(out) < 1:
        raise ValueError(f"`spatial` must be the grid size as 2 or 3 integers >= 1, got {spatial!r}")
    return out


def _as_index_tensor(value: Any, name: str) -> Tensor:
    """``value`` as an int64 tensor of voxel indices / labels; floats only when integral (never truncated)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor of integers, got {type(value).__name__}")
    if value.dtype == torch.bool or value.is_complex():
        raise TypeError(f"`{name}` must hold integers, got dtype {value.dtype}")
    if value.is_floating_point():
        if not bool((torch.isfinite(value) & (value == value.round())).all()):
            raise ValueError(f"`{name}` must hold integers, got non-integral or non-finite values")
        if value.numel() and float(value.abs().max()) >= 2.0 ** 53:
            raise ValueError(f"`{name}` holds values beyond 2**53 that no grid has")
    return value.long()


def _binary_map(m: Any, name: str, n: int, spatial: tuple[int, ...], device: torch.device) -> Tensor:
    """A prompt map as bool on ``device``: bool, or numbers that are all 0 or 1 (anything else is refused, not
    thresholded); shape ``(n, *spatial)``. A bool map costs no host sync (:meth:`draw_prompts` runs per step)."""
    if not isinstance(m, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor (N, *spatial) of bool, got {type(m).__name__}")
    if tuple(m.shape) != (n, *spatial):
        raise ValueError(f"`{name}` must have shape {(n, *spatial)} (the image's batch and grid), got "
                         f"{tuple(m.shape)}")
    if m.dtype != torch.bool:
        if m.is_complex() or not bool(((m == 0) | (m == 1)).all()):
            raise ValueError(f"`{name}` must be a binary map (bool, or only 0 and 1), got dtype {m.dtype} with other "
                             "values")
    return m.to(device, torch.bool)


def _class_indices(classes: Any, n: int, voxels: int, *, check: bool = True) -> Tensor:
    """``classes`` as ``(n,)`` int64 class indices in ``[0, voxels)`` (the code marks voxel ``classes[i]``)."""
    if not isinstance(classes, Tensor):
        raise TypeError(f"`prompts.classes` must be a torch.Tensor (N,) of class indices, got "
                        f"{type(classes).__name__}")
    if classes.numel() != n or classes.ndim > 1 and classes.shape[0] != n:
        raise ValueError(f"`prompts.classes` must hold one class index per sample ({n}), got shape "
                         f"{tuple(classes.shape)}")
    if not check:
        return classes.reshape(n).long()
    idx = _as_index_tensor(classes, "prompts.classes").reshape(n)
    if n and (int(idx.min()) < 0 or int(idx.max()) >= voxels):
        raise ValueError(f"`prompts.classes` must be class indices in [0, {voxels}) (the code marks one voxel of the "
                         f"{voxels}-voxel grid), got values in [{int(idx.min())}, {int(idx.max())}]")
    return idx


def _box_mask(boxes: Tensor, spatial: Sequence[int]) -> Tensor:
    """``(N, *spatial)`` bool filled boxes for ``boxes (N, 2 ndim)`` (start..., stop...; stop exclusive)."""
    nd = len(spatial)
    grids = torch.meshgrid(*[torch.arange(s, device=boxes.device) for s in spatial], indexing="ij")
    mask = torch.ones(boxes.shape[0], *spatial, dtype=torch.bool, device=boxes.device)
    view = (-1,) + (1,) * nd
    for d in range(nd):
        g = grids[d].unsqueeze(0)
        mask &= (g >= boxes[:, d].reshape(view)) & (g < boxes[:, nd + d].reshape(view))
    return mask
