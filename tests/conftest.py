"""Shared test setup: GPU tests run only where a GPU, torch with CUDA and pycuda are present."""

from __future__ import annotations

import functools

import pytest


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
