"""GAP: generative adversarial perturbations, and the trainer that fits the generator.

Poursaeed, Katsman, Gao, Belongie. "Generative Adversarial Perturbations", CVPR 2018; used on medical
classifiers by Xu, Zhang, Li, Liu, Zhang. "Towards evaluating the robustness of deep diagnostic models
by adversarial attack", Medical Image Analysis 2021.

A generator network G maps an image (image-dependent GAP) or one fixed noise tensor (universal GAP) to
a raw perturbation ``u = G(.)`` in (-1, 1). The L∞ budget is enforced by *rescaling*, never amplifying:
``delta = u * min(1, eps / ||u||_inf)`` per sample (and per channel by default, as in both reference
codes), then ``x_adv = clip(x + delta)`` to the data bounds. Once trained, :class:`GAP` is an ordinary
medadv attack: one forward pass of G per batch, usable in :func:`medadv.evaluation.evaluate` and on
other models than the one it was trained against (transfer).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..models.generators import build_generator
from ..models.io import load_checkpoint, save_checkpoint
from ..tasks import Task
from ..threats import Linf, Threat
from .base import Attack, attack_mode, check_input, model_device, register

__all__ = ["GAP", "GAPTrainer"]

_LOSSES = ("least_likely", "neg_true_logprob")


def _as_tuple(shape: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in shape)


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
            "L∞ = 7" on 0-255 images is ``eps = 7/255`` for data in [0, 1]); bounds are the data range.
        generator: the generator network (see :mod:`medadv.models.generators`); train it with
            :class:`GAPTrainer`. Its input has the data's channels; its output the perturbation's.
        universal: one perturbation for every input (``G(z)`` for a fixed noise ``z``) instead of an
            image-dependent ``G(x)``; needs ``input_shape``.
        input_shape: ``(C, *spatial)`` of the data, required when ``universal`` (the noise's shape).
        per_channel: rescale each channel of each sample to the budget separately (reference codes);
            False rescales each sample as a whole.
        output_scale: data units of one unit of the generator's tanh output, before the rescaling to the
            budget; default ``100 * (hi - lo)`` (100 when unbounded). The rescaling never amplifies, and a
            freshly initialised generator outputs about 0.01, so a unit gain would leave it far inside
            the ball; the reference codes avoid this by mean/std-normalising the raw output like an
            image, which puts it far outside the ball from the start. A large gain does the same
            without the quirk's constant offset: the budget is used in full and G learns the direction.
        targeted: see :class:`~medadv.attacks.base.Attack`.
        seed: seed of the universal noise ``z``.
    """

    def __init__(self, task: Task, threat: Threat, generator: nn.Module, *, universal: bool = False,
                 input_shape: tuple[int, ...] | None = None, per_channel: bool = True,
                 loss: str = "least_likely", output_scale: float | None = None, targeted: bool = False,
                 seed: int | None = 0) -> None:
        if not isinstance(threat, Linf):
            raise TypeError(f"`threat` must be a medadv Linf ball for GAP (budget by L∞ rescaling), got {threat!r}")
        super().__init__(task, threat, targeted=targeted, seed=seed)
        if not isinstance(generator, nn.Module):
            raise TypeError(f"`generator` must be a torch.nn.Module, got {type(generator).__name__}")
        if loss not in _LOSSES:
            raise ValueError(f"`loss` must be one of {_LOSSES}, got {loss!r}")
        self.generator = generator
        self.universal = bool(universal)
        self.per_channel = bool(per_channel)
        self.loss_name = loss
        self.noise: Tensor | None = None
        if output_scale is not None and not float(output_scale) > 0:
            raise ValueError(f"`output_scale` must be > 0, got {output_scale}")
        self.output_scale = output_scale
        if self.universal:
            if input_shape is None or len(input_shape) < 2:
                raise ValueError(f"`input_shape` (C, *spatial) is required for a universal GAP, got {input_shape!r}")
            self.input_shape = _as_tuple(input_shape)
            gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
            # Poursaeed's universal input is a fixed uniform image; here uniform in [0, 1).
            self.noise = torch.rand((1, *self.input_shape), generator=gen)
        else:
            self.input_shape = None if input_shape is None else _as_tuple(input_shape)

    # --- construction from a checkpoint ----------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, task: Task, threat: Threat, *, targeted: bool | None = None,
                        loss: str | None = None) -> GAP:
        """Rebuild a trained GAP from a :class:`GAPTrainer` checkpoint (``threat`` may set a new budget)."""
        payload = load_checkpoint(path)
        if "generator_config" not in payload:
            raise ValueError(f"{path} is not a GAP checkpoint (no 'generator_config' entry)")
        cfg = dict(payload["generator_config"])
        gen = build_generator(**cfg)
        gen.load_state_dict(payload["best_state"] if payload.get("best_state") else payload["state_dict"])
        meta = payload["gap"]
        atk = cls(task, threat, gen, universal=meta["universal"], input_shape=meta["input_shape"],
                  per_channel=meta["per_channel"], loss=loss or meta["loss"], output_scale=meta["output_scale"],
                  targeted=meta["targeted"] if targeted is None else targeted, seed=meta["seed"])
        if atk.universal:
            atk.noise = payload["noise"]
        return atk

    # --- the perturbation -----------------------------------------------------------------------------
    def raw(self, x: Tensor) -> Tensor:
        """The generator's output in data units, for a batch (image-dependent) or the one universal ``(1, ...)``."""
        if self.universal:
            if tuple(x.shape[1:]) != self.input_shape:
                raise ValueError(f"`x` must have sample shape {self.input_shape} for this universal GAP, "
                                 f"got {tuple(x.shape[1:])}")
            u = self.generator(self.noise.to(device=x.device, dtype=x.dtype))
        else:
            u = self.generator(x)
        return u * self._output_scale(x)

    def _output_scale(self, x: Tensor) -> Tensor | float:
        if self.output_scale is not None:
            return float(self.output_scale)
        if self.threat.bounds is None:
            return 100.0
        lo, hi = self.threat.bounds
        return 100.0 * (torch.as_tensor(hi, device=x.device, dtype=x.dtype)
                        - torch.as_tensor(lo, device=x.device, dtype=x.dtype))

    def scale(self, u: Tensor) -> Tensor:
        """Rescale to the budget: ``u * min(1, eps / ||u||_inf)`` per sample (and channel).

        The factor is detached (straight-through, as in both reference codes): the generator learns
        the direction, the budget fixes the size.
        """
        dims = tuple(range(2 if self.per_channel else 1, u.ndim))
        peak = u.detach().abs().amax(dim=dims, keepdim=True) if dims else u.detach().abs()
        factor = torch.clamp(self.threat.eps / peak.clamp_min(1e-12), max=1.0)
        return u * factor

    def apply(self, x: Tensor) -> Tensor:
        """``x_adv = clip(x + scale(G(.)))``, differentiable w.r.t. the generator's parameters.

        The bound clip passes gradients straight through (reference behaviour), so the generator still
        learns where the clip is active.
        """
        delta = self.scale(self.raw(x))
        if delta.shape[1] != x.shape[1]:
            raise ValueError(f"the generator outputs {delta.shape[1]} channels but `x` has {x.shape[1]}")
        x_adv = x + delta
        return x_adv + (self.threat.clip(x_adv) - x_adv).detach()

    # --- the training objective ------------------------------------------------------------------------
    def attack_target(self, clean_logits: Tensor, y: Tensor) -> Tensor:
        """The labels the generator is trained towards: the target, or the least-likely / flipped clean prediction."""
        if self.targeted or self.loss_name == "neg_true_logprob":
            return y
        return self.task.least_likely(clean_logits)

    def objective(self, adv_logits: Tensor, target: Tensor) -> Tensor:
        """Scalar the generator minimises (mean over the batch)."""
        if self.targeted or self.loss_name == "least_likely":
            return self.task.loss(adv_logits, target).mean()
        # Eq. (4): minimise log p(label) = -CE, floored at -20 per element to stay bounded.
        element = self.task.element_loss(adv_logits, target).clamp(max=20.0)
        return -self.task.reduce(element, target).mean()

    # --- Attack interface ------------------------------------------------------------------------------
    def _check_device(self, x: Tensor) -> None:
        dev = model_device(self.generator, x.device)
        if dev != x.device:
            raise ValueError(f"the generator is on {dev} but the model/input on {x.device}; move it with "
                             f"`attack.generator.to(device)`")

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
        self._check_device(x)
        training = self.generator.training
        self.generator.eval()  # Xu et al.'s code leaves G in train mode at test time; we do not (A14)
        try:
            with torch.no_grad():
                return self.apply(x)
        finally:
            self.generator.train(training)


