"""Composite steps (Lookahead.PAIRS): when no single candidate is faster, two in a row may be.

No GPU here, so the gate is the real compile-only gate with a stand-in for the GPU's timing: a
kernel's time is scripted from what it adds to the start kernel (each `__expf` or `#pragma
unroll` alone makes it 10% slower; the two kinds together make it faster). Everything else (the
planner, the transforms, the budget, the document) is the real loop; tests/test_optimize.py
covers it on a GPU."""

from __future__ import annotations

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.gate.warm import WarmRunner
from klineage.optimize import AttemptStatus, Lookahead, OptimizationResult, Stop, Strategy, optimize
from scripted_gate import script_gpu_timing

SOFTMAX = corpus.problem_path("row_softmax")


def scripted_time(source: str, start: str) -> float:
    fast = source.count("__expf(") - start.count("__expf(")
    unroll = source.count("#pragma unroll") - start.count("#pragma unroll")
    time = 1.1 ** (fast + unroll)
    return time * 0.7 if fast > 0 and unroll > 0 else time


RUNNERS: list = []  # the runner each scripted gate call was handed


@pytest.fixture
def scripted_gpu(monkeypatch, gate_cache):
    start = corpus.kernel_entry("row_softmax/naive").load()
    RUNNERS.clear()
    script_gpu_timing(monkeypatch, lambda source: scripted_time(source, start.source), RUNNERS)
    return start


def go(start, cache, lookahead, budget=40) -> OptimizationResult:
    result = optimize(SOFTMAX, start, strategy=Strategy.UNCONDITIONED_GREEDY, budget=budget, gate_mode=GateMode.GPU,
                      cache=cache, lookahead=lookahead)
    assert OptimizationResult.from_json(result.to_json()) == result
    return result


def test_single_steps_that_only_pay_together_stall_without_lookahead(scripted_gpu, gate_cache):
    result = go(scripted_gpu, gate_cache, Lookahead.NONE)
    assert result.stop is Stop.NO_IMPROVEMENT and not result.steps
    assert {a.status for a in result.attempts if a.status.gated} == {AttemptStatus.NOT_FASTER}
    # on the GPU gate every one-at-a-time gate of the run goes through the run's one warm runner
    assert RUNNERS and all(isinstance(r, WarmRunner) for r in RUNNERS) and len({id(r) for r in RUNNERS}) == 1


@pytest.mark.slow  # 40 gate calls of composites (half a minute and more): the suite's time limit
def test_a_composite_of_two_slower_candidates_is_taken_as_one_step(scripted_gpu, gate_cache):
    # the run takes 40 gate calls (the start's, the singles and the pairs at the start kernel and after the step):
    # a budget with room to spare, so that it ends by finding nothing better rather than by the budget
    result = go(scripted_gpu, gate_cache, Lookahead.PAIRS, budget=48)
    first = result.steps[0]
    assert set(first.transform.split("+")) == {"fast_math", "unroll"}
    assert first.ratio.overall == pytest.approx(1.1 ** 0 / (1.1 ** 2 * 0.7))
    taken = result.attempts[first.attempt]
    assert taken.parent == scripted_gpu.fingerprint and taken.status is AttemptStatus.FASTER
    # after it, each further addition is slower, alone or in pairs: the run ends there
    assert len(result.steps) == 1 and result.speedup == pytest.approx(first.ratio.overall)
    assert result.stop is Stop.NO_IMPROVEMENT and result.stats.evaluations <= 48


def test_composites_stay_within_the_budget(scripted_gpu, gate_cache):
    singles = len([a for a in go(scripted_gpu, gate_cache, Lookahead.NONE).attempts if a.status.gated])
    tight = go(scripted_gpu, gate_cache, Lookahead.PAIRS, budget=singles + 1)  # the start's gate, the singles
    assert tight.stop is Stop.BUDGET and not tight.steps and tight.stats.evaluations == singles + 1
