"""Common result container for the papers' studies (issue 12).

Every registered study (:func:`medadv.studies.available_studies`) returns one :class:`StudyResult`: a tidy table
(``rows``: one dict per key combination, the row contract of :mod:`medadv.studies.registry`) plus ``meta`` for
anything that is not tabular (confusion matrices, embeddings, ...). Everything is JSON-able so that a study can be
saved next to ``report.md`` and rendered later by :mod:`medadv.report.html`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["StudyResult", "jsonable"]


def jsonable(value: Any) -> Any:
    """Convert tensors / numpy values / tuples / paths to plain JSON types (recursively).

    Non-finite floats become ``None`` so the file stays valid JSON (``NaN`` is not JSON).
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    tolist = getattr(value, "tolist", None)  # torch.Tensor, numpy arrays and numpy scalars
    if callable(tolist):
        return jsonable(tolist())
    return str(value)


@dataclass
class StudyResult:
    """Result of one study: a tidy table plus free-form (JSON-able) metadata.

    Attributes
    ----------
    study:
        the registered study's name (``"classwise"``, ``"transfer"``, ...: :func:`medadv.studies.available_studies`).
    rows:
        One dict per key combination (e.g. attack x budget x class), values JSON-able.
    meta:
        Matrices and other non-tabular outputs (e.g. ``meta["confusion"]``), JSON-able.
    """

    study: str
    rows: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, "rows": jsonable(self.rows), "meta": jsonable(self.meta)}

    def to_json(self, path: str | Path) -> None:
        """Write the result as JSON (tensors/arrays converted, NaN written as ``null``)."""
        from ..safe_io import write_text

        # atomic, never through a link planted as study_*.json (issue 28)
        write_text(path, json.dumps(self.to_dict(), indent=1, allow_nan=False))

    @classmethod
    def from_json(cls, path: str | Path) -> StudyResult:
        data = json.loads(Path(path).read_text())
        return cls(study=str(data["study"]), rows=list(data["rows"]), meta=dict(data.get("meta") or {}))

    def columns(self) -> list[str]:
        """Column names in first-seen order over all rows."""
        names: dict[str, None] = {}
        for row in self.rows:
            for key in row:
                names.setdefault(key, None)
        return list(names)

    def column(self, name: str) -> list[Any]:
        """Values of column ``name``, one per row (``None`` where a row lacks it)."""
        if self.rows and not any(name in row for row in self.rows):
            raise KeyError(f"study {self.study!r} has no column {name!r}; columns: {self.columns()}")
        return [row.get(name) for row in self.rows]

    def to_markdown(self, digits: int = 4) -> str:
        """A GitHub-flavoured markdown table of ``rows`` under a ``### <study>`` heading."""
        lines = [f"### {self.study}", ""]
        cols = self.columns()
        if not cols:
            return "\n".join([*lines, "(no rows)", ""])
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "|".join("---" for _ in cols) + "|")
        for row in jsonable(self.rows):
            lines.append("| " + " | ".join(_cell(row.get(c), digits) for c in cols) + " |")
        return "\n".join(lines) + "\n"


def _cell(value: Any, digits: int) -> str:
    if value is None:
        return ""  # missing column or a non-finite number (written as null)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}g}" if abs(value) >= 1e4 else f"{value:.{digits}f}"
    return str(value).replace("|", "\\|")
