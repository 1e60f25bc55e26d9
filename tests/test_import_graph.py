"""The import graphs of the engine and of the web apps, read from the source by tests/import_reader.py: no
transform imports another transform (shared helpers live in the underscore modules of klineage/transforms/);
the imports among klineage/ modules form no cycle; and the imports among the modules of gate_app, skills_app and
klineage_web, those inside functions included, form none either (a cycle makes import order matter and hides
which module owns a concept; an import moved into a function only hides the cycle)."""

from __future__ import annotations

import pytest

from import_reader import imports, modules_of

MODULES = modules_of("klineage")
APP_PACKAGES = ("gate_app", "skills_app", "klineage_web")
APP_MODULES = modules_of(*APP_PACKAGES)


def is_transform(module: str) -> bool:
    """A catalog transform: a module the catalog loads (not base, not an underscore helper, not the package)."""
    prefix = "klineage.transforms."
    return module.startswith(prefix) and module[len(prefix):] != "base" and not module[len(prefix):].startswith("_")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_catalog_has_transforms_and_helpers():
    transforms = [m for m in MODULES if is_transform(m)]
    assert "klineage.transforms.devectorize" in transforms and "klineage.transforms._edit" not in transforms
    assert len(transforms) >= 18


def test_no_transform_imports_another_transform():
    offenders = {m: sorted(t for t in imports(m, MODULES) if is_transform(t))
                 for m in MODULES if is_transform(m)}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_helpers_import_no_transform_and_not_the_walk():
    helpers = [m for m in MODULES if m.startswith("klineage.transforms.") and not is_transform(m)]
    bad = {m: sorted(t for t in imports(m, MODULES) if is_transform(t) or t.startswith("klineage.walk"))
           for m in helpers + [m for m in MODULES if is_transform(m)]}
    assert {m: t for m, t in bad.items() if t} == {}


def test_no_import_cycles_among_engine_modules():
    """Imports inside functions count: a deferred import that closes a circle (as `cli.main` importing
    `skills.command` once did) still makes each module depend on the other."""
    graph = {m: imports(m, MODULES) for m in MODULES}
    assert cycles(graph) == []


def test_the_apps_modules_are_all_read():
    assert {"gate_app.kinds", "gate_app.queue", "skills_app.models", "klineage_web.settings"} <= set(APP_MODULES)


def test_no_import_cycles_among_the_apps_modules():
    """Imports inside functions count: a cycle through one still makes each module depend on the other."""
    graph = {m: imports(m, APP_MODULES) for m in APP_MODULES}
    assert cycles(graph) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
])
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert cycles(graph) == expected
