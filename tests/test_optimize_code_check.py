"""The optimize loop's code check: a candidate that runs the best kernel's machine code is recorded
`same_code` and never gated. Real compile-only gates (real nvcc), the real catalog and the cards of the
bundled softmax dry walk; where a run must take steps, the GPU's timing is a stand-in (a kernel is faster
by 20% for each `__expf` it adds to the start kernel), as in test_optimize_library_then_catalog."""

from __future__ import annotations

import json

import pytest

from klineage import config, corpus
from klineage.config import GateMode
from klineage.errors import DocumentError
from klineage.lineage import Lineage
from klineage.optimize import AttemptStatus, CodeCheck, OptimizationResult, Stop, Strategy, optimize
from klineage.skills import induce
from klineage.skills.card import CardStatus
from klineage.skills.library import Library
from scripted_gate import script_gpu_timing

SOFTMAX = corpus.problem_path("row_softmax")
NAIVE = corpus.kernel_entry("row_softmax/naive").load()


@pytest.fixture(scope="module")
def unroll_cards() -> Library:
    cards = induce([Lineage.load(config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.dry.json")])
    return Library(tuple(cards), {"lineages": ["row_softmax_warp_vec4 (dry)"]})


def _run(gate_cache, **kwargs) -> OptimizationResult:
    result = optimize(SOFTMAX, NAIVE, cache=gate_cache, **kwargs)
    assert OptimizationResult.from_json(result.to_json()) == result
    return result


def test_the_softmax_walks_unroll_cards_cost_no_gate_call_on_the_naive_kernel(gate_cache, unroll_cards):
    """nvcc already unrolls the naive kernel's loops: every kernel the cards make of it runs its machine code."""
    result = _run(gate_cache, strategy=Strategy.LIBRARY, library=unroll_cards, statuses=(CardStatus.CANDIDATE,),
                  budget=8, gate_mode=GateMode.COMPILE_ONLY)
    same = [a for a in result.attempts if a.status is AttemptStatus.SAME_CODE]
    assert same and all(a.status in (AttemptStatus.SAME_CODE, AttemptStatus.DUPLICATE) for a in result.attempts)
    assert result.stats.evaluations == 1 and result.stats.same_code == len(same) and result.stats.wasted == 0
    assert all(a.evaluation is None and a.verdict is None and "machine code" in a.message for a in same)
    assert result.stop is Stop.NO_IMPROVEMENT and result.code_check is CodeCheck.SASS
    assert json.loads(result.to_json())["code_check"] == "sass"
    without = _run(gate_cache, strategy=Strategy.LIBRARY, library=unroll_cards, statuses=(CardStatus.CANDIDATE,),
                   budget=8, gate_mode=GateMode.COMPILE_ONLY, code_check=CodeCheck.NONE)
    gated = [a for a in without.attempts if a.status.gated]
    assert {a.candidate for a in gated} == {a.candidate for a in same}, "without the check, each was gated"
    assert without.stats.evaluations == 1 + len(gated) and without.stats.same_code == 0


@pytest.mark.slow  # two greedy searches of 40 gate calls each (about a minute): the suite's time limit
def test_the_gate_calls_a_same_code_kernel_would_cost_go_to_the_next_candidates(monkeypatch, gate_cache):
    script_gpu_timing(monkeypatch, lambda source: 0.8 ** (source.count("__expf(") - NAIVE.source.count("__expf(")))
    runs = {check: _run(gate_cache, strategy=Strategy.UNCONDITIONED_GREEDY, budget=40, gate_mode=GateMode.GPU,
                        code_check=check) for check in CodeCheck}
    checked, unchecked = runs[CodeCheck.SASS], runs[CodeCheck.NONE]
    same = [a for a in checked.attempts if a.status is AttemptStatus.SAME_CODE]
    assert same, "the catalog's unroll and __launch_bounds__ change nothing nvcc emits for the naive kernel"
    for attempt in same:  # without the check, each was gated and timed as fast as its best: not a step
        twin = next(a for a in unchecked.attempts if a.candidate == attempt.candidate and a.status.gated)
        assert twin.status is AttemptStatus.NOT_FASTER and twin.ratio.overall == 1.0
    # the same path, to the same kernel, for fewer gate calls
    assert [s.child for s in checked.steps] == [s.child for s in unchecked.steps] and checked.steps
    assert checked.stop is unchecked.stop is Stop.NO_IMPROVEMENT
    # each same-code kernel cost a gate call without the check, and as a stepping stone the composites built on it
    assert checked.stats.evaluations <= unchecked.stats.evaluations - len(same)


def test_a_document_says_which_check_ran_and_one_from_before_the_check_reads_as_none(gate_cache, unroll_cards):
    result = _run(gate_cache, strategy=Strategy.LIBRARY, library=unroll_cards, statuses=(CardStatus.CANDIDATE,),
                  budget=2, gate_mode=GateMode.COMPILE_ONLY)
    data = json.loads(result.to_json())
    with pytest.raises(DocumentError, match="none, yet an attempt was recorded same_code"):
        OptimizationResult.from_dict({k: v for k, v in data.items() if k != "code_check"})
    with pytest.raises(DocumentError, match=r"optimization\.code_check"):
        OptimizationResult.from_dict(data | {"code_check": "ptx"})
    unchecked = _run(gate_cache, strategy=Strategy.LIBRARY, library=unroll_cards, statuses=(CardStatus.CANDIDATE,),
                     budget=2, gate_mode=GateMode.COMPILE_ONLY, code_check="none")
    old = json.loads(unchecked.to_json())
    assert "code_check" not in old and "same_code" not in old["stats"], "the bytes of runs from before the check"
    assert OptimizationResult.from_dict(old).code_check is CodeCheck.NONE

