"""The layers of docs/architecture.md, read off the code: the library (`tokenmill/`) imports nothing of the
application (`tasks/`, `flows/`) and works with Prefect and Dask absent; its stages stand side by side on the
shared base, never importing each other; and no module imports itself back, through any number of others."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from tokenmill.stages import STAGE_MODULES

from .conftest import REPO

APPLICATION = ("flows", "tasks")
ORCHESTRATORS = ("prefect", "dask", "distributed")
# The library's DAG stages (docs/architecture.md): each imports the base alone. Every other library module is the
# base, which imports no stage, except the tools that read what the stages made (TOOLS).
STAGES = set(STAGE_MODULES)
TOOLS = {"tokenmill.commands.verify"}  # `tokenmill inspect` and `diff`: read published datasets as publish wrote them


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function, absolute (relative imports resolved)."""
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
            base = base if node.level else node.module
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def library_files() -> list[Path]:
    return sorted((REPO / "tokenmill").rglob("*.py"))


def test_the_library_imports_nothing_of_the_application():
    upward = {
        f"{module_name(path)} imports {name}"
        for path in library_files()
        for name in imported(path)
        if name.split(".")[0] in APPLICATION
    }
    assert not upward, sorted(upward)


def test_every_library_module_imports_with_prefect_and_dask_absent():
    """Each module under tokenmill/ imported in a fresh interpreter where importing Prefect or Dask fails."""
    blocker = f"""
import importlib, importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ORCHESTRATORS!r}:
            raise ModuleNotFoundError(f"{{name}} is blocked: the library must not need it", name=name)

sys.meta_path.insert(0, Absent())
for name in {[module_name(p) for p in library_files()]!r}:
    importlib.import_module(name)
print(sorted(m for m in sys.modules if m.split(".")[0] in {ORCHESTRATORS!r}))
"""
    done = subprocess.run([sys.executable, "-c", blocker], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def import_graph() -> dict[str, set[str]]:
    """Each module of tokenmill/, tasks/ and flows/ and the modules of those it imports."""
    files = {module_name(p): p for root in ("tokenmill", *APPLICATION) for p in (REPO / root).rglob("*.py")}
    return {name: {m for m in imported(path) if m in files and m != name} for name, path in files.items()}


def test_the_stages_stand_side_by_side_on_the_base():
    graph = import_graph()
    assert STAGES | TOOLS <= graph.keys(), sorted((STAGES | TOOLS) - graph.keys())  # the lists name real modules
    library = {name for name in graph if name.split(".")[0] == "tokenmill"}
    crossing = {f"{name} imports {other}" for name in library - TOOLS for other in graph[name] & STAGES}
    assert not crossing, sorted(crossing)


def test_no_module_imports_itself_back():
    graph = import_graph()
    circles = set()

    def walk(name: str, path: list[str], seen: set[str]) -> None:
        for other in graph[name]:
            if other in path:
                circle = path[path.index(other) :]
                start = circle.index(min(circle))
                circles.add(" -> ".join(circle[start:] + circle[:start] + [min(circle)]))
            elif other not in seen:
                seen.add(other)
                walk(other, [*path, other], seen)

    for name in graph:
        walk(name, [name], {name})
    assert not circles, sorted(circles)


def test_the_architecture_page_names_every_library_module():
    """docs/architecture.md's list of the library's modules (its "The layers" block) names each one there is."""
    page = (REPO / "docs" / "architecture.md").read_text()
    block = page.split("## The layers", 1)[1].split("```")[1].split("\ntasks/", 1)[0]
    listed = set(re.findall(r"[a-z_]+", block))
    modules = {module_name(p).removeprefix("tokenmill.") for p in library_files()} - {"tokenmill", "formats"}
    assert {m.split(".")[-1] for m in modules} <= listed, sorted({m.split(".")[-1] for m in modules} - listed)
