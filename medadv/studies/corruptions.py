"""Common corruptions with the flip probability (Xu et al. 2021, Robust-Benchmark) and the noise baseline at
matched SSIM (Paschali et al. 2018).

**Corruptions.** Each corruption of the suite is a MONAI transform (2-D and 3-D) with five severity levels;
every corrupted input is clipped to the data box. Each test image becomes a short sequence of ``frames``
frames, frame 0 the clean image (ImageNet-P style, as in Xu et al.'s Robust-Benchmark):

* *random* corruptions (noise, bias field, k-space spike, elastic, motion-like): frames ``1..n-1`` are
  independent draws at the severity, compared with frame 0 (ImageNet-P's rule for noise sequences);
* *ramp* corruptions (deterministic: Gibbs ringing, blur, contrast): the strength grows linearly from none
  (frame 0) to the severity (last frame), and each frame is compared with the previous one (Eq. 5).

The flip probability is ``FP = 1 / (r (n − 1)) Σ_i Σ_j 1[C(x_j) ≠ C(x_ref)]`` over the ``r`` sequences and
``n − 1`` transitions, counted per prediction element: per image (multi-class), per label (multi-label,
Xu et al.'s FP_ML) or per voxel (segmentation; spatial corruptions move the clean prediction with the same
transform, so a flip is a voxel whose prediction does not follow the anatomy). ``metric`` is the mean robust
metric on the corrupted frames (random) or on the last, full-severity frame (ramp); spatial corruptions of a
segmentation move its label map too (nearest neighbour). Random draws are seeded per (sample, frame,
corruption) and shared across severities, so the curves over severity compare like with like; MONAI's own
random state is used, never torch's global RNG.

**Noise baseline.** For every adversarial example, Gaussian (or Rician) noise with a fixed per-sample draw
``z`` is scaled by a per-sample σ found by bisection until its SSIM to the clean image equals the
adversarial example's (``match="ssim"``), or its L2 distance does (``match="l2"``); the model is then
evaluated on the noisy images. ``adv_metric`` well below ``noise_metric`` at equal SSIM is Paschali et
al.'s finding that adversarial perturbations are not merely noise.

**Xu et al.'s Robust-Benchmark** (``suite="xu2021"``, alias ``"robust_benchmark"``): the paper's 14 sequences for
2-D images — gaussian / shot / speckle noise (random, compared with the clean frame, ImageNet-P's rule), gaussian
blur (``blur``), motion blur, zoom blur, snow, spatter, brightness, translate, rotate, tilt, scale and shear (ramps,
each frame compared with the previous). The ones MONAI lacks are batched torch on the data's device
(:mod:`.robust_benchmark`). Xu et al.'s code has one severity and 10 frames whose parameters sweep a range
(rotate ``i − 15`` degrees, translate ``i − 20`` pixels of 224, brightness ``+0.02`` per frame, ...); here each
sequence ramps from the clean image to the severity's level, and severity 3 spans about the code's range (the
paper's "five levels" are not given; spec 000 ambiguity A27). Motion blur, snow, spatter and tilt are 2-D only and
refuse volumes; the others also run on volumes (rotation and shear in the axial plane of the last two axes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict, field_validator
from pydantic_core import PydanticCustomError
from torch import Tensor, nn

from ..metrics.image import ssim
from ..params import closest
from ..report.blocks import (
    Cell,
    Section,
    StudyLike,
    Table,
    bars,
    curve,
    data_table,
    escape,
    figure_image,
    grid,
    group_rows,
    is_nan,
    legend_top,
    mean_of,
    pyplot,
    raw_table,
    setting_key,
    study_metric,
    style_axes,
    value_cell,
)
from ..tasks import Task
from ..threats import Bounds, Box
from . import robust_benchmark as rb
from ._common import (
    AttackSpec,
    TargetFn,
    attacked_batches,
    batches,
    check_model,
    check_task,
    forward,
    mean,
    named_attacks,
    robust_metric,
)
from .base import StudyResult
from .registry import Int, Number, StudySpec, data_box, one_model, pick_models, register_study, unknown_option

__all__ = ["Corruption", "SUITE", "XU2021", "CORRUPTIONS", "SUITES", "corruption_suite", "corruptions", "noise_baseline",
           "sequence_flips", "relative_flip_probability"]

# mean voxel displacement per unit of MONAI's elastic ``magnitude`` (measured on MONAI 1.6: control-point
# spacing max(4, size/4) in 2-D, Gaussian σ = 3 voxels in 3-D), so that severity levels read in voxels
_ELASTIC_GAIN = {2: 1.2, 3: 0.026}


@dataclass(frozen=True)
class Corruption:
    """One corruption: a MONAI dictionary transform built for a strength ``param``, or a batched torch function.

    Attributes:
        name: its name in the rows.
        levels: the parameter at severities 1..5 (units in ``unit``).
        kind: ``"random"`` (independent draws per frame, compared with frame 0) or ``"ramp"`` (strength grows over
            the frames from ``identity`` to the level, each frame compared with the previous; any random layer
            (snow flakes, spatter drops, a blur's angle) is drawn once per sample and kept over the frames).
        spatial: moves the anatomy (segmentation label maps and the clean prediction move with it).
        identity: the parameter value that leaves the image unchanged (start of a ramp).
        unit: what ``levels`` measure, and how they map to the data box.
        build: ``build(param, ndim, data_range, spatial_shape, keys, nearest_keys)`` -> a MONAI dict transform
            (applied sample by sample on the CPU).
        apply: ``apply(x, param, ctx)`` -> the corrupted batch, on ``x``'s device
            (:class:`~medadv.studies.robust_benchmark.FrameContext`); give ``build`` or ``apply``.
        ndims: the spatial ranks it is defined for (2: images, 3: volumes); others are refused.
        instead: what to use where it refuses a rank (in the error).
    """

    name: str
    levels: tuple[float, ...]
    kind: str
    spatial: bool
    identity: float
    unit: str
    build: Callable[..., Any] | None = None
    apply: Callable[[Tensor, float, rb.FrameContext], Tensor] | None = None
    ndims: tuple[int, ...] = (2, 3)
    instead: str = ""

    def __post_init__(self) -> None:
        if (self.build is None) == (self.apply is None):
            raise ValueError(f"corruption {self.name!r}: give exactly one of `build` (a MONAI transform) and `apply` "
                             "(a batched function)")
        if self.kind not in ("random", "ramp"):
            raise ValueError(f"corruption {self.name!r}: `kind` must be 'random' or 'ramp', got {self.kind!r}")
        if len(self.levels) != 5:
            raise ValueError(f"corruption {self.name!r}: `levels` needs 5 values (severities 1..5), got "
                             f"{len(self.levels)}")

    def check_rank(self, x: Tensor) -> None:
        """``ValueError`` when the corruption is not defined for ``x``'s spatial rank."""
        nd = x.ndim - 2
        if nd not in self.ndims:
            kinds = " and ".join({2: "2-D images", 3: "3-D volumes"}.get(d, f"{d}-D data") for d in self.ndims)
            raise ValueError(f"corruption {self.name!r} is defined for {kinds} only, got data with {nd} spatial axes"
                             + (f": {self.instead}" if self.instead else ""))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "levels": list(self.levels), "kind": self.kind, "spatial": self.spatial,
                "unit": self.unit, "ndims": list(self.ndims)}


def _gaussian(p: float, nd: int, rng: float, shape: Sequence[int], keys: list[str], near: list[str]) -> Any:
    from monai.transforms import RandGaussianNoised

    return RandGaussianNoised(["image"], prob=1.0, std=p * rng, sample_std=False)


def _rician(p: float, nd: int, rng: float, shape: Sequence[int], keys: list[str], near: list[str]) -> Any:
    from monai.transforms import RandRicianNoised

    return RandRicianNoised(["image"], prob=1.0, std=p * rng, sample_std=False)


def _bias(p: float, nd: int, rng: float, shape: Sequence[int], keys: list[str], near: list[str]) -> Any:
    from monai.transforms import RandBiasFieldd

    return RandBiasFieldd(["image"], degree=3, coeff_range=(-p, p), prob=1.0)


def _gibbs(p: float, nd: int, rng: float, shape: Sequence[int], keys: list[str], near: list[str]) -> Any:
    from monai.transforms import GibbsNoised

    return GibbsNoised(["image"], alpha=p)


def _spike(p: float, nd: int, rng: float, shape: Sequence[int], keys: list[str], near: list[str]) -> Any:
    from monai.transforms import RandKSpaceSpikeNoised

    # MONAI sets the log-magnitude of one k-space coefficient; a coefficient of magnitude A adds a grating of
    # amplitude A / (number of voxels) after the inverse FFT, so this is a grating of p · data range
    intensity = math.log(max(p * rng * math.prod(shape), 1e-12))
    return RandKSpaceSpikeNoised(["image"], prob=1.0, intensity_range=(intensity, intensity), channel_wise=False)


def _blur(p: float, nd: int, rng: float, shape: Sequence[int], keys: list[str], near: list[str]) -> Any:
    from monai.transforms import GaussianSmoothd

    return GaussianSmoothd(["image"], sigma=p)


def _contrast(p: float, nd: int, rng: float, shape: Sequence[int], keys: list[str], near: list[str]) -> Any:
    from monai.transforms import AdjustContrastd

    return AdjustContrastd(["image"], gamma=p)


def _modes(keys: list[str], near: list[str]) -> list[str]:
    return ["nearest" if k in near else "bilinear" for k in keys]


def _elastic(p: float, nd: int, rng: float, shape: Sequence[int], keys: list[str], near: list[str]) -> Any:
    from monai.transforms import Rand2DElasticd, Rand3DElasticd

    magnitude = p / _ELASTIC_GAIN[nd]
    if nd == 2:
        return Rand2DElasticd(keys, spacing=max(4, min(shape) // 4), magnitude_range=(magnitude, magnitude),
                              prob=1.0, mode=_modes(keys, near), padding_mode="border")
    return Rand3DElasticd(keys, sigma_range=(3.0, 3.0), magnitude_range=(magnitude, magnitude), prob=1.0,
                          mode=_modes(keys, near), padding_mode="border")


def _motion(p: float, nd: int, rng: float, shape: Sequence[int], keys: list[str], near: list[str]) -> Any:
    from monai.transforms import RandAffined

    # rigid patient movement: rotation up to p degrees about every axis and translation up to p/2 voxels
    rot = math.radians(p)
    return RandAffined(keys, prob=1.0, rotate_range=(rot,) * (1 if nd == 2 else 3), translate_range=(p / 2,) * nd,
                       mode=_modes(keys, near), padding_mode="border")


#: the default suite (MONAI 1.6 transforms); severities 1..5 index ``levels``
SUITE: tuple[Corruption, ...] = (
    Corruption("gaussian_noise", (0.02, 0.04, 0.06, 0.08, 0.10), "random", False, 0.0,
               "noise std, fraction of the data range (RandGaussianNoise)", _gaussian),
    Corruption("rician_noise", (0.02, 0.04, 0.06, 0.08, 0.10), "random", False, 0.0,
               "noise std, fraction of the data range (RandRicianNoise)", _rician),
    Corruption("bias_field", (0.1, 0.2, 0.3, 0.4, 0.5), "random", False, 0.0,
               "largest Legendre coefficient of the log bias field, degree 3 (RandBiasField)", _bias),
    Corruption("kspace_spike", (0.02, 0.04, 0.06, 0.08, 0.10), "random", False, 0.0,
               "amplitude of the spike's grating, fraction of the data range (RandKSpaceSpikeNoise)", _spike),
    Corruption("gibbs", (0.2, 0.35, 0.5, 0.65, 0.8), "ramp", False, 0.0,
               "fraction of k-space truncated (GibbsNoise alpha)", _gibbs),
    Corruption("blur", (0.5, 0.75, 1.0, 1.25, 1.5), "ramp", False, 0.0,
               "Gaussian sigma in voxels (GaussianSmooth)", _blur),
    Corruption("contrast", (1.2, 1.4, 1.7, 2.0, 2.5), "ramp", False, 1.0,
               "gamma on the min-max normalised image (AdjustContrast)", _contrast),
    Corruption("elastic", (0.5, 0.75, 1.0, 1.5, 2.0), "random", True, 0.0,
               "mean displacement in voxels (Rand2DElastic / Rand3DElastic)", _elastic),
    Corruption("motion", (1.0, 2.0, 3.0, 4.0, 6.0), "random", True, 0.0,
               "rigid motion: rotation up to this many degrees, translation up to half as many voxels (RandAffine)",
               _motion),
)


_BOX = "in box units u = (x - lo) / (hi - lo), clipped to the box"
_FILL = "what comes into view is filled with the box's lower bound"

#: the corruptions of Xu et al.'s Robust-Benchmark that MONAI lacks (batched torch, :mod:`.robust_benchmark`); the
#: paper's gaussian noise and gaussian blur are ``gaussian_noise`` and ``blur`` of :data:`SUITE`
_XU_EXTRA: tuple[Corruption, ...] = (
    Corruption("shot_noise", (600.0, 300.0, 150.0, 75.0, 40.0), "random", False, math.inf,
               f"photons per unit data range, Poisson(u·λ)/λ {_BOX} (ImageNet-P: 300)", apply=rb.shot_noise),
    Corruption("speckle_noise", (0.05, 0.1, 0.15, 0.25, 0.35), "random", False, 0.0,
               f"std of the multiplicative noise u + u·N(0, σ²) {_BOX} (ImageNet-P: 0.05)", apply=rb.speckle_noise),
    Corruption("motion_blur", (1.0, 2.0, 3.0, 4.0, 6.0), "ramp", False, 0.0,
               "σ in pixels of a one-sided Gaussian motion blur, at a seeded angle U(-45°, 45°) per sample "
               "(Xu: σ = 3 px)", apply=rb.motion_blur, ndims=(2,),
               instead="use `motion` (rigid patient motion) or `blur` for volumes"),
    Corruption("zoom_blur", (1.02, 1.04, 1.06, 1.09, 1.12), "ramp", False, 1.0,
               "largest zoom factor averaged about the centre, steps of 0.005 (MONAI Affine; ImageNet-P: "
               "1 + 0.004 per frame)", apply=rb.zoom_blur),
    Corruption("snow", (0.1, 0.2, 0.3, 0.4, 0.5), "ramp", False, 0.0,
               f"snow strength s: whitening weight s and flake opacity 2s, ImageNet-C snow in grayscale {_BOX}",
               apply=rb.snow, ndims=(2,), instead="snow is a 2-D camera effect"),
    Corruption("spatter", (0.02, 0.04, 0.06, 0.09, 0.12), "ramp", False, 0.0,
               f"fraction of the image wet, drops blended towards 0.86 of the range at opacity 0.6 (ImageNet-C "
               f"water spatter in grayscale) {_BOX}", apply=rb.spatter, ndims=(2,),
               instead="spatter is a 2-D camera effect"),
    Corruption("brightness", (0.06, 0.12, 0.18, 0.24, 0.3), "ramp", False, 0.0,
               f"shift, fraction of the data range, u + shift {_BOX} (Xu: 0.02 per frame, 0.18 over 10 frames)",
               apply=rb.brightness),
    Corruption("translate", (0.02, 0.03, 0.04, 0.06, 0.08), "ramp", True, 0.0,
               f"shift along the last axis, fraction of its size (MONAI Affine; Xu: 9 px of 224 = 0.04); {_FILL}",
               apply=rb.translate),
    Corruption("rotate", (3.0, 6.0, 9.0, 12.0, 15.0), "ramp", True, 0.0,
               f"rotation in degrees, volumes in the plane of the last two axes (MONAI Affine; Xu: 9° over 10 "
               f"frames); {_FILL}", apply=rb.rotate),
    Corruption("tilt", (3.0, 6.0, 9.0, 12.0, 15.0), "ramp", True, 0.0,
               f"perspective tilt φ = θ in degrees, focal length √(H² + W²) (ImageNet-P); {_FILL}",
               apply=rb.tilt, ndims=(2,), instead="use `rotate` or `shear` for volumes"),
    Corruption("scale", (0.95, 0.9, 0.85, 0.8, 0.75), "ramp", True, 1.0,
               f"scale factor of the content about the centre (MONAI Affine; Xu: 0.4 → 0.625 over 10 frames); "
               f"{_FILL}", apply=rb.scale),
    Corruption("shear", (3.0, 6.0, 9.0, 12.0, 15.0), "ramp", True, 0.0,
               f"shear angle in degrees, volumes within each axial slice (MONAI Affine; Xu: 9° over 10 frames); "
               f"{_FILL}", apply=rb.shear),
)

#: every corruption by name: :data:`SUITE` (MONAI, MRI/CT-minded, 2-D and 3-D) and Xu et al.'s extra ones
CORRUPTIONS: dict[str, Corruption] = {c.name: c for c in (*SUITE, *_XU_EXTRA)}

#: Xu et al.'s 14 Robust-Benchmark sequences, in the paper's order (its gaussian blur is ``blur``)
XU2021: tuple[str, ...] = ("brightness", "blur", "gaussian_noise", "motion_blur", "rotate", "scale", "shear",
                           "shot_noise", "snow", "spatter", "speckle_noise", "tilt", "translate", "zoom_blur")

#: named suites for ``suite=``
SUITES: dict[str, tuple[str, ...]] = {"default": tuple(c.name for c in SUITE), "xu2021": XU2021,
                                      "robust_benchmark": XU2021, "all": tuple(CORRUPTIONS)}

#: other names of a corruption (the paper's)
ALIASES = {"gaussian_blur": "blur"}


def corruption_suite(names: str | Sequence[str | Corruption] | None = None) -> list[Corruption]:
    """The corruptions named: a suite name of :data:`SUITES` (``"xu2021"``: Xu et al.'s 14), a list of names of
    :data:`CORRUPTIONS` (or :class:`Corruption` objects, which pass through), or ``None``: :data:`SUITE`."""
    if names is None:
        return list(SUITE)
    if isinstance(names, str):
        if names not in SUITES:
            from ..params import closest

            c = closest(names, list(SUITES) + list(CORRUPTIONS))
            raise ValueError(f"unknown corruption suite {names!r}{f'; did you mean {c!r}?' if c else ''} "
                             f"(suites: {', '.join(SUITES)}; or give a list of corruption names)")
        names = list(SUITES[names])
    out = []
    for n in names:
        if isinstance(n, Corruption):
            out.append(n)
        elif ALIASES.get(str(n), str(n)) in CORRUPTIONS:
            out.append(CORRUPTIONS[ALIASES.get(str(n), str(n))])
        else:
            from ..params import closest

            c = closest(str(n), list(CORRUPTIONS))
            raise ValueError(f"unknown corruption {n!r}{f'; did you mean {c!r}?' if c else ''} "
                             f"(known: {', '.join(CORRUPTIONS)})")
    return out


def _apply(corr: Corruption, param: float, x: Tensor, extras: dict[str, Tensor], seeds: Sequence[int],
           data_range: float, box: Box) -> tuple[Tensor, dict[str, Tensor]]:
    """Corrupt each sample of ``x`` (and move the label-like ``extras`` for spatial corruptions)."""
    corr.check_rank(x)
    if corr.apply is not None:
        return _apply_batched(corr, param, x, extras, seeds, data_range, box)
    assert corr.build is not None
    nd = x.ndim - 2
    keys = ["image", *extras] if corr.spatial else ["image"]
    near = list(extras) if corr.spatial else []
    transform = corr.build(param, nd, data_range, tuple(x.shape[2:]), keys, near)
    imgs: list[Tensor] = []
    moved: dict[str, list[Tensor]] = {k: [] for k in extras}
    for i in range(x.shape[0]):
        if hasattr(transform, "set_random_state"):
            transform.set_random_state(seed=int(seeds[i]))
        sample: dict[str, Any] = {"image": x[i].detach().cpu().float()}
        for k, v in extras.items():  # label maps as channel-first floats, moved by nearest neighbour
            sample[k] = v[i].detach().cpu().float().unsqueeze(0)
        out = transform(sample)
        imgs.append(torch.as_tensor(out["image"]).as_subclass(Tensor).to(x.dtype))
        for k in extras:
            src = out[k] if corr.spatial else sample[k]
            moved[k].append(torch.as_tensor(src).as_subclass(Tensor)[0].round().long())
    xc = box.clip(torch.stack(imgs).to(x.device))
    return xc, {k: torch.stack(v) for k, v in moved.items()}


def _apply_batched(corr: Corruption, param: float, x: Tensor, extras: dict[str, Tensor], seeds: Sequence[int],
                   data_range: float, box: Box) -> tuple[Tensor, dict[str, Tensor]]:
    """A batched corruption on ``x``'s device: the image in box units, label maps moved by nearest neighbour."""
    assert corr.apply is not None
    xf = x if x.is_floating_point() else x.float()
    lo: Tensor | float = box.lohi(xf)[0] if box.bounded else xf.detach().amin()
    ctx = rb.FrameContext(tuple(int(s) for s in seeds), lo, float(data_range))
    out = corr.apply(xf.detach(), float(param), ctx).to(x.dtype)
    moved: dict[str, Tensor] = {}
    for k, v in extras.items():
        if corr.spatial:
            lab = corr.apply(v.detach().unsqueeze(1).to(xf.dtype), float(param), replace(ctx, lo=0.0, label=True))
            moved[k] = lab[:, 0].round().long()
        else:
            moved[k] = v
    return box.clip(out), moved


def sequence_flips(preds: Sequence[Tensor], refs: Sequence[Tensor], mask: Tensor | None = None) -> tuple[float, int]:
    """``(flips, count)``: prediction elements of frame ``j`` that differ from ``refs[j]``, summed over frames.

    ``preds`` and ``refs`` are lists of equally shaped prediction tensors (one per transition); ``mask`` (bool,
    same shape) keeps only the elements that count (segmentation ``ignore_index``).
    """
    flips, count = 0.0, 0
    for p, r in zip(preds, refs, strict=True):
        diff = (p != r)
        if mask is not None:
            diff = diff & mask
            count += int(mask.sum())
        else:
            count += diff.numel()
        flips += float(diff.sum())
    return flips, count


def _seeds(seed: int, corruption: int, frame: int, first: int, n: int) -> list[int]:
    # shared across severities (common random numbers); distinct per sample, frame and corruption
    return [(seed * 7919 + corruption * 104729 + frame * 1299709 + first + i) % (2**32) for i in range(n)]


def corruptions(
    model: nn.Module,
    task: Task,
    data: Any,
    *,
    bounds: Box | Bounds | None,
    severities: Sequence[int] = range(1, 6),
    suite: str | Sequence[str | Corruption] | None = None,
    frames: int = 5,
    seed: int = 0,
) -> StudyResult:
    """Corruption robustness at five severities with the flip probability (Xu et al. 2021).

    Args:
        model: the model (mode and parameters are left as they were).
        task: how to read its output.
        data: an ``(x, y)`` pair or an iterable of ``(x, y)`` batches; images ``(N, C, H, W)`` or volumes
            ``(N, C, D, H, W)``.
        bounds: the data box (a :class:`~medadv.threats.Box` or ``(lo, hi)`` in data units); corrupted images are
            clipped to it and intensity levels are fractions of its range. ``None``: unbounded (no clipping; the
            range of each batch).
        severities: which of the levels 1..5 to run.
        suite: a suite name (``"xu2021"``: Xu et al.'s 14 Robust-Benchmark sequences; ``"default"``; ``"all"``),
            or corruption names from :data:`CORRUPTIONS` or :class:`Corruption` objects (default: :data:`SUITE`,
            the MONAI corruptions for 2-D and 3-D data). A corruption not defined for the data's rank (snow on a
            volume) is refused before anything runs.
        frames: frames per sequence, frame 0 clean (>= 2).
        seed: seed of the random corruptions (per sample and frame; a ramp's random layer per sample).

    Returns:
        ``StudyResult("corruptions")``: rows ``{corruption, severity, param, kind, metric_clean, metric,
        flip_probability}``, ``metric*`` the task's robust metric (``meta["metric"]``).
    """
    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
    box = Box.coerce(bounds)
    if box.bounds is not None:
        box.data_range()  # one data range (per-channel boxes of different widths have none): refused before any work
    corrs = corruption_suite(suite)
    sev = [int(s) for s in severities]
    if any(s < 1 or s > 5 for s in sev) or not sev:
        raise ValueError(f"`severities` must be levels in 1..5, got {list(severities)}")
    if int(frames) < 2:
        raise ValueError(f"`frames` must be >= 2 (frame 0 is the clean image), got {frames}")
    frames = int(frames)
    # (corruption, severity) -> [metric sum, metric count, flip sum, flip count]
    acc = {(c.name, s): [0.0, 0, 0.0, 0] for c in corrs for s in sev}
    clean_sum, clean_n, first = 0.0, 0, 0
    seg = task.spatial_labels  # label maps move with a spatial corruption
    for x, y in batches(data):
        logits0 = forward(model, x)
        y = y.to(logits0.device)
        task.validate(logits0, y, "y")
        pred0 = task.predict(logits0)
        m0 = robust_metric(task, logits0, y)
        clean_sum, clean_n = clean_sum + float(m0.sum()), clean_n + m0.numel()
        for corr in corrs:
            corr.check_rank(x)
        data_range = box.data_range(x)
        for ci, corr in enumerate(corrs):
            extras = {"label": y, "ref": pred0} if seg and corr.spatial else {}
            for s in sev:
                level = corr.levels[s - 1]
                entry = acc[(corr.name, s)]
                prev = pred0
                for j in range(1, frames):
                    if corr.kind == "ramp":
                        param = corr.identity + (level - corr.identity) * j / (frames - 1)
                    else:
                        param = level
                    xc, moved = _apply(corr, param, x, extras, _seeds(seed, ci, j if corr.kind == "random" else 0, first, x.shape[0]),
                                       data_range, box)
                    logits = forward(model, xc)
                    yj = moved.get("label", y).to(logits.device)
                    pred = task.predict(logits)
                    ref = moved["ref"].to(pred.device) if "ref" in moved else (prev if corr.kind == "ramp" else pred0)
                    mask = task.valid_mask(yj)
                    f, n = sequence_flips([pred], [ref], mask)
                    entry[2] += f
                    entry[3] += n
                    if corr.kind == "random" or j == frames - 1:
                        m = robust_metric(task, logits, yj)
                        entry[0] += float(m.sum())
                        entry[1] += m.numel()
                    prev = pred
        first += x.shape[0]
    if clean_n == 0:
        raise ValueError("`data` is empty")
    rows = []
    for corr in corrs:
        for s in sev:
            msum, mn, fsum, fn = acc[(corr.name, s)]
            rows.append({"corruption": corr.name, "severity": s, "param": corr.levels[s - 1], "kind": corr.kind,
                         "metric_clean": clean_sum / clean_n, "metric": msum / mn if mn else None,
                         "flip_probability": fsum / fn if fn else None})
    meta = {"metric": task.robust_metric_name, "frames": frames, "seed": seed, "bounds": box.describe(),
            "suite": [c.describe() for c in corrs]}
    return StudyResult("corruptions", rows, meta)


# --- noise at matched SSIM / L2 -----------------------------------------------------------------------------------
def _noisy(x: Tensor, z: Tensor, sigma: Tensor, noise: str, box: Box) -> Tensor:
    s = sigma.reshape(-1, *([1] * (x.ndim - 1)))
    if noise == "gaussian":
        out = x + s * z[0]
    else:  # Rician magnitude: sqrt((x + n1)^2 + n2^2)
        out = torch.sqrt((x + s * z[0]) ** 2 + (s * z[1]) ** 2)
    return box.clip(out)


def _win(x: Tensor) -> int:
    w = min(11, min(x.shape[2:]))
    return w if w % 2 == 1 else w - 1


def match_noise(x: Tensor, target: Tensor, *, box: Box, match: str = "ssim", noise: str = "gaussian",
                generator: torch.Generator | None = None, iters: int = 40) -> tuple[Tensor, Tensor]:
    """Per-sample noise whose SSIM (or L2 distance) to ``x`` equals ``target`` ``(N,)``, by bisection on σ.

    Returns ``(x_noisy, sigma)``. SSIM is :func:`medadv.metrics.image.ssim` (Gaussian window of at most 11
    voxels, ``data_range`` of the box); the noise draw ``z`` is fixed per sample, only its scale σ changes.
    """
    if match not in ("ssim", "l2"):
        raise ValueError(f"`match` must be 'ssim' or 'l2', got {match!r}")
    if noise not in ("gaussian", "rician"):
        raise ValueError(f"`noise` must be 'gaussian' or 'rician', got {noise!r}")
    rng = box.data_range(x)
    z = torch.randn((2, *x.shape), generator=generator, dtype=x.dtype, device="cpu").to(x.device)
    win = _win(x)

    def measure(sigma: Tensor) -> Tensor:
        xn = _noisy(x, z, sigma, noise, box)
        if match == "ssim":
            return ssim(x, xn, data_range=rng, win_size=win)
        return (xn - x).reshape(x.shape[0], -1).norm(dim=1)

    # SSIM falls and L2 grows with σ: find an upper bracket, then bisect
    lo = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    hi = torch.full_like(lo, rng)
    beyond = (lambda v: v <= target) if match == "ssim" else (lambda v: v >= target)
    for _ in range(20):
        ok = beyond(measure(hi))
        if bool(ok.all()):
            break
        hi = torch.where(ok, hi, hi * 2)
    for _ in range(iters):
        mid = (lo + hi) / 2
        ok = beyond(measure(mid))
        hi, lo = torch.where(ok, mid, hi), torch.where(ok, lo, mid)
    sigma = (lo + hi) / 2
    return _noisy(x, z, sigma, noise, box), sigma


def noise_baseline(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    match: str = "ssim",
    noise: str = "gaussian",
    seed: int = 0,
    target_fn: TargetFn | None = None,
) -> StudyResult:
    """Adversarial vs random noise at the same SSIM (or L2) per example (Paschali et al. 2018).

    Args:
        model, task, data, attacks: as for ``evaluate``.
        match: ``"ssim"`` (Paschali et al.) or ``"l2"``: the quantity the noise matches, per example.
        noise: ``"gaussian"`` (images) or ``"rician"`` (MRI magnitude).
        seed: seed of the noise draws (a private generator; torch's global RNG is not touched).
        target_fn: for targeted attacks, as in ``evaluate``.

    Returns:
        ``StudyResult("noise_baseline")``: rows ``{attack, budget, clean_metric, adv_metric, noise_metric,
        ssim_adv, ssim_noise, l2_adv, l2_noise, sigma}`` (means over the samples; metric = the task's robust
        metric, ``meta["metric"]``).
    """
    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the noise baseline matches each attack's examples")
    for _, atk in named:  # the SSIM needs one data range: a box without one is refused before any work
        if atk.box.bounds is not None:
            atk.box.data_range()
    gen = torch.Generator().manual_seed(int(seed))
    cols = ("clean_metric", "adv_metric", "noise_metric", "ssim_adv", "ssim_noise", "l2_adv", "l2_noise", "sigma")
    acc: dict[int, dict[str, list[Tensor]]] = {i: {c: [] for c in cols} for i in range(len(named))}
    for batch in attacked_batches(model, task, data, named, target_fn):
        x, y = batch.x, batch.y
        m_clean = robust_metric(task, batch.clean_logits, y)
        for i, att in enumerate(batch.attacked):
            box = att.attack.box
            rng, win = box.data_range(x), _win(x)
            x_adv = att.result.x_adv.to(x.device)
            s_adv = ssim(x, x_adv, data_range=rng, win_size=win)
            l2_adv = (x_adv - x).reshape(x.shape[0], -1).norm(dim=1)
            x_noise, sigma = match_noise(x, s_adv if match == "ssim" else l2_adv, box=box, match=match,
                                         noise=noise, generator=gen)
            logits_noise = forward(model, x_noise)
            a = acc[i]
            a["clean_metric"].append(m_clean)
            a["adv_metric"].append(robust_metric(task, att.result.logits, y))
            a["noise_metric"].append(robust_metric(task, logits_noise, y))
            a["ssim_adv"].append(s_adv.detach().double().cpu())
            a["ssim_noise"].append(ssim(x, x_noise, data_range=rng, win_size=win).detach().double().cpu())
            a["l2_adv"].append(l2_adv.detach().double().cpu())
            a["l2_noise"].append((x_noise - x).reshape(x.shape[0], -1).norm(dim=1).detach().double().cpu())
            a["sigma"].append(sigma.detach().double().cpu())
    rows = []
    for i, (name, atk) in enumerate(named):
        if not acc[i]["adv_metric"]:
            raise ValueError("`data` is empty")
        rows.append({"attack": name, "budget": atk.budget,
                     **{c: mean(torch.cat(acc[i][c])) for c in cols}})
    return StudyResult("noise_baseline", rows, {"metric": task.robust_metric_name, "match": match, "noise": noise,
                                                "seed": seed})


def relative_flip_probability(results: Mapping[str, StudyResult]) -> list[dict[str, Any]]:
    """Xu et al.'s relative flip probability (Table 4): each model's flip probability averaged over every
    corruption and severity of its study, divided by that of the first (reference) model.

    Rows ``{model, flip_probability, rfp}`` (``rfp`` ``None`` when the reference never flips)."""
    means: dict[str, float | None] = {}
    for name, r in results.items():
        fps = [float(row["flip_probability"]) for row in r.rows if row.get("flip_probability") is not None]
        means[name] = sum(fps) / len(fps) if fps else None
    ref = next(iter(means.values()), None)
    return [{"model": n, "flip_probability": fp,
             "rfp": fp / ref if fp is not None and ref not in (None, 0.0) else None} for n, fp in means.items()]


# --- the report section -------------------------------------------------------------------------------------------
def _model_table(study: StudyLike) -> Table | None:
    """Xu et al.'s Table 3: each corruption's flip probability per model, averaged over the severities run, and
    the mean over the corruptions (``None`` for rows of one model)."""
    names = list(dict.fromkeys(str(r["model"]) for r in study.rows if r.get("model") is not None))
    if len(names) < 2:
        return None
    groups = group_rows(study.rows, ["corruption", "model"])
    corrs = list(dict.fromkeys(str(r.get("corruption")) for r in study.rows))
    cells = [[mean_of(r.get("flip_probability") for r in groups.get((c, m), [])) for m in names] for c in corrs]
    means = [mean_of(row[j] for row in cells) for j in range(len(names))]
    body = [[Cell(c), *(value_cell("fp", v) for v in row)] for c, row in zip(corrs, cells, strict=True)]
    body.append([Cell("mean of all", "headline"), *(Cell(value_cell("fp", v).text, "num headline") for v in means)])
    # a Table of Cells, not data_table: model names are headers as written, whatever they are
    return Table([Cell("corruption"), *(Cell(m, title=f"flip probability of {m}") for m in names)], body,
                 "Flip probability per corruption and model, averaged over the severities run; the last row is the "
                 "mean over the corruptions (Xu et al., Table 3).")


def _draw_corruptions(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = study_metric(study)
    ref = study.meta.get("reference") if isinstance(study.meta, Mapping) else None
    # with several models the curves and the per-corruption table are the reference model's (Table 3 has all)
    own = [r for r in study.rows if ref is None or r.get("model") in (None, ref)]
    groups = group_rows(own, ["corruption"])
    has_flip = any(not is_nan(r.get("flip_probability")) for r in own)
    fig, axes = grid(1 + has_flip, 2, 5.4, 3.8)
    clean = mean_of(r.get("metric_clean") for r in own)
    for i, ((name,), rows) in enumerate(groups.items()):
        rows = sorted(rows, key=lambda r: float(r["severity"]))
        # colour, marker and line style all vary, so that 9+ corruptions stay apart
        severities = [r["severity"] for r in rows]
        curve(axes[0], severities, [r.get("metric") for r in rows], i, name)
        if has_flip:
            curve(axes[1], severities, [r.get("flip_probability") for r in rows], i, name)
    if not is_nan(clean):
        axes[0].axhline(clean, color="grey", ls=":", lw=1.2, label="clean")
    whose = f" ({ref})" if ref is not None else ""
    style_axes(axes[0], "severity", metric, f"{metric} vs corruption severity{whose}")
    if has_flip:
        style_axes(axes[1], "severity", "flip probability", f"flip probability vs severity{whose}")
        axes[1].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xticks(sorted({int(r["severity"]) for r in own}))
    fig.set_figheight(fig.get_figheight() + 0.25 * math.ceil((len(groups) + 1) / 5))
    legend_top(fig, axes[0], 5)
    blocks: list[Any] = [figure_image(fig, "corruption curves: metric and flip probability vs severity")]
    if has_flip:  # Xu et al. report the FP per type and their mean
        units = {str(c.get("name")): str(c.get("unit", "")) for c in study.meta.get("suite") or []
                 if isinstance(c, Mapping)}
        per = [{"corruption": name, "mean flip probability": mean_of(r.get("flip_probability") for r in rows),
                f"mean {metric}": mean_of(r.get("metric") for r in rows), "level unit": units.get(str(name), "")}
               for (name,), rows in groups.items()]
        per.append({"corruption": "mean of all", "mean flip probability": mean_of(r["mean flip probability"] for r in per),
                    f"mean {metric}": mean_of(r[f"mean {metric}"] for r in per), "level unit": ""})
        blocks.append(data_table(per, list(per[0]), "Flip probability and metric averaged over the severities run"
                                 + (f", model {ref}." if ref is not None else ".")))
    table3 = _model_table(study)
    if table3 is not None:
        blocks.append(table3)
    rfp = study.meta.get("rfp") if isinstance(study.meta, Mapping) else None
    if rfp:  # Xu et al.'s Table 4: each model's flip probability relative to the first model's
        blocks.append(data_table(rfp, ["model", "flip_probability", "rfp"],
                                 f"Relative flip probability: each model's mean flip probability over every corruption "
                                 f"and severity, divided by that of {rfp[0]['model']} (Xu et al., Table 4)."))
    blocks.append(raw_table(study.rows, "all rows of the corruption study"))
    return Section("study-corruptions", "Common corruptions (Xu et al.)",
                   "Natural image degradations at five severities. The flip probability is the share of samples "
                   "whose prediction the corruption changes.", blocks)


def _draw_noise_baseline(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    metric = study_metric(study)
    rows = study.rows
    names = [setting_key(r.get("attack"), r.get("budget")) for r in rows]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows) + 2), 3.6))
    match = str(study.meta.get("match") or "ssim").upper()
    series = [("clean", [r.get("clean_metric") for r in rows])] if any("clean_metric" in r for r in rows) else []
    series += [("adversarial", [r.get("adv_metric") for r in rows]),
               (f"random noise, same {match}", [r.get("noise_metric") for r in rows])]
    bars(ax, names, series, metric, "adversarial vs matched random noise", None)
    legend_top(fig, ax)
    return Section("study-noise-baseline", "Adversarial vs random noise (Paschali)",
                   f"Random noise scaled to the same image similarity ({escape(match)}) as each adversarial example: the gap "
                   "shows the damage is specific to the adversarial direction, not to the amount of noise.",
                   [figure_image(fig, "adversarial vs matched noise bars"),
                    data_table(rows, list(dict.fromkeys(k for r in rows for k in r)))])


