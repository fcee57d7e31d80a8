"""MkDocs hook: the API reference pages, generated at build time (nothing to keep in sync by hand).

One page per name of ``medadv.__all__`` (``api/PGD.md`` holds ``::: medadv.PGD``) and one page per public adapter
module (``api/adapters/art.md``: the classes and functions that module defines and lists in its ``__all__``). The
names come from the package itself, so a name added to ``medadv.__all__`` gets its page in the next build and a
removed one loses it: there are no committed stubs to drift.

A public name without a docstring of its own is a warning here, so ``mkdocs build --strict`` fails on it (the
mkdocstrings option ``show_if_no_docstring: false`` would otherwise render it as an empty page). Docstrings use
Sphinx roles (``:class:`~medadv.tasks.Task```), which Markdown shows verbatim; ``on_page_content`` turns them into
plain code spans.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.structure.files import File, Files

# a logger under "mkdocs." so that --strict counts its warnings
log = logging.getLogger("mkdocs.hooks.api_pages")

ROOT = Path(__file__).resolve().parents[2]
#: the adapter modules with a page of their own (installed as medadv.adapters.<name>, source in adapters/)
ADAPTER_MODULES = ("art", "art_regression", "foolbox", "torchattacks", "robustbench", "support")
NAV_TITLE = "API reference"


def public_names() -> list[str]:
    """``medadv.__all__``, in its order (``import medadv`` is lazy: this imports no toolkit)."""
    import medadv

    return list(medadv.__all__)


def defining_path(name: str) -> str:
    """Where ``medadv.<name>`` is defined (``medadv.attacks.pgd.PGD``): the page documents that object.

    ``medadv/__init__.py`` exports lazily (PEP 562), so a static reader of that file sees only its
    ``TYPE_CHECKING`` imports; the defining module is what every public name has for certain.
    """
    import medadv

    obj = getattr(medadv, name)
    module = getattr(obj, "__name__", "") if isinstance(obj, ModuleType) else getattr(obj, "__module__", "")
    return module if isinstance(obj, ModuleType) else f"{module}.{name}"


def adapter_members(module: str) -> list[str]:
    """The names of ``adapters/<module>.py``'s ``__all__`` that the module defines (classes and functions).

    Read from the source, not imported, so the build needs none of the toolkits; re-exports (Foolbox's own
    attacks, the support tables' constants) are documented where they are defined, or are data without a docstring.
    """
    tree = ast.parse((ROOT / "adapters" / f"{module}.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return [name for name in ast.literal_eval(node.value) if name in defined]
    return []


def pages() -> dict[str, str]:
    """Every generated page: its path under docs/ -> its Markdown."""
    out = {"api/index.md": _index()}
    for name in public_names():
        # the object's own heading is the page's title (level 1), so the name is not shown twice
        path = defining_path(name)
        full = "\n      show_root_full_path: true" if path == f"medadv.{name}" else ""  # a subpackage: medadv.data
        out[f"api/{name}.md"] = f"::: {path}\n    options:\n      heading_level: 1{full}\n"
    for module in ADAPTER_MODULES:
        members = "\n".join(f"        - {m}" for m in adapter_members(module))
        # griffe reads the source tree (paths: [.]), where medadv.adapters is the top-level folder adapters/
        out[f"api/adapters/{module}.md"] = (f"# medadv.adapters.{module}\n\n::: adapters.{module}\n"
                                            f"    options:\n      show_root_heading: false\n"
                                            f"      members:\n{members}\n")
    return out


def _index() -> str:
    lines = ["# API reference", "",
             "Generated from the docstrings at build time: one page per name of `medadv.__all__` (importable as",
             "`from medadv import NAME`) and one page per toolkit adapter module (`medadv.adapters.*`).", "",
             "## `medadv`", ""]
    lines += [f"- [`{name}`]({name}.md)" for name in public_names()]
    lines += ["", "## `medadv.adapters`", ""]
    lines += [f"- [`medadv.adapters.{m}`](adapters/{m}.md)" for m in ADAPTER_MODULES]
    return "\n".join(lines) + "\n"


def missing_docstrings() -> list[str]:
    """Public names whose object has no docstring of its own (a class's ``__doc__`` is never inherited)."""
    import medadv

    return [name for name in public_names() if not (getattr(medadv, name).__doc__ or "").strip()]


def on_config(config: Any) -> Any:
    """Fill the nav's "API reference" entry with the generated pages."""
    entries: list[Any] = [{"Overview": "api/index.md"}]
    entries += [{name: f"api/{name}.md"} for name in public_names()]
    entries += [{f"adapters.{m}": f"api/adapters/{m}.md"} for m in ADAPTER_MODULES]
    for item in config["nav"] or []:
        if isinstance(item, dict) and NAV_TITLE in item:
            item[NAV_TITLE] = entries
            break
    else:
        log.warning(f"mkdocs.yml's nav has no {NAV_TITLE!r} entry: the API pages are not in the navigation")
    return config


def on_files(files: Files, config: Any) -> Files:
    """Add the generated pages; warn (fatal under --strict) for every public name without a docstring."""
    for name in missing_docstrings():
        log.warning(f"medadv.{name} is public (medadv.__all__) but has no docstring: its API page would be empty")
    for uri, text in pages().items():
        files.append(File.generated(config, uri, content=text))
    return files


# :class:`~medadv.tasks.Task` -> Task, :func:`medadv.evaluate` -> medadv.evaluate (Sphinx's rendering of the role)
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj|ref):<code>(~?)([^<]*)</code>")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if match.group(1) else target}</code>"


#: where a guide shows the table of every registered attack (docs/attacks.md)
ATTACKS_MARK = "<!-- registered-attacks -->"


def attacks_table() -> str:
    """Every registered attack (``available_attacks()``): its name, class, tasks, spatial ranks and summary line."""
    from medadv.attacks.base import attack_class, available_attacks

    public = set(public_names())
    rows = ["| name | class | applies to | what it does |", "|---|---|---|---|"]
    for name in available_attacks():
        cls = attack_class(name)
        first = ((cls.__doc__ or "").strip().splitlines() or [""])[0].replace("|", "\\|")
        link = f"[`{cls.__name__}`](api/{cls.__name__}.md)" if cls.__name__ in public else f"`{cls.__name__}`"
        applies = ", ".join(getattr(cls, "tasks", ()) or ()) or "every task"
        dims = getattr(cls, "spatial_dims", ()) or ()
        if dims:
            applies += f" ({' or '.join(f'{d}-D' for d in dims)})"
        rows.append(f"| `{name}` | {link} | {applies} | {first} |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Fill the registered-attacks table; let ``<details>`` blocks hold Markdown (the generated support matrix
    writes GitHub's plain ``<details>``)."""
    if ATTACKS_MARK in markdown:
        markdown = markdown.replace(ATTACKS_MARK, attacks_table())
    return markdown.replace("<details>", '<details markdown="1">')


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """Show docstrings' Sphinx roles as the code spans Sphinx would render."""
    return _ROLE.sub(_role, html)
