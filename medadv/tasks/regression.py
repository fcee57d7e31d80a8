"""Regression, one or several targets per sample or dense maps: :class:`Regression`.

The model outputs numbers in the target's own units (a tissue volume fraction, a landmark coordinate in mm, an
age in years, a per-pixel value map): ``(N, K)`` or ``(N, K, *spatial)``, and ``y`` has the same shape. The
element grid is the output itself, so every per-element attack objective (the task's loss, CosPGD/SegPGD-style
weightings where they make sense, APGD) reads one value per output.

What "fooled" means for a regression model is a *tolerance* in the target's units (absolute), or a fraction of
the true value (``relative=True``): an untargeted attack succeeds when some output leaves the tolerance around
``y`` (the true values; the clean prediction when an attack is called with ``y=None``), a targeted one when every
output is within the tolerance of the target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Outcome, Task, TaskExample, _check_finite, register_task, tiny_net

__all__ = ["Regression"]

_LOSSES = ("mse", "l1", "huber")
_OUTPUTS = 2  # targets of the examples' regressors
_TINY = 1e-12


def _no_classes(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"Regression outputs are values, not class scores: {what} has no meaning for them, so attacks, losses and "
        "defenses built on class distributions (CosPGD, APGD's 'js'/'cospgd' losses, saliency attacks on class "
        "probabilities, GAP's least-likely target, TRADES/MAAdvT's KL terms) do not apply. Use PGD, FGSM, BIM, "
        "SegPGD or APGD (loss 'ce' = the regression loss, 'margin' = tolerance − |error|, 'signed-up' / "
        "'signed-down' = the signed error) or `auto`")


@register_task("regression")
class Regression(Task):
    """Regression of one or several values per sample ``(N, K)``, or dense value maps ``(N, K, *spatial)``.

    Args:
        loss: the per-element loss in target units: ``"mse"`` (squared error), ``"l1"`` (absolute error) or
            ``"huber"`` (quadratic within ``huber_delta`` of the target, linear beyond; Huber 1964).
        tolerance: how far an output may be from its target and still count as right (``> 0``): in the target's
            units, or with ``relative=True`` a fraction of ``|y|`` (0.1: within 10 % of the true value).
        relative: read ``tolerance`` relative to ``|y|`` per output (a target of exactly 0 then tolerates no error).
        huber_delta: the Huber loss's transition point, in target units (``> 0``).

    Labels ``y`` are floats shaped like the output. ``fooled``: untargeted — some output is farther than the
    tolerance from ``y``; targeted — every output is within the tolerance of the target ``y``.

    Metrics per sample (``outcome``): ``mae`` (mean absolute error, target units; the headline, lower is better),
    ``rmse``, ``max_error`` (the largest absolute error of any output), ``within`` (every output within the
    tolerance: not fooled), ``closeness`` (the robust metric, below) and, for ``(N, K)`` outputs, ``pred``.
    Result rows add ``induced_error``: the largest change of any output between the clean and the attacked
    prediction (target units), whatever ``y`` is.

    Robust metric ``closeness = 1 / (1 + r)``, ``r = max_k |pred_k − y_k| / τ_k`` the largest error in tolerance
    units: 1 for an exact prediction, 0.5 at the tolerance (below 0.5 exactly when fooled), towards 0 as the error
    grows. It is higher-is-better and minimised by the worst case as medadv requires, and graded beyond the
    tolerance, so ``auto`` keeps searching for the largest deviation instead of stopping at the first output
    that leaves the tolerance (a 0/1 "within tolerance" metric would stop there); its floor 0 is reached only at
    an infinite error, so no sample leaves ``auto``'s active set early. A monotone map of the largest error, it
    orders samples and iterates exactly as the largest error in tolerance units does, but stays bounded, so
    means, the unbounded-attack check and the report read it like accuracy or Dice.
    """

    name = "regression"
    traits = Task.traits.but(
        outputs={"outputs_are_logits": False, "class_scores": False},
        labels={"label_source": "values"},
        metrics={"headline": "mae", "higher_is_better": False, "robust_metric_name": "closeness",
                 "robust_metric_column": "closeness", "tiebreak_column": "max_error", "metric_floor": 0.0,
                 # an L∞ ball as wide as the data range drives the mean closeness below 0.25 (typical error ≥ 3
                 # tolerances)
                 "unbounded_tolerance": 0.25},
        # ``auto``: APGD on the loss, APGD on the signed error (up and down, on the mean and on each of the
        # ``targets`` outputs with the largest clean error), Square on the largest error; ``apgd-margin`` on request
        attacks={"auto_members": ("apgd-ce", "apgd-signed", "apgd-margin", "square"),
                 "auto_versions": {
                     "standard": {"attacks": ("apgd-ce", "apgd-signed", "square"), "steps": 100, "targets": 3,
                                  "queries": 1000, "square_loss": "min-margin"},
                     "fast": {"attacks": ("apgd-ce", "apgd-signed"), "steps": 20, "targets": 1, "queries": 200,
                              "square_loss": "min-margin"}}},
        # the report draws the largest error clean vs attacked, one dot per case (the error scatter)
        report={"title": "regression (values per sample or dense value maps)",
                "shapes": "outputs (N, K) or (N, K, *spatial); y the same shape, floats in the target's units",
                "case_view": "values", "classwise_view": None, "scatter_columns": ("max_error",)},
        toolkits={"adapters": frozenset({"art"})},  # ART's regressor wrapper (adapters.art_regression)
    )

    def __init__(self, loss: str = "mse", tolerance: float = 0.1, relative: bool = False,
                 huber_delta: float = 1.0) -> None:
        if loss not in _LOSSES:
            raise ValueError(f"`loss` must be one of {', '.join(map(repr, _LOSSES))}, got {loss!r}")
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not float(tolerance) > 0 \
                or float(tolerance) == float("inf"):
            raise ValueError(f"`tolerance` must be a finite number > 0 (target units, or a fraction of |y| with "
                             f"relative=True), got {tolerance!r}")
        if not isinstance(relative, bool):
            raise TypeError(f"`relative` must be True or False, got {relative!r}")
        if isinstance(huber_delta, bool) or not isinstance(huber_delta, int | float) or not float(huber_delta) > 0:
            raise ValueError(f"`huber_delta` must be a number > 0 (target units), got {huber_delta!r}")
        self.loss_name = loss
        self.tolerance = float(tolerance)
        self.relative = relative
        self.huber_delta = float(huber_delta)

    # --- validation -------------------------------------------------------------------------------------------------
    def validate_logits(self, logits: Tensor) -> None:
        if logits.ndim < 2 or not logits.is_floating_point():
            raise ValueError("model output must be floating (N, K) values or (N, K, *spatial) value maps for "
                             f"Regression, got shape {tuple(logits.shape)} dtype {logits.dtype} (a model with one "
                             "output per sample returns (N, 1), not (N,))")
        _check_finite("model output", logits)

    def validate_labels(self, logits: Tensor, y: Tensor, name: str = "y") -> None:
        if not y.is_floating_point():
            raise TypeError(f"`{name}` must hold floating target values for Regression, got dtype {y.dtype}")
        if tuple(y.shape) != tuple(logits.shape):
            raise ValueError(f"`{name}` must have the model output's shape {tuple(logits.shape)} for Regression, "
                             f"got {tuple(y.shape)}")
        _check_finite(name, y)

    # --- core quantities --------------------------------------------------------------------------------------------
    def error(self, logits: Tensor, y: Tensor) -> Tensor:
        """The signed error ``pred − y`` per output (target units), element-grid shaped."""
        return logits - y.to(logits.dtype)

    def signed_error(self, logits: Tensor, y: Tensor) -> Tensor:
        """``pred − y`` per output: APGD's ``signed-up`` loss ascends its mean, ``signed-down`` descends it (the
        signed error of ``auto``'s ``apgd-signed`` member; linear in the output, so its gradient does not vanish
        where the squared or absolute error does, at ``pred = y``)."""
        return self.error(logits, y)

    def tolerances(self, y: Tensor, like: Tensor | None = None) -> Tensor:
        """The tolerance τ per output (target units): ``tolerance``, or ``tolerance · |y|`` when relative."""
        dtype = like.dtype if like is not None else (y.dtype if y.is_floating_point() else torch.float32)
        tol = min(self.tolerance, torch.finfo(dtype).max)  # e.g. 1e308 in fp32: its max, not inf (inf * 0 is NaN)
        if self.relative:
            return (tol * y.to(dtype).abs()).clamp_min(_TINY)
        return torch.full_like(y, tol, dtype=dtype)

    def element_loss(self, logits: Tensor, y: Tensor) -> Tensor:
        t = y.to(logits.dtype)
        if self.loss_name == "mse":
            return F.mse_loss(logits, t, reduction="none")
        if self.loss_name == "l1":
            return F.l1_loss(logits, t, reduction="none")
        return F.huber_loss(logits, t, reduction="none", delta=self.huber_delta)

    def element_margin(self, logits: Tensor, y: Tensor) -> Tensor:
        """``τ − |pred − y|`` per output (target units): positive within the tolerance, negative outside it."""
        return self.tolerances(y, logits) - self.error(logits, y).abs()

    def predict(self, logits: Tensor) -> Tensor:
        """The output values themselves (a regression model's prediction is its output)."""
        return logits

    def distributions(self, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        raise _no_classes("a predicted class distribution (Task.distributions)")

    def log_probs(self, logits: Tensor) -> Tensor:
        raise _no_classes("a log-probability (Task.log_probs)")

    def target_cosine(self, logits: Tensor, y: Tensor) -> Tensor:
        raise _no_classes("the cosine of class distributions (CosPGD's weight, Task.target_cosine)")

    def least_likely(self, logits: Tensor) -> Tensor:
        raise _no_classes("a least-likely label (Task.least_likely)")

    def element_correct(self, logits: Tensor, y: Tensor) -> Tensor:
        """Boolean element grid: the output is within the tolerance of ``y``."""
        return self.error(logits, y).abs() <= self.tolerances(y, logits)

    def _normalised(self, pred: Tensor, y: Tensor) -> Tensor:
        """``(N,)`` the largest error in tolerance units, ``max_k |pred_k − y_k| / τ_k``."""
        r = self.error(pred, y).abs() / self.tolerances(y, pred)
        return r.reshape(r.shape[0], -1).amax(dim=1)

    def fooled(self, logits: Tensor, y: Tensor, targeted: bool = False) -> Tensor:
        return self.decide(logits, y, targeted)[1]

    def decide(self, logits: Tensor, y: Tensor, targeted: bool = False) -> tuple[Tensor, Tensor]:
        within = self.element_correct(logits, y).reshape(logits.shape[0], -1).all(dim=1)
        return logits, (within if targeted else ~within)

    def metrics(self, logits: Tensor, y: Tensor) -> dict[str, Tensor]:
        return dict(self.outcome(logits, y).columns)

    def outcome(self, logits: Tensor, y: Tensor, pred: Tensor | None = None) -> Outcome:
        pred = logits if pred is None else pred
        err = self.error(pred, y).abs()
        flat = err.reshape(err.shape[0], -1)
        r = (err / self.tolerances(y, pred)).reshape(err.shape[0], -1).amax(dim=1)
        within = r <= 1.0
        cols: dict[str, Tensor] = {"mae": flat.mean(dim=1), "rmse": flat.square().mean(dim=1).sqrt(),
                                   "max_error": flat.amax(dim=1), "within": within, "closeness": 1.0 / (1.0 + r)}
        if pred.ndim == 2:  # dense maps are not stored per row
            cols["pred"] = pred
        return Outcome(pred, ~within, cols)

    def sample_columns(self, y: Tensor, clean: Outcome, adv: Outcome) -> dict[str, Tensor]:
        induced = (adv.pred - clean.pred).abs().reshape(y.shape[0], -1).amax(dim=1)
        cols = {"changed": self.changed(clean.pred, adv.pred, y), **self._paired_columns(clean, adv),
                "induced_error": induced}
        if y.ndim == 2:
            cols = {"label": y, **cols}
        return cols

    def changed(self, clean_pred: Tensor, adv_pred: Tensor, y: Tensor) -> Tensor:
        """``(N,)`` bool: some output moved by more than its tolerance from the clean prediction (a float output
        always moves a little; only a move the tolerance notices counts)."""
        moved = (adv_pred - clean_pred).abs() > self.tolerances(y, adv_pred)
        return moved.reshape(moved.shape[0], -1).any(dim=1)

    def robust_metric(self, logits: Tensor, y: Tensor) -> Tensor:
        """``(N,)`` closeness ``1 / (1 + max_k |pred_k − y_k| / τ_k)`` (see the class docstring)."""
        return (1.0 / (1.0 + self._normalised(logits, y))).to(torch.float32)

    def to_target(self, y: Tensor, logits: Tensor) -> Tensor:
        return y.to(logits.dtype) if y.is_floating_point() else y

    # --- hooks (see Task) -------------------------------------------------------------------------------------------
    def parse_labels(self, y: Tensor, x: Tensor) -> Tensor:
        """Floats; a loader's ``(N,)`` column of single values becomes ``(N, 1)`` (one output per sample)."""
        if not y.is_floating_point():
            y = y.to(torch.float32)
        return y.unsqueeze(1) if y.ndim == 1 else y

    def change_fraction(self, clean_pred: Tensor, adv_pred: Tensor) -> Tensor:
        """``(N,)`` the largest change of any output, in units of ``tolerance`` (relative tolerances: of the clean
        value), so a report picks the cases the attack moved most."""
        scale = (self.tolerance * clean_pred.abs()).clamp_min(_TINY) if self.relative else self.tolerance
        d = (adv_pred - clean_pred).abs() / scale
        return d.reshape(d.shape[0], -1).amax(dim=1).double()

    def outcome_of_pred(self, pred: Tensor, y: Tensor) -> Outcome | None:
        return self.outcome(pred, y, pred)  # the prediction is the output

    def case_note(self, y: Tensor, clean_pred: Tensor, adv_pred: Tensor) -> str:
        e0 = float((clean_pred - y).abs().max())
        e1 = float((adv_pred - y).abs().max())
        moved = float((adv_pred - clean_pred).abs().max())
        return f"largest error {e0:.3g} → {e1:.3g} · output moved by {moved:.3g} (tolerance {self._tol_text()})"

    def _tol_text(self) -> str:
        return f"{100 * self.tolerance:g}% of |y|" if self.relative else f"{self.tolerance:g}"

    def num_groups(self, logits: Tensor) -> int:
        return int(logits.shape[1])

    @classmethod
    def examples(cls, seed: int = 0) -> list[TaskExample]:
        """A 2-D regressor with two outputs per sample (e.g. two tissue fractions) and a dense 3-D one (one value
        per voxel); targets are the labels shifted by twice the tolerance."""
        g = torch.Generator().manual_seed(seed)
        x2 = torch.rand(3, 1, 8, 8, generator=g)
        x3 = torch.rand(3, 1, 8, 8, 8, generator=g)
        net2 = tiny_net(1, _OUTPUTS, 2, dense=False, seed=seed)
        net3 = tiny_net(1, 1, 3, dense=True, seed=seed)
        with torch.no_grad():
            y2 = net2(x2) + 0.05 * torch.randn(3, _OUTPUTS, generator=g)
            y3 = net3(x3) + 0.05 * torch.randn(3, 1, 8, 8, 8, generator=g)
        task = cls(tolerance=0.1)
        return [TaskExample("regression", task, net2, x2, y2, target=y2 + 0.2),
                TaskExample("regression3d", task, net3, x3, y3, target=y3 + 0.2)]

    def __repr__(self) -> str:
        return (f"Regression(loss={self.loss_name!r}, tolerance={self.tolerance:g}"
                + (", relative=True" if self.relative else "")
                + (f", huber_delta={self.huber_delta:g}" if self.loss_name == "huber" else "") + ")")
