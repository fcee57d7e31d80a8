"""Which ART evasion attack, trainer and metric applies to which medical task (the ART rows of the matrix).

Every attack class ``art.attacks.evasion`` exports (ART 1.20.1: 59 classes, 17 of them for other domains in
:data:`EXCLUDED`) gets one :class:`~medadv.adapters.support.Cell` per task kind in :data:`SUPPORT`; ART's
adversarial trainers (``art.defences.trainer`` classes) and robustness metrics (``art.metrics`` functions)
get theirs in :data:`TRAINERS_AND_METRICS` (same :class:`Cell` type, keyed by class or function name).
:class:`medadv.adapters.art.ARTClassifier` and :class:`~medadv.adapters.art.ARTSegmenter` raise the refusals
from these tables when the attack is constructed (or at the first call into the estimator, before any
model call), and ``tests/adapters/test_art_matrix.py`` runs every cell.

How the ``ok`` cells are made to work:

* loss-gradient attacks (FGM, PGD on both back ends, BIM, momentum, Shadow) get the task loss: per-label BCE
  with the multi-hot ``y`` kept multi-hot, per-voxel CE / Dice on label maps;
* ``SquareAttack`` takes ART's own ``adv_criterion`` and ``loss`` arguments: the estimators'
  ``adversarial_criterion`` (the task's ``fooled``) and ``margin_loss`` (the task's logit margin);
* decision-based attacks (``BoundaryAttack``, ``HopSkipJump``) on a multi-label model run on
  ``clf.label_powerset()``: an ART classifier whose classes are the label *sets*, so ART's arg-max test is
  exactly the task's success test (any label flipped; targeted: the target label vector reached);
* feature-space attacks (``FeatureAdversariesNumpy``/``PyTorch``) only read a layer's activations;
* on a multi-class model every attack runs as ART wrote it.

:data:`PARAM_RULES` refuses the parameter settings that bring ART's arg-max logic back into an ``ok`` attack
(e.g. restarts chosen by arg-max success on a multi-label model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from .support import TASK_KINDS, Cell, ok, refused

__all__ = ["SUPPORT", "EXCLUDED", "TRAINERS_AND_METRICS", "EXCLUDED_TRAINERS_AND_METRICS", "PARAM_RULES",
           "POWERSET", "SQUARE_LIKE"]

_SEG = ("seg2d", "seg3d")

# --- what to use instead, per task ------------------------------------------------------------------------
_ML_INSTEAD = "use ART ProjectedGradientDescent or FastGradientMethod with the multi-hot y, or medadv's 'apgd'"
_SEG_INSTEAD = ("use ART ProjectedGradientDescent, BasicIterativeMethod or FastGradientMethod on ARTSegmenter "
                "with a label map, or medadv's 'segpgd' / 'cospgd' / 'dag'")

_R_CLASS_AXIS_ML = ("it moves the input across the boundary between the arg-max class and the others, which "
                    "independent sigmoid labels do not have; " + _ML_INSTEAD)
_R_SCORE_ML = ("it optimises the score of the arg-max class (one class per image), which independent sigmoid "
               "labels do not have; " + _ML_INSTEAD)
_R_ARGMAX_SUCCESS_ML = ("it decides success by the arg-max class (one class per image), which is meaningless for "
                        "independent labels; " + _ML_INSTEAD)
_R_APGD_ML = ("ART's APGD family only attacks samples whose arg-max output equals the arg-max label (ART "
              "internals), so most multi-label samples are left untouched; use medadv's 'apgd' or ART "
              "ProjectedGradientDescent with the multi-hot y")
_R_PATCH_ML = ("ART's patch attacks train the patch with cross-entropy on the arg-max target class; "
               + _ML_INSTEAD)
_R_CLASSIFIER_SEG = "it needs one class label per image (an ART classifier); " + _SEG_INSTEAD
_R_DECISION_SEG = ("it is an image-classification decision attack (one label per image); for segmentation use "
                   "Foolbox's BoundaryAttack / HopSkipJumpAttack with "
                   "medadv.adapters.foolbox.SegmentationMisclassification, or medadv's 'square'")
_R_PGD_TORCH_SEG = ("ART's PyTorch PGD back end requires a classifier; use ProjectedGradientDescent (it picks the "
                    "numpy back end for ARTSegmenter) or ProjectedGradientDescentNumpy")
_R_SPATIAL_SEG = ("rotating or shifting the input moves the anatomy the label map describes, so the clean label "
                  "map no longer applies; " + _SEG_INSTEAD)
_R_PATCH_SEG = ("ART's patch attacks train one patch towards an image-level target class; for a region target "
                "use ART ProjectedGradientDescent(targeted=True, mask=...) on ARTSegmenter with a target label map")
_R_SQUARE_3D = ("ART's SquareAttack only takes 4-D image batches (N, C, H, W); use medadv's 'square' for volumes")
_R_FEATURE_NP = ("ART's FeatureAdversariesNumpy runs scipy L-BFGS-B over every input element with one network "
                 "call per function evaluation (minutes for a 16x16 image); use FeatureAdversariesPyTorch")
_R_VAT = ("ART's VirtualAdversarialMethod needs a model that outputs probabilities in [0, 1], medadv's "
          "estimators return logits; use ART ProjectedGradientDescent or medadv's 'pgd'")
_R_SIMBA = ("ART's SimBA needs a model that outputs probabilities, medadv's estimators return logits; use ART "
            "SquareAttack or medadv's 'square' for a score-based attack")
_R_RGB = ("it perturbs colour (hue, saturation) or simulates a coloured light source on RGB photographs, which "
          "does not apply to single-channel medical images; use ART ProjectedGradientDescent or medadv's 'pgd'")
_R_GRAPHITE = ("GRAPHITE builds physical-world patches for RGB photographs with OpenCV transforms (not installed "
               "with medadv); use ART ProjectedGradientDescent(mask=...) for a region-limited attack")
_R_AUTOATTACK_MC = ("ART's AutoAttack imports the optional package `multiprocess` in every `generate` (not "
                    "installed with medadv); use medadv's 'autoattack' (the reference pyautoattack code)")
_R_AUTOATTACK = ("its APGD, DeepFool and Square members decide success by the arg-max class, and it needs the "
                 "optional package `multiprocess`; use medadv's 'auto' evaluation")
_R_THRESHOLD = ("ART's ThresholdAttack needs the optional package `cma` (not installed with medadv); use "
                "PixelAttack or medadv's 'square'")
_R_PATCH_NUMPY = ("ART 1.20.1's AdversarialPatchNumpy fails in its own constructor (reset_patch before the patch "
                  "exists); use AdversarialPatchPyTorch")
_R_GEODA = ("ART 1.20.1's GeoDA calls np.mat, which NumPy 2 removed, so it fails in its first step; use "
            "HopSkipJump (on clf.label_powerset() for multi-label models) or medadv's 'square'")
_R_TUP = ("ART's TargetedUniversalPerturbation pushes every image towards one target class with per-image "
          "FGSM/DeepFool steps; use UniversalPerturbation or ART ProjectedGradientDescent(targeted=True)")
_R_POWERSET_ONLY = ("it compares arg-max classes; run it on clf.label_powerset() (label sets as classes), where "
                    "ART's test is the task's own: any label flipped, or the target label vector reached")


def _row(**cells: Cell) -> dict[str, Cell]:
    missing = set(TASK_KINDS) - set(cells)
    if missing:
        raise AssertionError(f"row lacks {missing}")
    return cells


def _same(cell: Cell) -> dict[str, Cell]:
    return {k: cell for k in TASK_KINDS}


def _classifier_only(ml: Cell, mc: Cell | None = None, seg: str = _R_CLASSIFIER_SEG) -> dict[str, Cell]:
    return _row(multiclass=mc or ok(), multilabel=ml, seg2d=refused(seg), seg3d=refused(seg))


_TASK_LOSS = ok("task loss")
_TASK_LOSS_Y = ok("task loss; y multi-hot")
_SEG_LOSS = ok("task loss; label map y")
_SEG_LOSS_NO_RANDOM = ok("task loss; label map y; num_random_init=0")

#: ART evasion attack class name -> task kind -> cell.
SUPPORT: dict[str, dict[str, Cell]] = {
    # --- gradient attacks on the task loss ------------------------------------------------------------------
    "FastGradientMethod": _row(multiclass=ok(), multilabel=ok("task loss; y multi-hot; not minimal"),
                               seg2d=_SEG_LOSS, seg3d=_SEG_LOSS),
    "ProjectedGradientDescent": _row(multiclass=ok(), multilabel=ok("task loss; y multi-hot; num_random_init<=1"),
                                     seg2d=_SEG_LOSS_NO_RANDOM, seg3d=_SEG_LOSS_NO_RANDOM),
    "ProjectedGradientDescentNumpy": _row(multiclass=ok(),
                                          multilabel=ok("task loss; y multi-hot; num_random_init<=1"),
                                          seg2d=_SEG_LOSS_NO_RANDOM, seg3d=_SEG_LOSS_NO_RANDOM),
    "ProjectedGradientDescentPyTorch": _classifier_only(ok("task loss; y multi-hot; num_random_init<=1"),
                                                        seg=_R_PGD_TORCH_SEG),
    "BasicIterativeMethod": _row(multiclass=ok(), multilabel=_TASK_LOSS_Y, seg2d=_SEG_LOSS, seg3d=_SEG_LOSS),
    "MomentumIterativeMethod": _row(multiclass=ok(), multilabel=_TASK_LOSS_Y, seg2d=_SEG_LOSS, seg3d=_SEG_LOSS),
    "AutoProjectedGradientDescent": _classifier_only(refused(_R_APGD_ML)),
    "AutoConjugateGradient": _classifier_only(refused(_R_APGD_ML)),
    "RescalingAutoConjugateGradient": _classifier_only(refused(_R_APGD_ML)),
    "AutoAttack": _row(multiclass=refused(_R_AUTOATTACK_MC), multilabel=refused(_R_AUTOATTACK),
                       seg2d=refused(_R_CLASSIFIER_SEG), seg3d=refused(_R_CLASSIFIER_SEG)),
    "ShadowAttack": _classifier_only(ok("task loss; y multi-hot; one 2-D image per call")),
    "Wasserstein": _classifier_only(refused(_R_ARGMAX_SUCCESS_ML)),
    "VirtualAdversarialMethod": _row(multiclass=refused(_R_VAT), multilabel=refused(_R_VAT),
                                     seg2d=refused(_R_CLASSIFIER_SEG), seg3d=refused(_R_CLASSIFIER_SEG)),
    # --- class-axis (minimal-perturbation) attacks ------------------------------------------------------------
    "DeepFool": _classifier_only(refused(_R_CLASS_AXIS_ML)),
    "NewtonFool": _classifier_only(refused(_R_CLASS_AXIS_ML)),
    "CarliniL0Method": _classifier_only(refused(_R_CLASS_AXIS_ML)),
    "CarliniL2Method": _classifier_only(refused(_R_CLASS_AXIS_ML)),
    "CarliniLInfMethod": _classifier_only(refused(_R_CLASS_AXIS_ML)),
    "ElasticNet": _classifier_only(refused(_R_CLASS_AXIS_ML)),
    "SaliencyMapMethod": _classifier_only(refused(_R_CLASS_AXIS_ML)),
    # --- score- and decision-based attacks ----------------------------------------------------------------------
    "SquareAttack": _row(multiclass=ok(), multilabel=ok("adv_criterion=clf.adversarial_criterion, "
                                                        "loss=clf.margin_loss; y multi-hot"),
                         seg2d=ok("adv_criterion=est.adversarial_criterion, loss=est.margin_loss"),
                         seg3d=refused(_R_SQUARE_3D)),
    "BoundaryAttack": _classifier_only(ok("on clf.label_powerset()"), seg=_R_DECISION_SEG),
    "HopSkipJump": _classifier_only(ok("on clf.label_powerset()"), seg=_R_DECISION_SEG),
    "GeoDA": _row(multiclass=refused(_R_GEODA), multilabel=refused(_R_GEODA), seg2d=refused(_R_GEODA),
                  seg3d=refused(_R_GEODA)),
    "SignOPTAttack": _classifier_only(ok("on clf.label_powerset()"), seg=_R_DECISION_SEG),
    "SimBA": _row(multiclass=refused(_R_SIMBA), multilabel=refused(_R_SIMBA),
                  seg2d=refused(_R_CLASSIFIER_SEG), seg3d=refused(_R_CLASSIFIER_SEG)),
    "ZooAttack": _classifier_only(refused(_R_SCORE_ML)),
    "PixelAttack": _classifier_only(refused(_R_SCORE_ML)),
    "ThresholdAttack": _row(multiclass=refused(_R_THRESHOLD), multilabel=refused(_R_SCORE_ML),
                            seg2d=refused(_R_CLASSIFIER_SEG), seg3d=refused(_R_CLASSIFIER_SEG)),
    # --- universal, spatial, patch and feature attacks ------------------------------------------------------------
    "UniversalPerturbation": _classifier_only(refused(_R_ARGMAX_SUCCESS_ML)),
    "TargetedUniversalPerturbation": _row(multiclass=refused(_R_TUP), multilabel=refused(_R_ARGMAX_SUCCESS_ML),
                                          seg2d=refused(_R_CLASSIFIER_SEG), seg3d=refused(_R_CLASSIFIER_SEG)),
    "SpatialTransformation": _row(multiclass=ok(), multilabel=refused(_R_ARGMAX_SUCCESS_ML),
                                  seg2d=refused(_R_SPATIAL_SEG), seg3d=refused(_R_SPATIAL_SEG)),
    "AdversarialPatch": _classifier_only(refused(_R_PATCH_ML), seg=_R_PATCH_SEG),
    "AdversarialPatchPyTorch": _classifier_only(refused(_R_PATCH_ML), seg=_R_PATCH_SEG),
    "AdversarialPatchNumpy": _same(refused(_R_PATCH_NUMPY)),
    "FeatureAdversariesPyTorch": _row(multiclass=ok("feature space; y = guide images"),
                                      multilabel=ok("feature space; y = guide images"),
                                      seg2d=ok("feature space; y = guide images"),
                                      seg3d=ok("feature space; y = guide images")),
    "FeatureAdversariesNumpy": _same(refused(_R_FEATURE_NP)),
    "CompositeAdversarialAttackPyTorch": _same(refused(_R_RGB)),
    "LaserAttack": _same(refused(_R_RGB)),
    "GRAPHITEBlackbox": _same(refused(_R_GRAPHITE)),
    "GRAPHITEWhiteboxPyTorch": _same(refused(_R_GRAPHITE)),
}

#: Exported ``art.attacks.evasion`` classes outside the medical-imaging scope, with why.
EXCLUDED: dict[str, str] = {
    "AdversarialPatchTensorFlowV2": "TensorFlow v2 estimators only",
    "FeatureAdversariesTensorFlowV2": "TensorFlow v2 estimators only",
    "ProjectedGradientDescentTensorFlowV2": "TensorFlow v2 estimators only",
    "MalwareGDTensorFlow": "Windows PE malware byte sequences, TensorFlow only",
    "CarliniWagnerASR": "speech recognition (audio)",
    "ImperceptibleASR": "speech recognition (audio)",
    "ImperceptibleASRPyTorch": "speech recognition (audio)",
    "DPatch": "object detection",
    "RobustDPatch": "object detection",
    "SNAL": "object detection (YOLO)",
    "OverloadPyTorch": "object detection (YOLO latency)",
    "AdversarialTexturePyTorch": "object tracking (video)",
    "OverTheAirFlickeringPyTorch": "video classification",
    "FrameSaliencyAttack": "video classification (perturbs whole frames along a time axis)",
    "DecisionTreeAttack": "scikit-learn decision trees",
    "HighConfidenceLowUncertainty": "GPy Gaussian-process classifiers",
    "LowProFool": "tabular data (feature-importance weighted)",
}

# --- trainers and metrics ------------------------------------------------------------------------------------
_R_TRAIN_SOFTMAX_ML = ("its training loss is softmax cross-entropy / KL on arg-max labels (sizes mismatch with "
                       "multi-hot labels); use AdversarialTrainer or AdversarialTrainerMadryPGD, which train on "
                       "the task loss")
_R_TRAIN_SEG = ("it needs an ART classifier (class labels, softmax outputs); use AdversarialTrainer or "
                "AdversarialTrainerMadryPGD(num_random_init=0) on ARTSegmenter")
_R_METRIC_ML = ("it counts a sample as fooled when its arg-max class changes and bounds the top-class margin, "
                "which independent labels do not have; use medadv's evaluate() with a MultiLabel task")
_R_METRIC_SEG = ("it needs an ART classifier (one class per image); use medadv's evaluate() with a Segmentation "
                 "task (Dice under attack)")
_TRAIN_OK = ok("task loss")

_R_OAAT = ("OAAT needs an LPIPS feature network, weight-averaged model copies and a CIFAR-style `train_params` "
           "schedule, none of which medadv checks; use AdversarialTrainerAWPPyTorch or AdversarialTrainer")

#: ART trainer class names and ``art.metrics`` function names -> task kind -> cell.
TRAINERS_AND_METRICS: dict[str, dict[str, Cell]] = {
    "AdversarialTrainer": _row(multiclass=ok(), multilabel=_TRAIN_OK, seg2d=_TRAIN_OK, seg3d=_TRAIN_OK),
    "AdversarialTrainerMadryPGD": _row(multiclass=ok(), multilabel=ok("task loss; num_random_init<=1"),
                                       seg2d=ok("task loss; num_random_init=0"),
                                       seg3d=ok("task loss; num_random_init=0")),
    "AdversarialTrainerFBFPyTorch": _classifier_only(refused(_R_TRAIN_SOFTMAX_ML), ok("model not an nn.Sequential"),
                                                     seg=_R_TRAIN_SEG),
    "AdversarialTrainerTRADESPyTorch": _classifier_only(refused(_R_TRAIN_SOFTMAX_ML),
                                                        ok("model not an nn.Sequential"), seg=_R_TRAIN_SEG),
    "AdversarialTrainerAWPPyTorch": _classifier_only(refused(_R_TRAIN_SOFTMAX_ML), seg=_R_TRAIN_SEG),
    "AdversarialTrainerOAATPyTorch": _row(multiclass=refused(_R_OAAT), multilabel=refused(_R_TRAIN_SOFTMAX_ML),
                                          seg2d=refused(_R_TRAIN_SEG), seg3d=refused(_R_TRAIN_SEG)),
    "empirical_robustness": _classifier_only(refused(_R_METRIC_ML), seg=_R_METRIC_SEG),
    "adversarial_accuracy": _classifier_only(refused(_R_METRIC_ML), seg=_R_METRIC_SEG),
    "clever": _classifier_only(refused(_R_METRIC_ML), seg=_R_METRIC_SEG),
    "clever_u": _classifier_only(refused(_R_METRIC_ML), seg=_R_METRIC_SEG),
    "clever_t": _classifier_only(refused(_R_METRIC_ML), seg=_R_METRIC_SEG),
    "loss_sensitivity": _same(ok("task loss gradient")),
    "loss_gradient_check": _same(ok("task loss gradient")),
}

#: Exported trainers and metrics outside the table, with why (ART itself refuses them for these estimators).
EXCLUDED_TRAINERS_AND_METRICS: dict[str, str] = {
    "AdversarialTrainerFBF": "abstract base class (use AdversarialTrainerFBFPyTorch)",
    "AdversarialTrainerTRADES": "abstract base class (use AdversarialTrainerTRADESPyTorch)",
    "AdversarialTrainerAWP": "abstract base class (use AdversarialTrainerAWPPyTorch)",
    "AdversarialTrainerOAAT": "abstract base class (use AdversarialTrainerOAATPyTorch)",
    "AdversarialTrainerCertifiedPytorch": "certified training: takes ART's PytorchDeepZ estimator only (ART says so "
                                          "in the constructor)",
    "AdversarialTrainerCertifiedIBPPyTorch": "certified training: takes ART's PyTorchIBPClassifier only (ART says so "
                                             "in the constructor)",
    "DPInstaHideTrainer": "privacy training (InstaHide mixing with noise), not adversarial robustness",
    "wasserstein_distance": "a distance between two data sets; takes no estimator",
    "PDTP": "membership-privacy metric (retrains the model); not adversarial robustness",
    "SHAPr": "membership-privacy metric (retrains the model); not adversarial robustness",
}

#: Attacks whose multi-label cell runs on ``ARTClassifier.label_powerset()`` (and only there).
POWERSET: frozenset[str] = frozenset(
    a for a, row in SUPPORT.items() if "label_powerset" in row["multilabel"].note)

#: Attacks that take ART's ``adv_criterion`` / ``loss`` arguments: on multi-label and segmentation models they
#: must be the estimator's ``adversarial_criterion`` and ``margin_loss`` (ART's defaults are arg-max based).
SQUARE_LIKE: frozenset[str] = frozenset({"SquareAttack"})


# --- parameter settings that bring arg-max logic back --------------------------------------------------------
Getter = Callable[[str], Any]
Rule = Callable[[Getter, str, Any], "Refusal | None"]


Refusal = tuple[str, str]  # (the parameter setting, why it is refused and what to use instead)


def _restarts(get: Getter, kind: str, est: Any = None) -> Refusal | None:
    n = get("num_random_init")
    if kind == "multilabel" and isinstance(n, int) and n > 1:
        return (f"num_random_init={n}", "ART keeps a restart only if its arg-max class changed; use "
                "num_random_init<=1, or medadv's 'pgd' with restarts (per-sample best by the task loss)")
    if kind in _SEG and isinstance(n, int) and n > 0:
        return (f"num_random_init={n}", "ART's PGD has no random start for a segmenter (it raises in generate); "
                "pass num_random_init=0, or use medadv's 'pgd' / 'segpgd' with random_start=True")
    return None


def _fgm(get: Getter, kind: str, est: Any = None) -> Refusal | None:
    if kind != "multilabel":
        return None  # FGM's random start works on segmenters
    if get("minimal") is True:
        return ("minimal=True", "FGM's minimal search stops at the first arg-max class change; use "
                "minimal=False with a fixed eps")
    return _restarts(get, kind)


def _square(get: Getter, kind: str, est: Any = None) -> Refusal | None:
    if kind in ("multilabel", "seg2d"):
        crit, loss = get("adv_criterion"), get("loss")
        if not (getattr(crit, "_medadv_task_callable", False) and getattr(loss, "_medadv_task_callable", False)):
            return ("default adv_criterion/loss", "ART's defaults compare arg-max classes; pass "
                    "adv_criterion=est.adversarial_criterion, loss=est.margin_loss (the task's own test and "
                    "logit margin)")
    return None


def _sequential(get: Getter, kind: str, est: Any = None) -> Refusal | None:
    if isinstance(getattr(est, "model", None), nn.Sequential):
        return ("an nn.Sequential model", "for nn.Sequential models ART returns every layer's output and this trainer "
                "reads the first one as the logits (it crashes); wrap the model in a plain nn.Module, or use "
                "AdversarialTrainer")
    return None


#: Attack or trainer name -> ``rule(get, kind, estimator)`` returning ``(setting, reason)`` for a refused
#: setting (or None). ``get(name)`` reads the attack's attribute, or its constructor argument while it runs.
PARAM_RULES: dict[str, Rule] = {
    "AdversarialTrainerFBFPyTorch": _sequential,
    "AdversarialTrainerTRADESPyTorch": _sequential,
    "FastGradientMethod": _fgm,
    "ProjectedGradientDescent": _restarts,
    "ProjectedGradientDescentNumpy": _restarts,
    "ProjectedGradientDescentPyTorch": _restarts,
    "AdversarialTrainerMadryPGD": _restarts,
    "SquareAttack": _square,
}
