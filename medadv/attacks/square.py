"""Square Attack: a score-based black-box attack by random search, for every medadv task.

Andriushchenko, Croce, Flammarion, Hein. "Square Attack: a query-efficient black-box adversarial attack via
random search", ECCV 2020.

The attack only reads the model's output (no gradients), so it is the member of an evaluation that exposes
gradient masking: a model whose gradients are useless (quantisation, randomness, saturated softmax) is
still attacked. Each query changes a random square (a cube for 3-D volumes) of the current perturbation and
keeps the change if the objective improves; the window's side shrinks on the paper's schedule.

Everything is batched on the model's device, per sample: every sample gets its own window, signs and
(L2) split axis, drawn from one seeded generator for the *whole* batch at every query, so a sample's random
stream does not depend on which other samples are still attacked. Fooled samples stop being queried (their
cost is per still-robust sample); the still-attacked set is compacted every ``check_every`` queries, the
only host synchronisation in the loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Bool, Int, InvalidParameterError, Options, Real
from ..runtime import forward_tensor, make_generator
from ..tasks import Task
from ..threats import Linf, Threat
from .base import Attack, AttackDetails, register

__all__ = ["Square", "SquareDetails", "square_p", "square_eta"]

#: the paper's schedule: p halves after these queries (of a 10 000-query run; rescaled to other budgets)
_CHECKPOINTS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)


def square_p(i: int, queries: int, p_init: float) -> float:
    """The fraction of elements the ``i``-th query (0-based, after the init) changes.

    ``p_init`` halves at queries 10, 50, 200, 500, 1000, 2000, 4000, 6000 and 8000 of a 10 000-query run
    (the paper's code, and AutoAttack's); for another budget the query index is rescaled to
    ``⌊i / queries · 10000⌋`` first, as AutoAttack does.
    """
    it = int(i / queries * 10000)
    return p_init / 2 ** sum(it > c for c in _CHECKPOINTS)


def _side(p: float, spatial: tuple[int, ...], minimum: int) -> int:
    """The side of a window covering about a fraction ``p`` of the spatial elements (at least ``minimum``)."""
    d, n = len(spatial), math.prod(spatial)
    root = math.sqrt(p * n) if d == 2 else (p * n) ** (1.0 / d)
    return max(int(round(root)), minimum)


def _eta_block(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    """Nested centred cubes: element value ``Σ_{k ≥ r} 1/(k+1)²`` with ``r`` its Chebyshev distance to the
    centre ``⌊n/2⌋`` (the paper's L2 building block, any rank), unit L2 norm; all zeros if a side is 0."""
    if 0 in shape:
        return torch.zeros(shape, device=device, dtype=dtype)
    centre = [n // 2 for n in shape]
    rings = max(c + 1 for c in centre)
    axes = [(torch.arange(n, device=device) - c).abs() for n, c in zip(shape, centre, strict=True)]
    dist = torch.stack(torch.meshgrid(*axes, indexing="ij")).amax(dim=0)
    w = (torch.arange(rings, device=device, dtype=torch.float64) + 1).pow(-2)
    tail = w.flip(0).cumsum(0).flip(0)  # tail[r] = Σ_{k >= r} w[k]
    block = tail[dist]
    return (block / block.norm()).to(dtype)


def square_eta(side: int, ndim: int, axis: int, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> Tensor:
    """The paper's L2 update pattern on a ``side``^``ndim`` window, unit L2 norm.

    The window is split in two along ``axis``: the first ``⌊side/2⌋`` slices hold the nested-squares block
    (:func:`_eta_block`), the others its negative (the paper's Fig. 2; its code picks the axis at random,
    as medadv does per sample).
    """
    dev = torch.device(device)
    first = [side] * ndim
    second = [side] * ndim
    first[axis], second[axis] = side // 2, side - side // 2
    eta = torch.cat((_eta_block(tuple(first), dev, torch.float64),
                     -_eta_block(tuple(second), dev, torch.float64)), dim=axis)
    return (eta / eta.norm()).to(dtype)


def _rows(t: Tensor, like: Tensor) -> Tensor:
    return t.reshape((-1,) + (1,) * (like.ndim - 1))


def _spatial_view(t: Tensor, axis: int, ndim: int) -> Tensor:
    """``(n, size)`` per-axis values reshaped to broadcast as ``(n, 1, *spatial)`` along spatial ``axis``."""
    shape = [t.shape[0], 1] + [1] * ndim
    shape[2 + axis] = t.shape[1]
    return t.reshape(shape)


class _Grid:
    """The spatial grid of a batch, with its per-axis coordinates made once on the device (the query loop
    then needs no host-to-device copy)."""

    def __init__(self, spatial: tuple[int, ...], device: torch.device) -> None:
        self.spatial = spatial
        self.coords = [torch.arange(size, device=device).unsqueeze(0) for size in spatial]
        self.sizes = torch.tensor(spatial, device=device)  # one copy per run

    def windows(self, u: Tensor, side: int) -> tuple[Tensor, list[Tensor]]:
        """Per-sample windows of side ``side`` from uniforms ``u`` ``(n, d)``, every corner that fits equally
        likely: the masks ``(n, 1, *spatial)`` (bool) and the per-axis coordinates relative to the corner,
        ``(n, size_a)`` each."""
        d = len(self.spatial)
        room = self.sizes - side  # the last corner that fits, per axis
        corner = torch.minimum((u * (room + 1)).floor().long(), room)
        mask: Tensor | None = None
        rel = []
        for a in range(d):
            r = self.coords[a] - corner[:, a:a + 1]
            rel.append(r)
            inside = _spatial_view((r >= 0) & (r < side), a, d)
            mask = inside if mask is None else mask & inside
        assert mask is not None
        return mask, rel


def _signs(u: Tensor) -> Tensor:
    return torch.where(u < 0.5, -1.0, 1.0).to(u.dtype)


def _norm(t: Tensor) -> Tensor:
    """Per-sample L2 norm ``(n,)``."""
    return t.reshape(t.shape[0], -1).pow(2).sum(1).sqrt()


@dataclass
class SquareDetails(AttackDetails):
    """Square Attack's per-sample record.

    Attributes:
        queries: ``(N,)`` long: model queries spent on each sample (the init counts as one, summed over
            restarts; 0 for a sample fooled by the clean input). Queries a fooled sample rode along in the
            batch until the next compaction are not counted: a real black-box attacker stops at once.
        objective: ``(N,)`` the attack's minimised objective at the returned point (lower: stronger;
            the clean value for samples not moved).
    """

    columns: ClassVar[tuple[str, ...]] = ("queries", "objective")
    queries: Tensor
    objective: Tensor


@register("square")
class Square(Attack):
    """Square Attack (Andriushchenko et al., ECCV 2020): score-based black-box random search, any task.

    L∞: the start is the paper's vertical stripes (each column of each channel at ``±ε``, constant along the
    height; 3-D: along the second-to-last axis), then each query sets a random window of side ``s`` (square
    in 2-D, cube in 3-D; one per sample, at a uniform position) to ``x ± ε`` with one random sign per
    channel, clipped to the box. L2: the start is the paper's grid of nested centred squares (cubes) with
    random signs, scaled to the sphere of radius ε; each query moves the perturbation's mass between two
    random windows (the first gets the paper's two-signed nested-squares pattern plus its old content,
    the second is emptied) and rescales the whole perturbation to norm ε, then clips to the box. The window
    side covers a fraction ``p`` of the spatial elements (``s = round((p·|spatial|)^(1/d))``, at least 1 for
    L∞ and 3, odd, for L2, at most the smallest side) and ``p`` follows the paper's schedule
    (:func:`square_p`). A query's change is kept for a sample when it is better: fooled first, then a lower
    objective. The returned point is each sample's best over the restarts (and the clean input), projected
    exactly into the ε-ball and the box.

    Objective (``loss``), minimised, per sample through the task:

    * ``"margin"``: the task's mean logit margin (:meth:`Task.margin`: per sample, per label averaged for
      multi-label, per voxel averaged for segmentation); targeted: the negative margin of the target.
    * ``"ce"``: the task's loss (:meth:`Task.loss`), maximised (minimised towards the target when targeted).
    * ``"min-margin"``: the smallest element margin (multi-label: the weakest label; the sample is fooled
      as soon as it is negative); targeted: minus the smallest margin to the target. The same as
      ``"margin"`` for multi-class. Refused for segmentation: one voxel says nothing about the Dice there.

    A sample counts as fooled by the task's own test (:meth:`Task.fooled`: class changed, any label flipped,
    mean Dice below the task's threshold; targeted: the target reached).

    Args:
        task: the model's :class:`~medadv.tasks.Task` (multi-class, multi-label, 2-D or 3-D segmentation).
        threat: :class:`~medadv.threats.Linf` or :class:`~medadv.threats.L2`; ε and the box (scalars or
            per-channel tensors) in data units.
        queries: model queries (loss evaluations) per restart after the init's one; 10 000 in the paper,
            5000 in AutoAttack's standard version.
        p_init: initial fraction (0 < p <= 1) of the spatial elements a window covers (AutoAttack's 0.8; the
            paper tunes it per data set); halved on the schedule of :func:`square_p`.
        loss: ``"margin"``, ``"ce"`` or ``"min-margin"`` (see above).
        restarts: independent runs (fresh random starts); each runs on the samples not yet fooled
            (all samples without ``active_set``) and the best run per sample is kept.
        active_set: stop querying a sample once it is fooled (the paper's and AutoAttack's behaviour). False:
            every sample uses its whole budget, driving its objective further down (e.g. the Dice of a
            segmentation below the fooled threshold).
        check_every: queries between compactions of the still-attacked set (each one host sync); results
            do not depend on it.
        targeted: ``y`` is a target to reach (see :class:`~medadv.attacks.base.Attack`).
        seed: seed of the attack's random search (same seed, same adversarial tensor); ``None`` uses
            torch's global RNG.
    """

    params: ClassVar[dict[str, Any]] = {
        "queries": Int(low=1),
        "p_init": Real(low=0.0, high=1.0, low_open=True),
        "loss": Options("margin", "ce", "min-margin"),
        "restarts": Int(low=1),
        "active_set": Bool(),
        "check_every": Int(low=1),
    }
    spatial_dims = (2, 3)

    queries: int
    p_init: float
    loss: str
    restarts: int
    active_set: bool
    check_every: int

    def __init__(
        self,
        task: Task,
        threat: Threat,
        *,
        queries: int = 5000,
        p_init: float = 0.8,
        loss: str = "margin",
        restarts: int = 1,
        active_set: bool = True,
        check_every: int = 10,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        # a kind scored by per-class Dice on label maps: its weakest element is one voxel of the map
        if self.loss == "min-margin" and task.traits.metrics.class_dice:
            raise InvalidParameterError(
                "`loss='min-margin'` of Square minimises the margin of the single weakest element, and for "
                "Segmentation that is one voxel: flipping it barely moves the Dice. Use loss='margin' (the "
                "voxel margin averaged over the map) or loss='ce' (the task's loss)")

    # --- objective -------------------------------------------------------------------------------------------
    def objective(self, logits: Tensor, y: Tensor) -> Tensor:
        """The per-sample objective ``(N,)`` the attack minimises (see the class docstring)."""
        if self.loss == "ce":
            value = self.task.loss(logits, y)
            return value if self.targeted else -value
        if self.loss == "margin":
            m = self.task.margin(logits, y)
        else:
            m = self.task.element_margin(logits, y).reshape(logits.shape[0], -1).amin(dim=1)
        return -m if self.targeted else m

    def finished(self, logits: Tensor, y: Tensor) -> Tensor:
        """``(N,)`` bool: the sample needs no more queries (default: the task's fooled test)."""
        return self.task.fooled(logits, y, self.targeted)

    def _score(self, model: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        logits = forward_tensor(model, x)
        return self.objective(logits, y), self.finished(logits, y)

    @staticmethod
    def _better(fooled: Tensor, obj: Tensor, best_fooled: Tensor, best_obj: Tensor) -> Tensor:
        """Fooled first, then a strictly lower objective."""
        return (fooled & ~best_fooled) | ((fooled == best_fooled) & (obj < best_obj))

    # --- starts -----------------------------------------------------------------------------------------------
    def _init_linf(self, x: Tensor, gen: torch.Generator | None) -> Tensor:
        eps = self.threat.eps  # type: ignore[union-attr]
        shape = list(x.shape)
        shape[-2] = 1  # stripes: one sign per column (and depth slice), constant along the height
        s = _signs(torch.rand(shape, generator=gen, device=x.device, dtype=x.dtype))
        return self.box.clip(x + eps * s)

    def _init_l2(self, x: Tensor, gen: torch.Generator | None) -> Tensor:
        eps = self.threat.eps  # type: ignore[union-attr]
        n, c = x.shape[:2]
        spatial = tuple(x.shape[2:])
        d = len(spatial)
        tile = max(min(spatial) // 5, 1)
        counts = [size // tile for size in spatial]
        tiles = math.prod(counts)
        # each position's tile (flat index over the grid) and its position inside the tile; the grid is
        # centred, positions outside it (a margin narrower than a tile) stay 0
        tile_id: Tensor | None = None
        rel_id: Tensor | None = None
        valid: Tensor | None = None
        for a, (size, count) in enumerate(zip(spatial, counts, strict=True)):
            start = (size - tile * count) // 2
            pos = torch.arange(size, device=x.device) - start
            ok = (pos >= 0) & (pos < tile * count)
            pos = pos.clamp(0, tile * count - 1)
            view = [1] * d
            view[a] = size
            t_a, r_a, ok_a = (pos // tile).reshape(view), (pos % tile).reshape(view), ok.reshape(view)
            tile_id = t_a if tile_id is None else tile_id * count + t_a
            rel_id = r_a if rel_id is None else rel_id * tile + r_a
            valid = ok_a if valid is None else valid & ok_a
        assert tile_id is not None and rel_id is not None and valid is not None
        u_axis = torch.rand((n, tiles), generator=gen, device=x.device, dtype=x.dtype)
        u_sign = torch.rand((n, c, tiles), generator=gen, device=x.device, dtype=x.dtype)
        patterns = torch.stack([square_eta(tile, d, a, x.device, x.dtype).flatten() for a in range(d)])
        axis = (u_axis * d).floor().long().clamp_max(d - 1)  # (n, tiles)
        flat_tile, flat_rel = tile_id.flatten(), rel_id.flatten()
        values = patterns[axis[:, flat_tile], flat_rel.unsqueeze(0)]  # (n, P)
        delta = values.unsqueeze(1) * _signs(u_sign)[:, :, flat_tile] * valid.flatten().to(x.dtype)
        delta = delta.reshape(x.shape)
        return self.box.clip(x + eps * delta / _rows(_norm(delta) + 1e-12, delta))

    # --- one query ---------------------------------------------------------------------------------------------
    def _propose_linf(self, grid: _Grid, x: Tensor, best: Tensor, lo: Tensor, hi: Tensor, u: Tensor,
                      p: float) -> Tensor:
        spatial = grid.spatial
        d, c = len(spatial), x.shape[1]
        side = min(_side(p, spatial, 1), min(spatial))
        mask, _ = grid.windows(u[:, :d], side)
        up = (u[:, d:d + c] >= 0.5).reshape(x.shape[0], c, *([1] * d))
        return torch.where(mask, torch.where(up, hi, lo), best)

    def _propose_l2(self, grid: _Grid, x: Tensor, best: Tensor, u: Tensor, p: float,
                    cache: dict[int, Tensor]) -> Tensor:
        eps = self.threat.eps  # type: ignore[union-attr]
        n, c = x.shape[:2]
        spatial = grid.spatial
        d = len(spatial)
        side = _side(p, spatial, 3)
        side = min(side + 1 if side % 2 == 0 else side, min(spatial))
        if side not in cache:  # the pattern changes only when the schedule changes the side
            cache[side] = torch.stack([square_eta(side, d, a, x.device, x.dtype).flatten() for a in range(d)])
        m1, rel = grid.windows(u[:, :d], side)
        m2, _ = grid.windows(u[:, d:2 * d], side)
        axis = (u[:, 2 * d] * d).floor().long().clamp_max(d - 1)
        signs = _signs(u[:, 2 * d + 1:2 * d + 1 + c]).reshape(n, c, *([1] * d))
        # the pattern placed at each sample's first window: flat index into the side^d block
        flat: Tensor | None = None
        for a, r in enumerate(rel):
            ra = _spatial_view(r.clamp(0, side - 1), a, d)
            flat = ra if flat is None else flat * side + ra
        assert flat is not None
        flat = flat.expand(n, 1, *spatial).reshape(n, -1)
        pattern = cache[side][axis].gather(1, flat).reshape(n, 1, *spatial) * m1

        dims = tuple(range(2, x.ndim))
        delta = best - x
        sq = delta * delta
        norm_w1 = (sq * m1).sum(dims, keepdim=True).sqrt()
        norm_windows = (sq * (m1 | m2)).sum(dims, keepdim=True).sqrt()
        norm_image = _rows(_norm(delta), delta)
        new = pattern * signs + delta * m1 / (norm_w1 + 1e-12)
        norm_new = (new * new).sum(dims, keepdim=True).sqrt()
        # the window gets the mass of both windows plus what the ball still has to spare, shared by channel
        budget = ((eps * eps - norm_image * norm_image).clamp_min(0) / c + norm_windows * norm_windows).sqrt()
        new = new / (norm_new + 1e-12) * budget
        delta = torch.where(m1, new, torch.where(m2, torch.zeros_like(delta), delta))
        return self.box.clip(x + eps * delta / _rows(_norm(delta) + 1e-12, delta))

    # --- the search -----------------------------------------------------------------------------------------
    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, *, skip: Tensor | None = None,
                **call_args: Any):
        """``skip`` (internal, for ensembles): samples treated as finished from the start (0 queries); the
        random numbers are still drawn for the whole batch, so the others get the results of a full run."""
        assert logits is not None and self.threat is not None
        n = x.shape[0]
        with torch.no_grad():
            best_obj = self.objective(logits, y)
            best_fooled = self.finished(logits, y)
        if skip is not None:
            best_fooled = best_fooled | skip
        best_x = x.clone()
        queries = torch.zeros(n, dtype=torch.long, device=x.device)
        if self.threat.eps > 0:
            gen = make_generator(self.seed, x.device)
            for _ in range(self.restarts):
                todo = ~best_fooled if self.active_set else torch.ones_like(best_fooled)
                index = todo.nonzero().squeeze(1)  # one host sync per restart
                if index.numel() == 0:
                    break
                with torch.no_grad():
                    rx, robj, rfooled = self._restart(model, x, y, index, gen, queries)
                b = self._better(rfooled, robj, best_fooled[index], best_obj[index])
                best_x[index] = torch.where(_rows(b, rx), rx, best_x[index])
                best_obj[index] = torch.where(b, robj, best_obj[index])
                best_fooled[index] = torch.where(b, rfooled, best_fooled[index])
        x_adv = self.threat.finalize(x, best_x)
        return x_adv, SquareDetails(queries=queries, objective=best_obj), None

    def _restart(self, model: nn.Module, x: Tensor, y: Tensor, index: Tensor, gen: torch.Generator | None,
                 queries: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One run on the samples ``index``; adds each sample's queries to ``queries`` (full batch, in place).

        Returns the run's best point, objective and fooled flag of each sample of ``index``.
        """
        assert self.threat is not None
        n, c = x.shape[:2]
        d = x.ndim - 2
        linf = isinstance(self.threat, Linf)
        eps = self.threat.eps
        # random numbers are drawn for the whole batch and then subset: a sample's stream does not depend on
        # which other samples are still attacked (the compaction leaves every result unchanged)
        start = self._init_linf(x, gen) if linf else self._init_l2(x, gen)
        width = d + c if linf else 2 * d + 1 + c

        out_x, out_obj = start[index], torch.empty(index.shape[0], device=x.device, dtype=x.dtype)
        out_fooled = torch.zeros(index.shape[0], dtype=torch.bool, device=x.device)
        pos = torch.arange(index.shape[0], device=x.device)  # positions of the attacked samples in `index`
        batch_rows = index  # their rows in the batch
        xa, ya, best = x[index], y[index], out_x.clone()
        obj, fooled = self._score(model, best, ya)
        obj = obj.to(x.dtype)
        queries.index_add_(0, index, torch.ones_like(index))
        lo = hi = xa
        if linf:
            lo, hi = self.box.clip(xa - eps), self.box.clip(xa + eps)
        cache: dict[int, Tensor] = {}
        grid = _Grid(tuple(x.shape[2:]), x.device)
        for i in range(self.queries):
            u = torch.rand((n, width), generator=gen, device=x.device, dtype=torch.float32)[batch_rows]
            p = square_p(i, self.queries, self.p_init)
            if linf:
                new = self._propose_linf(grid, xa, best, lo, hi, u.to(x.dtype), p)
            else:
                new = self._propose_l2(grid, xa, best, u.to(x.dtype), p, cache)
            new_obj, new_fooled = self._score(model, new, ya)
            accept = self._better(new_fooled, new_obj, fooled, obj)
            if self.active_set:
                live = ~fooled  # fooled samples are frozen (they only ride along until the compaction)
                accept = accept & live
                queries.index_add_(0, batch_rows, live.long())
            else:
                queries.index_add_(0, batch_rows, torch.ones_like(batch_rows))
            best = torch.where(_rows(accept, best), new, best)
            obj = torch.where(accept, new_obj.to(obj.dtype), obj)
            fooled = torch.where(accept, new_fooled, fooled)
            if self.active_set and (i + 1) % self.check_every == 0 and i + 1 < self.queries:
                keep = ~fooled
                if not bool(keep.all()):  # the one host sync: compact the still-robust samples
                    out_x[pos], out_obj[pos], out_fooled[pos] = best, obj, fooled
                    if not bool(keep.any()):
                        pos = pos[:0]
                        break
                    pos, xa, ya, best, obj, fooled = pos[keep], xa[keep], ya[keep], best[keep], obj[keep], fooled[keep]
                    batch_rows = index[pos]
                    if linf:
                        lo, hi = lo[keep], hi[keep]
        if pos.numel():
            out_x[pos], out_obj[pos], out_fooled[pos] = best, obj, fooled
        return out_x, out_obj, out_fooled
