"""The import graph follows the layers docs/conventions.md documents: a package imports only
packages on its own row or above, nothing in analyzer/ imports Streamlit or the app
(the CLI's dashboard command aside), and `import analyzer.cli` stays light.

Inside the packages whose rooms are done (``ROOMS_DONE``: reuse and ingest; cost joins
once its split lands), the modules' imports form no circle: every import, at the top, in
a function or under ``TYPE_CHECKING``, is an edge, and one cycle fails the test naming
it."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANALYZER = ROOT / "analyzer"

# The rows of docs/conventions.md "Layout of the code", top (1) to bottom (7).
LAYERS = {
    "__init__": 1,
    "errors": 1,
    "jsontypes": 1,
    "limits": 1,
    "outputs": 1,
    "quoting": 1,
    "spill": 1,
    "progress": 1,
    "spawn": 1,
    "trace": 1,
    "dense": 1,
    "storage": 1,
    "tokenize": 2,
    "blocks": 2,
    "cost": 2,
    "cache": 2,
    "synth": 2,
    "ingest": 3,
    "reuse": 3,
    "replay": 4,
    "advisor": 5,
    "report": 6,
    "cli": 7,
}


def _package(path: Path) -> str:
    return path.relative_to(ANALYZER).parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute import in the file, including those inside functions."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def test_every_package_has_a_layer():
    found = {_package(p) for p in ANALYZER.rglob("*.py")}
    assert found <= set(LAYERS), f"add {sorted(found - set(LAYERS))} to README and LAYERS"


def test_no_upward_imports():
    bad = []
    for path in sorted(ANALYZER.rglob("*.py")):
        src = _package(path)
        for line, module in _imports(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{line}: {module}"
            if top in ("app", "streamlit") and src != "cli":
                bad.append(where)
            if top != "analyzer" or module == "analyzer":
                continue
            dst = module.split(".")[1]
            if dst in LAYERS and LAYERS[dst] > LAYERS[src]:
                bad.append(where)
    assert not bad, "imports of a higher layer:\n" + "\n".join(bad)


def test_only_the_dashboard_command_imports_the_app():
    users = sorted(
        str(p.relative_to(ROOT))
        for p in ANALYZER.rglob("*.py")
        if any(m.split(".")[0] in ("app", "streamlit") for _, m in _imports(p))
    )
    assert users == ["analyzer/cli/__init__.py"]


def test_the_command_layer_loads_no_heavy_library():
    """`kvpool --help` pays for typer and rich only: numba, numpy, pyarrow, polars and
    streamlit are imported by the commands that use them."""
    code = (
        "import sys, analyzer.cli\n"
        "heavy = ('numba', 'numpy', 'pyarrow', 'polars', 'streamlit', 'sklearn', 'tiktoken')\n"
        "print(' '.join(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == ""


# Packages whose modules were split into rooms of one job each: their import graphs are
# kept free of circles (docs/conventions.md "Layout of the code").
ROOMS_DONE = ("reuse", "ingest")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _edges(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports by name (``from pkg import mod``
    names a module too), wherever the import sits."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            if subs:
                out |= subs
            elif node.module in modules:
                out.add(node.module)
    return out


def test_no_import_cycles_inside_the_rooms_that_are_done():
    for package in ROOMS_DONE:
        files = sorted((ANALYZER / package).rglob("*.py"))
        modules = {_module(p) for p in files}
        graph = {_module(p): _edges(p, modules) - {_module(p)} for p in files}
        try:
            tuple(graphlib.TopologicalSorter(graph).static_order())
        except graphlib.CycleError as exc:
            raise AssertionError(f"an import cycle in analyzer/{package}: {exc.args[1]}") from None
