"""torchattacks bridge, both directions, for multi-label and 2-D/3-D segmentation models.

torchattacks 3.5 assumes a softmax classifier on [0, 1] images: its attacks use ``nn.CrossEntropyLoss``,
arg-max success tests and ``clamp(0, 1)`` on every step (HU-valued CT is silently clipped), and
``set_normalization_used`` reshapes mean/std to ``(1, C, 1, 1)`` (2-D only). This module offers:

* :class:`TorchattacksModel` -- wraps a medical model so torchattacks' **own, unmodified** attacks run on it:
  inputs live in the unit box and are mapped to data units (``lo + u * (hi - lo)``) before an optional
  per-channel normalisation of any spatial rank. For the gradient attacks (FGSM, PGD, BIM, MIFGSM, ...)
  multi-label logits ``z`` are presented as two-class logits ``[0, z]`` per label, for which torchattacks'
  cross-entropy *is* the per-label BCE, and segmentation logits ``(N, C, *spatial)`` are already what its
  cross-entropy takes per voxel. The attacks that read one class per sample (C&W, EAD, DeepFool, FAB,
  Square, SPSA, JSMA, OnePixel, Pixle, APGD, ...) see the task's margin as a two-class decision per sample
  (see :mod:`medadv.adapters.torchattacks_support`), whose sign is the task's own fooled test, so what they
  report as success passes it. :meth:`TorchattacksModel.attack` runs an attack and returns the adversarial
  batch in data units, :meth:`TorchattacksModel.attack_result` also the success flag torchattacks does not
  return (the task's test on the result); attacks that do not apply to the task are refused from
  :data:`SUPPORT` before any work, and so are the unsafe direct calls (``atk(x_in_HU, y)``) and budgets in the
  wrong units (``PGD(w, eps=8)`` meant as 8 HU: torchattacks' ``eps`` is a fraction of the data range here).
* :class:`MedadvAttack` -- any medadv attack as a ``torchattacks.Attack``: torchattacks' targeted modes,
  ``set_normalization_used`` (multi-channel 2-D/3-D), ``set_model_training_mode`` and ``save`` work.

How a direct call is recognised: every torchattacks ``Attack.__call__`` starts by switching its model to eval
(or train) mode, so :meth:`TorchattacksModel.train` -- and, as a fallback, ``forward`` -- walks up the Python
stack to the outermost ``Attack.__call__`` frame (microseconds, once per call: the result is cached on the
input tensor) and checks that attack, its members, its inputs and labels, before the attack has done anything.
:meth:`TorchattacksModel.attack` checks up front and skips the walk.

Models that return probabilities (a final softmax or sigmoid): with the task declaring
``outputs="probabilities"``, :class:`TorchattacksModel` presents the logits they come from
(:meth:`~medadv.tasks.Task.logits_model`: ``log p`` / ``logit p``) to torchattacks, whose cross-entropy and margins
expect logits; ``mean``/``std`` stay the input normalisation. Undeclared, its first forward refuses outputs that
look like probabilities in one line (:meth:`~medadv.tasks.Task.check_outputs`), before the attack's first step.
:class:`MedadvAttack` runs a medadv attack, which reads the model through its own task the same way (converted
when declared, refused on the first output when not); torchattacks' ``get_logits`` (its random and least-likely
target modes) then sees the model's own outputs, whose arg-max / arg-min are those of the logits.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import sys
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
import torch.nn.functional as F
import torchattacks
from torch import Tensor, nn

from medadv.attacks.autoattack import UnitBox
from medadv.attacks.base import Attack as MedadvBase
from medadv.attacks.base import AttackResult
from medadv.tasks import Task
from medadv.threats import check_budget_scale, per_sample_norm

from ._common import check_first_output, check_model, check_task
from .support import UnsupportedAttackError, check_supported, task_kind
from .torchattacks_support import EXCLUDED, MARGIN_VIEW, SUPPORT, Usage, usage_problem

__all__ = ["TorchattacksModel", "MedadvAttack", "SUPPORT", "EXCLUDED", "UnsupportedAttackError"]


class TorchattacksModel(nn.Module):
    """A medical model as torchattacks expects one: [0, 1] inputs, cross-entropy-compatible logits.

    Args:
        model: the PyTorch model (multi-class, multi-label or segmentation logits).
        task: its :class:`~medadv.tasks.Task`.
        bounds: ``(lo, hi)`` data range (HU, z-scores, ...), scalars or per-channel tensors broadcastable to
            one batch; the unit box [0, 1] torchattacks clamps to is mapped onto it.
        mean, std: optional per-channel normalisation applied after the mapping (data units), any rank.
        allow_large_budgets: let attacks take an ``eps`` above half the unit box (L∞; for L2, half its L2
            diagonal). Refused by default before the attack does any work: torchattacks' ``eps`` is a fraction of
            the data range here, so ``PGD(w, eps=8)`` meant as 8 HU would move every voxel across the whole
            range; 8 HU is ``eps=w.unit_eps(8)``. An ``eps`` below 0.1 % of the range (``w.unit_eps(4/255)`` on
            CT in HU) warns (:func:`medadv.threats.check_budget_scale`).

    Use :meth:`unit_eps` for torchattacks' ``eps``/``alpha`` (data units to unit box) and :meth:`attack`
    to run an attack: it checks the attack against :data:`SUPPORT` before any work, runs the attacks that
    read one class per sample on the task margin, one sample at a time, and turns torchattacks' targeted
    modes into per-label / per-voxel targets. The task-loss attacks (PGD, FGSM, MIFGSM, ...) may also be
    called directly on :meth:`encode` (x) and :meth:`labels` (y); a direct call on data outside [0, 1], or of
    an attack that needs :meth:`attack`, is refused before the attack does any work, with the call to use.
    """

    def __init__(self, model: nn.Module, task: Task, bounds: tuple[Any, Any], *,
                 mean: Any = None, std: Any = None, allow_large_budgets: bool = False) -> None:
        super().__init__()
        check_model(model)
        if not isinstance(allow_large_budgets, bool):
            raise TypeError(f"`allow_large_budgets` must be True or False, got {allow_large_budgets!r}")
        self.allow_large_budgets = allow_large_budgets
        check_task(task, "torchattacks")
        if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
            raise TypeError(f"`bounds` must be a (lo, hi) pair, got {bounds!r}")
        if (mean is None) != (std is None):
            raise ValueError("give both `mean` and `std` or neither")
        self.task = task
        # declared probabilities: torchattacks gets their logits (its cross-entropy and margins expect logits)
        self.box = UnitBox(task.logits_model(model), *bounds)
        self.norm = None if mean is None else _ChannelNorm(mean, std)
        # torchattacks restores the wrapper's flag onto the whole model; set the flags directly, because
        # self.train() would recurse and overwrite the wrapped model's per-submodule modes
        self.training = model.training
        self.box.training = model.training
        if self.norm is not None:
            self.norm.training = model.training
        # what forward presents while `attack` runs (None: a direct call, checked by `_guard`)
        self._run: _Run | None = None
        # the direct call already checked (weak references: nothing is kept alive) and a pending check
        # that needs the number of classes (known after the first forward of a multi-class model)
        self._checked: tuple[Any, ...] | None = None
        self._pending: tuple[list[Any], str, int, int, int] | None = None

    # --- unit box <-> data units ----------------------------------------------------------------------------
    def encode(self, x: Tensor) -> Tensor:
        """Data units to the unit box torchattacks works in."""
        return self.box.encode(x)

    def decode(self, u: Tensor, x: Tensor | None = None) -> Tensor:
        """Unit box back to data units (pass the clean ``x`` for a bit-exact unperturbed part)."""
        return self.box.decode(u, x)

    def unit_eps(self, eps: float) -> float:
        """A budget in data units (ε, step size) as torchattacks' unit-box value."""
        return self.box.unit_eps(eps)

    def labels(self, y: Tensor) -> Tensor:
        """Labels in the form torchattacks' cross-entropy takes (class indices per sample/label/voxel)."""
        if self.task.label_source == "vector":
            if y.is_floating_point() and not bool(((y == 0) | (y == 1)).all()):
                raise ValueError("`y` must be multi-hot (0/1) for a MultiLabel task")
            return y.long()
        if y.is_floating_point() or y.dtype == torch.bool:
            raise TypeError(f"`y` must hold integer class labels, got dtype {y.dtype}")
        return y.long()

    def kind(self, x: Tensor) -> str:
        """The support-matrix column of this model for input ``x`` (``multiclass``, ..., ``seg3d``)."""
        return task_kind(self.task, x.ndim - 2 if self.task.spatial_labels else None)

    # --- forward ----------------------------------------------------------------------------------------
    def _model_logits(self, u: Tensor) -> Tensor:
        x = self.box.decode(u)
        if self.norm is not None:
            x = self.norm(x)
        z = self.box.model(x)
        check_first_output(self, self.task, z)  # undeclared probabilities: refused before the attack's first step
        return z

    def forward(self, u: Tensor) -> Tensor:
        run = self._run
        if run is None:
            self._guard(u)
        z = self._model_logits(u)
        if run is None:
            if self._pending is not None:
                self._check_classes(z)
        elif run.view == "margin":
            ref = run.ref.expand(z.shape[0], *run.ref.shape[1:])
            m = _decided_margin(self.task, z, ref, run.targeted, _task_margin(self.task, z, ref, run.targeted))
            # class 0: the sample keeps its labels (untargeted) / has not reached the target; class 1: it left
            # them / reached it. Logits ±m/2 rather than (m, 0): the same softmax and margin, and both logits
            # carry the gradient (JSMA's saliency map reads the target logit's gradient)
            return torch.stack((0.5 * m, -0.5 * m) if not run.targeted else (-0.5 * m, 0.5 * m), dim=1)
        if self.task.label_source == "vector":
            # CE over [0, z] with label y is exactly BCE-with-logits(z, y), per label
            return torch.stack((torch.zeros_like(z), z), dim=1)
        return z

    def logits(self, u: Tensor) -> Tensor:
        """The wrapped model's own logits (for ``task.metrics`` / ``task.fooled``)."""
        return self._model_logits(u)

    # --- checks -----------------------------------------------------------------------------------------
    def _view(self, kind: str, tree: list[Any]) -> str:
        if kind == "multiclass":
            return "logits"
        return "margin" if any(_name(a) in MARGIN_VIEW for a in tree) else "loss"

    def _check_budgets(self, tree: list[Any], u: Tensor) -> None:
        """The budget-scale rule of medadv's ``Linf`` (:func:`medadv.threats.check_budget_scale`) on the budget of
        every attack in the tree (``eps``, PI-FGSM's ``max_epsilon``), which torchattacks reads in the unit box:
        a fraction of the data range."""
        size = int(u[0].numel()) if u.ndim and u.shape[0] else None
        lo, hi = self.box.lo, self.box.lo + self.box.scale
        data = (f"({float(lo.min()):g}, {float(hi.max()):g})" if lo.numel() == 1 and hi.numel() == 1
                else "(per-channel)")
        for a in tree:
            for arg in _budget_args(a):
                eps = getattr(a, arg, None)
                norm = str(getattr(a, "norm", "L2" if "L2" in type(a).__name__ else "Linf"))
                p = 2.0 if norm == "L2" else math.inf if norm == "Linf" else math.nan
                unit = f"w.unit_eps({eps})"
                if isinstance(eps, int | float) and not isinstance(eps, bool):
                    with contextlib.suppress(ValueError):  # per-channel ranges of different widths have no one scale
                        unit = f"w.unit_eps({eps:g}) = {self.unit_eps(float(eps)):.6g}"
                check_budget_scale(
                    eps, (0.0, 1.0), name=arg, owner=f"torchattacks {type(a).__name__} ",
                    where=f" (torchattacks' unit box, onto which this TorchattacksModel maps its bounds {data})",
                    p=p, size=size, allow_large_budgets=self.allow_large_budgets, stacklevel=3,
                    advice=(f"torchattacks budgets are fractions of the data range here; for {eps} data units pass "
                            f"{arg}={unit}, or build TorchattacksModel(..., allow_large_budgets=True) if you mean it"),
                    small_advice=(f"torchattacks budgets are fractions of the data range here ({arg}=4/255 is 4/255 "
                                  f"of the range {data}); pass the fraction itself, not w.unit_eps of a budget meant "
                                  "on a [0, 1] scale"))

    def _check_tree(self, tree: list[Any], kind: str, view: str, u: Tensor, direct: bool,
                    classes: int | None) -> None:
        for a in tree:
            check_supported(SUPPORT, "torchattacks", _name(a), kind)
        sd = u.ndim - 2
        for a in tree:
            if isinstance(a, _Proxy):
                continue  # not built yet (LGV's base attack): its class was checked above
            problem = usage_problem(Usage(a, kind, view, sd, int(u.shape[1]), int(u.shape[0]), direct, classes))
            if problem:
                raise UnsupportedAttackError(f"torchattacks {type(a).__name__}: {problem}")

    def train(self, mode: bool = True) -> TorchattacksModel:
        # every torchattacks Attack.__call__ starts with model.eval() (or .train()): the first moment a direct
        # call can be checked, before the attack does anything (PGDL2's random start would already crash)
        if self._run is None:
            self._guard(None)
        return super().train(mode)

    def _guard(self, u: Tensor | None) -> None:
        """Check a direct call ``atk(u, labels)`` once, before the attack's work (see :meth:`train`)."""
        found = _calling_attack()
        if found is None:
            return  # not called by a torchattacks attack (e.g. the user evaluating the wrapper)
        atk, inputs, labels, lgv_batch = found
        if lgv_batch is not None:
            if u is not None:
                _check_lgv_batch(self, u, lgv_batch[0])
            return
        if not isinstance(inputs, Tensor) or not isinstance(atk, torchattacks.attack.Attack):
            return
        key = (id(atk), id(inputs), inputs._version, id(labels))
        if self._checked is not None and self._checked[0] == key and self._checked[1]() is inputs:
            return
        kind = self.kind(inputs)
        tree = _tree(atk)
        view = self._view(kind, tree)
        name = type(atk).__name__
        for a in tree:
            check_supported(SUPPORT, "torchattacks", _name(a), kind)
        if view == "margin":
            raise UnsupportedAttackError(
                f"torchattacks {name} reads one class per sample, so on a {kind} model it runs on the task margin, "
                "one sample at a time: call w.attack(atk, x, y) instead of atk(...)")
        # before torchattacks un-normalises them (set_normalization_used), the inputs are normalised
        data = atk.inverse_normalize(inputs) if atk._normalization_applied is True else inputs
        if data.numel() and (bool(data.min() < -_TOL) or bool(data.max() > 1 + _TOL)):
            raise UnsupportedAttackError(
                f"torchattacks {name} was called directly on data outside [0, 1] (it clamps every step to [0, 1], "
                "so data in `bounds` units such as HU would be destroyed silently); call w.attack(atk, x, y), "
                "or atk(w.encode(x), w.labels(y))")
        self._check_budgets(tree, data)
        if isinstance(labels, Tensor) and (labels.is_floating_point() or labels.dtype == torch.bool):
            raise UnsupportedAttackError(
                f"torchattacks {name} was given {labels.dtype} labels; its cross-entropy takes class indices per "
                "sample / label / voxel: call w.attack(atk, x, y), or atk(w.encode(x), w.labels(y))")
        self._check_tree(tree, kind, view, data, True, None)
        self._pending = (tree, kind, data.ndim - 2, int(data.shape[1]), int(data.shape[0])) \
            if kind == "multiclass" else None
        self._checked = (key, weakref.ref(inputs))

    def _check_classes(self, z: Tensor) -> None:
        """The multi-class checks that need the number of classes, right after the first forward."""
        assert self._pending is not None
        tree, kind, sd, ch, n = self._pending
        self._pending = None
        for a in tree:
            if isinstance(a, _Proxy):
                continue
            problem = usage_problem(Usage(a, kind, "logits", sd, ch, n, True, int(z.shape[1])))
            if problem:
                self._checked = None
                raise UnsupportedAttackError(f"torchattacks {type(a).__name__}: {problem}")

    # --- running an attack --------------------------------------------------------------------------------
    def attack(self, atk: torchattacks.attack.Attack, x: Tensor, y: Tensor) -> Tensor:
        """Run torchattacks attack ``atk`` (built on this wrapper) on data-unit ``x``; returns data-unit x_adv.

        ``y`` are the task's labels (multi-hot, label maps, class indices), or the targets when ``atk`` is in
        ``set_mode_targeted_by_label``. Raises :class:`~medadv.adapters.support.UnsupportedAttackError`
        before any work when ``atk`` (or one of its members) does not apply to this task.

        torchattacks returns no success flag, and several of its attacks (CW, Square, DeepFool, ...) return the
        clean input where they fail: use :meth:`attack_result` for the task's own fooled test on the result.
        """
        return self._attack(atk, x, y)[0]

    def attack_result(self, atk: torchattacks.attack.Attack, x: Tensor, y: Tensor) -> AttackResult:
        """:meth:`attack`, with the success flag torchattacks does not return, as a medadv
        :class:`~medadv.attacks.base.AttackResult`.

        ``fooled`` is the task's own test on the returned ``x_adv`` (one forward of the wrapped model on the
        whole batch): untargeted, the prediction left ``y``; targeted, it reached the target (``y`` in
        ``set_mode_targeted_by_label``, or the targets :meth:`attack` drew for the random, least-likely and
        function modes). ``linf``/``l2`` are the norms of ``x_adv - x`` in data units.
        """
        x_adv, ref, targeted = self._attack(atk, x, y)
        if ref is None:
            raise UnsupportedAttackError(
                f"torchattacks {type(atk).__name__} draws its targets inside torchattacks in {atk.attack_mode} mode, "
                "so whether it reached them cannot be tested; use set_mode_targeted_by_label with the targets, or "
                "w.attack for the adversarial batch alone")
        with torch.no_grad(), _modes_kept(self.box.model):
            self.box.model.eval()
            z = self._plain_logits(x_adv)
        ref = ref.to(z.device)
        fooled = self.task.fooled(z, ref, targeted=targeted)
        d = x_adv - x
        return AttackResult(x_adv=x_adv, fooled=fooled, linf=per_sample_norm(d, math.inf),
                            l2=per_sample_norm(d, 2.0), logits=z.detach(), y=ref, pred=self.task.predict(z))

    def _plain_logits(self, x: Tensor) -> Tensor:
        """The wrapped model on data-unit ``x`` (normalisation included), as the user's own evaluation sees it."""
        z = self.box.model(self.norm(x) if self.norm is not None else x)
        check_first_output(self, self.task, z)
        return z

    def _attack(self, atk: torchattacks.attack.Attack, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor | None, bool]:
        """The adversarial batch, the reference of the task's test on it (labels, or targets; ``None`` when
        torchattacks drew the targets itself) and whether the test is targeted."""
        if not isinstance(atk, torchattacks.attack.Attack):
            raise TypeError(f"`atk` must be a torchattacks Attack, got {type(atk).__name__}")
        if atk.model is not self and not _is_lgv_copy(atk, self):
            raise ValueError("`atk` must be built on this TorchattacksModel, e.g. torchattacks.PGD(wrapped, ...)")
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            raise TypeError("`x` and `y` must be tensors")
        u = self.encode(x)
        if bool((u < -_TOL).any()) or bool((u > 1 + _TOL).any()):
            raise ValueError("`x` lies outside the declared `bounds`; torchattacks would clip it silently")
        u = u.clamp(0, 1)
        kind = self.kind(x)
        tree = _tree(atk)
        view = self._view(kind, tree)
        for a in tree:
            check_supported(SUPPORT, "torchattacks", _name(a), kind)
        self._check_budgets(tree, u)
        lab = self.labels(y).to(u.device)
        name, mode = type(atk).__name__, atk.attack_mode
        # LGV hands its mode to the base attack it builds; FAB's own targeted modes work on multi-class logits
        native = name == "LGV" or (name == "FAB" and view == "logits")
        convert = bool(atk.targeted) and not native
        # one clean forward of the adapter's own when the checks or the targets need the logits
        need_z = (convert and mode == "targeted(least-likely)") or (kind == "multiclass" and (
            any(_name(a) in _NEEDS_CLASSES for a in tree) or (convert and mode == "targeted(random)")))
        z0 = None
        if need_z:
            with torch.no_grad(), _modes_kept(self):
                self.box.model.eval()
                z0 = self._model_logits(u)
        classes = 2 if view == "margin" else (None if z0 is None or kind != "multiclass" else int(z0.shape[1]))
        self._check_tree(tree, kind, view, u, False, classes)
        # the labels torchattacks gets, and the reference the task margin is taken against
        target: Tensor | None = None
        if convert:
            target = self._targets(atk, u, lab, z0)
        elif name == "JSMA" and view == "logits" and z0 is not None:
            target = (lab + 1) % int(z0.shape[1])  # torchattacks aims at (y + 1) mod 10, assuming 10 classes
        with _modes_kept(self), _as_targeted_by_label(atk, target is not None):
            if view == "margin":
                ref = lab if target is None else target
                parts = []
                for i in range(u.shape[0]):
                    self._run = _Run("margin", ref[i:i + 1], target is not None)
                    try:
                        parts.append(atk(u[i:i + 1], torch.full((1,), int(target is not None), dtype=torch.long,
                                                              device=u.device)).detach())
                    finally:
                        self._run = None
                u_adv = torch.cat(parts)
            else:
                given = lab if target is None else target
                # LGV runs on copies of this wrapper, which check themselves like a direct call
                self._run = None if name == "LGV" else _Run(view, given, target is not None)
                try:
                    if name == "PGDL2" and u.ndim == 5:
                        # PGDL2 reshapes norms to (N, 1, 1, 1): one volume at a time keeps the samples apart
                        u_adv = torch.cat([atk(u[i:i + 1], given[i:i + 1]).detach() for i in range(u.shape[0])])
                    else:
                        u_adv = atk(u, given).detach()
                finally:
                    self._run = None
        u_adv = u_adv.to(x)
        bad = ~torch.isfinite(u_adv.reshape(u_adv.shape[0], -1)).all(dim=1)
        if bool(bad.any()):
            # torchattacks divides by the gradient's mean magnitude (MI-FGSM family): a sample whose loss
            # gradient is exactly zero comes back as NaN; the attack found no direction there
            warnings.warn(f"torchattacks {name} returned NaN/inf for {int(bad.sum())} sample(s) "
                          "(zero loss gradient); they are returned unperturbed", RuntimeWarning, stacklevel=2)
            u_adv = torch.where(bad.reshape(-1, *[1] * (u.ndim - 1)), u.to(x), u_adv)
        lo = self.box.lo.to(x)
        # decoding only the perturbation keeps untouched voxels exact; the clamp removes round-off
        x_adv = torch.clamp(self.decode(u_adv, x), lo, lo + self.box.scale.to(x))
        if not atk.targeted:
            return x_adv, _as_task_labels(self.task, y, lab), False
        if target is not None:
            return x_adv, _as_task_labels(self.task, y, target), True
        # torchattacks' own targeted modes (FAB on logits, LGV) draw the targets internally; by label: y itself
        return x_adv, (y if mode == "targeted(label)" else None), True

    def _targets(self, atk: Any, u: Tensor, lab: Tensor, z0: Tensor | None) -> Tensor:
        """The targets of ``atk``'s targeted mode, per sample / label / voxel, in torchattacks' label form."""
        mode = atk.attack_mode
        if mode == "targeted(label)":
            return lab
        if mode == "targeted(custom)":
            fn = atk._target_map_function
            with torch.no_grad():
                t = fn(u, lab)
            if not isinstance(t, Tensor) or tuple(t.shape) != tuple(lab.shape):
                raise ValueError(f"the target function of set_mode_targeted_by_function must return labels shaped "
                                 f"like w.labels(y), {tuple(lab.shape)}; got {getattr(t, 'shape', type(t))}")
            return self.labels(t.to(lab.device))
        if self.task.label_source == "vector":
            if mode == "targeted(least-likely)" and int(atk._kth_min) != 1:
                raise UnsupportedAttackError(
                    f"torchattacks {type(atk).__name__}: each label has one other class, so least-likely "
                    f"kth_min={atk._kth_min} does not exist; use kth_min=1")
            return 1 - lab  # the one other class of every label
        if mode == "targeted(random)":
            k = int(z0.shape[1]) if z0 is not None else int(self.task.num_classes)  # type: ignore[attr-defined]
            r = (torch.rand(lab.shape, device=lab.device) * (k - 1)).long().clamp_max(k - 2)
            return r + (r >= lab).long()  # uniform over the classes other than the label
        assert z0 is not None
        k, kth = int(z0.shape[1]), int(atk._kth_min)
        if not 1 <= kth <= k - 1:
            raise UnsupportedAttackError(f"torchattacks {type(atk).__name__}: least-likely kth_min={kth} must be in "
                                         f"[1, {k - 1}] for {k} classes")
        z = z0.detach().scatter(1, lab.unsqueeze(1), float("inf"))  # the label itself is never the target
        return z.kthvalue(kth, dim=1).indices

