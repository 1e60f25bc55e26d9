"""Shared fixtures for the transform tests."""

from __future__ import annotations

import pytest

from shared_cache import share


@pytest.fixture(scope="session")
def cache(tmp_path_factory, shared_cache):
    """One compile cache for every transform test: the experts compile once per run, their compiles and
    SASS features the run's (tests/shared_cache.py: content-addressed, so a shared entry is the one a
    fresh cache would have made; no transform test counts or empties its compiles)."""
    return share(tmp_path_factory.mktemp("compile-cache"), shared_cache)
