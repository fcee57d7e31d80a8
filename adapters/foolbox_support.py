"""Which Foolbox 3 attack applies to which medical task (the Foolbox rows of the support matrix).

Every attack class ``foolbox.attacks`` exports (58 classes; aliases such as ``PGD`` or ``FGSM`` are the same
class and share its row, keyed by the class's own name) gets one :class:`~medadv.adapters.support.Cell` per
task kind. :class:`medadv.adapters.foolbox.TaskModel` raises the refusals from this table before the attack
does any work, and ``tests/adapters/test_foolbox_matrix.py`` runs every cell.

How the ``ok`` cells are made to work:

* gradient attacks (every ``BaseGradientDescent``: PGD, BIM, FGM, their Adam and momentum variants, Sparse L1
  Descent) take ``ep.crossentropy(model(x), labels)``; the logits a ``TaskModel`` returns compute the task's
  own per-sample loss there (per-label BCE, per-voxel CE or Dice), and the medadv criteria hand over the
  multi-hot vectors or label maps (``target_classes`` for targeted criteria, which Foolbox descends);
* decision- and score-based attacks (noise, blur, contrast, blending, salt-and-pepper, Boundary,
  HopSkipJump, Pointwise, dataset, inversion, binarization refinement) only ask the criterion, and the
  medadv criteria are the task's own success test (any label flipped, Dice or pixel accuracy below a
  threshold, the target reached);
* on a multi-class model every attack runs as Foolbox wrote it, with integer labels.

Attacks refused on multi-label and segmentation models read one class axis (arg-max, softmax, a logit margin
against the best other class, class-index labels of shape ``(N,)``); no task-loss or criterion substitute
keeps their meaning there.
"""

from __future__ import annotations

from .support import TASK_KINDS, Cell, ok, refused

__all__ = ["SUPPORT", "EXCLUDED", "GRADIENT", "DECISION", "CLASS_AXIS", "UNIT_BOX_ONLY"]

_CLASSIFIERS = ("multiclass", "multilabel")
_DENSE = ("multilabel", "seg2d", "seg3d")

#: Gradient attacks (Foolbox's ``BaseGradientDescent`` family): the task loss replaces cross-entropy.
GRADIENT: tuple[str, ...] = (
    "L1ProjectedGradientDescentAttack", "L2ProjectedGradientDescentAttack", "LinfProjectedGradientDescentAttack",
    "L1AdamProjectedGradientDescentAttack", "L2AdamProjectedGradientDescentAttack",
    "LinfAdamProjectedGradientDescentAttack",
    "L1BasicIterativeAttack", "L2BasicIterativeAttack", "LinfBasicIterativeAttack",
    "L1AdamBasicIterativeAttack", "L2AdamBasicIterativeAttack", "LinfAdamBasicIterativeAttack",
    "L1MomentumIterativeFastGradientMethod", "L2MomentumIterativeFastGradientMethod",
    "LinfMomentumIterativeFastGradientMethod",
    "L1FastGradientAttack", "L2FastGradientAttack", "LinfFastGradientAttack",
    "SparseL1DescentAttack",
)

#: Attacks that only ask the criterion (or do not query the model at all): the task's success test applies.
DECISION: tuple[str, ...] = (
    "L2AdditiveGaussianNoiseAttack", "L2AdditiveUniformNoiseAttack", "L2ClippingAwareAdditiveGaussianNoiseAttack",
    "L2ClippingAwareAdditiveUniformNoiseAttack", "LinfAdditiveUniformNoiseAttack",
    "L2RepeatedAdditiveGaussianNoiseAttack", "L2RepeatedAdditiveUniformNoiseAttack",
    "L2ClippingAwareRepeatedAdditiveGaussianNoiseAttack", "L2ClippingAwareRepeatedAdditiveUniformNoiseAttack",
    "LinfRepeatedAdditiveUniformNoiseAttack",
    "L2ContrastReductionAttack", "BinarySearchContrastReductionAttack", "LinearSearchContrastReductionAttack",
    "LinearSearchBlendedUniformNoiseAttack", "SaltAndPepperNoiseAttack", "InversionAttack", "DatasetAttack",
    "BinarizationRefinementAttack", "BoundaryAttack", "HopSkipJumpAttack", "PointwiseAttack",
    "GaussianBlurAttack", "SpatialAttack",
)

