"""Which torchattacks 3.5 attack applies to which medical task (the torchattacks rows of the support matrix).

Every attack class ``torchattacks.__all__`` exports (39) gets one :class:`~medadv.adapters.support.Cell` per
task kind. :class:`medadv.adapters.torchattacks.TorchattacksModel` raises the refusals from this table before
the attack does any work, and ``tests/adapters/test_torchattacks_matrix.py`` runs every cell.

How the ``ok`` cells are made to work (``w.attack(atk, x, y)`` with ``w = TorchattacksModel(...)``):

* **task loss** (:data:`LOSS_VIEW`): the gradient attacks take ``nn.CrossEntropyLoss`` of what the model
  returns; ``TorchattacksModel`` returns logits for which that cross-entropy *is* the task loss (two-class
  logits ``[0, z]`` per label: per-label BCE; per-voxel cross-entropy for segmentation). These also run when
  torchattacks is called directly as ``atk(w.encode(x), w.labels(y))``.
* **task margin** (:data:`MARGIN_VIEW`): attacks that read one class per sample (arg-max success tests,
  logit margins against the best other class, per-class Jacobians, softmax scores) see a two-class
  classifier per sample, ``[m, 0]``, where ``m`` is the task's margin against the labels: the smallest
  per-label margin for multi-label (``m < 0`` exactly when a label is flipped: the task's own "fooled"),
  the soft (softmax) mean Dice minus the task's ``dice_threshold`` for segmentation. Its sign is the task's own
  test with a margin of 1e-4 to spare: what these attacks report as success (an arg-max change, a margin below
  0) is ``task.fooled`` on the result, and :meth:`TorchattacksModel.attack_result` returns that flag, which
  torchattacks does not (CW, Square and others return the clean input where they fail).
  ``w.attack`` runs them one sample at a time (the rows an attack evaluates are then copies of that sample).
  Targeted (``set_mode_targeted_by_label``), the margin is taken against the target, ``[0, m_t]``, and
  torchattacks drives the sample to class 1.
* on a multi-class model every attack runs as torchattacks wrote it, on the model's logits.

Targeted modes: ``w.attack`` turns ``set_mode_targeted_random`` / ``_least_likely`` / ``_by_function`` into
the targets torchattacks means (another class per sample, label or voxel; the k-th least likely one; the
function's output) and runs the attack on them, so they work on every task (torchattacks' own versions read
one class per sample, and SPSA and PIFGSMPP ignore them).

Apart from this table, :func:`usage_problem` refuses settings of an ``ok`` attack that cannot work (a 3-channel
kernel on a 1-channel image, ``eps=0`` in PGDL2, the DLR loss on a two-class view, ...), again before work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .support import TASK_KINDS, Cell, ok, refused

__all__ = ["SUPPORT", "EXCLUDED", "LOSS_VIEW", "MARGIN_VIEW", "TWO_D_ONLY", "Usage", "usage_problem"]

#: Attacks whose cross-entropy (or KL divergence) becomes the task loss on multi-label and segmentation models.
LOSS_VIEW: frozenset[str] = frozenset({
    "VANILA", "GN", "FGSM", "BIM", "RFGSM", "PGD", "EOTPGD", "FFGSM", "TPGD", "MIFGSM", "UPGD", "DIFGSM",
    "TIFGSM", "NIFGSM", "SINIFGSM", "VMIFGSM", "VNIFGSM", "PIFGSM", "PIFGSMPP", "PGDL2", "LGV",
})

#: Attacks that read one class per sample: on multi-label and segmentation models they see the task margin.
MARGIN_VIEW: frozenset[str] = frozenset({
    "APGD", "SPSA", "JSMA", "EADL1", "EADEN", "CW", "DeepFool", "SparseFool", "OnePixel", "Pixle", "FAB",
    "Square", "PGDRS", "PGDRSL2", "MultiAttack",
})

#: Attacks written for 2-D images only (``c, h, w = x.shape[1:]``, 2-D convolutions or resizing, 4-D reshapes).
TWO_D_ONLY: frozenset[str] = frozenset({
    "DIFGSM", "TIFGSM", "PIFGSM", "PIFGSMPP", "Square", "OnePixel", "Pixle", "APGD", "APGDT", "AutoAttack",
    "Jitter", "PGDRS", "PGDRSL2",
})

_KINDS = TASK_KINDS
_DENSE = ("multilabel", "seg2d", "seg3d")
_SEG = ("seg2d", "seg3d")

_PGD = "torchattacks PGD / PGDL2 / MIFGSM on this TorchattacksModel (task loss) or medadv 'pgd' / 'apgd'"
_PGD_SEG = "torchattacks PGD / MIFGSM on this TorchattacksModel (task loss) or medadv 'segpgd' / 'cospgd'"


def _row(default: Cell, **cells: Cell) -> dict[str, Cell]:
    return {k: cells.get(k, default) for k in _KINDS}


_LOSS = ok("task loss")
_MARGIN = ok("task margin, per sample")
_TWO_D_3D = refused("it is written for 2-D images (it reshapes or resizes inputs as (N, C, H, W)); for 3-D "
                    "volumes use " + _PGD_SEG)

SUPPORT: dict[str, dict[str, Cell]] = {
    "VANILA": _row(ok("no perturbation: the clean baseline")),
    "GN": _row(ok("Gaussian noise baseline; `std` in unit-box units")),
    "FGSM": _row(_LOSS),
    "BIM": _row(_LOSS),
    "RFGSM": _row(_LOSS),
    "PGD": _row(_LOSS),
    "EOTPGD": _row(_LOSS),
    "FFGSM": _row(_LOSS),
    "TPGD": _row(ok("KL to the clean prediction, per label / voxel")),
    "MIFGSM": _row(_LOSS),
    "UPGD": _row(ok("loss='ce': task loss")),
    "NIFGSM": _row(_LOSS),
    "SINIFGSM": _row(_LOSS),
    "VMIFGSM": _row(_LOSS),
    "VNIFGSM": _row(_LOSS),
    "PGDL2": _row(_LOSS, seg3d=ok("task loss; one volume at a time")),
    "LGV": _row(ok("task loss; the trainloader yields (w.encode(x), w.labels(y))")),
    "DIFGSM": _row(ok("task loss; 2-D images"),
                   seg2d=refused("its input-diversity resize-and-pad moves the image but not the label map, so "
                                 "the loss compares shifted predictions with unshifted labels; use " + _PGD_SEG),
                   seg3d=_TWO_D_3D),
    "TIFGSM": _row(ok("task loss; 3-channel 2-D images"),
                   seg2d=refused("its input-diversity resize-and-pad moves the image but not the label map; use "
                                 + _PGD_SEG),
                   seg3d=_TWO_D_3D),
    "PIFGSM": _row(ok("task loss; 3-channel 2-D images"), seg3d=_TWO_D_3D),
    "PIFGSMPP": _row(ok("task loss; 3-channel 2-D images"), seg3d=_TWO_D_3D),
    "APGD": _row(_MARGIN, multiclass=ok(), seg3d=_TWO_D_3D),
    "APGDT": _row(ok(), **{k: refused("its targeted DLR loss ranks at least four classes per sample, and a "
                                      "multi-label or segmentation model has one decision per label / voxel; "
                                      "use " + (_PGD if k == "multilabel" else _PGD_SEG)) for k in _DENSE}),
    "AutoAttack": _row(ok(), **{k: refused("its APGD-T and FAB-T members rank at least four classes per sample; "
                                           "use MultiAttack([APGD(...), FAB(...), Square(...)]) through "
                                           "w.attack, or medadv 'auto'") for k in _DENSE}),
    "Jitter": _row(ok(), **{k: refused("its loss normalises the logit vector by its largest entry and one-hot "
                                       "encodes one class per sample, which has no per-label or per-voxel "
                                       "form; use " + (_PGD if k == "multilabel" else _PGD_SEG)) for k in _DENSE}),
    "SPSA": _row(_MARGIN, multiclass=ok()),
    "JSMA": _row(_MARGIN, multiclass=ok("untargeted: target (y + 1) mod K through w.attack"),
                 **{k: refused("it builds a (features x features) saliency map per step, which does not fit a "
                               "segmentation input, and changes a few pixels for one decision; use " + _PGD_SEG)
                    for k in _SEG}),
    "EADL1": _row(_MARGIN, multiclass=ok()),
    "EADEN": _row(_MARGIN, multiclass=ok()),
    "CW": _row(_MARGIN, multiclass=ok()),
    "DeepFool": _row(_MARGIN, multiclass=ok()),
    "SparseFool": _row(_MARGIN, multiclass=ok(),
                       **{k: refused("it changes one pixel at a time until a single decision flips, thousands of "
                                     "steps for a dense prediction; use " + _PGD_SEG) for k in _SEG}),
    "OnePixel": _row(_MARGIN, multiclass=ok(),
                     **{k: refused("a few changed pixels cannot push a dense prediction below its Dice threshold, "
                                   "so it would return a (nearly) clean image; use " + _PGD_SEG) for k in _SEG}),
    "Pixle": _row(_MARGIN, multiclass=ok(),
                  **{k: refused("a few moved patches cannot push a dense prediction below its Dice threshold, "
                                "so it would return a (nearly) clean image; use " + _PGD_SEG) for k in _SEG}),
    "FAB": _row(_MARGIN, multiclass=ok()),
    "Square": _row(_MARGIN, multiclass=ok(), seg3d=_TWO_D_3D),
    "PGDRS": _row(_MARGIN, multiclass=ok(), seg3d=_TWO_D_3D),
    "PGDRSL2": _row(_MARGIN, multiclass=ok(), seg3d=_TWO_D_3D),
    "MultiAttack": _row(ok("members on the task margin, per sample"), multiclass=ok()),
}

# the classifier columns say where an attack is 2-D only (a 3-D classifier's input is refused by usage_problem)
for _name in TWO_D_ONLY:
    for _kind in ("multiclass", "multilabel"):
        _cell = SUPPORT[_name][_kind]
        if _cell.status == "ok" and "2-D" not in _cell.note:
            SUPPORT[_name][_kind] = ok("; ".join(filter(None, (_cell.note, "2-D images"))))

#: torchattacks exports nothing outside image evasion, so nothing is out of scope.
EXCLUDED: dict[str, str] = {}


@dataclass(frozen=True)
class Usage:
    """What :func:`usage_problem` knows about one attack in one call."""

    attack: Any  #: the torchattacks attack (a member of the attack tree)
    kind: str  #: task kind (:data:`~medadv.adapters.support.TASK_KINDS`)
    view: str  #: "logits" (multi-class), "loss" or "margin"
    spatial_dims: int
    channels: int
    batch: int
    direct: bool  #: called as ``atk(u, labels)`` rather than through ``w.attack``
    classes: int | None  #: classes per decision as the attack sees them (None: not known yet)


_RANDOM_MODES = ("targeted(random)", "targeted(least-likely)")


def _mode(a: Any) -> str:
    return str(getattr(a, "attack_mode", "default"))


def usage_problem(u: Usage) -> str | None:
    """Why this setting of an ``ok`` attack cannot work (one sentence with the fix), or ``None``."""
    a, name, mode = u.attack, type(u.attack).__name__, _mode(u.attack)
    targeted = bool(getattr(a, "targeted", False))
    if name in TWO_D_ONLY and u.spatial_dims != 2:
        return (f"{name} is written for 2-D images (N, C, H, W) and this input has {u.spatial_dims} spatial "
                "dimensions; use torchattacks PGD / MIFGSM on this TorchattacksModel or a medadv attack")
    if name in ("TIFGSM", "PIFGSM", "PIFGSMPP") and u.channels != 3:
        return (f"{name} convolves with a fixed 3-channel kernel (RGB images) and this input has {u.channels} "
                "channel(s); use MIFGSM or DIFGSM (multi-class / multi-label) or PGD")
    if name in ("PGDL2", "PGDRSL2") and not float(a.eps) > 0:
        return f"{name} with eps={a.eps} divides by a zero perturbation norm and returns NaN; give eps > 0"
    if name == "PGDL2" and u.spatial_dims == 3 and u.batch > 1 and u.direct:
        return ("PGDL2 reshapes per-sample norms to (N, 1, 1, 1), which mixes the samples of a 3-D batch; "
                "call w.attack(atk, x, y), which runs it one volume at a time")
    if name in ("APGD", "UPGD") and isinstance(a.loss, str) and a.loss != "ce":
        if u.view != "logits":
            return (f"{name}'s loss={a.loss!r} ranks classes per sample and sees two (correct / fooled) on a "
                    f"{u.kind} model; use loss='ce'")
        need = 4 if targeted else 3
        if u.classes is not None and u.classes < need:
            return f"{name}'s loss={a.loss!r} needs at least {need} classes, the model has {u.classes}; use loss='ce'"
        if targeted and mode == "targeted(label)":
            return (f"{name}'s targeted loss={a.loss!r} reads `labels` as both the true class and the target "
                    "in set_mode_targeted_by_label; use loss='ce' or set_mode_targeted_by_function")
    if name in ("APGDT", "FAB", "AutoAttack"):
        multi = name != "FAB" or bool(a.multi_targeted)
        n = int(a.n_classes) if name == "AutoAttack" else int(a.n_target_classes) + 1
        if multi and u.view == "margin":
            return (f"{name}'s multi-targeted search ranks {n} classes and sees two (correct / fooled) on a "
                    f"{u.kind} model; use multi_targeted=False")
        if multi and u.classes is not None and n > u.classes:
            return f"{name} was built with n_classes={n} and the model has {u.classes} classes; pass n_classes={u.classes}"
        if name != "FAB" and u.classes is not None and u.classes < 4:
            return f"{name}'s targeted DLR loss needs at least 4 classes, the model has {u.classes}; use APGD"
    if name == "FAB" and targeted:
        if u.view == "margin":
            return "targeted FAB on a multi-label or segmentation model is not supported; use targeted CW or PGD"
        if mode == "targeted(label)":
            return ("FAB reads `labels` as the true class, so set_mode_targeted_by_label attacks towards the true "
                    "class; use set_mode_targeted_by_function")
    if name == "LGV" and targeted:
        if mode not in _RANDOM_MODES:
            return ("LGV passes only torchattacks' random and least-likely targeted modes to its base attack; "
                    "use set_mode_targeted_random / _least_likely")
        if u.view != "logits":
            return ("LGV's targeted modes pick one class per sample inside its base attack; on a multi-label or "
                    "segmentation model use targeted PGD with set_mode_targeted_by_label")
    if name == "MultiAttack":
        if any(getattr(m, "targeted", False) for m in a.attacks):
            return ("MultiAttack counts a sample as done once its prediction leaves `labels`, so targeted members "
                    "would be judged as untargeted; run the targeted attacks on their own")
    if u.direct and targeted and mode in _RANDOM_MODES and u.view != "logits":
        return (f"torchattacks' {mode} mode picks one class per sample and cannot read multi-label vectors or "
                "label maps; call w.attack(atk, x, y), which draws the targets per label / voxel")
    if u.direct and targeted and mode != "targeted(label)" and name in ("SPSA", "PIFGSMPP"):
        return (f"{name} ignores torchattacks' {mode} mode and uses `labels` as the targets; call "
                "w.attack(atk, x, y), which computes the targets first, or use set_mode_targeted_by_label")
    if u.direct and name == "JSMA" and not targeted and u.view == "logits" and u.classes is not None\
            and u.classes < 10:
        return ("untargeted JSMA aims at class (y + 1) mod 10, which does not exist on a model with "
                f"{u.classes} classes; call w.attack(atk, x, y), which aims at (y + 1) mod {u.classes}")
    return None
