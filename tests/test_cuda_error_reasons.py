"""The driver's error words as a rejection reason: a kernel's own fault is never called a resource limit."""

from __future__ import annotations

import pytest

from klineage.gate.runner import _classify_cuda_error
from klineage.gate.verdict import Reason


@pytest.mark.parametrize("words, reason", [
    # a global load of a register's (local) address: the uncache_row forward once wrote __ldg(&row_cache[t])
    ("cuCtxSynchronize failed: operation not supported on global/shared address space", Reason.CRASH),
    ("cuCtxSynchronize failed: an illegal memory access was encountered", Reason.CRASH),
    ("cuLaunchKernel failed: too many resources requested for launch", Reason.RESOURCE_LIMIT),
    ("cuModuleLoadData failed: entry function uses too much shared data", Reason.RESOURCE_LIMIT),
    ("cuLaunchKernel failed: invalid argument", Reason.LAUNCH_ERROR),
])
def test_driver_words_name_the_reason(words, reason):
    assert _classify_cuda_error(words) is reason
