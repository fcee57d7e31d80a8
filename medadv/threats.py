"""Threat models: the set an attack may search, in the data's own units.

A threat model is a norm ball around the clean input plus the data bounds (HU for CT, [0, 1] for
scaled images, z-scores for normalised MRI). Bounds are always declared by the caller: medadv never
assumes [0, 1]. Bounds may be scalars or tensors broadcastable to the input (per-channel ranges of
multi-modal MRI, for instance).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["Box", "Threat", "Linf", "L2", "Bounds", "per_sample_norm", "LargeBudgetWarning", "SmallBudgetWarning",
           "check_budget_scale", "MAX_BUDGET_FRACTION", "MIN_BUDGET_FRACTION", "MAX_SIGMA_FRACTION"]

BoundValue = float | Tensor
Bounds = tuple[BoundValue, BoundValue]


class LargeBudgetWarning(UserWarning):
    """An L∞ budget above half the data range: almost always a budget in the wrong units (``8`` for 8/255)."""


class SmallBudgetWarning(UserWarning):
    """A budget below :data:`MIN_BUDGET_FRACTION` of the data range: almost always a budget in the wrong units
    (``4/255`` meant on [0, 1] data, given for CT in HU, moves no voxel by more than 0.016 HU)."""


#: an L∞ budget (or noise level) above this fraction of the data range ``hi - lo`` is too large: the ball
#: reaches every point of the box from its middle (the config refuses it unless ``allow_large_budgets``)
MAX_BUDGET_FRACTION = 0.5
#: the largest budget a threat takes: float32's largest value (an attack's steps are in the data's dtype)
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)
#: a positive budget (any norm) or noise level below this fraction of the data range changes nothing meaningful:
#: no element moves by more than 0.1 % of its range (4 HU of a 4 095 HU CT window, 0.26/255 on [0, 1] data)
MIN_BUDGET_FRACTION = 1e-3
#: randomized smoothing: a noise standard deviation above this fraction of the data range is too large (Cohen et
#: al.'s largest, σ = 1 on [0, 1] images, is at the limit; σ = 25 on [0, 1] is a 0-255 value)
MAX_SIGMA_FRACTION = 1.0


def _fraction_text(fraction: float) -> str:
    return {0.5: "half the", 1.0: "the"}.get(fraction, f"{fraction:g} of the")


def _widths(bounds: Box | Bounds | None) -> tuple[float, float, float, float] | None:
    """``(narrowest width, widest width, lowest lo, highest hi)`` of a bounded box on the CPU; ``None`` when
    unbounded or when the bounds live on a GPU (reading them would synchronise at every construction)."""
    box = Box.coerce(bounds)
    if box.bounds is None:
        return None
    lo, hi = box.bounds
    if any(isinstance(v, Tensor) and v.device.type != "cpu" for v in (lo, hi)):
        return None
    width = (torch.as_tensor(hi, dtype=torch.float64) - torch.as_tensor(lo, dtype=torch.float64)).flatten()
    return (float(width.min()), float(width.max()), float(torch.as_tensor(lo).min()),
            float(torch.as_tensor(hi).max()))


def _budget_values(eps: Any) -> list[float]:
    """The numbers (NaN left out) of a budget given as a number, a sequence (Foolbox's ``epsilons``) or an array
    (ART's per-sample ``eps``); anything else (``None``, strings) has no scale to check."""
    if isinstance(eps, bool) or eps is None or isinstance(eps, str):
        return []
    if isinstance(eps, Tensor):
        return [float(v) for v in eps.detach().cpu().flatten().tolist() if not math.isnan(float(v))]
    if hasattr(eps, "__array__") and not isinstance(eps, int | float):
        import numpy as np

        return [float(v) for v in np.asarray(eps, dtype=np.float64).ravel() if not math.isnan(float(v))]
    if isinstance(eps, Sequence):
        return [v for e in eps for v in _budget_values(e)]
    try:
        v = float(eps)
    except (TypeError, ValueError):
        return []
    return [] if math.isnan(v) else [v]  # an infinite budget is as large as budgets get


def check_budget_scale(eps: Any, bounds: Box | Bounds | None, *, name: str = "eps", owner: str = "",
                       where: str = "", p: float = math.inf, size: int | None = None,
                       allow_large_budgets: bool = False, large: str = "raise", small: bool = True,
                       max_fraction: float = MAX_BUDGET_FRACTION, min_fraction: float = MIN_BUDGET_FRACTION,
                       advice: str | None = None, small_advice: str | None = None, stacklevel: int = 2) -> None:
    """The budget-scale rule shared by medadv's threat models, randomized smoothing and every toolkit adapter.

    A budget is in the data's own units (HU, [0, 1], z-scores), so its size against the data range ``hi - lo``
    tells a unit mistake apart from a choice:

    * **too large**: an Lp budget above ``max_fraction`` (:data:`MAX_BUDGET_FRACTION`, one half) of the box's
      Lp half-diagonal, ``max_fraction · (hi - lo) · size^(1/p)`` (for L∞ half the range of the widest channel:
      the ball then reaches any point of the box from its middle, e.g. ``8`` meant as 8/255 on [0, 1] data). It
      raises ``ValueError`` (``large="raise"``) or warns :class:`LargeBudgetWarning` (``large="warn"``), unless
      ``allow_large_budgets``. An Lp budget with ``p < ∞`` needs ``size`` (elements per sample), else only the
      small side is checked.
    * **too small**: a positive budget of any norm below ``min_fraction`` (:data:`MIN_BUDGET_FRACTION`, 0.1 %) of
      the narrowest channel's range moves no element by more than that (``|δ_i| ≤ ‖δ‖_p``), e.g. ``4/255`` given
      for CT in HU: a :class:`SmallBudgetWarning` (the attack still runs; silence it with the ``warnings`` module).

    ``eps`` may be a number, a sequence or an array (every finite entry is checked; ``None`` is skipped).
    Unbounded boxes and bounds on a GPU are not checked. ``name`` is the argument named in the message,
    ``owner`` what it belongs to (``"ART FastGradientMethod "``), ``where`` says where the box comes from
    (``" (`clip_values`)"``); ``advice`` and ``small_advice`` replace the default fix that ends the message of
    each side.
    """
    if large not in ("raise", "warn"):
        raise ValueError(f"`large` must be 'raise' or 'warn', got {large!r}")
    values = _budget_values(eps)
    widths = _widths(bounds) if values else None
    if widths is None or not values or math.isnan(p) or p <= 0:
        return  # p = 0 (pixel counts) has no scale in data units
    narrow, wide, lo, hi = widths
    box = f"[{lo:g}, {hi:g}]"
    if math.isinf(p):
        limit: float | None = max_fraction * wide
        span = f"more than {_fraction_text(max_fraction)} data range {box}{where}"
    elif size is not None and size > 0:
        limit = max_fraction * wide * size ** (1.0 / p)
        span = (f"more than {_fraction_text(max_fraction)} L{p:g} diagonal of the data box {box}{where} over "
                f"{size} elements ({limit:.6g})")
    else:
        limit = None
    import warnings

    big = max(values)
    if limit is not None and big > limit and not allow_large_budgets:
        fix = advice if advice is not None else "budgets are in data units, e.g. 8/255 for 8 on a 0-255 scale"
        msg = f"{owner}{name}={big:g} is {span}: {fix}"
        if large == "raise":
            raise ValueError(msg)
        warnings.warn(msg, LargeBudgetWarning, stacklevel=stacklevel + 1)
        return
    positive = [v for v in values if v > 0]
    tiny = min(positive) if positive else None
    if small and tiny is not None and tiny < min_fraction * narrow:
        fix = small_advice if small_advice is not None else (
            f"values are in data units, and a {name} meant on a [0, 1] scale is {name} × (hi − lo) here "
            f"({tiny:g} → {tiny * narrow:.6g})")
        warnings.warn(f"{owner}{name}={tiny:g} is below {min_fraction:g} of the data range {box}{where}: at that "
                      f"size no element moves by more than {min_fraction:.1%} of its range, so the result means "
                      f"nothing; {fix}", SmallBudgetWarning, stacklevel=stacklevel + 1)


def per_sample_norm(t: Tensor, p: float) -> Tensor:
    """Lp norm of each sample of a batch, ``(N,)``."""
    flat = t.reshape(t.shape[0], -1)
    if math.isinf(p):
        return flat.abs().amax(dim=1) if flat.shape[1] else flat.new_zeros(flat.shape[0])
    return flat.norm(p=p, dim=1)


def _as_bound(v: BoundValue, name: str) -> BoundValue:
    if isinstance(v, Tensor):
        if not torch.isfinite(v).all():
            raise ValueError(f"`bounds` {name} must be finite")
        return v.detach().clone()
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError(f"`bounds` {name} must be a number or a tensor, got {type(v).__name__}") from None
    if not math.isfinite(f):
        raise ValueError(f"`bounds` {name} must be finite, got {v}")
    return f


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


class Box:
    """The data bounds: where valid inputs live, in the data's own units.

    ``Box(lo, hi)`` with scalars or tensors broadcastable to the input (per-channel ranges of multi-modal
    MRI: shape ``(C, 1, 1)`` in 2-D, ``(C, 1, 1, 1)`` in 3-D), or ``Box.unbounded()`` (also ``Box(None)``)
    for data without bounds. There is no default range: medadv never assumes [0, 1].

    A threat model is a box plus a norm ball; attacks whose constraint is not an Lp ball (VAFA, DAG without
    ε, GAP's clipping) take the box alone.
    """

    def __init__(self, lo: BoundValue | Bounds | Box | None, hi: BoundValue | None = None) -> None:
        self._width: float | str | None = None  # hi - lo as one number, or why there is none (bounded boxes)
        if isinstance(lo, Box) and hi is None:
            self.bounds: Bounds | None = lo.bounds
            self._width = lo.__dict__.get("_width")
            return
        if hi is None and isinstance(lo, Sequence) and not isinstance(lo, str | Tensor):
            pair: Sequence[Any] = lo
            if len(pair) != 2:
                raise TypeError(f"`bounds` must be a (lo, hi) pair, a Box or None, got {lo!r}")
            lo, hi = pair[0], pair[1]
        if lo is None and hi is None:
            self.bounds = None
            return
        if lo is None or hi is None:
            raise TypeError("`bounds` needs both lo and hi (or None for unbounded data)")
        lo_, hi_ = _as_bound(lo, "lo"), _as_bound(hi, "hi")  # type: ignore[arg-type]
        if not bool(torch.all(torch.as_tensor(lo_) < torch.as_tensor(hi_))):
            raise ValueError(f"`bounds` must satisfy lo < hi, got ({lo!r}, {hi!r})")
        self.bounds = (lo_, hi_)
        # read once here, not in an attack's setup: on a GPU each read of tensor bounds is a synchronisation
        self._width = self._single_width()

    def _single_width(self) -> float | str:
        """``hi − lo`` as one number, or the reason there is none (per-channel ranges of different widths)."""
        assert self.bounds is not None
        width = torch.as_tensor(self.bounds[1]) - torch.as_tensor(self.bounds[0])
        if width.numel() > 1 and not bool((width == width.flatten()[0]).all()):
            # e.g. one channel in [0, 1] and one in HU: a default "fraction of the data range" would move
            # the narrow channel by its whole range; the caller must give the value in data units
            return (f"the box {self.describe()} has per-channel ranges of different widths "
                    f"({', '.join(f'{w:.6g}' for w in width.flatten().tolist())}): there is no single data "
                    "range; give the step/size explicitly in data units")
        return float(width.flatten()[0])

    @classmethod
    def unbounded(cls) -> Box:
        return cls(None)

    @classmethod
    def coerce(cls, value: Box | Bounds | None, name: str = "bounds") -> Box:
        """A :class:`Box` from a Box, a ``(lo, hi)`` pair or ``None`` (unbounded)."""
        if isinstance(value, Box):
            return value
        if value is None:
            return cls(None)
        if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
            return cls(value[0], value[1])
        raise TypeError(f"`{name}` must be a (lo, hi) pair, a medadv Box or None (unbounded), got {value!r}")

    @property
    def bounded(self) -> bool:
        return self.bounds is not None

    @property
    def lo(self) -> BoundValue | None:
        return None if self.bounds is None else self.bounds[0]

    @property
    def hi(self) -> BoundValue | None:
        return None if self.bounds is None else self.bounds[1]

    def _bound(self, i: int, like: Tensor) -> BoundValue:
        assert self.bounds is not None
        b = self.bounds[i]
        if not isinstance(b, Tensor):
            return b
        # cached per device/dtype: clip runs every attack step, a host-to-device copy each time would sync
        cache = self.__dict__.setdefault("_bound_cache", {})
        key = (i, like.device, like.dtype)
        if key not in cache:
            cache[key] = b.to(device=like.device, dtype=like.dtype)
        return cache[key]

    def lohi(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """Both bounds as tensors on ``like``'s device and dtype (bounded boxes only)."""
        if self.bounds is None:
            raise ValueError("this Box is unbounded: it has no (lo, hi)")
        lo, hi = self._bound(0, like), self._bound(1, like)
        return (torch.as_tensor(lo, device=like.device, dtype=like.dtype),
                torch.as_tensor(hi, device=like.device, dtype=like.dtype))

    def clip(self, x: Tensor) -> Tensor:
        """Clip to the bounds (identity when unbounded)."""
        if self.bounds is None:
            return x
        lo, hi = self._bound(0, x), self._bound(1, x)
        if isinstance(lo, Tensor) or isinstance(hi, Tensor):
            return torch.clamp(x, torch.as_tensor(lo, device=x.device, dtype=x.dtype),
                               torch.as_tensor(hi, device=x.device, dtype=x.dtype))
        return x.clamp(lo, hi)

    def check_inside(self, x: Tensor, name: str = "x") -> None:
        """Raise ``ValueError`` if ``x`` lies outside the bounds (or they do not fit its shape)."""
        if self.bounds is None:
            return
        lo, hi = self._bound(0, x), self._bound(1, x)
        for b in (lo, hi):
            # a bound that broadcasts to a *larger* shape would silently reshape every clipped batch
            if isinstance(b, Tensor) and not _broadcasts_to(b.shape, x.shape):
                raise ValueError(
                    f"`bounds` tensors of shape {tuple(b.shape)} do not broadcast to `{name}` of shape "
                    f"{tuple(x.shape)}; per-channel bounds need shape (C, 1, 1) for 2-D, (C, 1, 1, 1) for 3-D"
                )
        if bool((x < lo).any()) or bool((x > hi).any()):
            raise ValueError(
                f"`{name}` has values in [{float(x.min()):.6g}, {float(x.max()):.6g}], outside the declared "
                f"bounds {self.describe()}; rescale the data or declare the right bounds"
            )

    def data_range(self, x: Tensor | None = None) -> float:
        """``hi − lo`` as one number (``x``'s range if unbounded). Per-channel bounds of different widths have
        none: ``ValueError`` (defaults relative to the data range then need an explicit value)."""
        if self.bounds is None:
            if x is None:
                raise ValueError("an unbounded Box has no data range; pass the data")
            return float(x.max() - x.min()) or 1.0
        width = self.__dict__.get("_width")
        if width is None:  # a Box copied from another Box, or unpickled from an older release
            width = self._width = self._single_width()
        if isinstance(width, str):
            raise ValueError(width)
        return width

    def describe(self) -> str:
        if self.bounds is None:
            return "None"
        parts = [f"{b:.6g}" if not isinstance(b, Tensor) else f"tensor{tuple(b.shape)}" for b in self.bounds]
        return f"({parts[0]}, {parts[1]})"

    def fingerprint(self) -> str:
        from .params import stable_hash

        return stable_hash(None if self.bounds is None else list(self.bounds))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Box) and self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __repr__(self) -> str:
        return f"Box{self.describe()}" if self.bounds is not None else "Box.unbounded()"


class Threat(ABC):
    """A norm ball of radius ``eps`` (data units) intersected with the data box.

    Args:
        eps: radius of the ball in the data's units; ``>= 0``.
        bounds: the data box: a :class:`Box`, a ``(lo, hi)`` pair (scalars or tensors broadcastable to the
            input), or ``None`` for unbounded data. Required: there is no default range.
    """

    p: float = math.inf

    def __init__(self, eps: float, *, bounds: Box | Bounds | None) -> None:
        if isinstance(eps, bool):
            raise TypeError("`eps` must be a number, got bool")
        try:
            eps = float(eps)
        except (TypeError, ValueError):
            raise TypeError(f"`eps` must be a number, got {type(eps).__name__}") from None
        if not math.isfinite(eps) or eps < 0:
            raise ValueError(f"`eps` must be a finite number >= 0, got {eps}")
        if eps > _FLOAT32_MAX:  # steps and projections of float32 data would overflow to inf/nan, not a number
            raise ValueError(f"`eps` must be at most {_FLOAT32_MAX:.4g} (float32's largest value), got {eps:g}")
        self.eps = eps
        self.box = Box.coerce(bounds)
        if self.p == math.inf:
            self._warn_if_large()

    def _warn_if_large(self) -> None:
        """Warn when ε exceeds half the data range (the widest channel's): the ball then reaches any point of
        the box from its middle, so the "robust" numbers measure nothing. Configs refuse it outright
        (``allow_large_budgets`` lets it through); from Python this is a warning."""
        # the large side only: a tiny ε is also how attacks are probed (and the default of derived radii)
        check_budget_scale(self.eps, self.box, owner=f"{type(self).__name__} ", large="warn", small=False,
                           stacklevel=3)

    @property
    def bounds(self) -> Bounds | None:
        """The box's ``(lo, hi)`` (``None`` when unbounded)."""
        return self.box.bounds

    def with_eps(self, eps: float) -> Threat:
        """The same geometry and box with another radius.

        No :class:`LargeBudgetWarning`: attacks derive radii from the one the caller chose (AutoAttack's
        progressive 2ε phase, a budget shared over sliding windows), which was checked when it was made."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LargeBudgetWarning)
            return type(self)(eps, bounds=self.box)

    # --- bounds ------------------------------------------------------------------------------------------
    def clip(self, x: Tensor) -> Tensor:
        """Clip to the data bounds (identity when unbounded)."""
        return self.box.clip(x)

    def check_inside(self, x: Tensor, name: str = "x") -> None:
        """Raise ``ValueError`` if ``x`` lies outside the declared bounds (or they do not fit its shape)."""
        self.box.check_inside(x, name)

    def describe_bounds(self) -> str:
        return self.box.describe()

    def fingerprint(self) -> str:
        from .params import stable_hash

        return stable_hash({"norm": type(self).__name__, "eps": repr(self.eps), "box": self.box.fingerprint()})

    # --- geometry ------------------------------------------------------------------------------------------
    def norm(self, delta: Tensor) -> Tensor:
        """Per-sample norm of a perturbation in this threat's geometry, ``(N,)``."""
        return per_sample_norm(delta, self.p)

    @abstractmethod
    def project(self, delta: Tensor, eps: Tensor | float | None = None) -> Tensor:
        """Project a perturbation onto the ball (``eps`` overrides the radius, per sample allowed)."""

    @abstractmethod
    def ascent_direction(self, grad: Tensor) -> Tensor:
        """Steepest-ascent direction of unit norm (per sample) for a gradient."""

    @abstractmethod
    def random_delta(self, x: Tensor, generator: torch.Generator | None) -> Tensor:
        """A random start inside the ball (uniform in the L∞ box; uniform radius for L2)."""

    def finalize(self, x: Tensor, x_adv: Tensor) -> Tensor:
        """Project ``x_adv`` onto the ball around ``x`` and clip to the bounds."""
        return self.clip(x + self.project(x_adv - x))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(eps={self.eps:.6g}, bounds={self.describe_bounds()})"


def _expand(v: Tensor | float, like: Tensor) -> Tensor | float:
    """Reshape a per-sample value ``(N,)`` to broadcast over a batch tensor."""
    if isinstance(v, Tensor) and v.ndim == 1:
        return v.reshape(-1, *([1] * (like.ndim - 1)))
    return v


class Linf(Threat):
    """L∞ ball: every element moves by at most ``eps`` (data units)."""

    p = math.inf

    def project(self, delta: Tensor, eps: Tensor | float | None = None) -> Tensor:
        e = _expand(self.eps if eps is None else eps, delta)
        if isinstance(e, Tensor):
            return torch.clamp(delta, -e, e)
        return delta.clamp(-e, e)

    def ascent_direction(self, grad: Tensor) -> Tensor:
        return grad.sign()

    def random_delta(self, x: Tensor, generator: torch.Generator | None) -> Tensor:
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return (2 * u - 1) * self.eps


class L2(Threat):
    """L2 ball: the whole perturbation of one sample has Euclidean norm at most ``eps`` (data units)."""

    p = 2.0

    def project(self, delta: Tensor, eps: Tensor | float | None = None) -> Tensor:
        e = self.eps if eps is None else eps
        n = per_sample_norm(delta, 2.0)
        factor = (n.clamp_min(1e-12).reciprocal() * e).clamp(max=1.0)  # e: float or (N,) tensor, no copy
        return delta * _expand(factor, delta)

    def ascent_direction(self, grad: Tensor) -> Tensor:
        n = per_sample_norm(grad, 2.0).clamp_min(1e-12)
        return grad / _expand(n, grad)

    def random_delta(self, x: Tensor, generator: torch.Generator | None) -> Tensor:
        d = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        d = d / _expand(per_sample_norm(d, 2.0).clamp_min(1e-12), d)
        r = torch.rand(x.shape[0], generator=generator, device=x.device, dtype=x.dtype)
        return d * _expand(r * self.eps, d)
