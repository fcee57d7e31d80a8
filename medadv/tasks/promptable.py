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

The code is *not* part of the search set:

1. **The data box pins it.** :class:`PromptBox` is a :class:`~medadv.threats.Box` whose code channels may only hold
   the two code values ``lo``/``hi`` (the data range's ends): its ``clip`` — the last operation of every attack's
   projection (the engine's ``finalize``, APGD, Square, GAP, VAFA, DAG) — snaps each code voxel back to the nearer
   of the two. A code voxel moved by less than half the data range snaps back to its clean value, so the code of
   every iterate and of ``x_adv`` is exactly the clean one: L∞ budgets below half the data range (every budget that
   does not raise :class:`~medadv.threats.LargeBudgetWarning`) cannot change it, and the norms of ``x_adv − x``
   count image channels only.
2. **The model does not differentiate it.** :class:`~medadv.models.promptable.Prompted` (the wrapper that turns
   ``model(image, prompts)`` into ``model(x)``) detaches the code channels and decodes them by thresholding, so the
   input gradient on them is exactly zero: sign and normalised steps never move them, only a random start or a
   random search can, and (1) undoes that.
3. **Nothing is lost silently.** :meth:`PromptBox.check_inside` refuses an ``x`` whose code channels hold other
   values (every attack checks its input against the box before any work), and the code has a fixed layout
   (:meth:`PromptableSegmentation.encode` / :meth:`~PromptableSegmentation.decode`).

Prompts are therefore fixed during a fixed-prompt attack (PGD, APGD, ``auto``, ... on ``x``) and never perturbed;
the caller's tensors are never written. The prompt-agnostic attack (:mod:`medadv.attacks.prompt_agnostic`) replaces
the code channels of its own copies with prompts drawn per step (:meth:`PromptableSegmentation.draw_prompts`) and
ascends the expected loss over them.

Labels ``y`` are the mask of the prompted structure, ``(N, *spatial)`` in {0, 1}: a two-class segmentation, so
Dice, CosPGD/SegPGD weightings, DAG targets and reports are :class:`~medadv.tasks.Segmentation`'s. One result row is
one (image, prompt) pair: ``clean_mean_dice``/``adv_mean_dice`` are per-prompt Dice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..threats import BoundValue, Box
from .base import TaskExample, register_task
from .segmentation import Segmentation

__all__ = ["PromptableSegmentation", "PromptBox", "Prompts", "PROMPT_KINDS", "code_range"]

#: prompt kinds and the number of code channels each takes, in code order
PROMPT_KINDS: dict[str, int] = {"points": 2, "box": 1, "class": 1}


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
        """Clicks from coordinates: ``coords (N, P, ndim)`` voxel indices, ``labels (N, P)`` 1 positive, 0 negative,
        −1 padding (VISTA3D's convention)."""
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
        """A box per sample: ``boxes (N, 2 ndim)`` as ``(start_0, …, start_{d-1}, stop_0, …)`` voxel indices, stop
        exclusive."""
        nd = len(spatial)
        grids = torch.meshgrid(*[torch.arange(s, device=boxes.device) for s in spatial], indexing="ij")
        mask = torch.ones(boxes.shape[0], *spatial, dtype=torch.bool, device=boxes.device)
        view = (-1,) + (1,) * nd
        for d in range(nd):
            g = grids[d].unsqueeze(0)
            mask &= (g >= boxes[:, d].reshape(view)) & (g < boxes[:, nd + d].reshape(view))
        return Prompts(box=mask)

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

    title = "promptable segmentation (points / box / class prompts, 2-D / 3-D)"
    shapes = "x (N, C_image + C_code, *spatial) with the prompt code; logits (N, 2, *spatial); y (N, *spatial) in {0, 1}"

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
        if isinstance(image_channels, bool) or int(image_channels) < 1:
            raise ValueError(f"`image_channels` must be an integer >= 1, got {image_channels!r}")
        kinds = (prompts,) if isinstance(prompts, str) else tuple(prompts)
        unknown = [k for k in kinds if k not in PROMPT_KINDS]
        if not kinds or unknown or len(set(kinds)) != len(kinds):
            raise ValueError(f"`prompts` must be distinct kinds among {list(PROMPT_KINDS)}, got {prompts!r}")
        if int(jitter) < 0:
            raise ValueError(f"`jitter` must be >= 0 voxels, got {jitter}")
        self.image_channels = int(image_channels)
        self.prompts = tuple(k for k in PROMPT_KINDS if k in kinds)  # code order
        self.jitter = int(jitter)

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

    def fixed_input_channels(self) -> int:
        return self.code_channels

    def image(self, x: Tensor) -> Tensor:
        """The image channels of ``x``."""
        return x[:, :self.image_channels]

    def encode(self, image: Tensor, prompts: Prompts, box: Box) -> Tensor:
        """``x = [image | code]`` (a new tensor) for ``image (N, C_image, *spatial)`` and ``prompts``; every kind of
        :attr:`prompts` must be given (``"points"``: at least one of positive/negative)."""
        if image.ndim < 3 or image.shape[1] != self.image_channels:
            raise ValueError(f"`image` must be (N, {self.image_channels}, *spatial), got {tuple(image.shape)}")
        n, spatial = image.shape[0], image.shape[2:]
        maps: list[Tensor] = []
        for k in self.prompts:
            if k == "points":
                if prompts.positive is None and prompts.negative is None:
                    raise ValueError("this task's prompts include points: give `positive` and/or `negative` clicks")
                empty = torch.zeros(n, *spatial, dtype=torch.bool, device=image.device)
                maps += [empty if m is None else m.to(image.device, torch.bool) for m in (prompts.positive, prompts.negative)]
            elif k == "box":
                if prompts.box is None:
                    raise ValueError("this task's prompts include a box: give `box` (Prompts.from_boxes)")
                maps.append(prompts.box.to(image.device, torch.bool))
            else:
                if prompts.classes is None:
                    raise ValueError("this task's prompts include a class index: give `classes`")
                cls = prompts.classes.to(image.device).long().reshape(n)
                flat = torch.zeros(n, int(torch.tensor(spatial).prod()), dtype=torch.bool, device=image.device)
                maps.append(flat.scatter(1, cls.unsqueeze(1), True).reshape(n, *spatial))
        for m in maps:
            if tuple(m.shape) != (n, *spatial):
                raise ValueError(f"prompt maps must have shape {(n, *spatial)}, got {tuple(m.shape)}")
        code = torch.stack(maps, dim=1).to(image.dtype)
        lo, hi = code_range(box)
        code = code * (hi - lo) + lo
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
        return self.encode(xr[:, :self.image_channels], prompts, box)

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
        out = Prompts.from_boxes(b, spatial).box
        assert out is not None
        return out

    @classmethod
    def config_schema(cls) -> type:
        from ..config_schema import task_schema_from_signature

        return task_schema_from_signature(cls)

    @classmethod
    def examples(cls, seed: int = 0) -> list[TaskExample]:
        """A small untrained promptable 2-D UNet (one click per prompt; a point-heatmap input channel) on a random
        image in [0, 1], and a 3-D one with a box prompt; each ``y`` is a random blob the prompt points into."""
        from ..models.promptable import PromptableUNet, Prompted

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
