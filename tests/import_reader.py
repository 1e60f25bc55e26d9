"""Which modules of this repository a module imports, read from its source with `ast`: the one reader behind the
import-graph tests (tests/test_import_graph.py) and the app-boundary tests (tests/test_app_boundaries.py).

Imports anywhere count, inside functions and classes too: an import moved into a function still makes the
module depend on the one it imports, it only hides that from the top of the file."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(*packages: str) -> dict[str, Path]:
    """Every module of the packages (directories under the repository root), by dotted name."""
    return {module_name(path): path for package in packages for path in sorted((ROOT / package).rglob("*.py"))}


def _package(module: str, modules: Mapping[str, Path]) -> str:
    return module if modules.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]


def imported(source: str, module: str, modules: Mapping[str, Path]) -> set[str]:
    """Every module `source` (the text of `module`) imports, as dotted names: `from a import b` counts as a.b when
    that is one of `modules`, else as a; relative imports are resolved against `module`'s package. Names outside
    `modules` (the standard library, Django) are kept: a caller that wants only ours intersects with `modules`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package(module, modules).split(".")
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return found


def imports(module: str, modules: Mapping[str, Path]) -> set[str]:
    """The modules of `modules` that `module` (one of them) imports, itself left out."""
    return imported(modules[module].read_text(encoding="utf-8"), module, modules) & (set(modules) - {module})
