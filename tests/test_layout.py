"""No import cycle between the rooms of medadv.

A *room* is a top-level module or sub-package of :mod:`medadv` (``medadv.tasks``, ``medadv.attacks``,
``medadv.config_schema`` ...). Rooms are layered; a room imports only rooms below it, so each one can be read,
tested and changed knowing only what lies beneath it, and no import order can half-initialise a module. The
layering, bottom first (a room may import any room listed before it)::

    leaves       params, runtime, threats, safe_io, dct, offline, distributed, fingerprints   (no medadv imports
                 of note; fingerprints: the content hashes of rows, samples and crafted examples)
    schema_base  ConfigError, the strict value types, the section base, the file-source sections
    metrics      per-sample and per-class metrics (imports no task: a task computes its metrics with them)
    tasks        the task kinds, their trait groups and their ``task:`` config sections
    models       networks, checkpoints, zoo, sliding windows and ROI tiles, the one fitting loop
                 (``models/fitting.py``; the promptable example nets live with the kind)
    explain      differentiable saliency (the attacks on explanations build on it)
    attacks      the attacks, ``auto``, the gradient-masking checks ``auto`` runs (``attacks/masking.py``) and
                 the tile-wise attack of whole volumes (``attacks/tilewise.py``); GAP's generators come from models
    training     plain training and GAP's trainer on the fitting loop
    defenses, certify, masking, frequency   (masking: the public home of ``attacks/masking.py``)
    results      result tables
    data         data sources and loaders (their sections come from schema_base)
    attack_cache, evaluation_batches, evaluation_output   crafting once, the batches, what evaluate() writes
    evaluation   evaluate()
    report       HTML / Markdown reports, case figures, windows, the study-section drawers
                 (``report/sections.py``, filled by ``register_study``)
    config_schema  the whole config schema (re-exports schema_base and the kinds' sections; builds the
                 ``task:`` union from the task registry)
    config       config loading (``config/``: ``data.py``, ``targets.py``, ``trust.py``)
    studies      paper studies (their data sections load through ``medadv.config.data``)
    run          Plan and Run: a config evaluated into an output folder, studies and reports
    demo, demo_deepbet   the offline demos
    cli, testing the command line (``__main__`` runs it); the conformance checks of every extension point

The package root :mod:`medadv` re-exports names from every room (lazily), so edges out of the root are not
counted. Every import statement counts, at module level *and* inside functions (a deferred import is still a
dependency, it only hides the cycle until the function runs); imports under ``if TYPE_CHECKING:`` do not, since
they never execute (type annotations only).

The test asserts that the graph of rooms has no cycle (no strongly connected component of more than one room) and
names the modules behind every edge of a cycle it finds.
"""

from __future__ import annotations

import ast
import os
import sys
from collections import defaultdict
from pathlib import Path

import medadv

ROOT = Path(medadv.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, at any depth (functions, classes, ``try``), except those under
    ``if TYPE_CHECKING:`` (its ``else`` branch runs and counts)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        for sub in ast.iter_child_nodes(node):
            visit(sub)

    visit(tree)
    return out


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The medadv modules an import statement loads (the nearest known module of each imported name)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            pkg = ".".join(base + ([node.module] if node.module else []))
        else:
            pkg = node.module or ""
        # `from pkg import sub` loads pkg.sub when it is a module, else a name defined in pkg
        names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in known else pkg for a in node.names]
    out = set()
    for name in names:
        if not (name == "medadv" or name.startswith("medadv.")):
            continue
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        out.add(name)
    return out


def room(module: str) -> str:
    """``medadv.tasks.base`` → ``medadv.tasks``; ``medadv.config_schema`` → itself; ``medadv`` → itself."""
    return ".".join(module.split(".")[:2])


def room_edges() -> dict[tuple[str, str], set[str]]:
    """``{(room, room it imports): {importing modules}}`` over every medadv module, edges out of the root left out."""
    mods = _modules()
    known = set(mods)
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _imports(tree):
            for target in _targets(name, path.name == "__init__.py", node, known):
                a, b = room(name), room(target)
                if a != b and a != "medadv":
                    edges[(a, b)].add(name)
    return edges


