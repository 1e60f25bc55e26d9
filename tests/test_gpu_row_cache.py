"""scalarize_row_cache's forward on a real GPU (sm_90; skipped elsewhere): the kernel each row operator of the
transfer benchmark ends its default search with (its register row cache filled and written 16 bytes a lane at a
time), made by replaying that search off the recorded verdicts, passes the full gate on every case of its problem,
compute-sanitizer included, against the kernel it came from (the same cache one float a lane per 32 columns). The
cases take both paths: the headline's rows of 2,048 the 16-byte walk, the ragged, narrow and small ones the scalar
code. The headline ratio is printed (run with -s).

    python -m pytest tests/test_gpu_row_cache.py -v -s -n 0
"""

from __future__ import annotations

import os

import pytest

from gpu_tools import assert_passes_every_case, gate_cache
from klineage import config
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.kernel import load_kernel
from klineage.optimize import Strategy, optimize
from klineage.skills.library import bundled_library, load_library
from klineage.transforms import get

pytestmark = pytest.mark.gpu
TRANSFER = config.REPO_ROOT / "bench" / "transfer"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return gate_cache(tmp_path_factory)


@pytest.mark.parametrize("operator", ["rms_norm", "layer_norm", "l2_normalize", "log_softmax"])
def test_the_16_byte_row_cache_passes_every_case_under_the_sanitizer(cache, operator):
    folder = TRANSFER / operator
    result = optimize(folder / "problem.py", load_kernel(folder / "naive"), strategy=Strategy.LIBRARY_THEN_CATALOG,
                      library=load_library(bundled_library()), budget=8, gate_mode=GateMode.REPLAY, jobs=6,
                      cache=GateCache(None, config.recorded_dir()))
    vector = result.steps[-1].state
    transform = get("scalarize_row_cache")
    assert "const bool row_vec4 =" in vector.source
    parent = transform.backward(vector, transform.find(vector)[0]).state
    verdict = run_gate(folder / "problem.py", vector, against=parent, cache=cache,
                       policy=GatePolicy(sanitize=Sanitize.ON_PASS, vendor=False),
                       record=bool(os.environ.get("KLINEAGE_RECORDED_DIR")))
    assert_passes_every_case(verdict, {"headline", "ragged", "narrow", "small"})
    ratio = verdict.profile["ratios"]["vs_baseline"]["overall"]
    print(f"\n{operator}: the 16-byte row cache is {ratio:.3f}x its scalar cache on the headline")
    assert ratio > 1.0
