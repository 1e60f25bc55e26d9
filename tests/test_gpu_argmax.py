"""The held-out row argmax (bench/transfer/row_argmax) given a warp per row by serialize_reduction's forward, on a
real GPU (sm_90; skipped elsewhere).

- The gate: the forwarded kernel passes every case of the held-out problem, timed against the vendor (torch.max)
  and the naive kernel it was made from; the ratios are printed (run with -s).
- The bits: the naive and the forwarded kernel, launched side by side on rows made to trip a (value, index)
  combine (ties across lanes, NaNs at the start and inside, infinities, signed zeros; 1, 5, 33, 70 and 2048
  columns), give the same value bits and the same index on every row (the CPU emulator checks the same in
  tests/transforms/test_serialize_reduction.py; this is the hardware's shuffle).

    python -m pytest tests/test_gpu_argmax.py -v -s -n 0
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_tools import (
    assert_passes_every_case,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    probe_driver,
)
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.kernel import KernelState, load_kernel
from klineage.transforms import get
from tests.transforms.emulate import hard_rows

pytestmark = pytest.mark.gpu
OPERATOR = Path(__file__).resolve().parent.parent / "bench" / "transfer" / "row_argmax"


def _forms() -> tuple[KernelState, KernelState]:
    naive = load_kernel(OPERATOR / "naive")
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(naive)
    return naive, transform.forward(naive, site).state



def test_the_warp_per_row_argmax_passes_every_case_and_beats_the_naive_kernel(cache):
    naive, warp = _forms()
    verdict = run_gate(OPERATOR / "problem.py", warp, against=naive, cache=cache,
                       policy=GatePolicy(sanitize=Sanitize.NEVER), record=bool(os.environ.get("KLINEAGE_RECORDED_DIR")))
    assert_passes_every_case(verdict, {"headline", "ragged", "narrow", "small"})
    ratios = verdict.profile["ratios"]
    medians = {role: round(c["median_us"], 1) for role, c in verdict.profile["contenders"].items()}
    print(f"\nrow_argmax, a warp per row, on the headline: median us {medians}; "
          f"{ratios['vs_baseline']['overall']:.3f}x the naive kernel, {ratios['vs_vendor']['overall']:.3f}x torch.max")
    assert ratios["vs_baseline"]["overall"] > 1.0


def test_the_warp_per_row_argmax_gives_the_naive_kernels_bits_on_hard_rows(tmp_path):
    import numpy as np

    naive, warp = _forms()
    # C linkage, so that pycuda finds both kernels by their plain names
    source = 'extern "C" {\n' + naive.source + warp.source.replace("row_argmax(", "row_argmax_warp(") + "\n}\n"
    with probe_driver(tmp_path, source, "-O3") as (drv, torch, module, _):
        for n in (1, 5, 33, 70, 2048):
            x = hard_rows(n, torch.Generator().manual_seed(n)).repeat(40, 1).cuda()  # 480 rows: several blocks
            rows = x.shape[0]
            outputs = {}
            for name, per_block in (("row_argmax", 128), ("row_argmax_warp", 4)):
                value = torch.empty(rows, device="cuda")
                index = torch.full((rows,), -7, dtype=torch.int64, device="cuda")
                module.get_function(name)(np.uintp(x.data_ptr()), np.uintp(value.data_ptr()),
                                          np.uintp(index.data_ptr()), np.int32(rows), np.int32(n),
                                          block=(128, 1, 1), grid=(-(-rows // per_block), 1))
                drv.Context.synchronize()
                outputs[name] = (value.view(torch.int32).cpu(), index.cpu())
            assert torch.equal(outputs["row_argmax"][0], outputs["row_argmax_warp"][0]), n
            assert torch.equal(outputs["row_argmax"][1], outputs["row_argmax_warp"][1]), n
            assert (outputs["row_argmax"][1] >= 0).all()
