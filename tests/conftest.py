"""Shared test setup: GPU tests run only where a GPU, torch with CUDA and pycuda are present; a gate
cache of its own for each module that runs the gate (its probes and compiles shared by the run)."""

from __future__ import annotations

from threads import one_thread_per_worker

one_thread_per_worker()  # before anything below imports torch or numpy (tests/threads.py)

import sys  # noqa: E402

# pytest caches its assertion rewrite of each test module as bytecode (tests/__pycache__, ignored by git), checked
# against the source's size and mtime, but only where bytecode may be written: under PYTHONDONTWRITEBYTECODE (set
# on the development VMs) each xdist worker rewrote and compiled every module of tests/ on every run, collection
# 27 s a worker against 7 s from the cache. The processes the tests start keep the variable as found.
sys.dont_write_bytecode = False

import functools  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from klineage.gate.cache import GateCache  # noqa: E402
from shared_cache import BUILDS_ENV, DERIVED, SHARED_ENV, share, shared_root  # noqa: E402


@functools.cache
def gpu_available() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import pycuda.driver  # noqa: F401
    except Exception:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with torch (CUDA) and pycuda")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def shared_emulator_builds(tmp_path_factory):
    """The run's CPU emulator builds, shared by content (tests/cuda_tools.py `build_mma_emulator`), the run's
    shared folder (tests/dashboard_data.py's import of the corpus), and the engine cache of a test that names none
    of its own: this worker's, its probes and compiles the run's. Never the machine's var/cache, which a
    development machine keeps warm and a CI checkout starts cold, so that the suite's time here is CI's, and the
    compiles of a test without a cache are not made a second time beside the run's."""
    root = shared_root(tmp_path_factory.getbasetemp())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BUILDS_ENV, str(root / "emulators"))
        patch.setenv(SHARED_ENV, str(root))
        patch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path_factory.mktemp("worker_cache"), root)))
        yield


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """The run's shared probes and compiles (tests/shared_cache.py)."""
    return shared_root(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def gate_cache(request, tmp_path_factory, shared_cache):
    """A gate cache of the module's own, with no verdict and nothing recorded; KLINEAGE_CACHE_DIR points
    into it. Its problem probes, compiles, SASS features and artifact reports are the run's (shared_cache),
    or only the parts a module names in SHARED_CACHE (one that empties or counts its compiles keeps them)."""
    root = tmp_path_factory.mktemp("gate_cache")
    share(root / "cache", shared_cache, getattr(request.module, "SHARED_CACHE", DERIVED))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KLINEAGE_CACHE_DIR", str(root / "cache"))
        yield GateCache(root / "cache", root / "recorded")


@pytest.fixture
def back_to_the_latest_migration():
    """A test that moves the database to an older migration leaves it at the newest one again: the next
    test on the same worker (a live server's, whose tables are not re-created) needs every column."""
    yield
    from migration_tools import latest, migrate

    migrate(latest())


@pytest.fixture
def sleep_kind(monkeypatch):
    """The test-only `sleep` job kind (tests/job_kinds.py), known to this process and to every process it
    starts (workers, their jobs' children) for the test."""
    from job_kinds import ENV

    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
