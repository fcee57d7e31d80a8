"""Which toolkit attack applies to which medical task: one table per toolkit, the refusals and the README matrix.

Every attack class a toolkit exports gets one :class:`Cell` per task kind (:data:`TASK_KINDS`): either
``ok`` (the adapter makes the toolkit's own attack do the right thing on that task) or ``refused`` with a
one-sentence reason that also says what to use instead. The adapters raise :class:`UnsupportedAttackError`
from these same cells before the attack does any work, the matrix tests in ``tests/adapters/`` check every
cell against the toolkit's real behaviour, and :func:`render_markdown` writes the README's support matrix
from them, so the documentation, the refusals and the tests cannot drift apart.

Each toolkit adapter module defines ``SUPPORT: dict[str, dict[str, Cell]]`` keyed by the attack's class
name (as the toolkit exports it) and then task kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from medadv.tasks import Task, registered_task_classes

__all__ = ["TASK_KINDS", "Cell", "ok", "refused", "UnsupportedAttackError", "task_kind", "check_supported",
           "counts", "render_markdown", "toolkit_tables", "readme_section", "README_BEGIN", "README_END"]

README_BEGIN, README_END = "<!-- support-matrix:begin -->", "<!-- support-matrix:end -->"

#: column → title of every support-matrix column the registered kinds declare (``traits.toolkits.support_columns``),
#: in registration order
_TITLES: dict[str, str] = {col: title for cls in registered_task_classes()
                           for col, title in cls.traits.toolkits.support_columns.items()}
#: The task kinds of the support matrix, in column order (declared by the kinds: ``multiclass``, ``multilabel``,
#: ``seg2d``, ``seg3d`` for the built-in ones).
TASK_KINDS: tuple[str, ...] = tuple(_TITLES)


@dataclass(frozen=True)
class Cell:
    """One attack on one task kind: ``status`` is ``"ok"`` or ``"refused"``; ``reason`` (refusals) says why
    the attack does not apply and what to use instead; ``note`` (optional, ok cells) says how it is made to
    work (e.g. "task loss", "criterion on Dice")."""

    status: Literal["ok", "refused"]
    reason: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if self.status not in ("ok", "refused"):
            raise ValueError(f"`status` must be 'ok' or 'refused', got {self.status!r}")
        if self.status == "refused" and not self.reason:
            raise ValueError("a refused cell needs a `reason` saying why and what to use instead")


def ok(note: str = "") -> Cell:
    """An ``ok`` cell."""
    return Cell("ok", note=note)


def refused(reason: str) -> Cell:
    """A ``refused`` cell; ``reason`` says why and what to use instead."""
    return Cell("refused", reason=reason)


class UnsupportedAttackError(ValueError):
    """A toolkit attack that does not apply to the model's task, raised before the attack does any work."""


def task_kind(task: Task, spatial_dims: int | None = None) -> str:
    """The matrix column of ``task`` (:meth:`~medadv.tasks.Task.support_column`): ``multiclass``, ``multilabel``,
    ``seg2d`` or ``seg3d`` for the built-in kinds, the kind's name for others (a column no toolkit table has, so
    every toolkit attack is refused on it with the reason).

    ``spatial_dims`` (2 or 3) is needed for segmentation; it comes from the input shape the adapter knows.
    """
    return task.support_column(spatial_dims)


def check_supported(table: Mapping[str, Mapping[str, Cell]], toolkit: str, attack: str, kind: str) -> Cell:
    """The cell of ``attack`` on ``kind``; raises :class:`UnsupportedAttackError` for a refused or unknown one.

    An attack missing from the table (e.g. added by a newer toolkit release) is refused rather than run
    unchecked: nobody has verified what it does on a medical task.
    """
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"`kind` must be a support-matrix column such as {TASK_KINDS}, got {kind!r}")
    title = _TITLES.get(kind, kind)
    if kind not in TASK_KINDS:  # a task kind no toolkit table covers (a newer or user-defined kind)
        raise UnsupportedAttackError(
            f"{toolkit} {attack} has not been checked on {title} models by medadv (the {toolkit} adapter covers "
            f"{', '.join(_TITLES[k] for k in TASK_KINDS)} models), so it is refused rather than run unchecked; use a "
            "medadv attack (medadv.available_attacks()) instead")
    row = table.get(attack)
    if row is None or kind not in row:
        raise UnsupportedAttackError(
            f"{toolkit} {attack} has not been checked on {title} models by medadv, so it is refused "
            "rather than run unchecked; use a medadv attack (medadv.available_attacks()) instead")
    cell = row[kind]
    if cell.status == "refused":
        raise UnsupportedAttackError(f"{toolkit} {attack} does not apply to a {title} model: {cell.reason}")
    return cell


