"""Shared test setup: GPU tests run only where a GPU, torch with CUDA and pycuda are present; a gate
cache of its own for each module that runs the gate."""

from __future__ import annotations

import functools

import pytest

from klineage.gate.cache import GateCache


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


# What nvcc, the artifact policy, disassembly and the problem probe produced, keyed by content: the
# same kernel compiles to the same entry in every module, so the modules of one test worker share it.
# Verdicts are never shared: each module judges from an empty verdict cache.
_BUILD_PARTS = ("compile", "artifact", "sass", "problems")


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("build_cache")


@pytest.fixture(scope="module")
def gate_cache(tmp_path_factory, build_cache):
    """A gate cache of the module's own, with no verdict in it and nothing recorded (compiled artifacts
    shared within the worker); KLINEAGE_CACHE_DIR points into it."""
    root = tmp_path_factory.mktemp("gate_cache")
    (root / "cache").mkdir()
    for part in _BUILD_PARTS:
        (build_cache / part).mkdir(exist_ok=True)
        (root / "cache" / part).symlink_to(build_cache / part, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KLINEAGE_CACHE_DIR", str(root / "cache"))
        yield GateCache(root / "cache", root / "recorded")


@pytest.fixture
def sleep_kind(monkeypatch):
    """The test-only `sleep` job kind (tests/job_kinds.py), known to this process and to every process it
    starts (workers, their jobs' children) for the test."""
    from job_kinds import ENV

    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
