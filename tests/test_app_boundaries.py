"""Which way the Django apps lean, read from the source with `ast` (imports at module level and inside functions).

skills_app holds problems, kernels, verdicts, lineages and cards, and never imports gate_app: a page that shows
both (the home page's jobs, the job that made a lineage) is put together in klineage_web. gate_app, the jobs app,
reads skills_app only in the modules listed in ALLOWED, each for a stated reason. The helpers both apps share live
in klineage_web, and a klineage_web module an app imports imports neither app, so no rule is met by a detour.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("skills_app", "gate_app")
PROJECT = "klineage_web"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for package in (*APPS, PROJECT) for path in sorted((ROOT / package).rglob("*.py"))}

# gate_app module -> the skills_app modules it may import, and why it must.
ALLOWED = {
    # Job submission checks that the named problem and kernel exist; their models are skills_app's.
    "gate_app.api": {"skills_app.models"},
    # Job pages link the cards and verdicts a job produced, and list a walk's steps as the lineage table does.
    "gate_app.presenters": {"skills_app.models", "skills_app.lineage_overview"},
    # An uploaded kernel is stored as a Kernel and KernelState by the importer that stores bundled ones.
    "gate_app.uploads": {"skills_app.importer", "skills_app.models"},
    # A walk's lineage is imported by the lineage importer; an optimization is offered the stored card library.
    "gate_app.work": {"skills_app.importer", "skills_app.models"},
    # create_user --reviewer puts the account in the reviewer group, which skills_app's AppConfig keeps.
    "gate_app.management.commands.create_user": {"skills_app.apps"},
}


def _package(module: str) -> str:
    return module if MODULES.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]


def imported(source: str, module: str) -> set[str]:
    """Every module `source` (the text of `module`) imports anywhere, as dotted names: `from a import b` counts as
    a.b when that is a module of ours, else as a; relative imports are resolved against `module`'s package."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package(module).split(".")
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names}
    return found


def imports(module: str) -> set[str]:
    return imported(MODULES[module].read_text(encoding="utf-8"), module)


def within(names: set[str], package: str) -> set[str]:
    return {name for name in names if name == package or name.startswith(package + ".")}


def test_the_apps_are_read():
    assert {"skills_app.summary", "skills_app.lineage_views", "gate_app.work", "klineage_web.access"} <= set(MODULES)
    assert len([m for m in MODULES if m.startswith("gate_app.")]) >= 15


def test_skills_app_never_imports_gate_app():
    offenders = {m: sorted(within(imports(m), "gate_app")) for m in MODULES if m.startswith("skills_app")}
    assert {m: found for m, found in offenders.items() if found} == {}


def test_gate_app_imports_skills_app_only_where_listed():
    actual = {m: within(imports(m), "skills_app") for m in MODULES if m.startswith("gate_app")}
    # Equal, not a subset: a listed module that stopped needing skills_app leaves the list too.
    assert {m: found for m, found in actual.items() if found} == ALLOWED


def test_project_helpers_the_apps_use_import_neither_app():
    """klineage_web modules imported by an app (and what they import in klineage_web) stay below both apps."""
    used = set().union(*(within(imports(m), PROJECT) for m in MODULES if m.startswith(APPS))) & set(MODULES)
    seen: set[str] = set()
    while used - seen:
        module = (used - seen).pop()
        seen.add(module)
        used |= within(imports(module), PROJECT) & set(MODULES)
    assert {"klineage_web.access", "klineage_web.pagination", "klineage_web.diff_rows",
            "klineage_web.short_ids"} <= seen
    offenders = {m: sorted(within(imports(m), "skills_app") | within(imports(m), "gate_app")) for m in seen}
    assert {m: found for m, found in offenders.items() if found} == {}


@pytest.mark.parametrize("source, expected", [
    ("from gate_app.models import Job\n", {"gate_app.models"}),
    ("def f():\n    from gate_app import queue\n", {"gate_app.queue"}),
    ("class A:\n    def f(self):\n        import gate_app.models as m\n", {"gate_app.models"}),
    ("from ..gate_app import models\n", {"gate_app.models"}),
    ("from . import presenters\n", {"skills_app.presenters"}),
])
def test_the_reader_sees_every_kind_of_import(source, expected):
    assert imported(source, "skills_app.lineage_views") == expected
