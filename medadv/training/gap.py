"""GAPTrainer: fit a :class:`~medadv.attacks.gap.GAP` generator against a frozen model, on the shared loop."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ..attacks.gap import GAP
from ..params import Pair, Real
from ..runtime import attack_mode, check_input, forward_tensor, model_device
from .loop import Fitter

__all__ = ["GAPTrainer"]


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
