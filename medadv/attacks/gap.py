"""GAP: generative adversarial perturbations: the attack, and its trainer (:class:`GAPTrainer`, published as
:class:`medadv.training.GAPTrainer`).

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

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..models.fitting import Fitter  # the models sit below the attacks (tests/test_layout.py)
from ..models.generators import build_generator, generator_from_checkpoint
from ..models.io import load_checkpoint
from ..params import (
    Bool,
    Component,
    Constraint,
    InvalidParameterError,
    Optional,
    Options,
    Pair,
    Real,
    look_up_option,
)
from ..runtime import attack_mode, check_input, forward_tensor
from ..tasks import Task
from ..threats import Threat
from .base import Attack, model_device, register

__all__ = ["GAP", "GAPTrainer", "load_generator"]

#: generators built fresh from an architecture name: GAP refuses to attack with them until trained
_UNTRAINED: weakref.WeakSet[nn.Module] = weakref.WeakSet()
#: generators loaded from a GAPTrainer checkpoint -> the GAP settings they were trained with
_CHECKPOINT_SETTINGS: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()
#: the settings a generator's checkpoint fixes (G was trained for them)
_TRAINED_WITH = ("universal", "input_shape", "per_channel", "output_scale")
_ARCHITECTURES = ("unet", "resnet")


def load_generator(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """The generator of a :class:`~medadv.training.GAPTrainer` checkpoint (its best epoch) and the payload."""
    payload = load_checkpoint(path)
    gen = generator_from_checkpoint(payload, path)  # what the file holds instead, in one line, when it is not one
    settings = dict(payload["gap"])
    settings["noise"] = payload.get("noise")
    _CHECKPOINT_SETTINGS[gen] = settings
    return gen, payload


def _build_generator(spec: str | Mapping[str, Any]) -> nn.Module:
    """``generator`` given by name: ``"unet"``, ``{"name": "resnet", "ngf": 8, ...}`` or ``{"checkpoint": path}``."""
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


# --- the trainer ----------------------------------------------------------------------------------------------------
# Defined here, with the attack it trains, on the shared loop (medadv.models.fitting, below the attacks), and
# published at medadv.training.GAPTrainer (its __module__): medadv.training imports it from here, so the attacks
# never import the training package (tests/test_layout.py).
class GAPTrainer(Fitter):
    """Fit a :class:`~medadv.attacks.gap.GAP` generator against a frozen model (Adam, epochs, checkpoints, resume).

    The attacked model is in eval mode with frozen parameters for the whole fit (restored afterwards);
    only the generator learns. After every epoch the generator is scored on ``x_val`` (or the training
    data) and the one with the highest fooling rate is kept (Xu et al. keep the lowest attacked
    accuracy; select on a validation split to avoid test leakage). A checkpoint is written after every
    epoch; a trainer pointed at an existing checkpoint resumes from it and ends with exactly the
    generator an uninterrupted run would have produced. The loop is :class:`~medadv.training.loop.Fitter`,
    shared with :class:`~medadv.defenses.AdversarialTrainer` and :func:`~medadv.training.fit_supervised`.

    Args:
        attack: the :class:`GAP` whose generator is trained in place (marked trained after :meth:`fit`).
        model: the model to fool (frozen).
        epochs: passes over the training data.
        batch_size: training batch size.
        lr: Adam learning rate (2e-4 in both reference codes).
        betas: Adam betas ((0.5, 0.999) Poursaeed; Xu et al. use (0.9, 0.999)).
        max_batches: cap on batches per epoch (``MaxIter`` of the references), or None.
        seed: seed of the data order.
        checkpoint: file to write after every epoch and to resume from, or None. It also rebuilds the
            attack: ``GAP.from_checkpoint(path, ...)`` or ``GAP(task, threat, {"checkpoint": path})``.
        progress: show a tqdm progress bar (one host sync per epoch for the displayed loss).
        target: for a targeted GAP, one target broadcast to every sample: a class index, a label vector
            ``(L,)`` or a label map ``(*spatial)``. Or ``None`` to take per-sample targets from ``y``.

    The history holds one record per epoch: ``{"epoch", "loss" (per-sample mean), "fooling_rate"}``.
    """

    desc = "GAP"

    def __init__(self, attack: GAP, model: nn.Module, *, epochs: int = 10, batch_size: int = 16, lr: float = 2e-4,
                 betas: tuple[float, float] = (0.5, 0.999), max_batches: int | None = None, seed: int = 0,
                 checkpoint: str | os.PathLike | None = None, progress: bool = False,
                 target: Tensor | int | None = None) -> None:
        if not isinstance(attack, GAP):
            raise TypeError(f"`attack` must be a GAP attack, got {type(attack).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
        if target is not None and not attack.targeted:
            raise ValueError("`target` was given but the GAP attack is untargeted; build it with targeted=True")
        lr = Real(low=0, low_open=True).check(lr, "lr", "GAPTrainer")
        betas = Pair(Real(low=0, high=1, high_open=True)).check(betas, "betas", "GAPTrainer")
        optimizer = torch.optim.Adam(attack.generator.parameters(), lr=lr, betas=betas)
        super().__init__(attack.generator, optimizer, epochs=epochs, batch_size=batch_size, seed=seed,
                         checkpoint=checkpoint, progress=progress, max_batches=max_batches)
        # `outputs: probabilities` declared on the attack's task: the objective reads their logits
        self.attack, self.model, self.target = attack, attack.task.logits_model(model), target
        self._val: tuple[Tensor, Tensor | None] | None = None
        self._best_state: dict[str, Tensor] | None = None
        self._best_fr = -1.0

    # --- helpers --------------------------------------------------------------------------------------
    def _targets(self, y: Tensor | None, logits: Tensor) -> Tensor:
        """Training labels of a batch: the target (targeted) or what the untargeted objective needs."""
        atk, task = self.attack, self.attack.task
        if atk.targeted:
            if self.target is not None:
                t = torch.as_tensor(self.target, device=logits.device)
                t = t.unsqueeze(0).expand(logits.shape[0], *t.shape)
            elif y is None:
                raise ValueError("a targeted GAP needs `target=` or per-sample targets in `y`")
            else:
                t = y.to(logits.device)
            task.validate(logits, t, "target")
            return task.to_target(t, logits)
        if y is None or atk.loss == "least_likely":
            ref = task.predict(logits)
        else:
            ref = y.to(logits.device)
            task.validate(logits, ref, "y")
        return atk.attack_target(logits, task.to_target(ref, logits))

    def _fooling_rate(self, x: Tensor, y: Tensor | None) -> float:
        """Untargeted: fraction of predictions changed (Xu et al.'s FR); targeted: fraction at the target."""
        atk, device = self.attack, model_device(self.model)
        fooled = torch.zeros((), device=device)
        for i in range(0, x.shape[0], 256):
            xb = x[i:i + 256].to(device)
            with torch.no_grad():
                clean = forward_tensor(self.model, xb)
                if atk.targeted:
                    yb = self._targets(None if y is None else y[i:i + 256], clean)
                else:
                    yb = atk.task.predict(clean)
                fooled = fooled + atk.task.fooled(forward_tensor(self.model, atk.apply(xb)), yb, atk.targeted).sum()
        return float(fooled) / x.shape[0]

    # --- loop hooks -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        with attack_mode(self.model):  # the attacked model: eval mode, frozen, both restored
            yield

    def begin_epoch(self, epoch: int) -> None:
        self.attack.generator.train()

    def batch_loss(self, x: Tensor, y: Tensor | None, generator: torch.Generator) -> Tensor:
        with torch.no_grad():
            clean = forward_tensor(self.model, x)
        target = self._targets(y, clean)
        return self.attack.objective(forward_tensor(self.model, self.attack.apply(x)), target)

    def end_epoch(self, epoch: int, mean_loss: Tensor) -> dict[str, float]:
        gen = self.attack.generator
        gen.eval()
        assert self._val is not None
        fr = self._fooling_rate(*self._val)
        if fr > self._best_fr:
            self._best_fr = fr
            self._best_state = {k: v.detach().cpu().clone() for k, v in gen.state_dict().items()}
        return {"epoch": epoch, "loss": float(mean_loss), "fooling_rate": fr}

    def postfix(self, record: Any) -> dict[str, str]:
        return {"loss": f"{record['loss']:.4f}", "fooling": f"{record['fooling_rate']:.3f}"}

    def checkpoint_state(self) -> dict[str, Any]:
        atk = self.attack
        assert atk.threat is not None
        return dict(best_state=self._best_state, best_fooling_rate=self._best_fr,
                    generator_config=getattr(atk.generator, "config", None), noise=atk.noise,
                    gap=dict(universal=atk.universal, input_shape=atk.input_shape, per_channel=atk.per_channel,
                             loss=atk.loss, output_scale=atk.output_scale, targeted=atk.targeted, seed=atk.seed,
                             eps=atk.threat.eps))

    def load_checkpoint_state(self, payload: dict[str, Any]) -> None:
        if "gap" not in payload:
            raise ValueError(f"checkpoint {self.checkpoint} is not a GAPTrainer checkpoint")
        self._best_state, self._best_fr = payload["best_state"], float(payload["best_fooling_rate"])
        if self.attack.universal and payload.get("noise") is not None:
            self.attack.noise = payload["noise"]

    # --- the fit --------------------------------------------------------------------------------------
    def fit(self, x: Tensor, y: Tensor | None = None, x_val: Tensor | None = None,
            y_val: Tensor | None = None, callback: Callable[[int, dict[str, float]], None] | None = None) -> GAP:
        """Train the generator on ``x`` (labels ``y`` optional: the clean prediction is used); return the attack.

        ``y`` holds the true labels (used by ``loss="neg_true_logprob"``) or, for a targeted GAP without
        ``target=``, per-sample targets (``y_val`` likewise for the validation split). The selection score
        is the fooling rate: untargeted, the fraction of predictions that change (Xu et al.'s FR).
        ``callback(epoch, record)`` runs after every epoch. The best generator is loaded at the end and the
        attack is marked trained.
        """
        atk, model = self.attack, self.model
        check_input(x, atk.box, "x")
        if x_val is not None:
            check_input(x_val, atk.box, "x_val")
        if y is not None and (not isinstance(y, Tensor) or y.shape[0] != x.shape[0]):
            raise ValueError("`y` must be a tensor with one entry per sample of `x`")
        device = model_device(model, x.device)
        atk.generator.to(device)
        self._best_state, self._best_fr = None, -1.0
        self._val = (x, y) if x_val is None else (x_val, y_val)
        self.run(x, y, device, callback)
        if self._best_state is not None:
            atk.generator.load_state_dict(self._best_state)
        atk.generator.eval()
        atk.trained = True
        return atk


GAPTrainer.__module__ = "medadv.training.gap"  # its public home (as numpy sets __module__ of its public names)
