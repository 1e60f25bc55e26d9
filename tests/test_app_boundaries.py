"""Which way the Django apps lean, read from the source by tests/import_reader.py (imports anywhere in a module).

skills_app holds problems, kernels, verdicts, lineages and cards, and never imports gate_app: a page that shows
both (the home page's jobs, the job that made a lineage) is put together in klineage_web. gate_app, the jobs app,
reads skills_app only in the modules listed in ALLOWED, each for a stated reason. The helpers both apps share live
in klineage_web, and a klineage_web module an app imports imports neither app, so no rule is met by a detour.
"""

from __future__ import annotations

import pytest

from import_reader import imported, imports, modules_of

APPS = ("skills_app", "gate_app")
PROJECT = "klineage_web"
MODULES = modules_of(*APPS, PROJECT)

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
    # An optimization names the stored library it draws on.
    "gate_app.submit": {"skills_app.models"},
    # create_user --reviewer puts the account in the reviewer group, which skills_app's AppConfig keeps.
    "gate_app.management.commands.create_user": {"skills_app.apps"},
}


def within(names: set[str], package: str) -> set[str]:
    return {name for name in names if name == package or name.startswith(package + ".")}


def test_the_apps_are_read():
    assert {"skills_app.summary", "skills_app.lineage_views", "gate_app.work", "klineage_web.access"} <= set(MODULES)
    assert len([m for m in MODULES if m.startswith("gate_app.")]) >= 15


def test_skills_app_never_imports_gate_app():
    offenders = {m: sorted(within(imports(m, MODULES), "gate_app")) for m in MODULES if m.startswith("skills_app")}
    assert {m: found for m, found in offenders.items() if found} == {}


def test_gate_app_imports_skills_app_only_where_listed():
    actual = {m: within(imports(m, MODULES), "skills_app") for m in MODULES if m.startswith("gate_app")}
    # Equal, not a subset: a listed module that stopped needing skills_app leaves the list too.
    assert {m: found for m, found in actual.items() if found} == ALLOWED


def test_project_helpers_the_apps_use_import_neither_app():
    """klineage_web modules imported by an app (and what they import in klineage_web) stay below both apps."""
    used = set().union(*(within(imports(m, MODULES), PROJECT) for m in MODULES if m.startswith(APPS)))
    seen: set[str] = set()
    while used - seen:
        module = (used - seen).pop()
        seen.add(module)
        used |= within(imports(module, MODULES), PROJECT)
    assert {"klineage_web.access", "klineage_web.pagination", "klineage_web.diff_rows",
            "klineage_web.short_ids"} <= seen
    offenders = {m: sorted(within(imports(m, MODULES), "skills_app") | within(imports(m, MODULES), "gate_app"))
                 for m in seen}
    assert {m: found for m, found in offenders.items() if found} == {}


@pytest.mark.parametrize("source, expected", [
    ("from gate_app.models import Job\n", {"gate_app.models"}),
    ("def f():\n    from gate_app import queue\n", {"gate_app.queue"}),
    ("class A:\n    def f(self):\n        import gate_app.models as m\n", {"gate_app.models"}),
    ("from ..gate_app import models\n", {"gate_app.models"}),
    ("from . import presenters\n", {"skills_app.presenters"}),
])
def test_the_reader_sees_every_kind_of_import(source, expected):
    assert imported(source, "skills_app.lineage_views", MODULES) == expected