# --- the config entry ---------------------------------------------------------------------------------------------
@register_study("corruptions", draw=_draw_corruptions, single_range=True,
                check_options={"suite": ["contrast"], "severities": [1], "frames": 2})
class CorruptionsSpec(StudySpec):
    """Corruptions at severities 1..5 with the flip probability (Xu et al.). ``suite``: a suite name (``xu2021``
    / ``robust_benchmark``: the paper's 14 Robust-Benchmark sequences for 2-D images; ``default``: the MONAI
    MRI/CT corruptions; ``all``) or a list of corruption names. ``bounds``: the data box (default: the attacks'
    box; ``null``: unbounded). ``models``: also run every named model and give each its mean flip probability
    relative to ``model``'s (Xu et al.'s RFP, Table 4), in ``meta["rfp"]``; the rows then hold every model's
    rows with a ``model`` column (``model``'s first; ``meta["reference"]`` names it), and the section shows Xu et
    al.'s Table 3 (mean flip probability per corruption and model) and Table 4 in one place."""

    study: Literal["corruptions"]
    models: Annotated[list[str], Field(min_length=1)] | None = None
    severities: Annotated[list[Annotated[int, Strict(), Field(ge=1, le=5)]], Field(min_length=1)] = [1, 2, 3, 4, 5]
    suite: Annotated[list[str], Field(min_length=1)] | str | None = None
    frames: Int = Field(5, ge=2)
    seed: Int = 0
    bounds: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None

    @field_validator("suite")
    @classmethod
    def _known(cls, names: list[str] | str | None) -> list[str] | str | None:
        if isinstance(names, str):
            if names not in SUITES:
                c = closest(names, list(SUITES))
                raise PydanticCustomError("option", "must be a suite ({listed}) or a list of corruptions; got "
                                          "{given}{hint}", {"listed": ", ".join(repr(k) for k in SUITES),
                                                            "given": repr(names),
                                                            "hint": f"; did you mean {c!r}?" if c else "",
                                                            "field": ""})
            return names
        known = [*CORRUPTIONS, *ALIASES]
        for n in names or []:
            if n not in known:
                raise unknown_option(n, known)
        return names

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        box = data_box(self, attacks, "corruptions")
        # unknown names are refused before any model runs
        chosen = None if self.models is None else pick_models(models, self.models, "models")
        ref = one_model(models, self)
        result = corruptions(ref, task, data, bounds=box, severities=self.severities, suite=self.suite,
                             frames=self.frames, seed=self.seed)
        if chosen is not None:
            ref_name = self.model or next(iter(models))
            others = {n: corruptions(m, task, data, bounds=box, severities=self.severities, suite=self.suite,
                                     frames=self.frames, seed=self.seed)
                      for n, m in chosen.items() if n != ref_name}
            every = {ref_name: result, **others}
            # one section for Xu et al.'s Table 3 (flip probability per model) and Table 4 (RFP): every model's
            # rows, tagged with the row contract's multi-model column, the reference model's first
            result = StudyResult("corruptions", [{"model": n, **row} for n, r in every.items() for row in r.rows],
                                 {**result.meta, "reference": ref_name, "models": list(every),
                                  "rfp": relative_flip_probability(every)})
        return result


@register_study("noise_baseline", draw=_draw_noise_baseline, single_range=True)
class NoiseBaselineSpec(StudySpec):
    """Noise matched per example in SSIM (or L2) to each attack's examples (Paschali et al.)."""

    study: Literal["noise_baseline"]
    match: Literal["ssim", "l2"] = "ssim"
    noise: Literal["gaussian", "rician"] = "gaussian"
    seed: Int = 0

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        return noise_baseline(one_model(models, self), task, data, attacks if attacks is not None else {}, match=self.match,
                              noise=self.noise, seed=self.seed, target_fn=target_fn)
