"""The rule rewriter's catalog: every named transform, registered by name.

A transform module defines one `Transform` subclass and adds an instance here; the catalog is the
vocabulary shared by the walk, the skill cards and the LLM rewriter's prompt.
"""

from __future__ import annotations

import functools

from klineage.errors import KLineageError
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform, refusals

CATALOG: dict[str, Transform] = {}


def register(transform: Transform) -> Transform:
    if transform.name in CATALOG:
        raise KLineageError(f"transform '{transform.name}' is registered twice")
    CATALOG[transform.name] = transform
    return transform


def get(name: str) -> Transform:
    _load()
    try:
        return CATALOG[name]
    except KeyError:
        raise KLineageError(f"unknown transform '{name}' (known: {', '.join(sorted(CATALOG))})") from None


def catalog() -> dict[str, Transform]:
    _load()
    return dict(CATALOG)


@functools.cache
def _load() -> None:
    """Import every transform module once (each registers itself). Once a process: `get` runs for every
    site of every candidate, and the package's folder need not be listed again each time."""
    import importlib
    import pkgutil

    import klineage.transforms as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in ("base",) and not module.name.startswith("_"):
            importlib.import_module(f"klineage.transforms.{module.name}")


__all__ = ["Anchor", "CATALOG", "Direction", "NotApplicable", "Rewrite", "Role", "Transform", "catalog", "get",
           "refusals", "register"]
