"""Shared fixtures for the transform tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One compile cache for every transform test: the experts compile once per session."""
    return tmp_path_factory.mktemp("compile-cache")
