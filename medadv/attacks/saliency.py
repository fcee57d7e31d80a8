"""The shared loop of the explanation (saliency-map) attacks.

Both tests of Zhang et al. (Radiology: AI 2024) are optimisations of ``γ_s·L_map + γ_p·L_pred`` over an
L∞/L2 ball, differentiating the saliency map itself (double backprop, :mod:`medadv.explain`):

* relevance (:class:`~medadv.attacks.relevance.SaliencyRelevance`): move the map, keep the prediction;
* resistance (:class:`~medadv.attacks.resistance.SaliencyResistance`): flip the prediction, keep the map.

Gradients are taken on a softplus surrogate of the model when ``beta`` is set (ReLU networks have no
second-order signal); every iterate is then checked on the *original* model and the best admissible
input so far is kept (Ghorbani et al., AAAI 2019). The loop stays on the model's device with no host
synchronisation: best-so-far bookkeeping is done with ``torch.where``.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import torch
from torch import Tensor, nn

from ..explain import Explanation, beta_schedule, set_softplus_beta, softplus_surrogate
from ..explain.base import ClassScores, as_target
from ..metrics.saliency import compare_maps
from ..tasks import MultiClass, Segmentation, Task
from ..threats import Threat
from .base import Attack

__all__ = ["SaliencyAttack", "square_target", "REFERENCE_PIXELS"]

#: map size (512²) at which Zhang et al.'s prefactors were tuned; defaults are rescaled from it
REFERENCE_PIXELS = 512 * 512


def square_target(
    spatial: tuple[int, int], rows: tuple[int, int] = (130, 190), cols: tuple[int, int] = (380, 440), ref: int = 512,
) -> Tensor:
    """Zhang et al.'s target map: a square in the upper right, ``[130:190, 380:440]`` at 512², sum 1.

    The square's corners are scaled from the ``ref``×``ref`` grid to ``spatial`` = ``(H, W)``.
    """
    if len(spatial) != 2 or min(spatial) < 1:
        raise ValueError(f"`spatial` must be (H, W) with positive sizes, got {spatial}")
    h, w = spatial
    r0, r1 = (round(r * h / ref) for r in rows)
    c0, c1 = (round(c * w / ref) for c in cols)
    r1, c1 = max(r1, r0 + 1), max(c1, c0 + 1)
    t = torch.zeros(h, w)
    t[r0:r1, c0:c1] = 1.0
    return t / t.sum()


class SaliencyAttack(Attack):
    """Base class: Adam or signed steps on ``γ_s·L_map + γ_p·L_pred`` with best-so-far selection.

    Args:
        task: the model's task.
        threat: L∞/L2 ball and data bounds (data units).
        explanation: the attacked saliency method (:mod:`medadv.explain`).
        label: class/label whose map is attacked: an int, an ``(N,)`` tensor, or ``None`` (multi-class: the
            label ``y``; multi-label: the label with the highest clean logit; segmentation: the counted
            class with the highest mean logit).
        steps: iterations T.
        lr: Adam learning rate, or the step length for ``optimizer="sign"`` (data units).
        optimizer: ``"adam"`` (Dombrowski et al., Zhang et al.) or ``"sign"`` (Ghorbani et al.).
        prefactors: ``(γ_s, γ_p)``.
        beta: softplus surrogate for the gradients: ``None`` (differentiate the model as is), a number
            (fixed β) or ``(β_start, β_end)`` (geometric growth over the T steps).
        check_every: evaluate the current input on the original model every this many steps (and at
            the last step) for the best-so-far selection; each check costs one map computation.
        record_trace: keep the per-sample loss of every step, ``trace["loss"]`` ``(T, N)``.
        seed: unused by the deterministic methods; kept for the attack interface.
    """

    default_steps = 100

    def __init__(
        self,
        task: Task,
        threat: Threat,
        explanation: Explanation,
        *,
        label: int | Tensor | None = None,
        steps: int | None = None,
        lr: float = 2e-4,
        optimizer: str = "adam",
        prefactors: tuple[float, float] | None = None,
        beta: float | tuple[float, float] | None = None,
        check_every: int = 1,
        record_trace: bool = False,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        if threat is None:
            raise TypeError("`threat` is required (Linf or L2 with bounds, data units)")
        super().__init__(task, threat, targeted=targeted, seed=seed)
        if not isinstance(explanation, Explanation):
            raise TypeError(f"`explanation` must be a medadv.explain.Explanation, got {type(explanation).__name__}")
        self.explanation = explanation
        self.label = label
        self.steps = int(self._default_steps() if steps is None else steps)
        if self.steps < 1:
            raise ValueError(f"`steps` must be >= 1, got {steps}")
        if not float(lr) > 0:
            raise ValueError(f"`lr` must be > 0 (data units), got {lr}")
        self.lr = float(lr)
        if optimizer not in ("adam", "sign"):
            raise ValueError(f"`optimizer` must be 'adam' or 'sign', got {optimizer!r}")
        self.optimizer = optimizer
        if prefactors is not None:
            if len(prefactors) != 2 or any(float(p) < 0 for p in prefactors):
                raise ValueError(f"`prefactors` must be two numbers >= 0 (γ_s, γ_p), got {prefactors!r}")
            prefactors = (float(prefactors[0]), float(prefactors[1]))
        self.prefactors = prefactors
        if beta is not None:
            pair = beta if isinstance(beta, (tuple, list)) else (beta, beta)
            if len(pair) != 2 or not all(float(b) > 0 for b in pair):
                raise ValueError(f"`beta` must be None, a number > 0 or a (start, end) pair > 0, got {beta!r}")
            beta = (float(pair[0]), float(pair[1]))
        self.beta = beta
        if int(check_every) < 1:
            raise ValueError(f"`check_every` must be >= 1, got {check_every}")
        self.check_every = int(check_every)
        self.record_trace = bool(record_trace)
        self._check_settings()

    def _check_settings(self) -> None:
        """Test-specific validation of the constructor arguments (raise ValueError)."""

    # --- what differs between the two tests --------------------------------------------------------------
    def _default_steps(self) -> int:
        return self.default_steps

    @abstractmethod
    def _default_prefactors(self, pixels: int) -> tuple[float, float]:
        """(γ_s, γ_p) when the user gave none, for maps of ``pixels`` elements."""

    @abstractmethod
    def _setup(self, x: Tensor, y: Tensor, logits: Tensor, label: Tensor, map0: Tensor) -> dict[str, Any]:
        """Per-call constants (targets, masks) used by the losses and the check."""

    @abstractmethod
    def _losses(self, state: dict[str, Any], m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Per-sample ``(L_map, L_pred)`` on the surrogate's map and logits (both ``(N,)``)."""

    @abstractmethod
    def _check(self, state: dict[str, Any], m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """On the original model: ``(admissible (N,) bool, score (N,))``, lower score is better."""

    # --- helpers shared by the tests -------------------------------------------------------------------------
    def _labels(self, y: Tensor, logits: Tensor) -> Tensor:
        n = logits.shape[0]
        scores = ClassScores(nn.Identity())(logits)
        if self.label is not None:
            return as_target(self.label, n, logits.device, scores.shape[1])
        if isinstance(self.task, MultiClass):
            return y.long()
        if isinstance(self.task, Segmentation) and not self.task.include_background:
            return scores[:, 1:].argmax(dim=1) + 1
        return scores.argmax(dim=1)

    def _probs(self, logits: Tensor) -> Tensor:
        """Predicted distribution (softmax/sigmoid) for the prediction-preservation term."""
        p, _ = self.task.distributions(logits, self.task.predict(logits))
        return p

    # --- the loop ---------------------------------------------------------------------------------------------
    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor):
        expl = self.explanation
        label = self._labels(y, logits)
        map0 = expl.compute(model, x, label)
        pixels = map0[0].numel()
        g_s, g_p = self.prefactors or self._default_prefactors(pixels)
        state = self._setup(x, y, logits, label, map0)

        betas = None
        surrogate = model
        if self.beta is not None:
            betas = beta_schedule(self.beta[0], self.beta[1], self.steps)
            surrogate = softplus_surrogate(model, betas[0])

        shape = (-1,) + (1,) * (x.ndim - 1)
        ok0, score0 = self._check(state, map0, logits)
        best = x.clone()
        best_score = torch.where(ok0, score0, torch.full_like(score0, float("inf")))
        found = ok0.clone()

        delta = torch.zeros_like(x, requires_grad=True)
        opt = torch.optim.Adam([delta], lr=self.lr) if self.optimizer == "adam" else None
        trace: list[Tensor] = []
        for t in range(self.steps):
            if betas is not None:
                set_softplus_beta(surrogate, betas[t])
            with torch.enable_grad():
                x_adv = x + delta
                m = expl.compute(surrogate, x_adv, label, create_graph=True)
                l_map, l_pred = self._losses(state, m, surrogate(x_adv))
                loss = g_s * l_map + g_p * l_pred
                (g,) = torch.autograd.grad(loss.sum(), delta)
            if self.record_trace:
                trace.append(loss.detach())
            with torch.no_grad():
                if opt is not None:
                    delta.grad = g
                    opt.step()
                else:
                    delta.sub_(self.lr * self.threat.ascent_direction(g))
                delta.copy_(self.threat.finalize(x, x + delta) - x)
            if (t + 1) % self.check_every == 0 or t + 1 == self.steps:
                x_new = (x + delta).detach()
                with torch.no_grad():
                    logits_new = model(x_new)
                ok, score = self._check(state, expl.compute(model, x_new, label), logits_new)
                better = ok & (score < best_score)
                best = torch.where(better.reshape(shape), x_new, best)
                best_score = torch.where(better, score, best_score)
                found = found | ok

        # samples never admissible keep the last iterate (resistance: the closest attempt at a flip)
        last = self.threat.finalize(x, x + delta.detach())
        x_adv = torch.where(found.reshape(shape), best, last)
        with torch.no_grad():
            logits_adv = model(x_adv)
        map_adv = expl.compute(model, x_adv, label)
        extras = {
            "label": label,
            "map": map0,
            "map_adv": map_adv,
            "similarity": compare_maps(map0, map_adv),
            "admissible": found,
            "prefactors": (g_s, g_p),
            "logits_clean": logits,
        }
        extras.update(self._extras(state, map_adv, logits_adv))
        return x_adv, extras, ({"loss": torch.stack(trace)} if self.record_trace else None)

    def _extras(self, state: dict[str, Any], map_adv: Tensor, logits_adv: Tensor) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(explanation={self.explanation!r}, threat={self.threat!r}, steps={self.steps}, "
                f"lr={self.lr}, optimizer={self.optimizer!r}, beta={self.beta})")