def counts(table: Mapping[str, Mapping[str, Cell]]) -> dict[str, dict[str, int]]:
    """``{kind: {"ok": n, "refused": m}}`` over the whole table."""
    out = {k: {"ok": 0, "refused": 0} for k in TASK_KINDS}
    for row in table.values():
        for k, cell in row.items():
            out[k][cell.status] += 1
    return out


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(tables: Mapping[str, Mapping[str, Mapping[str, Cell]]]) -> str:
    """The README's support matrix: a count table, then per toolkit every attack and its cells.

    ``tables`` maps a toolkit's display name to its ``SUPPORT`` table.
    """
    head = "| toolkit | " + " | ".join(_TITLES[k] for k in TASK_KINDS) + " |"
    lines = ["Attacks each toolkit exports, checked by `tests/adapters/` on every task (ok / clear refusal):", "",
             head, "|---" * (len(TASK_KINDS) + 1) + "|"]
    for name, table in tables.items():
        c = counts(table)
        lines.append(f"| {name} ({len(table)}) | "
                     + " | ".join(f"{c[k]['ok']} / {c[k]['refused']}" for k in TASK_KINDS) + " |")
    for name, table in tables.items():
        lines += ["", f"<details><summary>{name}: every attack</summary>", "",
                  "| attack | " + " | ".join(_TITLES[k] for k in TASK_KINDS) + " |",
                  "|---" * (len(TASK_KINDS) + 1) + "|"]
        reasons: dict[str, int] = {}
        for attack in sorted(table):
            cells = []
            for k in TASK_KINDS:
                cell = table[attack].get(k)
                if cell is None:
                    cells.append("–")
                elif cell.status == "ok":
                    cells.append("ok" + (f" ({_escape(cell.note)})" if cell.note else ""))
                else:
                    ref = reasons.setdefault(cell.reason, len(reasons) + 1)
                    cells.append(f"refused [{ref}]")
            lines.append(f"| `{attack}` | " + " | ".join(cells) + " |")
        if reasons:
            lines.append("")
            lines += [f"{i}. {_escape(r)}" for r, i in reasons.items()]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def toolkit_tables() -> dict[str, Mapping[str, Mapping[str, Cell]]]:
    """The ``SUPPORT`` table of every toolkit adapter, by display name (imports the three toolkits)."""
    from . import art, foolbox, torchattacks

    return {"ART": art.SUPPORT, "ART trainers and metrics": art.TRAINERS_AND_METRICS,
            "Foolbox": foolbox.SUPPORT, "torchattacks": torchattacks.SUPPORT}


def readme_section() -> str:
    """The README's support-matrix block, markers included."""
    return f"{README_BEGIN}\n{render_markdown(toolkit_tables())}{README_END}"


def _write_readme(path: str) -> None:
    import re

    text = open(path, encoding="utf-8").read()
    if README_BEGIN not in text or README_END not in text:
        raise SystemExit(f"{path} has no {README_BEGIN} ... {README_END} markers")
    pattern = re.escape(README_BEGIN) + ".*?" + re.escape(README_END)
    new = re.sub(pattern, lambda _: readme_section(), text, count=1, flags=re.S)
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)


if __name__ == "__main__":  # python -m medadv.adapters.support docs/adapters.md: regenerate the docs' matrix
    import sys

    _write_readme(sys.argv[1] if len(sys.argv) > 1 else "docs/adapters.md")
