"""Register blocking (unblock_matmul) on a real GPU (sm_90; skipped elsewhere).

The held-out batch of small products (bench/transfer/bmm_small, no corpus walk or card has seen it) is tiled by
untile_matmul, then register-blocked: each thread a 4 x 4 micro-tile from 64 x 64 shared tiles. The blocked kernel
passes every case against the tiled form under the gate's sanitizer, and its ratios against the tiled form and
torch eager are printed (run with -s).

    python -m pytest tests/test_gpu_register_blocking.py -v -s -n 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tools import (
    forwarded,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    passes_against,
)
from klineage.kernel import load_kernel

pytestmark = pytest.mark.gpu
BMM = Path(__file__).resolve().parent.parent / "bench" / "transfer" / "bmm_small"
CASES = {"headline", "ragged", "small"}  # the problem's CASES (named here: a problem file runs only in the sandbox)



def test_the_blocked_product_passes_every_case_against_the_tiled_form(cache):
    tiled = forwarded(load_kernel(BMM / "naive"), "untile_matmul")
    blocked = forwarded(tiled, "unblock_matmul")
    passes_against(BMM / "problem.py", blocked, tiled, CASES, cache, "bmm_small's blocked product", "the tiled form")