#: Attacks built on one class axis: Foolbox's own behaviour on multi-class models, refused elsewhere.
CLASS_AXIS: tuple[str, ...] = (
    "L2DeepFoolAttack", "LinfDeepFoolAttack", "L2CarliniWagnerAttack", "EADAttack", "DDNAttack",
    "L0FMNAttack", "L1FMNAttack", "L2FMNAttack", "LInfFMNAttack", "NewtonFoolAttack", "GenAttack",
    "VirtualAdversarialAttack",
    "L0BrendelBethgeAttack", "L1BrendelBethgeAttack", "L2BrendelBethgeAttack", "LinfinityBrendelBethgeAttack",
)

#: Attacks that clip to [0, 1] whatever the model bounds (Foolbox 3.3.4): the TaskModel must have bounds (0, 1).
UNIT_BOX_ONLY: frozenset[str] = frozenset({"HopSkipJumpAttack", "GenAttack"})

_TITLE = {"multilabel": "multi-label", "seg2d": "segmentation", "seg3d": "segmentation"}
_INSTEAD = {
    "multilabel": "fb.attacks.L2PGD / LinfPGD / L1PGD on this TaskModel with mfb.criterion(task, y) "
                  "(task loss), or medadv 'apgd'",
    "seg2d": "fb.attacks.L2PGD / LinfPGD on this TaskModel with mfb.criterion(task, y) (task loss), "
             "or medadv 'segpgd' / 'apgd'",
}
_INSTEAD["seg3d"] = _INSTEAD["seg2d"]


def _class_axis(what: str, kind: str, instead: str | None = None) -> Cell:
    return refused(f"{what}, which has no meaning for a {_TITLE[kind]} model; use "
                   f"{instead or _INSTEAD[kind]} instead")


def _row(**cells: Cell) -> dict[str, Cell]:
    assert set(cells) == set(TASK_KINDS), cells
    return {k: cells[k] for k in TASK_KINDS}


def _same(cell: Cell) -> dict[str, Cell]:
    return {k: cell for k in TASK_KINDS}


