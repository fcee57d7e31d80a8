"""The explanation interface: a differentiable saliency map of one output class per sample.

An :class:`Explanation` maps ``(model, x, target)`` to a raw attribution (same shape as ``x``, or a
layer map for Grad-CAM) and, through :meth:`Explanation.__call__`, to a saliency map ``(N, *spatial)``
post-processed as in Zhang et al. (2023) and Dombrowski et al. (2019): absolute value, summed over
input channels, L1-normalised so that each sample's map sums to 1.

Targets name the output whose map is wanted: the class (multi-class), the label (multi-label) or the
segmentation class. Segmentation outputs ``(N, C, *spatial)`` are reduced to one score per class, the
spatial mean of that class's logits, so the map of class ``c`` explains "how much of the volume looks
like ``c``".

``create_graph=True`` keeps the autograd graph of the map, so a loss on the map can be back-propagated
to the input (double backpropagation). Attacks need it; evaluation does not.

The entry points (:meth:`Explanation.__call__`, :meth:`Explanation.compute`, :func:`class_maps`) run
the model the way attacks do: eval mode, parameters frozen, both restored afterwards
(:func:`~medadv.runtime.attack_mode`), so a map of a model in training mode neither updates its
BatchNorm statistics nor applies dropout.

Explanations are small :class:`~medadv.params.Configurable` objects registered by name, so configs can
say ``explanation: gradcam`` or ``{name: gradcam, layer: features.denseblock4}``
(:func:`get_explanation`, :func:`available_explanations`).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import Configurable, Constraint, InvalidParameterError, closest
from ..runtime import attack_mode, check_input, check_model, unbatched_hint

__all__ = [
    "Explanation",
    "ClassScores",
    "normalize_map",
    "class_maps",
    "as_target",
    "register_explanation",
    "explanation_class",
    "get_explanation",
    "available_explanations",
    "LayerName",
]

TargetLike = int | Sequence[int] | Tensor


class ClassScores(nn.Module):
    """Wraps a model so that it returns one score per class ``(N, C)``.

    Classifier logits pass through unchanged; segmentation logits ``(N, C, *spatial)`` are averaged
    over the spatial dims. Layers of the wrapped model stay reachable (Grad-CAM hooks them).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        out = self.model(x)
        if not isinstance(out, Tensor):
            raise TypeError(f"the model must return a tensor of logits, got {type(out).__name__}")
        return out if out.ndim == 2 else out.flatten(2).mean(dim=2)


def normalize_map(attr: Tensor, channel_dim: bool = True) -> Tensor:
    """abs → sum over channels (dim 1, if ``channel_dim``) → divide by the per-sample sum.

    All-zero maps stay all-zero (no division by zero).
    """
    m = attr.abs()
    if channel_dim:
        m = m.sum(dim=1)
    total = m.flatten(1).sum(dim=1).reshape(-1, *([1] * (m.ndim - 1)))
    return m / total.clamp_min(torch.finfo(m.dtype).tiny)


def as_target(target: TargetLike, n: int, device: torch.device, num_classes: int | None = None) -> Tensor:
    """Validate ``target`` (int or ``(N,)`` ints) and return it as an ``(N,)`` int64 tensor on ``device``."""
    if isinstance(target, bool):
        raise TypeError("`target` must be an int or a sequence/tensor of ints, got bool")
    if isinstance(target, int):
        t = torch.full((n,), target, dtype=torch.long, device=device)
    elif isinstance(target, Tensor):
        if target.is_floating_point() or target.dtype == torch.bool:
            raise TypeError(f"`target` must hold integer class indices, got dtype {target.dtype}")
        t = target.reshape(-1).to(device=device, dtype=torch.long) if target.ndim <= 1 else target
        if t.ndim != 1 or (t.numel() not in (1, n)):
            raise ValueError(f"`target` must be an int or have shape ({n},), got {tuple(target.shape)}")
        t = t.expand(n) if t.numel() == 1 else t
    elif isinstance(target, Sequence):
        return as_target(torch.as_tensor(list(target)), n, device, num_classes)
    else:
        raise TypeError(f"`target` must be an int or a sequence/tensor of ints, got {type(target).__name__}")
    if t.numel() and int(t.min()) < 0:
        raise ValueError("`target` must be >= 0")
    if num_classes is not None and t.numel() and int(t.max()) >= num_classes:
        raise ValueError(f"`target` must be < {num_classes} (the model's number of outputs), got {int(t.max())}")
    return t.clone()


