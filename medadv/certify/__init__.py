"""Certified robustness by Gaussian randomized smoothing, per task (multi-class, multi-label, 2-D/3-D segmentation).

* :class:`RandomizedSmoothing` — CERTIFY and PREDICT (Cohen, Rosenfeld & Kolter, ICML 2019), per-label
  certification with family-wise error control for multi-label models, SegCertify per voxel (Fischer, Baader &
  Vechev, ICML 2021); :class:`CertifyResult` holds per-element radii and per-sample columns.
* :func:`certified_accuracy`, :func:`certified_dice` — certified metrics at a list of L2 radii.
* :func:`clopper_pearson`, :func:`lower_confidence_bound` — the exact binomial bounds.
* :class:`DnCNN`, :class:`Denoised`, :func:`fit_denoiser` — denoised smoothing (Salman et al., NeurIPS 2020).

The noise-augmentation training strategy for smoothing is :class:`medadv.defenses.GaussianAugmentation`.
"""

from .denoise import Denoised, DnCNN, fit_denoiser
from .metrics import certified_accuracy, certified_dice
from .smoothing import ABSTAIN, FAMILIES, CertifyResult, RandomizedSmoothing, SmoothedPrediction
from .stats import binomial_pvalue, clopper_pearson, holm_reject, lower_confidence_bound

__all__ = ["RandomizedSmoothing", "CertifyResult", "SmoothedPrediction", "ABSTAIN", "FAMILIES",
           "certified_accuracy", "certified_dice", "clopper_pearson", "lower_confidence_bound", "binomial_pvalue",
           "holm_reject", "DnCNN", "Denoised", "fit_denoiser"]
