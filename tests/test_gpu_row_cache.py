"""scalarize_row_cache's forward on a real GPU (sm_90; skipped elsewhere): the kernel each row operator of the
transfer benchmark ends its default search with (its register row cache filled and written 16 bytes a lane at a
time), made by replaying that search off the recorded verdicts (bench/row_cache_when.py's `vector_step`),
passes the full gate on every case of its problem,
compute-sanitizer included, against the kernel it came from (the same cache one float a lane per 32 columns). The
cases take both paths: the headline's rows of 2,048 the 16-byte walk, the ragged, narrow and small ones the scalar
code. The headline ratio is printed (run with -s).

    python -m pytest tests/test_gpu_row_cache.py -v -s -n 0
"""

from __future__ import annotations

import os

import pytest

from bench_tools import bench_script
from gpu_tools import (
    assert_passes_every_case,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
)
from klineage import config
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize

pytestmark = pytest.mark.gpu
TRANSFER = config.REPO_ROOT / "bench" / "transfer"



@pytest.mark.parametrize("operator", ["rms_norm", "layer_norm", "l2_normalize", "log_softmax"])
def test_the_16_byte_row_cache_passes_every_case_under_the_sanitizer(cache, operator):
    folder = TRANSFER / operator
    parent, vector = bench_script("row_cache_when").vector_step(operator, GateCache(None, config.recorded_dir()))
    assert "const bool row_vec4 =" in vector.source
    verdict = run_gate(folder / "problem.py", vector, against=parent, cache=cache,
                       policy=GatePolicy(sanitize=Sanitize.ON_PASS, vendor=False),
                       record=bool(os.environ.get("KLINEAGE_RECORDED_DIR")))
    assert_passes_every_case(verdict, {"headline", "ragged", "narrow", "small"})
    ratio = verdict.profile["ratios"]["vs_baseline"]["overall"]
    print(f"\n{operator}: the 16-byte row cache is {ratio:.3f}x its scalar cache on the headline")
    assert ratio > 1.0
