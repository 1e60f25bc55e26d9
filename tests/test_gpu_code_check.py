"""On a GPU (skipped without one): the optimize loop's code check on the GPU host's own toolchain, which
disassembles what the gate compiles there, so a candidate that runs its best kernel's machine code is kept from
the gate on the GPU as it is without one (tests/test_optimize_code_check.py)."""

from __future__ import annotations

import os

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.optimize import AttemptStatus, CodeCheck, Strategy, optimize

pytestmark = pytest.mark.gpu
SOFTMAX = corpus.problem_path("row_softmax")


def test_on_the_gpu_host_a_same_code_kernel_costs_no_gate_call(tmp_path):
    cache = GateCache(tmp_path / "cache", os.environ.get("KLINEAGE_RECORDED_DIR") or None)
    start = corpus.kernel_entry("row_softmax/naive").load()
    runs = {check: optimize(SOFTMAX, start, strategy=Strategy.UNCONDITIONED_GREEDY, budget=8, gate_mode=GateMode.GPU,
                            cache=cache, jobs=4, code_check=check) for check in CodeCheck}
    checked, unchecked = runs[CodeCheck.SASS], runs[CodeCheck.NONE]
    same = [a for a in checked.attempts if a.status is AttemptStatus.SAME_CODE]
    assert same and checked.stats.same_code == len(same), "nvcc unrolls the naive kernel's loops itself"
    # without the check the same kernels were gated; each timed within the gate's noise of its best
    twins = [a for a in unchecked.attempts if a.candidate in {s.candidate for s in same} and a.ratio is not None]
    assert twins and all(0.97 < a.ratio.overall < 1.03 for a in twins)
    print(f"{len(same)} same-code candidate(s) not gated ({', '.join(sorted({a.transform for a in same}))}); "
          f"without the check {len(twins)} of them were timed at "
          f"{', '.join(f'{a.ratio.overall:.3f}x' for a in twins)} their best; stop {checked.stop.value} after "
          f"{checked.stats.evaluations} gate calls, {unchecked.stop.value} after {unchecked.stats.evaluations} without")
