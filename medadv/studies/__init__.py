"""The papers' studies (issue 12), one call each, every one returning a :class:`StudyResult` (tidy rows + meta).

=================  =====================================================================  =======================
study              what                                                                   paper
=================  =====================================================================  =======================
``classwise``      per-class recall / label accuracy / Dice, CFPS (+ CFNS), confusion,    Medi et al. 2024
                   attractors, clean vs attacked
``transfer``       surrogate × target table of transferred attacks                         Paschali 2018, Malik 2024
``corruptions``    MONAI corruptions at severities 1..5 with the flip probability          Xu et al. 2021
``noise_baseline`` random noise matched in SSIM (or L2) to each adversarial example        Paschali et al. 2018
``frequency``      attacks restricted to low / high DCT bands                              Malik et al. 2024
``models``         clean vs robust over several models                                     Paschali et al. 2018
``correlation``    feature embedding clean vs attacked, label co-occurrence                Xu et al. 2021
``certify``        randomized-smoothing certificates vs. an attack on the smoothed model   Cohen 2019, Salman 2019
``defenses``       one copy of the model per training strategy, clean vs attacked          Xu et al. 2021 (Tab. 5)
``gap``            GAP generator fitted on a training split: training vs held-out rows     Xu et al. 2021
=================  =====================================================================  =======================

:func:`run_study` runs one by name with the options of a ``studies:`` config entry (:mod:`.schema`).
MONAI and the plotting stacks load only when a study runs.
"""

from __future__ import annotations

from . import reader as _reader  # noqa: F401  (registers the reader_study entry and its report section)

# the functions are bound here, over the submodules of the same names (``medadv.studies.classwise`` is the
# function; its module stays importable as ``medadv.studies.classwise`` through ``sys.modules``)
from .base import StudyResult
from .certify import certify
from .classwise import classwise
from .correlation import correlation
from .corruptions import SUITE, Corruption, corruptions, noise_baseline
from .defenses import defenses
from .frequency import frequency
from .gap_rows import gap
from .models import models
from .saliency import saliency
from .schema import STUDY_SPECS, run_study, validate_studies, validate_study
from .transfer import transfer

__all__ = ["StudyResult", "classwise", "transfer", "corruptions", "noise_baseline", "frequency", "models",
           "correlation", "certify", "run_study", "validate_studies", "validate_study", "STUDY_SPECS", "SUITE",
           "Corruption", "defenses", "gap", "saliency"]
