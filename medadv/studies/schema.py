"""The ``studies:`` config section: one pydantic schema per study, and :func:`run_study` to run one.

A ``studies:`` section is a list of entries, each a bare study name or a mapping with ``study:`` and that
study's options::

    studies:
      - classwise                                  # defaults
      - {study: corruptions, severities: [1, 3, 5], suite: [gaussian_noise, blur]}
      - {study: noise_baseline, match: ssim}
      - {study: transfer, surrogates: [unet_a], targets: [unet_b, unet_c]}

Unknown keys are refused with the closest valid one, as everywhere in the config (the sections reuse
:mod:`medadv.config_schema`'s rules). Each study's schema lives in its own module beside its computation and
report section, registered by :func:`~medadv.studies.registry.register_study`; this module re-exports the
registry's entry points and the schemas under their former names.
"""

from __future__ import annotations

from .certify import CertifySpec
from .classwise import ClasswiseSpec
from .correlation import CorrelationSpec
from .corruptions import CorruptionsSpec, NoiseBaselineSpec
from .frequency import FrequencySpec
from .models import ModelsSpec
from .registry import STUDY_SPECS, StudySpec, register_study, run_study, validate_studies, validate_study
from .saliency import SaliencySpec
from .transfer import TransferSpec

__all__ = ["STUDY_SPECS", "StudySpec", "ClasswiseSpec", "TransferSpec", "CorruptionsSpec", "NoiseBaselineSpec",
           "FrequencySpec", "ModelsSpec", "CorrelationSpec", "CertifySpec", "SaliencySpec", "register_study",
           "validate_study", "validate_studies", "run_study"]
