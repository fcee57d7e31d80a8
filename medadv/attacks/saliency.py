"""The explanation (saliency-map) attacks on the iterative engine.

Both tests of Zhang et al. (Radiology: AI 2024) are optimisations of ``γ_s·L_map + γ_p·L_pred`` over an
L∞/L2 ball, differentiating the saliency map itself (double backprop, :mod:`medadv.explain`):

* relevance (:class:`~medadv.attacks.relevance.SaliencyRelevance`): move the map, keep the prediction;
* resistance (:class:`~medadv.attacks.resistance.SaliencyResistance`): flip the prediction, keep the map.

They are hooks on :class:`~medadv.attacks.engine.IterativeAttack`: the objective (``−(γ_s·L_map +
γ_p·L_pred)``, ascended) is computed on a softplus surrogate of the model when ``softplus_beta`` is set
(ReLU networks have no second-order signal), with β set for each step from its schedule; the step rule
is Adam (:class:`~medadv.attacks.steps.AdamStep`, equal to ``torch.optim.Adam``) or the threat's signed
step; every ``check_every`` steps and at the end the iterate is assessed on the *original* model and the
best admissible one is kept (Ghorbani et al., AAAI 2019); samples never admissible keep the last iterate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..explain import Explanation, beta_schedule, get_explanation, set_softplus_beta, softplus_surrogate
from ..explain.base import ClassScores, as_target
from ..metrics.saliency import compare_maps
from ..params import (
    AnyOf,
    Bool,
    Component,
    Instance,
    Int,
    InvalidParameterError,
    Optional,
    Options,
    Pair,
    Real,
    renamed,
)
from ..tasks import Task
from ..threats import Threat
from .base import AttackDetails
from .engine import EngineOutput, IterativeAttack, StepContext
from .steps import AdamStep, StepRule, ThreatStep

__all__ = ["SaliencyAttack", "SaliencyDetails", "square_target", "REFERENCE_PIXELS", "EXPLANATION"]

#: map size (512²) at which Zhang et al.'s prefactors were tuned; defaults are rescaled from it
REFERENCE_PIXELS = 512 * 512

#: the declaration of an ``explanation`` argument: an instance, a registered name or a mapping
EXPLANATION = Component(
    Explanation, get_explanation,
    "a medadv Explanation, an explanation name ('gradient', 'gradient_x_input', 'integrated_gradients', "
    "'smoothgrad', 'gradcam'; not the evaluation-only 'guided_backprop', 'guided_gradcam', 'xrai') or a mapping "
    "{name: ..., **params}",
)


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


@dataclass
class SaliencyDetails(AttackDetails):
    """Typed results of the saliency attacks.

    Per-sample columns (copied into result rows): ``admissible`` (the returned input passed the attack's
    test on the original model: prediction kept for relevance, flipped for resistance) and the similarity
    of the clean and adversarial maps from :func:`~medadv.metrics.saliency.compare_maps`: ``map_ssim``
    (NaN for maps smaller than SSIM's 7-wide window), ``map_pearson``, ``map_spearman``, ``map_mse``,
    ``map_topk`` (top-k intersection, k = 5% of the map), ``map_com_shift``, ``map_jsd``.

    Attributes:
        label: ``(N,)`` the attacked class/label per sample.
        map, map_adv: clean and adversarial maps ``(N, *spatial)`` on the original model.
        similarity: the same similarities as a dict keyed by :func:`compare_maps` names.
        prefactors: the ``(γ_s, γ_p)`` used.
        logits_clean: the clean model output.
    """

    columns: ClassVar[tuple[str, ...]] = ("admissible", "map_ssim", "map_pearson", "map_spearman", "map_mse",
                                          "map_topk", "map_com_shift", "map_jsd")
    sample_fields: ClassVar[tuple[str, ...]] = ("label", "map", "map_adv", "similarity", "logits_clean")

    label: Tensor
    map: Tensor
    map_adv: Tensor
    admissible: Tensor
    map_ssim: Tensor
    map_pearson: Tensor
    map_spearman: Tensor
    map_mse: Tensor
    map_topk: Tensor
    map_com_shift: Tensor
    map_jsd: Tensor
    similarity: dict[str, Tensor]
    prefactors: tuple[float, float]
    logits_clean: Tensor

    @staticmethod
    def similarity_columns(map0: Tensor, map_adv: Tensor) -> dict[str, Any]:
        """``similarity`` and the per-sample ``map_*`` columns of two map batches."""
        sim = compare_maps(map0, map_adv)
        nan = torch.full((map0.shape[0],), float("nan"), device=map0.device, dtype=map0.dtype)
        cols = {f"map_{k}": sim.get(k, nan) for k in ("ssim", "pearson", "spearman", "mse", "topk", "com_shift", "jsd")}
        return {"similarity": sim, **cols}


class SaliencyAttack(IterativeAttack):
    """Base class: Adam or signed steps on ``γ_s·L_map + γ_p·L_pred`` with best-admissible selection.

    Args:
        task: the model's task.
        threat: L∞/L2 ball and data box (data units).
        explanation: the attacked saliency method: an :class:`~medadv.explain.Explanation`, a name
            (``"gradient"`` default, ``"gradient_x_input"``, ``"integrated_gradients"``, ``"smoothgrad"``,
            ``"gradcam"``) or a mapping ``{name: gradcam, layer: features.denseblock4}``. Evaluation-only
            explanations (``"guided_backprop"``, ``"guided_gradcam"``, ``"xrai"``: no input gradient) are refused with
            the differentiable one to attack instead; evaluate them on the attacked images (transfer).
        label: class/label whose map is attacked: an int, ``(N,)`` ints (tensor or list), or ``None`` (multi-class: the
            label ``y``; multi-label: the label with the highest clean logit; segmentation: the counted
            class with the highest mean logit).
        steps: iterations T (``None``: the attack's default).
        step_size: Adam learning rate, or the step length for ``optimizer="sign"``, in data units;
            default ``2e-4 × the box's data range`` (Zhang et al.'s 2e-4 on [0, 1] images; the relevance
            test uses ε/20 under L∞). Required where there is no default (an unbounded box). (Deprecated
            name: ``lr``.)
        optimizer: ``"adam"`` (Dombrowski et al., Zhang et al.) or ``"sign"`` (Ghorbani et al.).
        prefactors: ``(γ_s, γ_p)``; default per attack.
        softplus_beta: softplus surrogate for the gradients: ``None`` (differentiate the model as is), a
            number (fixed β) or ``(β_start, β_end)`` (geometric growth over the T steps). (Deprecated name:
            ``beta``.)
        check_every: assess the current input on the original model every this many steps (and at the
            last step and the end) for the best-admissible selection; each check costs one map computation.
        record_trace: keep the per-sample loss ``γ_s·L_map + γ_p·L_pred`` of every step,
            ``trace["loss"]`` ``(T, N)``.
        targeted: see the subclasses.
        seed: unused by the deterministic methods; kept for the attack interface.
    """

    params: ClassVar[dict[str, Any]] = {
        "explanation": EXPLANATION,
        "label": Optional(AnyOf(Int(low=0), Instance(Tensor, list, tuple, text="an (N,) tensor or list of class indices"))),
        "steps": Optional(Int(low=1)),
        "step_size": Optional(Real(low=0, low_open=True)),
        "optimizer": Options("adam", "sign"),
        "prefactors": Optional(Pair(Real(low=0))),
        "softplus_beta": Optional(Pair(Real(low=0, low_open=True), scalar_ok=True)),
        "check_every": Int(low=1),
        "record_trace": Bool(),
    }
    aliases: ClassVar[dict[str, str]] = {"lr": "step_size", "beta": "softplus_beta"}
    keep_best = True
    fallback = "last"
    trace_key = "objective"

    #: default T
    default_steps: ClassVar[int] = 100
    #: default step size as a fraction of the box's data range (Zhang et al.'s Adam lr 2e-4 on [0, 1] data)
    step_size_fraction: ClassVar[float] = 2e-4

    #: the relevance test has no targeted form (its constructor has no ``targeted``)
    targeted: bool = False
    explanation: Explanation
    label: int | Tensor | Sequence[int] | None
    step_size: float | None
    optimizer: str
    prefactors: tuple[float, float] | None
    softplus_beta: tuple[float, float] | None

    @renamed(lr="step_size", beta="softplus_beta")
    def __init__(
        self,
        task: Task,
        threat: Threat,
        explanation: Explanation | str | dict[str, Any] = "gradient",
        *,
        label: int | Tensor | Sequence[int] | None = None,
        steps: int | None = None,
        step_size: float | None = None,
        optimizer: str = "adam",
        prefactors: tuple[float, float] | None = None,
        softplus_beta: float | tuple[float, float] | None = None,
        check_every: int = 1,
        record_trace: bool = False,
        targeted: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        # the attacks differentiate the map w.r.t. the input: evaluation-only maps are refused here, by name
        self.explanation.require_differentiable(type(self).__name__)
        if step_size is None and self._default_step_size() is None:
            raise InvalidParameterError(
                f"`step_size` of {type(self).__name__} is required for an unbounded data box (its default is "
                f"{self.step_size_fraction:g} × the box's data range)")
        self._check_settings()

    # `steps=None` means the attack's default, resolved when read (it may depend on the explanation)
    @property
    def steps(self) -> int:
        given = getattr(self, "_steps", None)
        return self._default_steps() if given is None else given

    @steps.setter
    def steps(self, value: int | None) -> None:
        self._steps = value

    def get_params(self) -> dict[str, Any]:
        # ``steps`` as given (None: the default), so set_params(explanation=...) re-resolves it
        return {**super().get_params(), "steps": getattr(self, "_steps", None)}

    @property
    def alpha(self) -> float:
        """The step length (Adam learning rate) in data units: ``step_size`` or the attack's default."""
        if self.step_size is not None:
            return self.step_size
        default = self._default_step_size()
        assert default is not None  # refused in __init__
        return default

    def _default_step_size(self) -> float | None:
        """The step size when none is given (data units), ``None`` if there is none (unbounded box)."""
        if not (self.box.bounded and math.isfinite(self.box.data_range())):
            return None
        return self.step_size_fraction * self.box.data_range()

    def _check_settings(self) -> None:
        """Test-specific validation of combinations of arguments (raise ValueError)."""

    # --- what differs between the two tests --------------------------------------------------------------
    def _default_steps(self) -> int:
        return self.default_steps

    def _default_prefactors(self, pixels: int) -> tuple[float, float]:
        """(γ_s, γ_p) when the user gave none, for maps of ``pixels`` elements."""
        raise NotImplementedError

    def _setup(self, ctx: StepContext, label: Tensor, map0: Tensor) -> None:
        """Per-call constants (targets, masks): per-sample tensors into ``ctx.state``, others into ``ctx.shared``."""

    def _step_setup(self, surrogate: nn.Module, ctx: StepContext) -> None:
        """Per-step constants that depend on the surrogate's current β (into ``ctx.state``); default none."""

    def _losses(self, ctx: StepContext, m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Per-sample ``(L_map, L_pred)`` on the surrogate's map and logits (both ``(n,)``)."""
        raise NotImplementedError

    def _check(self, ctx: StepContext, m: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """On the original model: ``(admissible (n,) bool, criterion (n,))``, lower criterion is better."""
        raise NotImplementedError

    def _details(self, out: EngineOutput, common: dict[str, Any], logits_adv: Tensor) -> SaliencyDetails:
        """The attack's typed results, from the shared fields ``common``."""
        return SaliencyDetails(**common)

    # --- helpers shared by the tests -------------------------------------------------------------------------
    def _labels(self, y: Tensor, logits: Tensor) -> Tensor:
        n = logits.shape[0]
        scores = ClassScores(nn.Identity())(logits)
        if self.label is not None:
            return as_target(self.label, n, logits.device, scores.shape[1])
        return self.task.explained_class(y, scores)

    def _probs(self, logits: Tensor) -> Tensor:
        """Predicted distribution (softmax/sigmoid) for the prediction-preservation term."""
        p, _ = self.task.distributions(logits, self.task.predict(logits))
        return p

    # --- engine hooks ------------------------------------------------------------------------------------------
    def setup(self, model: nn.Module, ctx: StepContext) -> None:
        assert ctx.clean_logits is not None  # needs_clean_logits
        label = self._labels(ctx.y, ctx.clean_logits)
        map0 = self.explanation.map(model, ctx.x, label)
        ctx.state.update(label=label, map0=map0)
        ctx.shared["prefactors"] = self.prefactors or self._default_prefactors(map0[0].numel())
        if self.softplus_beta is None:
            ctx.shared["surrogate"], ctx.shared["betas"] = model, None
        else:
            betas = beta_schedule(self.softplus_beta[0], self.softplus_beta[1], self.steps)
            ctx.shared["surrogate"], ctx.shared["betas"] = softplus_surrogate(model, betas[0]), betas
        self._setup(ctx, label, map0)

    def step_rule(self) -> StepRule:
        if self.optimizer == "adam":
            return AdamStep(self.alpha)
        assert self.threat is not None
        return ThreatStep(self.threat, self.alpha)

    def objective(self, model: nn.Module, v: Tensor, ctx: StepContext) -> tuple[Tensor, Tensor]:
        """``−(γ_s·L_map + γ_p·L_pred)`` on the surrogate (β of step ``ctx.step``), and its logits."""
        surrogate, betas = ctx.shared["surrogate"], ctx.shared["betas"]
        if betas is not None:
            set_softplus_beta(surrogate, betas[ctx.step])
        self._step_setup(surrogate, ctx)
        m = self.explanation.map(surrogate, v, ctx.state["label"], create_graph=True)
        logits = self.forward(surrogate, v)
        l_map, l_pred = self._losses(ctx, m, logits)
        g_s, g_p = ctx.shared["prefactors"]
        return -(g_s * l_map + g_p * l_pred), logits

    def logits_objective(self, logits: Tensor, ctx: StepContext) -> Tensor:
        # the objective needs the map, not only the output: never used for selection here (assess is)
        return logits.new_zeros(logits.shape[0])

    def assess(self, model: nn.Module, v: Tensor, logits: Tensor, objective: Tensor,
               ctx: StepContext) -> tuple[Tensor, Tensor]:
        """The attack's test on the *original* model (its output and map at ``v``); score = −criterion."""
        # in the step loop ``logits`` are the surrogate's; the final assessment (step -1) passes the model's
        logits = logits if ctx.step < 0 else self.forward(model, v)
        m = self.explanation.map(model, v, ctx.state["label"])
        ok, criterion = self._check(ctx, m, logits)
        return ok, -criterion.float()

    def details(self, model: nn.Module, out: EngineOutput) -> SaliencyDetails:
        ctx = out.ctx
        label, map0 = ctx.state["label"], ctx.state["map0"]
        with torch.no_grad():
            logits_adv = self.forward(model, out.x_adv)
        map_adv = self.explanation.map(model, out.x_adv, label)
        assert ctx.clean_logits is not None
        common = dict(label=label, map=map0, map_adv=map_adv, admissible=out.admissible,
                      prefactors=ctx.shared["prefactors"], logits_clean=ctx.clean_logits,
                      **SaliencyDetails.similarity_columns(map0, map_adv))
        return self._details(out, common, logits_adv)

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any):
        x_adv, details, trace = super().perturb(model, x, y, logits, **call_args)
        # the engine records the ascended objective; report the minimised loss γ_s·L_map + γ_p·L_pred
        return x_adv, details, (None if trace is None else {"loss": -trace[self.trace_key]})
