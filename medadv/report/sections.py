"""Which function draws the report section of a study: a small registry in the report room.

The report lies below the studies (``tests/test_layout.py``), so :mod:`medadv.report.html` cannot ask the study
registry for a study's drawer. The studies tell the report instead: :func:`medadv.studies.register_study` with
``draw=`` calls :func:`register_section`, and the report looks the drawer up with :func:`section_drawer` (a study
without one is shown as its raw rows). Every study of :mod:`medadv.studies` is registered as soon as anything of
that package is imported — :class:`~medadv.studies.base.StudyResult` included, so a result read back with
``StudyResult.from_json`` is drawn by its study's drawer.

Example, a drawer for a study of one's own (``register_study(..., draw=draw_mine)`` does the same)::

    from medadv.report.sections import register_section

    register_section("my_study", draw_mine)   # draw_mine(study, class_names) -> medadv.report.blocks.Section
"""

from __future__ import annotations

from .blocks import StudyDrawer

__all__ = ["register_section", "section_drawer", "registered_sections"]

#: study name -> the function drawing its report section (filled by register_study)
_DRAWERS: dict[str, StudyDrawer] = {}


def register_section(study_name: str, drawer: StudyDrawer | None) -> None:
    """Record ``drawer(study, class_names) -> Section`` as the report section of study ``study_name``.

    A second registration replaces the first (a study module imported again brings its drawer again);
    ``drawer=None`` removes it, so the study is shown as its raw rows.
    """
    if not isinstance(study_name, str) or not study_name:
        raise ValueError(f"`study_name` of register_section must be a study's name such as 'classwise', "
                         f"got {study_name!r}")
    if drawer is not None and not callable(drawer):
        raise TypeError(f"`drawer` of register_section({study_name!r}) must be a function (study, class_names) -> "
                        f"Section, got {drawer!r}")
    if drawer is None:
        _DRAWERS.pop(study_name, None)
    else:
        _DRAWERS[study_name] = drawer


def section_drawer(name: str) -> StudyDrawer | None:
    """The drawer registered for study ``name``, or ``None`` (an unknown study, or one without a drawer)."""
    return _DRAWERS.get(name) if isinstance(name, str) else None


def registered_sections() -> list[str]:
    """The study names that have a drawer, sorted."""
    return sorted(_DRAWERS)