def cycles(edges: dict[tuple[str, str], set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one room (Tarjan), each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


#: the layering of the module docstring, bottom first, one tuple per line of it (a room may import its own line
#: and the lines before it; the cycle test above covers imports within a line)
LAYERS: list[tuple[str, ...]] = [
    ("params", "runtime", "threats", "safe_io", "dct", "offline", "distributed", "fingerprints"),
    ("schema_base",), ("metrics",), ("tasks",), ("models",), ("explain",), ("attacks",), ("training",),
    ("defenses", "certify", "masking", "frequency"), ("results",), ("data",),
    ("attack_cache", "evaluation_batches", "evaluation_output"), ("evaluation",), ("report",), ("config_schema",),
    ("config",), ("studies",), ("run",), ("demo", "demo_deepbet"), ("cli", "testing", "__main__"),
]


def _docstring_layers() -> list[str]:
    """The lines of the docstring's layering block that open a layer (4 spaces in; continuations are deeper)."""
    block = (__doc__ or "").split("::\n", 1)[1].lstrip("\n").split("\n\n", 1)[0]
    return [ln for ln in block.splitlines() if ln.startswith("    ") and not ln.startswith("     ")]


def test_every_room_imports_only_rooms_at_or_below_its_layer() -> None:
    """Each import goes down the documented layering (or stays in its line), and every room is placed in it: a
    new top-level module or package is added to the docstring and to ``LAYERS`` where it belongs."""
    rank = {f"medadv.{r}": i for i, layer in enumerate(LAYERS) for r in layer}
    rooms = {room(m) for m in _modules()} - {"medadv"}
    assert not rooms - set(rank), f"rooms missing from the layering (tests/test_layout.py): {sorted(rooms - set(rank))}"
    up = [f"{a} -> {b}: {', '.join(sorted(who))}" for (a, b), who in sorted(room_edges().items())
          if b != "medadv" and rank[b] > rank[a]]
    assert not up, "imports that go up the layering of tests/test_layout.py:\n" + "\n".join(up)


def test_the_docstring_shows_the_layers_in_order() -> None:
    """The layering in the docstring is ``LAYERS``: line i opens with (or names) the rooms of layer i."""
    lines = _docstring_layers()
    assert len(lines) == len(LAYERS), lines
    for line, layer in zip(lines, LAYERS, strict=True):
        words = set(line.replace(",", " ").split())
        missing = [r for r in layer if r not in words and r != "__main__"]
        assert not missing, f"docstring line {line.strip()!r} does not name {missing}"


def test_no_import_cycle_between_rooms() -> None:
    edges = room_edges()
    found = cycles(edges)
    lines = []
    for comp in found:
        lines.append(f"cycle between {', '.join(comp)}:")
        for (a, b), who in sorted(edges.items()):
            if a in comp and b in comp:
                lines.append(f"  {a} -> {b}: {', '.join(sorted(who))}")
    assert not found, ("rooms import each other (move the import or the function to the room below, see the "
                       "layering in tests/test_layout.py):\n" + "\n".join(lines))


def test_the_scan_sees_deferred_and_relative_imports_and_skips_type_checking() -> None:
    """The scan counts imports inside functions and relative imports, and leaves out ``if TYPE_CHECKING:``: a
    cycle hidden in a function body is found, a type-only import is not a cycle."""
    src = ("from typing import TYPE_CHECKING\nfrom ..metrics import segmentation\nif TYPE_CHECKING:\n"
           "    from ..attacks.base import Attack\nelse:\n    from ..threats import Box\n"
           "def f():\n    from ..models.io import load_checkpoint\n    import medadv.data.sources\n")
    known = set(_modules())
    got = set()
    for node in _imports(ast.parse(src)):
        got |= _targets("medadv.tasks.base", False, node, known)
    assert {room(m) for m in got} == {"medadv.metrics", "medadv.threats", "medadv.models", "medadv.data"}
    assert "medadv.metrics.segmentation" in got and "medadv.models.io" in got
    edges = {("medadv.a", "medadv.b"): {"medadv.a.x"}, ("medadv.b", "medadv.c"): {"medadv.b.y"},
             ("medadv.c", "medadv.a"): {"medadv.c.z"}, ("medadv.c", "medadv.d"): {"medadv.c.w"}}
    assert cycles(edges) == [["medadv.a", "medadv.b", "medadv.c"]]


# --- the report lies below the studies: the studies hand their drawers down (medadv.report.sections) ---------------
def test_a_study_read_back_from_json_is_drawn_by_its_drawer(tmp_path: Path) -> None:
    """In a fresh interpreter: the HTML report imports no study, and a ``StudyResult`` read back with ``from_json``
    (whose import registers every study) is drawn by its study's drawer, not shown as raw rows."""
    import subprocess

    code = (
        "import sys\n"
        "from medadv.report.html import _drawer, _study_generic, render_html_report\n"
        "assert 'medadv.studies' not in sys.modules, 'the report imports the studies'\n"
        "assert _drawer('classwise') is _study_generic  # nothing registered yet: the raw rows\n"
        "from medadv.studies.base import StudyResult\n"
        "from medadv.studies import available_studies, get_study\n"
        f"path = {str(tmp_path / 'study.json')!r}\n"
        "StudyResult('classwise', [], {}).to_json(path)\n"
        "html = str(render_html_report(None, studies=[StudyResult.from_json(path)]))\n"
        "assert 'Class-wise robustness' in html and 'Study: classwise' not in html, html[-3000:]\n"
        "for name in available_studies():\n"
        "    assert _drawer(name) is get_study(name).draw, name\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]


def test_register_study_hands_its_drawer_to_the_report() -> None:
    """``register_study(..., draw=)`` records the drawer in :mod:`medadv.report.sections`; ``register_section`` refuses
    a bad name or drawer in one line naming the argument, and ``None`` removes a drawer (raw rows again)."""
    from typing import Literal

    import pytest

    from medadv.report.blocks import Section
    from medadv.report.sections import register_section, registered_sections, section_drawer
    from medadv.studies import get_study
    from medadv.studies.registry import StudySpec, register_study

    assert section_drawer("classwise") is get_study("classwise").draw and "classwise" in registered_sections()

    def draw(study, class_names):  # type: ignore[no-untyped-def]
        return Section("study-layout_probe", "probe", "", [])

    class ProbeSpec(StudySpec):
        study: Literal["layout_probe"]

    try:
        register_study("layout_probe", draw=draw)(ProbeSpec)
        assert section_drawer("layout_probe") is draw
        register_section("layout_probe", None)
        assert section_drawer("layout_probe") is None and "layout_probe" not in registered_sections()
    finally:
        from medadv.studies import registry

        registry._REGISTRY.pop("layout_probe", None)
        register_section("layout_probe", None)
    with pytest.raises(ValueError, match="`study_name` of register_section"):
        register_section("", draw)
    with pytest.raises(TypeError, match="`drawer` of register_section"):
        register_section("x", "not a function")  # type: ignore[arg-type]
    assert section_drawer(None) is None  # type: ignore[arg-type]