class LayerName(Constraint):
    """A non-empty dotted submodule name (``model.named_modules()``), e.g. ``"features.denseblock4"``."""

    def describe(self) -> str:
        return "a non-empty submodule name (str, as in model.named_modules())"

    def convert(self, value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError
        if not value:
            raise ValueError
        return value


class Explanation(Configurable, ABC):
    """Base class of the differentiable saliency methods.

    Subclasses implement :meth:`attribute` and declare their constructor arguments in ``params``
    (:mod:`medadv.params`). Call the object to get normalised maps with validation; attacks, which
    already hold the model in attack mode, use :meth:`map` inside their loops (no validation, no mode
    switching, no host synchronisation).
    """

    #: registry name (``get_explanation(name)``); set by :func:`register_explanation`
    name: ClassVar[str] = "explanation"
    #: whether the map can be differentiated w.r.t. the input (``create_graph=True``), as the saliency
    #: attacks need; ``False`` marks an evaluation-only explanation (see :meth:`require_differentiable`)
    differentiable: ClassVar[bool] = True
    #: evaluation-only explanations: why their map has no usable input gradient
    not_differentiable_because: ClassVar[str] = ""
    #: evaluation-only explanations: the differentiable explanation to attack instead (its registry name)
    attack_instead: ClassVar[str] = ""

    @abstractmethod
    def attribute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        """Raw attribution for ``target`` (``(N,)`` int64): same shape as ``x`` unless stated otherwise."""

    @classmethod
    def require_differentiable(cls, who: str = "this call") -> None:
        """Raise :class:`~medadv.params.InvalidParameterError` if the map cannot be differentiated.

        Attacks call it with their own name (``who``); the message says why the map has no input gradient
        and which explanation to attack instead (the evaluation-only map is then evaluated on the attacked
        images, by transfer, as Zhang et al. evaluate Guided Grad-CAM).
        """
        if cls.differentiable:
            return
        instead = cls.attack_instead
        raise InvalidParameterError(
            f"explanation {cls.name!r} is evaluation-only: {cls.not_differentiable_because}. {who} needs a map "
            f"it can differentiate w.r.t. the input; attack {instead!r} instead and evaluate {cls.name!r} on the "
            f"attacked images (transfer)")

    def map(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        """Normalised map ``(N, *spatial)`` with the model as it is (for attack loops: no checks, no mode change).

        The caller is responsible for the model's mode; :meth:`compute` and :meth:`__call__` put it in
        attack mode first. ``create_graph=True`` is refused for evaluation-only explanations
        (:attr:`differentiable` False).
        """
        if create_graph:
            self.require_differentiable("create_graph=True")
        if not x.requires_grad:
            # a fresh leaf that shares storage: the caller's tensor keeps its requires_grad flag
            x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            attr = self.attribute(model, x, target, create_graph=create_graph)
        m = normalize_map(attr, channel_dim=True)
        return m if create_graph else m.detach()

    def compute(self, model: nn.Module, x: Tensor, target: Tensor, *, create_graph: bool = False) -> Tensor:
        """Normalised map ``(N, *spatial)`` of ``target`` (``(N,)`` int64) without input checks.

        The model runs in eval mode with frozen parameters; its modes and ``requires_grad`` flags are
        restored afterwards.
        """
        with attack_mode(model):
            return self.map(model, x, target, create_graph=create_graph)

    def __call__(self, model: nn.Module, x: Tensor, target: TargetLike, *, create_graph: bool = False) -> Tensor:
        """Saliency map ``(N, *spatial)`` of ``target`` for ``x``: non-negative, each sample sums to 1.

        The model runs in eval mode with frozen parameters (restored afterwards), like an attack.

        Args:
            model: the network (classifier ``(N, C)`` or segmenter ``(N, C, *spatial)`` logits).
            x: input batch ``(N, C_in, *spatial)``, floating point, finite.
            target: class/label index per sample (int or ``(N,)`` ints).
            create_graph: keep the graph so that the map is differentiable w.r.t. ``x``.
        """
        _check_model_and_input(model, x)
        with attack_mode(model):
            with torch.no_grad():
                num_classes = ClassScores(model)(x[:1]).shape[1]
            t = as_target(target, x.shape[0], x.device, num_classes)
            return self.map(model, x, t, create_graph=create_graph)

    def config(self) -> dict[str, Any]:
        """``{"name": ..., **get_params()}``: what :func:`get_explanation` rebuilds this explanation from."""
        return {"name": self.name, **self.get_params()}


def _check_model_and_input(model: Any, x: Any) -> None:
    # the same checks and messages as attacks: meta tensors/models, batch-first inputs, finite values
    check_model(model)
    check_input(x)
    hint = unbatched_hint(model, x)
    if hint is not None:
        raise ValueError(hint)


def class_maps(
    explanation: Explanation, model: nn.Module, x: Tensor, classes: Sequence[int] | None = None,
    *, create_graph: bool = False,
) -> Tensor:
    """Maps of several classes/labels at once, ``(N, K, *spatial)``.

    Per-label maps of a multi-label model, or per-class maps of a segmentation model. ``classes``
    defaults to every output of the model. The model runs in attack mode (eval, frozen; restored).
    """
    if not isinstance(explanation, Explanation):
        raise TypeError(f"`explanation` must be a medadv Explanation, got {type(explanation).__name__}")
    _check_model_and_input(model, x)
    with attack_mode(model):
        with torch.no_grad():
            num_classes = ClassScores(model)(x[:1]).shape[1]
        classes = list(range(num_classes)) if classes is None else list(classes)
        if not classes:
            raise ValueError("`classes` must name at least one class")
        return torch.stack(
            [explanation(model, x, int(c), create_graph=create_graph) for c in classes], dim=1
        )


# --- registry: names used by configs --------------------------------------------------------------------------
_REGISTRY: dict[str, type[Explanation]] = {}


def register_explanation(name: str) -> Callable[[type[Explanation]], type[Explanation]]:
    """Class decorator: make an explanation constructible by name (:func:`get_explanation`)."""

    def deco(cls: type[Explanation]) -> type[Explanation]:
        key = name.lower()
        if key in _REGISTRY and _REGISTRY[key] is not cls:
            raise ValueError(f"explanation name {name!r} is already registered to {_REGISTRY[key].__name__}")
        _REGISTRY[key] = cls
        cls.name = key
        return cls

    return deco


def available_explanations() -> list[str]:
    """Registered explanation names (``"gradient"``, ``"gradcam"``, ...)."""
    return sorted(_REGISTRY)


def explanation_class(name: str) -> type[Explanation]:
    """The registered class for ``name`` (case-insensitive; unknown names get the closest one)."""
    if not isinstance(name, str):
        raise InvalidParameterError(f"an explanation name must be a string, got {type(name).__name__}")
    key = name.lower()
    if key not in _REGISTRY:
        c = closest(key, _REGISTRY)
        hint = f"; did you mean {c!r}?" if c else ""
        raise InvalidParameterError(
            f"unknown explanation {name!r}{hint or ';'} available: {', '.join(available_explanations())}")
    return _REGISTRY[key]


def get_explanation(spec: str | Mapping[str, Any] | Explanation, **params: Any) -> Explanation:
    """Build an explanation from a name, a ``{name: ..., **params}`` mapping, or pass an instance through.

    Examples: ``get_explanation("gradient")``, ``get_explanation("gradcam", layer="features.norm5")``,
    ``get_explanation({"name": "smoothgrad", "n_samples": 20})``. Unknown names and parameters are
    refused with the closest valid one; missing required parameters (Grad-CAM's ``layer``) are named.
    """
    if isinstance(spec, Explanation):
        if params:
            raise InvalidParameterError("give parameters with an explanation name, not with an Explanation instance")
        return spec
    if isinstance(spec, Mapping):
        spec = dict(spec)
        if "name" not in spec:
            raise InvalidParameterError(
                f"an explanation mapping needs a `name` (one of {', '.join(available_explanations())}); got {spec!r}")
        name = spec.pop("name")
        params = {**spec, **params}
    else:
        name = spec
    cls = explanation_class(name)
    kwargs = cls.check_kwargs(params, what=f"explanation {cls.name!r}")
    sig = inspect.signature(cls.__init__)
    missing = [n for n, p in sig.parameters.items()
               if n != "self" and p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in kwargs]
    if missing:
        names = ", ".join(f"`{m}`" for m in missing)
        raise InvalidParameterError(f"explanation {cls.name!r} requires {names}, e.g. "
                                    f"{{name: {cls.name}, {missing[0]}: ...}}")
    return cls(**kwargs)
