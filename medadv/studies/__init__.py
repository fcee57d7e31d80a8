"""The papers' studies (issue 12), one call each, every one returning a :class:`StudyResult` (tidy rows + meta).

Each study is one module of this package holding its config schema, its computation and its report section,
registered by one :func:`register_study` (:mod:`medadv.studies.registry`, which documents the row contract).
Importing the package imports every module in it, so the registry needs no list: :func:`available_studies`
names the studies, :func:`get_study` describes one (``get_study("transfer").summary``) and
:func:`run_study` runs one by name with the options of a ``studies:`` config entry.
MONAI and the plotting stacks load only when a study runs or is drawn.
"""

from __future__ import annotations

import importlib
import pkgutil

# every module of the package registers its study on import (private helpers start with "_")
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
del _module

# the functions are bound here, over the submodules of the same names (``medadv.studies.classwise`` is the
# function; its module stays importable as ``medadv.studies.classwise`` through ``sys.modules``)
from .base import StudyResult  # noqa: E402
from .certify import certify  # noqa: E402
from .classwise import classwise  # noqa: E402
from .correlation import correlation  # noqa: E402
from .corruptions import SUITE, Corruption, corruptions, noise_baseline  # noqa: E402
from .defenses import defenses  # noqa: E402
from .frequency import frequency  # noqa: E402
from .gap_rows import gap  # noqa: E402
from .models import models  # noqa: E402
from .reader import reader_study  # noqa: E402
from .registry import (  # noqa: E402
    STUDY_SPECS,
    StudyInfo,
    StudySpec,
    available_studies,
    get_study,
    register_study,
    run_study,
    study_drawer,
    validate_studies,
    validate_study,
)
from .saliency import saliency  # noqa: E402
from .transfer import transfer  # noqa: E402

__all__ = ["StudyResult", "classwise", "transfer", "corruptions", "noise_baseline", "frequency", "models",
           "correlation", "certify", "run_study", "validate_studies", "validate_study", "STUDY_SPECS", "SUITE",
           "Corruption", "defenses", "gap", "saliency", "reader_study", "available_studies", "get_study",
           "register_study", "study_drawer", "StudySpec", "StudyInfo"]
