"""The import graph follows the layers docs/conventions.md documents: a package imports only
packages on its own row or above, nothing in analyzer/ imports Streamlit or the app
(the CLI's dashboard command aside), and `import analyzer.cli` stays light.

Inside the packages whose rooms are done (``ACYCLIC``: cost, ingest and reuse), the
modules' imports form no circle: every import, at the top, in a function or under
``TYPE_CHECKING``, is an edge, and one cycle fails the test naming it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    "heap": 1,
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# Packages whose modules import one another as a tree (no module reaches itself again
# through its imports). The others join as their circles are broken.
ACYCLIC = ("analyzer.cost", "analyzer.ingest", "analyzer.reuse")


def _module_graph() -> dict[str, set[str]]:
    """Module -> the analyzer modules it imports (every import: top, inside functions,
    under TYPE_CHECKING). ``from package import name`` points at the submodule when
    ``name`` is one, else at the package (its ``__init__``)."""
    modules: dict[str, Path] = {}
    for path in ANALYZER.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            graph[module] |= {t for n in names if (t := known(n)) and t != module}
    return graph


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path of imports from ``start`` back to itself, or None (depth-first search)."""
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph[node]):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


@pytest.mark.slow
def test_the_finished_packages_import_as_a_tree():
    graph = _module_graph()
    cycles = []
    for module in sorted(graph):
        if module.startswith(ACYCLIC) and (cycle := _cycle_through(graph, module)):
            cycles.append(" -> ".join(cycle))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.slow
def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle_through(graph, "b") == ["b", "c", "a", "b"]
    assert _cycle_through(graph, "d") is None
    # the graph of today's tree has its known edges
    real = _module_graph()
    assert "analyzer.cost.step_formula" in real["analyzer.cost.model"]
    assert "analyzer.cost.model" not in real["analyzer.cost.step_formula"]


# Libraries a module imports inside the function that uses them, not at its top: each is
# heavy to import (start-up time of a command or dashboard page that does not need it)
# or optional (an extra, a product's own package, a GPU library). docs/conventions.md
# "Imports" lists them with the reason; everything else is imported at the top.
LATE = {
    "aiconfigurator_core": "the step model's kernel database (seconds to load)",
    "app": "the dashboard, imported by its command only",
    "huggingface_hub": "model folders and repository ids, only with --model or --tokenizer",
    "jinja2": "chat templates, only when a log names one",
    "numba": "compiled kernels (a second or more to load)",
    "numpy": "array work (150 ms to import; kvpool --help never needs it)",
    "polars": "lazy frames (200 ms to import)",
    "prometheus_client": "engine metrics, only for validate --prometheus",
    "pyarrow": "Arrow and Parquet (300 ms to import)",
    "ray": "the Ray cluster read, an extra",
    "rich": "terminal tables and progress (80 ms to import)",
    "scipy": "fits of the cost model",
    "sklearn": "regressions of the cost model (a second to import)",
    "streamlit": "the dashboard",
    "tiktoken": "the tokenizer (encodings load on first use)",
    "tokenizers": "Hugging Face tokenizers, only with --tokenizer",
    "torch": "kvpool cost profile on a GPU, optional",
    "vl_convert": "report charts as images, only for the PDF",
    "yaml": "the deployment bundle's YAML, only when it is written",
    "zmq": "vLLM KV events, only for kvpool record",
    "zstandard": "compressed logs, only when one is read or written",
}


def _late_imports(path: Path) -> list[tuple[int, str]]:
    """The imports inside a function body (a ``try`` around one included)."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import):
                out.extend((child.lineno, a.name) for a in child.names)
            elif in_function and isinstance(child, ast.ImportFrom) and child.level == 0:
                out.append((child.lineno, child.module or ""))
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


@pytest.mark.slow
def test_imports_sit_at_the_top_but_the_listed_late_libraries():
    """A module's dependencies read from its header: inside a function only the libraries
    in ``LATE`` are imported, and the commands (analyzer/cli), which load their stage
    when they run so that `kvpool --help` starts fast."""
    wrong = []
    for path in sorted(ANALYZER.rglob("*.py")):
        if path.relative_to(ANALYZER).parts[0] == "cli":
            continue
        for line, module in _late_imports(path):
            if module.split(".")[0] not in LATE:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not wrong, "imported inside a function, not at the top:\n" + "\n".join(wrong)
