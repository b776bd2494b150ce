"""The layers of docs/architecture.md, read off the code: the library (`tokenmill/`) imports nothing of the
application (`tasks/`, `flows/`) and works with Prefect and Dask absent."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

APPLICATION = ("flows", "tasks")
ORCHESTRATORS = ("prefect", "dask", "distributed")


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
