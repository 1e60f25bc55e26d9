"""The premises of tests/test_gpu_spellings.py, checked where there is no GPU: each naive kernel as spelled there is
read by the forward the GPU test gates, and the rewrite shows what that test expects. A change to the readings that
lost one of those sites would otherwise stay hidden until a GPU session ran the queue."""

from __future__ import annotations

import pytest

from tests.test_gpu_spellings import SPELLINGS, Spelling


@pytest.mark.parametrize("spelling", SPELLINGS, ids=lambda spelling: spelling.name)
def test_the_forward_reads_each_spelling_the_gpu_gates(spelling: Spelling):
    written = spelling.rewritten()
    assert written.source != spelling.naive().source
