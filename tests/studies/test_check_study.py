"""Every registered study passes :func:`medadv.testing.check_study` on every registered task kind.

The parameters come from the registries (:func:`medadv.studies.available_studies` × :func:`medadv.tasks.available_tasks`),
so a new study module or task kind is checked without an edit here. Each case runs the study at a tiny size (2 samples,
one FGSM step, the study's declared ``check_options``) or checks that it refuses the kind in one line before any work.
"""

from __future__ import annotations

import pytest

from medadv.studies import available_studies, get_study
from medadv.tasks import available_tasks
from medadv.testing import check_study


@pytest.mark.parametrize("kind", available_tasks())
@pytest.mark.parametrize("study", available_studies())
def test_check_study(study, kind):
    report = check_study(study, kinds=[kind])
    assert report.ran or report.refused, "no example of the kind was checked"
    assert not set(report.ran) & set(report.refused)
    for key in report.ran:  # a run example passed every per-example property
        for prop in ("runs", "caller state", "strict JSON", "JSON file", "report", "determinism"):
            assert f"{key}: {prop}" in report.passed
    info = get_study(study)
    for key, why in report.refused.items():  # refused only what the study declares it cannot run
        assert why and "\n" not in why
        assert info.needs is not None or info.spatial_dims or info.single_range, (key, why)
