"""GAP: generative adversarial perturbations (the attack; its trainer is :class:`medadv.training.GAPTrainer`).

Poursaeed, Katsman, Gao, Belongie. "Generative Adversarial Perturbations", CVPR 2018; used on medical
classifiers by Xu, Zhang, Li, Liu, Zhang. "Towards evaluating the robustness of deep diagnostic models
by adversarial attack", Medical Image Analysis 2021.

A generator network G maps an image (image-dependent GAP) or one fixed noise tensor (universal GAP) to
a raw perturbation ``u = G(.)`` in (-1, 1). The L∞ budget is enforced by *rescaling*, never amplifying:
``delta = u * min(1, eps / ||u||_inf)`` per sample (and per channel by default, as in both reference
codes), then ``x_adv = clip(x + delta)`` to the data box. Once trained, :class:`GAP` is an ordinary
medadv attack: one forward pass of G per batch, usable in :func:`medadv.evaluation.evaluate` and on
other models than the one it was trained against (transfer).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..params import (
    Bool,
    Component,
    Constraint,
    InvalidParameterError,
    Optional,
    Options,
    Real,
    look_up_option,
)
from ..tasks import Task
from ..threats import Threat
from .base import Attack, model_device, register

__all__ = ["GAP", "load_generator"]  # GAPTrainer: re-exported lazily (module __getattr__ below)

#: generators built fresh from an architecture name: GAP refuses to attack with them until trained
_UNTRAINED: weakref.WeakSet[nn.Module] = weakref.WeakSet()
#: generators loaded from a GAPTrainer checkpoint -> the GAP settings they were trained with
_CHECKPOINT_SETTINGS: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()
#: the settings a generator's checkpoint fixes (G was trained for them)
_TRAINED_WITH = ("universal", "input_shape", "per_channel", "output_scale")
_ARCHITECTURES = ("unet", "resnet")


def load_generator(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """The generator of a :class:`~medadv.training.GAPTrainer` checkpoint (its best epoch) and the payload."""
    # lazy: attacks do not import models at import time
    from ..models.generators import generator_from_checkpoint
    from ..models.io import load_checkpoint

    payload = load_checkpoint(path)
    gen = generator_from_checkpoint(payload, path)  # what the file holds instead, in one line, when it is not one
    settings = dict(payload["gap"])
    settings["noise"] = payload.get("noise")
    _CHECKPOINT_SETTINGS[gen] = settings
    return gen, payload


def _build_generator(spec: str | Mapping[str, Any]) -> nn.Module:
    """``generator`` given by name: ``"unet"``, ``{"name": "resnet", "ngf": 8, ...}`` or ``{"checkpoint": path}``."""
    from ..models.generators import build_generator

    if isinstance(spec, Mapping) and "checkpoint" in spec:
        extra = sorted(k for k in spec if k != "checkpoint")
        if extra:
            raise InvalidParameterError(f"`generator` of GAP: {{checkpoint: ...}} takes no other keys, got {extra}")
        try:
            return load_generator(spec["checkpoint"])[0]
        except ValueError as e:  # the file's own reason (a Component would say only "got dict")
            raise InvalidParameterError(f"`generator` of GAP: {e}") from None
    args = dict(spec) if isinstance(spec, Mapping) else {"name": spec}
    name = args.pop("name", args.pop("kind", "unet"))
    kind = look_up_option(name, _ARCHITECTURES, argument="generator", owner="GAP")
    try:
        # a fresh generator's initial weights are drawn from a fork of the global RNG: the same global seed gives
        # the same generator, and building the attack does not advance the caller's random stream
        with torch.random.fork_rng(devices=[]):
            gen = build_generator(kind, **args)
    except (TypeError, ValueError) as e:
        raise InvalidParameterError(f"`generator` of GAP ({kind!r}): {e}") from None
    _UNTRAINED.add(gen)
    return gen


class _Shape(Constraint):
    """A sample shape ``(C, *spatial)``: at least two integers >= 1."""

    def describe(self) -> str:
        return "a sample shape (C, *spatial) of at least two integers >= 1"

    def convert(self, value: Any) -> tuple[int, ...]:
        if isinstance(value, str | bytes) or not hasattr(value, "__len__"):
            raise TypeError
        out = []
        for v in value:
            if isinstance(v, bool) or int(v) != v or int(v) < 1:
                raise ValueError
            out.append(int(v))
        if len(out) < 2:
            raise ValueError
        return tuple(out)


def _straight_through(v: Tensor, f: Callable[[Tensor], Tensor]) -> Tensor:
    """``f(v)`` in the forward pass (bit-exact), the identity in the backward pass.

    ``v + (f(v) - v).detach()`` is not exact in floating point (it left GAP's output up to one ulp outside
    the box); ``f(v) + (v - v.detach())`` adds an exact zero to ``f(v)``.
    """
    return f(v).detach() + (v - v.detach())


@register("gap")
class GAP(Attack):
    """Generative adversarial perturbation attack (a trained generator network).

    Args:
        task: the model's task. Untargeted objectives (``loss``):
            ``"least_likely"`` (default, the reference codes): drive the prediction towards the clean
            prediction's least-likely class (MultiClass), towards the flipped clean prediction of every
            label (MultiLabel, as Xu et al. do for CheXNet), or towards the least-likely class of every
            voxel (Segmentation); ``"neg_true_logprob"`` (Xu et al.'s Eq. 4): push the log-probability
            of the label down, floored at -20 per element so the objective stays bounded.
            Targeted: drive the prediction to the target (a class, a label vector or a label map).
        threat: a :class:`~medadv.threats.Linf` ball; ``eps`` is the budget in data units (the papers'
            "L∞ = 7" on 0-255 images is ``eps = 7/255`` for data in [0, 1]); its box is the data range.
        generator: the generator (see :mod:`medadv.models.generators`), one of

            * an ``nn.Module``: used as given and trusted to be trained (its input has the data's
              channels, its output the perturbation's);
            * an architecture by name, ``"unet"`` (default) or ``"resnet"``, or a mapping
              ``{"name": "unet", "in_channels": 3, "ngf": 32, ...}`` with the arguments of
              :func:`~medadv.models.generators.build_generator`: a *fresh* network, which the attack
              refuses to use until :class:`~medadv.training.GAPTrainer` has fitted it;
            * ``{"checkpoint": "gap.pt"}``: the best generator of a GAPTrainer checkpoint. The settings it
              was trained with (``universal``, ``input_shape``, ``per_channel``, ``output_scale`` and the
              universal noise) are taken from the checkpoint where left at their defaults; a different
              explicit value is an error.
        universal: one perturbation for every input (``G(z)`` for a fixed noise ``z``) instead of an
            image-dependent ``G(x)``; needs ``input_shape``.
        input_shape: ``(C, *spatial)`` of the data, required when ``universal`` (the noise's shape).
        per_channel: rescale each channel of each sample to the budget separately (reference codes);
            False rescales each sample as a whole.
        loss: the training objective (see ``task`` above): ``"least_likely"`` or ``"neg_true_logprob"``.
        output_scale: gain of the generator's tanh output before the rescaling to the budget, **relative
            to the box's data range**: one unit of G's output is ``output_scale * (hi - lo)`` data units
            (per channel for per-channel boxes; plain data units for an unbounded box). Default 100. The
            rescaling never amplifies, and a freshly initialised generator outputs about 0.01, so a unit
            gain would leave it far inside the ball; the reference codes avoid this by mean/std-normalising
            the raw output like an image, which puts it far outside the ball from the start. A large gain
            does the same without the quirk's constant offset: the budget is used in full and G learns the
            direction.
        targeted: see :class:`~medadv.attacks.base.Attack`.
        seed: seed of the universal noise ``z``.
    """

    transforms_whole_input = True  # the generator rewrites every input channel
    params: ClassVar[dict[str, Any]] = {
        "generator": Component(
            nn.Module, _build_generator,
            "a generator nn.Module, an architecture name ('unet', 'resnet'), a mapping {name: 'unet', ...its "
            "arguments} or {checkpoint: 'gap.pt'}"),
        "universal": Bool(),
        "input_shape": Optional(_Shape()),
        "per_channel": Bool(),
        "loss": Options("least_likely", "neg_true_logprob"),
        "output_scale": Real(low=0, low_open=True),
    }
    norms: ClassVar[tuple[str, ...]] = ("Linf",)

    generator: nn.Module
    universal: bool
    input_shape: tuple[int, ...] | None
    per_channel: bool
    loss: str
    output_scale: float

    def __init__(self, task: Task, threat: Threat, generator: nn.Module | str | Mapping[str, Any] = "unet", *,
                 universal: bool = False, input_shape: tuple[int, ...] | None = None, per_channel: bool = True,
                 loss: str = "least_likely", output_scale: float = 100.0, targeted: bool = False,
                 seed: int | None = 0) -> None:
        super().__init__(task, threat, targeted=targeted, seed=seed)
        self._init_params(locals())
        settings = _CHECKPOINT_SETTINGS.get(self.generator)
        if settings is not None:
            self._adopt(settings)
        self.noise: Tensor | None = None
        if self.universal:
            if self.input_shape is None:
                raise InvalidParameterError("`input_shape` (C, *spatial) is required for a universal GAP")
            if settings is not None and settings.get("noise") is not None:
                self.noise = settings["noise"]
            else:
                gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
                # Poursaeed's universal input is a fixed uniform image; here uniform in [0, 1).
                self.noise = torch.rand((1, *self.input_shape), generator=gen)

    def _adopt(self, settings: Mapping[str, Any]) -> None:
        """Take the checkpoint's training settings where the caller left the default; refuse conflicts."""
        declared, defaults = self.declared_params(), self.param_defaults()
        for key in _TRAINED_WITH:
            if key not in settings:
                continue
            want = settings[key]
            if key == "output_scale" and want is None:  # checkpoints of the absolute-units era
                want = defaults[key]
            want = declared[key].check(want, key, "GAP")
            have = getattr(self, key)
            if have == want:
                continue
            if have != defaults[key]:
                raise InvalidParameterError(
                    f"`{key}` of GAP is {have!r} but its generator's checkpoint was trained with {key}={want!r}; "
                    f"leave `{key}` out or set it to {want!r}")
            setattr(self, key, want)

    # --- trained or not --------------------------------------------------------------------------------
    @property
    def trained(self) -> bool:
        """False for a generator built fresh from its name and not fitted yet (the attack then refuses to run).

        :class:`~medadv.training.GAPTrainer` sets it after a fit; set it yourself after loading weights into
        a generator built by name (``attack.trained = True``).
        """
        return self.generator not in _UNTRAINED

    @trained.setter
    def trained(self, value: bool) -> None:
        if value:
            _UNTRAINED.discard(self.generator)
        else:
            _UNTRAINED.add(self.generator)

    @property
    def loss_name(self) -> str:
        """The training objective (an older name of ``loss``)."""
        return self.loss

    # --- construction from a checkpoint ----------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, task: Task, threat: Threat, *, targeted: bool | None = None,
                        loss: str | None = None) -> GAP:
        """Rebuild a trained GAP from a :class:`~medadv.training.GAPTrainer` checkpoint (``threat`` may set a
        new budget). Same as ``GAP(task, threat, {"checkpoint": path})`` with the checkpoint's ``loss``,
        ``targeted`` and ``seed`` (unless given)."""
        gen, payload = load_generator(path)
        meta = payload["gap"]
        return cls(task, threat, gen, universal=meta["universal"], input_shape=meta["input_shape"],
                   per_channel=meta["per_channel"], loss=loss or meta["loss"],
                   output_scale=meta["output_scale"] if meta.get("output_scale") is not None else 100.0,
                   targeted=meta["targeted"] if targeted is None else targeted, seed=meta["seed"])

    # --- the perturbation -----------------------------------------------------------------------------
    def raw(self, x: Tensor) -> Tensor:
        """The generator's output in data units, for a batch (image-dependent) or the one universal ``(1, ...)``."""
        if self.universal:
            if tuple(x.shape[1:]) != self.input_shape:
                raise ValueError(f"`x` must have sample shape {self.input_shape} for this universal GAP, "
                                 f"got {tuple(x.shape[1:])}")
            assert self.noise is not None
            u = self.generator(self.noise.to(device=x.device, dtype=x.dtype))
        else:
            want = getattr(self.generator, "config", {}).get("in_channels")
            if want is not None and want != x.shape[1]:
                raise ValueError(f"the generator takes {want} input channels but `x` has {x.shape[1]}; build it "
                                 f"with in_channels={x.shape[1]} (e.g. generator={{'name': 'unet', "
                                 f"'in_channels': {x.shape[1]}}})")
            u = self.generator(x)
        return u * self._output_scale(x)

    def _output_scale(self, x: Tensor) -> Tensor | float:
        if not self.box.bounded:
            return self.output_scale
        lo, hi = self.box.lohi(x)
        return self.output_scale * (hi - lo)

    def scale(self, u: Tensor) -> Tensor:
        """Rescale to the budget: ``u * min(1, eps / ||u||_inf)`` per sample (and channel).

        The factor is detached (straight-through, as in both reference codes): the generator learns
        the direction, the budget fixes the size. The result is exactly within ``[-eps, eps]``.
        """
        assert self.threat is not None
        eps = self.threat.eps
        dims = tuple(range(2 if self.per_channel else 1, u.ndim))
        peak = u.detach().abs().amax(dim=dims, keepdim=True) if dims else u.detach().abs()
        factor = torch.clamp(eps / peak.clamp_min(1e-12), max=1.0)
        return _straight_through(u * factor, lambda d: d.clamp(-eps, eps))

    def apply(self, x: Tensor) -> Tensor:
        """``x_adv = clip(x + scale(G(.)))``, differentiable w.r.t. the generator's parameters.

        The box clip passes gradients straight through (reference behaviour), so the generator still
        learns where the clip is active; its forward value is exactly inside the box.
        """
        delta = self.scale(self.raw(x))
        if delta.shape[1] != x.shape[1]:
            raise ValueError(f"the generator outputs {delta.shape[1]} channels but `x` has {x.shape[1]}")
        return _straight_through(x + delta, self.box.clip)

    # --- the training objective ------------------------------------------------------------------------
    def attack_target(self, clean_logits: Tensor, y: Tensor) -> Tensor:
        """The labels the generator is trained towards: the target, or the least-likely / flipped clean prediction."""
        if self.targeted or self.loss == "neg_true_logprob":
            return y
        return self.task.least_likely(clean_logits)

    def objective(self, adv_logits: Tensor, target: Tensor) -> Tensor:
        """Scalar the generator minimises (mean over the batch)."""
        if self.targeted or self.loss == "least_likely":
            return self.task.loss(adv_logits, target).mean()
        # Eq. (4): minimise log p(label) = -CE, floored at -20 per element to stay bounded.
        element = self.task.element_loss(adv_logits, target).clamp(max=20.0)
        return -self.task.reduce(element, target).mean()

    # --- Attack interface ------------------------------------------------------------------------------
    def _check_call(self, model: Any, x: Any, y: Any) -> None:
        super()._check_call(model, x, y)
        if not self.trained:
            raise RuntimeError(
                "this GAP's generator was built fresh from its name and is untrained: fit it first with "
                "medadv.GAPTrainer(attack, model).fit(x), or give a trained one (generator={'checkpoint': "
                "'gap.pt'}, GAP.from_checkpoint(...), or the trained nn.Module)")

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None, **call_args: Any) -> Tensor:
        dev = model_device(self.generator, x.device)
        if dev != x.device:
            raise ValueError(f"the generator is on {dev} but the model/input on {x.device}; move it with "
                             f"`attack.generator.to(device)`")
        training = self.generator.training
        self.generator.eval()  # Xu et al.'s code leaves G in train mode at test time; we do not (A14)
        try:
            with torch.no_grad():
                return self.apply(x)
        finally:
            self.generator.train(training)

    def __repr__(self) -> str:
        g = self.generator
        cfg = getattr(g, "config", None)
        short = f"{type(g).__name__}({', '.join(f'{k}={v!r}' for k, v in cfg.items())})" if cfg else type(g).__name__
        text = super().__repr__()
        return text.replace(repr(g), short) if repr(g) in text else text


def __getattr__(name: str) -> Any:
    # GAPTrainer lives in medadv.training (it trains; attacks do not import training at import time)
    if name == "GAPTrainer":
        from ..training.gap import GAPTrainer

        return GAPTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