def _build() -> dict[str, dict[str, Cell]]:
    table: dict[str, dict[str, Cell]] = {}
    for name in GRADIENT:
        native = ok("Foolbox's cross-entropy")
        task_loss = ok("task loss")
        table[name] = _row(multiclass=native, multilabel=task_loss, seg2d=task_loss, seg3d=task_loss)

    for name in DECISION:
        table[name] = _same(ok("task criterion"))
    table["BinarizationRefinementAttack"] = _same(ok("task criterion; model must binarise its input"))
    table["HopSkipJumpAttack"] = _same(ok("task criterion; [0, 1] units: fmodel.transform_bounds((0, 1))"))
    table["PointwiseAttack"]["seg3d"] = refused(
        "Pointwise restores the perturbed voxels one model call at a time, sweep after sweep (about 10^7 "
        "forward passes per sweep on a 256^3 CT), so it does not finish on volumes; use fb.attacks.BoundaryAttack "
        "with mfb.criterion(task, y) or medadv 'square' instead")
    table["GaussianBlurAttack"]["seg3d"] = refused(
        "Foolbox blurs 2-D images only (it rejects 5-D volumes); use medadv 'square' (score-based) or the "
        "noise attacks (e.g. fb.attacks.L2RepeatedAdditiveGaussianNoiseAttack) for a 3-D model")
    moves = ("rotating and shifting the image moves the anatomy away from the label map, so a lower Dice "
             "measures the transform, not the model; use fb.attacks.LinfPGD with mfb.criterion(task, y) or "
             "medadv 'dag' instead")
    table["SpatialAttack"]["seg2d"] = refused(moves)
    table["SpatialAttack"]["seg3d"] = refused(
        "Foolbox rotates and shifts 2-D images only and a moved volume no longer matches its label map; "
        "use fb.attacks.LinfPGD with mfb.criterion(task, y) or medadv 'vafa' instead")

    native = ok("Foolbox's own, class indices")
    for name in ("L2DeepFoolAttack", "LinfDeepFoolAttack"):
        table[name] = {"multiclass": native, **{k: _class_axis(
            "DeepFool linearises the arg-max over one softmax class axis and moves towards the nearest "
            "other class", k) for k in _DENSE}}
    margin = "minimises the logit margin of the label against the best other class and needs class-index labels (N,)"
    for name, what, instead in (
            ("L2CarliniWagnerAttack", f"C&W {margin}", "fb.attacks.L2PGD on this TaskModel with mfb.criterion(task, y) "
                                                        "(task loss), or medadv 'apgd' with its margin loss"),
            ("EADAttack", f"EAD {margin}", "fb.attacks.L1PGD or SparseL1DescentAttack on this TaskModel with "
                                           "mfb.criterion(task, y) (task loss), or medadv 'apgd' with its margin loss")):
        table[name] = {"multiclass": native, **{k: _class_axis(what, k, instead) for k in _DENSE}}
    table["DDNAttack"] = {"multiclass": native, **{k: _class_axis(
        "DDN needs class-index labels (N,) and stops on the arg-max", k,
        "fb.attacks.L2PGD or L2BasicIterativeAttack on this TaskModel with mfb.criterion(task, y) "
        "(task loss, fixed budget)") for k in _DENSE}}
    for name in ("L0FMNAttack", "L1FMNAttack", "L2FMNAttack", "LInfFMNAttack"):
        table[name] = {"multiclass": native, **{k: _class_axis(
            "FMN descends the logit margin of the label against the best other class and needs class-index "
            "labels (N,)", k) for k in _DENSE}}
    table["NewtonFoolAttack"] = {"multiclass": ok("Foolbox's own, class indices; its stepsize 0.1 gives NaN in "
                                                  "Foolbox 3.3.4, keep the default 0.01"), **{k: _class_axis(
        "NewtonFool drives the softmax score of the labelled class down and needs class-index labels (N,)", k)
        for k in _DENSE}}
    table["VirtualAdversarialAttack"] = {"multiclass": native, **{k: _class_axis(
        "the virtual adversarial direction is a KL divergence over a softmax on the last axis and the attack "
        "needs class-index labels (N,)", k) for k in _DENSE}}
    table["GenAttack"] = {"multiclass": ok("Foolbox's own, target class indices; [0, 1] units"), **{k: _class_axis(
        "GenAttack is targeted at one class index per sample and its fitness is that class's softmax log-odds",
        k, "medadv 'square' (score-based, task loss) or fb.attacks.LinfPGD with "
           "mfb.criterion(task, target, targeted=True)") for k in _DENSE}}
    numba = ("Foolbox's Brendel-Bethge attacks need numba, which medadv does not install or test, and they "
             "follow the logit margin of one class axis; use fb.attacks.L2FMNAttack / LInfFMNAttack on a "
             "multi-class model or medadv 'apgd' instead")
    for name in ("L0BrendelBethgeAttack", "L1BrendelBethgeAttack", "L2BrendelBethgeAttack",
                 "LinfinityBrendelBethgeAttack"):
        table[name] = _same(refused(numba))
    return table


#: ``{attack class name: {task kind: Cell}}`` for every attack class ``foolbox.attacks`` exports.
SUPPORT: dict[str, dict[str, Cell]] = _build()

#: Foolbox attacks left out of the matrix (other domains); Foolbox 3.3.4 exports image evasion attacks only.
EXCLUDED: dict[str, str] = {}
