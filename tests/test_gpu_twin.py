"""On a GPU (skipped without one): a timed gate with a passed correctness twin runs only the timing,
and `optimize --jobs` judges a round's correctness side by side and decides as it does alone."""

from __future__ import annotations

import os

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.optimize import DEFAULT_POLICY, Strategy, optimize
from klineage.walk import walker

pytestmark = pytest.mark.gpu
SOFTMAX = corpus.problem_path("row_softmax")


@pytest.fixture()
def cache(tmp_path) -> GateCache:
    return GateCache(tmp_path / "cache", os.environ.get("KLINEAGE_RECORDED_DIR") or None)


def test_a_passed_twin_leaves_only_the_timing_to_run(cache):
    fast, slow = corpus.kernel_entry("row_softmax/warp_vec4").load(), corpus.kernel_entry("row_softmax/naive").load()
    twin = run_gate(SOFTMAX, fast, policy=DEFAULT_POLICY.correctness_twin(), cache=cache)
    assert twin.status is Status.PASSED and set(twin.sanitizer) == {"memcheck", "racecheck"}
    timed = run_gate(SOFTMAX, fast, against=slow, policy=DEFAULT_POLICY, cache=cache)
    assert timed.status is Status.PASSED
    assert timed.provenance["correctness_from"] == twin.provenance["key"]
    assert timed.correctness == twin.correctness and timed.sanitizer == twin.sanitizer
    assert "memcheck" not in timed.timings  # the sanitizers ran once, in the twin
    assert timed.profile["ratios"]["vs_baseline"]["overall"] > 1.0  # warp_vec4 beats the naive kernel
    print(f"twin {sum(v for k, v in twin.timings.items() if '.' not in k):.1f} s, "
          f"timing only {sum(v for k, v in timed.timings.items() if '.' not in k):.1f} s")


def test_a_walk_states_pass_leaves_its_forward_timing_only_the_timing(cache):
    """The walk times each forward step under a lighter policy (one seed, no sanitizer) than its
    states were judged under; the parent's stored state verdict answers that gate's correctness."""
    parent, child = corpus.kernel_entry("row_softmax/warp_vec4").load(), corpus.kernel_entry("row_softmax/naive").load()
    as_state = run_gate(SOFTMAX, parent, policy=walker.DEFAULT_POLICY, cache=cache)
    assert as_state.status is Status.PASSED
    forward = walker.forward_timing_policy(walker.DEFAULT_POLICY)
    timed = run_gate(SOFTMAX, parent, against=child, policy=forward, cache=cache, judged_under=walker.DEFAULT_POLICY)
    assert timed.status is Status.PASSED and timed.provenance["correctness_from"] == as_state.provenance["key"]
    assert timed.profile["ratios"]["vs_baseline"]["overall"] > 1.0
    print(f"state {sum(v for k, v in as_state.timings.items() if '.' not in k):.1f} s, "
          f"forward timing {sum(v for k, v in timed.timings.items() if '.' not in k):.1f} s")


def test_optimize_with_jobs_reuses_the_twins_and_stays_in_budget(cache):
    start = corpus.kernel_entry("row_softmax/naive").load()
    result = optimize(SOFTMAX, start, strategy=Strategy.UNCONDITIONED_GREEDY, budget=6, gate_mode=GateMode.GPU,
                      cache=cache, jobs=4)
    assert result.stats.evaluations <= 6
    gated = [a for a in result.attempts if a.key]
    assert gated, result.message
    reused = [a for a in gated if cache.lookup(a.key)[0].provenance.get("correctness_from")]
    assert reused, "no gate call found its correctness twin"
    print(f"{len(reused)} of {len(gated)} gate calls reused a twin; {result.stats.seconds:.1f} s of gate time, "
          f"stop {result.stop.value}, speedup {result.speedup}")