def _as_task_labels(task: Task, y: Tensor, lab: Tensor) -> Tensor:
    """Labels or targets in torchattacks' form (class indices) back in the task's own form: multi-hot vectors
    in ``y``'s dtype for multi-label, integer indices / label maps otherwise."""
    if task.label_source == "vector":
        return lab.to(y.dtype if y.is_floating_point() else torch.float32)
    return lab


@contextlib.contextmanager
def _modes_kept(model: nn.Module) -> Iterator[None]:
    """Restore every sub-module's train/eval flag: torchattacks only restores the top-level one."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


_TOL = 1e-6
#: attacks whose usage checks on a multi-class model need the number of classes
_NEEDS_CLASSES = frozenset({"APGD", "APGDT", "FAB", "AutoAttack", "UPGD", "JSMA"})
_CALL = torchattacks.attack.Attack.__call__.__code__
_LGV_COLLECT = torchattacks.LGV.collect_models.__code__


@dataclass
class _Run:
    """What :meth:`TorchattacksModel.forward` presents while :meth:`TorchattacksModel.attack` runs."""

    view: str  #: "logits", "loss" or "margin"
    ref: Tensor  #: labels (or targets) the margin is taken against: one sample in the margin view
    targeted: bool


def _task_margin(task: Any, z: Tensor, ref: Tensor, targeted: bool) -> Tensor:
    """Per sample: > 0 while the task's own test says "not fooled" (untargeted) / "target reached" (targeted).

    Multi-label: the smallest per-label margin against ``ref`` (labels or target): negative exactly when a
    label differs (untargeted ``fooled``), positive exactly when every label is the target's (targeted).
    Segmentation: the soft (softmax) version of the task's test, so that it has a gradient: mean Dice against
    the labels minus ``dice_threshold``, or the mean target probability over valid voxels minus
    ``target_fraction``.
    """
    if task.label_source == "vector":
        return task.element_margin(z, ref).min(dim=1).values
    assert task.label_source == "map", task  # the support table admits label maps and multi-hot vectors here
    p = z.float().softmax(dim=1)
    mask = task.valid_mask(ref)
    if targeted:
        hit = p.gather(1, task.safe_labels(ref).unsqueeze(1)).squeeze(1)
        return (task.reduce(hit, ref) - task.target_fraction).to(z.dtype)
    t = task.one_hot(ref, p.dtype)
    if mask is not None:
        p = p * mask.unsqueeze(1).to(p.dtype)
    dims = tuple(range(2, p.ndim))
    dice = (2.0 * (p * t).sum(dims) + 1e-5) / (p.sum(dims) + t.sum(dims) + 1e-5)
    with torch.no_grad():
        # the classes task.mean_dice averages over: present in the labels or in the (hard) prediction
        pred = F.one_hot(z.argmax(1), task.num_classes).movedim(-1, 1).to(p.dtype)
        if mask is not None:
            pred = pred * mask.unsqueeze(1).to(p.dtype)
        present = (t.sum(dims) > 0) | (pred.sum(dims) > 0)
    if not task.include_background:
        dice, present = dice[:, 1:], present[:, 1:]
    w = present.to(dice.dtype)
    n = w.sum(dim=1)
    mean = torch.where(n > 0, (dice * w).sum(dim=1) / n.clamp_min(1.0), torch.ones_like(n))
    return (mean - task.dice_threshold).to(z.dtype)


#: how far past the task's boundary (in margin units: logits for multi-label, soft Dice for segmentation) the
#: margin view reports success: a sample left exactly on the boundary flips back under the round-off of another
#: batch size or thread count (DeepFool's multi-label result sat at a margin of +1e-6 in a batch of 4, -2e-7 alone)
_DECISION_TOL = 1e-4


def _decided_margin(task: Task, z: Tensor, ref: Tensor, targeted: bool, m: Tensor) -> Tensor:
    """The margin the margin-view attacks see, such that what they report as success (CW's and DeepFool's
    arg-max, Square's margin below 0) is the task's own test, ``task.fooled``, with a little room to spare.

    ``m`` (> 0: not fooled / target reached) is shifted by :data:`_DECISION_TOL` towards "not done", so success
    needs ``m`` past the boundary by that much, not on it. The soft margin (a soft Dice for segmentation) can
    also disagree with the hard test: CW kept "successes" whose hard Dice was still above the threshold. Where
    the shifted margin says done and the task's test does not, its value becomes ``±eps`` on the "not done" side;
    the gradient stays the soft margin's (straight-through), so the attacks keep their direction.
    """
    with torch.no_grad():
        done = task.fooled(z, ref, targeted=targeted)  # untargeted: left the labels; targeted: reached the target
        tiny = torch.full_like(m, torch.finfo(m.dtype).eps)
        if targeted:  # reached: m > 0
            value = torch.where(done | (m - _DECISION_TOL <= 0), m - _DECISION_TOL, -tiny)
        else:  # fooled: m < 0
            value = torch.where(done | (m + _DECISION_TOL >= 0), m + _DECISION_TOL, tiny)
    return m + (value - m).detach()


def _tree(atk: Any) -> list[Any]:
    """``atk`` and every attack it runs (MultiAttack members, AutoAttack's, SparseFool's DeepFool, LGV's base)."""
    out = [atk, *atk.__dict__.get("_attacks", {}).values()]
    if isinstance(atk, torchattacks.LGV) and atk.base_attack is None:
        out.append(_Proxy(atk.attack_class))
    seen: set[int] = set()
    return [a for a in out if not (id(a) in seen or seen.add(id(a)))]  # type: ignore[func-returns-value]


#: torchattacks' budget arguments (constructor names, stored under the same attribute)
_BUDGET_ARGS = ("eps", "max_epsilon")


def _budget_args(a: Any) -> tuple[str, ...]:
    """The budget arguments an attack's constructor takes (from torchattacks' own signatures, so a release that
    adds a budgeted attack is covered); none for a class not built yet (LGV's base attack)."""
    if isinstance(a, _Proxy):
        return ()
    try:
        params = inspect.signature(type(a).__init__).parameters
    except (TypeError, ValueError):
        return ()
    return tuple(n for n in _BUDGET_ARGS if n in params)


class _Proxy:
    """An attack class not built yet (LGV's ``attack_class``): checked against the table by its name."""

    def __init__(self, cls: type) -> None:
        self.name = cls.__name__


def _name(a: Any) -> str:
    return a.name if isinstance(a, _Proxy) else type(a).__name__


def _is_lgv_copy(atk: Any, model: TorchattacksModel) -> bool:
    """LGV deep-copies its model: accept the copy of this wrapper (same task and box)."""
    m = atk.model
    return (isinstance(atk, torchattacks.LGV) and isinstance(m, TorchattacksModel) and type(m.task) is type(model.task)
            and torch.equal(m.box.lo.cpu(), model.box.lo.cpu()) and torch.equal(m.box.scale.cpu(), model.box.scale.cpu()))


def _calling_attack() -> tuple[Any, Any, Any, Any] | None:
    """The outermost torchattacks ``Attack.__call__`` on the stack: (attack, inputs, labels, LGV batch or None).

    One walk up the Python stack per model call (microseconds); ``w.attack`` skips it.
    """
    f: FrameType | None = sys._getframe(2)
    outer: FrameType | None = None
    lgv: FrameType | None = None
    while f is not None:
        if f.f_code is _CALL:
            outer = f
        elif f.f_code is _LGV_COLLECT and lgv is None:
            lgv = f
        f = f.f_back
    if outer is None:
        return None
    loc = outer.f_locals
    # LGV training its surrogates: the batch's labels (the inputs reach forward)
    batch = None if lgv is None else (lgv.f_locals.get("target"),)
    return loc.get("self"), loc.get("inputs"), loc.get("labels"), batch


def _check_lgv_batch(model: TorchattacksModel, u: Tensor, target: Any) -> None:
    """LGV trains copies of the wrapper on its trainloader: the batches must be in the wrapper's form."""
    if bool(u.min() < -_TOL) or bool(u.max() > 1 + _TOL) or (
            isinstance(target, Tensor) and model.task.label_source != "index" and target.is_floating_point()):
        raise UnsupportedAttackError(
            "torchattacks LGV trains on its trainloader through this TorchattacksModel: the loader must yield "
            "(w.encode(x), w.labels(y)) (unit-box inputs, class-index labels)")


@contextlib.contextmanager
def _as_targeted_by_label(atk: Any, active: bool) -> Iterator[None]:
    """Run ``atk`` (and its members) in ``set_mode_targeted_by_label`` for the targets ``attack`` computed."""
    if not active:
        yield
        return
    tree = [a for a in _tree(atk) if isinstance(a, torchattacks.attack.Attack)]
    saved = [(a, {k: a.__dict__[k] for k in ("attack_mode", "targeted", "_target_map_function")}) for a in tree]
    try:
        for a in tree:
            if "targeted" in a.supported_mode:
                for k, v in (("attack_mode", "targeted(label)"), ("targeted", True),
                             ("_target_map_function", "function is a string")):
                    object.__setattr__(a, k, v)
        yield
    finally:
        for a, state in saved:
            for k, v in state.items():
                object.__setattr__(a, k, v)


class _ChannelNorm(nn.Module):
    """``(x - mean) / std`` with per-channel vectors broadcast over any number of spatial dims."""

    mean: Tensor
    std: Tensor

    def __init__(self, mean: Any, std: Any) -> None:
        super().__init__()
        m = torch.as_tensor(mean, dtype=torch.float32).flatten()
        s = torch.as_tensor(std, dtype=torch.float32).flatten()
        if m.shape != s.shape:
            raise ValueError(f"`mean` and `std` must have the same length, got {m.numel()} and {s.numel()}")
        if not bool((s > 0).all()):
            raise ValueError("`std` must be > 0")
        self.register_buffer("mean", m, persistent=False)
        self.register_buffer("std", s, persistent=False)

    def _shape(self, x: Tensor) -> tuple[int, ...]:
        c = self.mean.numel()
        if c != 1 and x.shape[1] != c:
            raise ValueError(f"normalisation has {c} channels, the input has {x.shape[1]}")
        return (1, c) + (1,) * (x.ndim - 2)

    def forward(self, x: Tensor) -> Tensor:
        shape = self._shape(x)
        return (x - self.mean.to(x).reshape(shape)) / self.std.to(x).reshape(shape)

    def inverse(self, x: Tensor) -> Tensor:
        shape = self._shape(x)
        return x * self.std.to(x).reshape(shape) + self.mean.to(x).reshape(shape)


class _Logits(nn.Module):
    """The torchattacks attack's ``get_logits`` (its normalisation included) as a module to attack."""

    def __init__(self, owner: MedadvAttack) -> None:
        super().__init__()
        self.net = owner.model  # registered, so medadv's attack_mode freezes and restores it
        self._owner = [owner]  # a list keeps the (non-module) owner out of the module tree

    def forward(self, x: Tensor) -> Tensor:
        return self._owner[0].get_logits(x)


class MedadvAttack(torchattacks.attack.Attack):
    """A medadv attack (task-aware, bounds in data units) as a ``torchattacks.Attack``.

    ``atk(inputs, labels)`` returns the adversarial batch like any torchattacks attack. Targeted modes
    (``set_mode_targeted_by_label``, ``..._by_function``; ``..._random``/``..._least_likely`` for
    multi-class) drive the medadv attack towards ``get_target_label``; ``set_normalization_used(mean, std)``
    accepts per-channel statistics for 2-D and 3-D inputs and, as in torchattacks, then expects normalised
    inputs and returns normalised outputs. ``save`` works (its printed accuracy is multi-class only, so use
    ``verbose=False`` for multi-label and segmentation models).

    Args:
        attack: a configured medadv attack, e.g. ``PGD(MultiLabel(), Linf(2/255, bounds=(0, 1)))``.
        model: the PyTorch model.
    """

    def __init__(self, attack: MedadvBase, model: nn.Module) -> None:
        if not isinstance(attack, MedadvBase):
            raise TypeError(f"`attack` must be a medadv Attack, got {type(attack).__name__}")
        check_model(model)
        super().__init__(f"Medadv{type(attack).__name__}", model)
        self.medadv_attack = attack
        self.supported_mode = ["default", "targeted"]
        self._norm: _ChannelNorm | None = None

    # --- normalisation of any rank (torchattacks reshapes to (1, C, 1, 1)) ---------------------------------
    def set_normalization_used(self, mean: Any, std: Any) -> None:
        self._norm = _ChannelNorm(mean, std)
        # filled after assignment: torchattacks' __setattr__ cannot scan dicts of tensors
        self.normalization_used = {}
        self.normalization_used["mean"] = self._norm.mean
        self.normalization_used["std"] = self._norm.std
        self._set_normalization_applied(True)

    def normalize(self, inputs: Tensor) -> Tensor:
        return self._norm(inputs)  # type: ignore[misc]

    def inverse_normalize(self, inputs: Tensor) -> Tensor:
        return self._norm.inverse(inputs)  # type: ignore[union-attr]

    # --- the attack -------------------------------------------------------------------------------------
    def __call__(self, inputs: Tensor, labels: Tensor | None = None, *args: Any, **kwargs: Any) -> Tensor:
        with _modes_kept(self.model):
            return super().__call__(inputs, labels, *args, **kwargs)

    def forward(self, inputs: Tensor, labels: Tensor | None = None) -> Tensor:
        x = inputs.clone().detach().to(self.device)
        y = None if labels is None else labels.clone().detach().to(self.device)
        atk = copy.copy(self.medadv_attack)  # a copy: the configured attack itself is never mutated
        if not atk.always_targeted:  # DAG-like attacks: y is always their target map
            atk.targeted = bool(self.targeted)
        if self.targeted:
            y = self.get_target_label(x, y)
        return atk(_Logits(self), x, y).x_adv