class GAPTrainer:
    """Fit a :class:`GAP` generator against a frozen model (Adam, epochs, checkpoints, resume).

    The attacked model is in eval mode with frozen parameters for the whole fit (restored afterwards);
    only the generator learns. After every epoch the generator is scored on ``x_val`` (or the training
    data) and the one with the highest fooling rate is kept (Xu et al. keep the lowest attacked
    accuracy; select on a validation split to avoid test leakage). A checkpoint is written after every
    epoch; a trainer pointed at an existing checkpoint resumes from it and ends with exactly the
    generator an uninterrupted run would have produced.

    Args:
        attack: the :class:`GAP` whose generator is trained in place.
        model: the model to fool (frozen).
        epochs: passes over the training data.
        batch_size: training batch size.
        lr: Adam learning rate (2e-4 in both reference codes).
        betas: Adam betas ((0.5, 0.999) Poursaeed; Xu et al. use (0.9, 0.999)).
        max_batches: cap on batches per epoch (``MaxIter`` of the references), or None.
        seed: seed of the data order.
        checkpoint: file to write after every epoch and to resume from, or None.
        progress: show a tqdm progress bar (one host sync per epoch for the displayed loss).
        target: for a targeted GAP, one target broadcast to every sample: a class index, a label vector
            ``(L,)`` or a label map ``(*spatial)``. Or ``None`` to take per-sample targets from ``y``.
    """

    def __init__(self, attack: GAP, model: nn.Module, *, epochs: int = 10, batch_size: int = 16, lr: float = 2e-4,
                 betas: tuple[float, float] = (0.5, 0.999), max_batches: int | None = None, seed: int = 0,
                 checkpoint: str | os.PathLike | None = None, progress: bool = False,
                 target: Tensor | int | None = None) -> None:
        if not isinstance(attack, GAP):
            raise TypeError(f"`attack` must be a GAP attack, got {type(attack).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
        for name, v in (("epochs", epochs), ("batch_size", batch_size)):
            if int(v) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {v}")
        if max_batches is not None and int(max_batches) < 1:
            raise ValueError(f"`max_batches` must be >= 1 or None, got {max_batches}")
        if not float(lr) > 0:
            raise ValueError(f"`lr` must be > 0, got {lr}")
        if target is not None and not attack.targeted:
            raise ValueError("`target` was given but the GAP attack is untargeted; build it with targeted=True")
        self.attack, self.model = attack, model
        self.epochs, self.batch_size = int(epochs), int(batch_size)
        self.max_batches = None if max_batches is None else int(max_batches)
        self.seed = int(seed)
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.progress = bool(progress)
        self.target = target
        self.optimizer = torch.optim.Adam(attack.generator.parameters(), lr=float(lr), betas=tuple(betas))
        self.history: list[dict[str, float]] = []

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
        if y is None or atk.loss_name == "least_likely":
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
                clean = self.model(xb)
                if atk.targeted:
                    yb = self._targets(None if y is None else y[i:i + 256], clean)
                else:
                    yb = atk.task.predict(clean)
                fooled = fooled + atk.task.fooled(self.model(atk.apply(xb)), yb, atk.targeted).sum()
        return float(fooled) / x.shape[0]

    def _save(self, epoch: int, gen_state: Tensor, best_state: dict | None, best_fr: float) -> None:
        atk = self.attack
        cfg = getattr(atk.generator, "config", None)
        save_checkpoint(self.checkpoint, atk.generator, optimizer=self.optimizer.state_dict(), epoch=epoch,
                        rng_state=gen_state, best_state=best_state, best_fooling_rate=best_fr,
                        history=self.history, generator_config=cfg, noise=atk.noise,
                        gap=dict(universal=atk.universal, input_shape=atk.input_shape, per_channel=atk.per_channel,
                                 loss=atk.loss_name, output_scale=atk.output_scale, targeted=atk.targeted, seed=atk.seed, eps=atk.threat.eps))

    # --- the fit --------------------------------------------------------------------------------------
    def fit(self, x: Tensor, y: Tensor | None = None, x_val: Tensor | None = None,
            y_val: Tensor | None = None, callback: Callable[[int, dict[str, float]], None] | None = None) -> GAP:
        """Train the generator on ``x`` (labels ``y`` optional: the clean prediction is used); return the attack.

        ``y`` holds the true labels (used by ``loss="neg_true_logprob"``) or, for a targeted GAP without
        ``target=``, per-sample targets (``y_val`` likewise for the validation split). The selection score
        is the fooling rate: untargeted, the fraction of predictions that change (Xu et al.'s FR).
        ``callback(epoch, record)`` runs after every epoch. The best generator is loaded at the end.
        """
        atk, model = self.attack, self.model
        check_input(x, atk.threat, "x")
        if x_val is not None:
            check_input(x_val, atk.threat, "x_val")
        if y is not None and (not isinstance(y, Tensor) or y.shape[0] != x.shape[0]):
            raise ValueError("`y` must be a tensor with one entry per sample of `x`")
        device = model_device(model, x.device)
        atk.generator.to(device)
        gen = torch.Generator().manual_seed(self.seed)
        start, best_state, best_fr = 0, None, -1.0
        if self.checkpoint is not None and self.checkpoint.is_file():
            payload = load_checkpoint(self.checkpoint, atk.generator)
            self.optimizer.load_state_dict(payload["optimizer"])
            gen.set_state(payload["rng_state"])
            start, best_state, best_fr = int(payload["epoch"]), payload["best_state"], float(payload["best_fooling_rate"])
            self.history = list(payload["history"])
            if atk.universal and payload.get("noise") is not None:
                atk.noise = payload["noise"]
        epochs = range(start, self.epochs)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(epochs, desc="GAP", unit="epoch", initial=start, total=self.epochs)
            epochs = bar
        with attack_mode(model):
            for epoch in epochs:
                atk.generator.train()
                perm = torch.randperm(x.shape[0], generator=gen)
                total = torch.zeros((), device=device)
                n_batches = 0
                for b, i in enumerate(range(0, x.shape[0], self.batch_size)):
                    if self.max_batches is not None and b >= self.max_batches:
                        break
                    idx = perm[i:i + self.batch_size]
                    xb = x[idx].to(device)
                    with torch.no_grad():
                        clean = model(xb)
                    tb = self._targets(None if y is None else y[idx], clean)
                    loss = atk.objective(model(atk.apply(xb)), tb)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self.optimizer.step()
                    total = total + loss.detach()
                    n_batches += 1
                atk.generator.eval()
                xv, yv = (x, y) if x_val is None else (x_val, y_val)
                fr = self._fooling_rate(xv, yv)
                record = {"epoch": epoch + 1, "loss": float(total) / max(n_batches, 1), "fooling_rate": fr}
                self.history.append(record)
                if fr > best_fr:
                    best_fr = fr
                    best_state = {k: v.detach().cpu().clone() for k, v in atk.generator.state_dict().items()}
                if self.checkpoint is not None:
                    self._save(epoch + 1, gen.get_state(), best_state, best_fr)
                if bar is not None:
                    bar.set_postfix(loss=f"{record['loss']:.4f}", fooling=f"{fr:.3f}")
                if callback is not None:
                    callback(epoch + 1, record)
        if best_state is not None:
            atk.generator.load_state_dict(best_state)
        atk.generator.eval()
        return atk
