"""Rivals: before a first improvement is taken, the round's candidates it would rule out are gated too.

column_max's naive kernel (a thread per column) has four forwards of its one column loop, each ruling out
the others: a block per column (`serialize_block_reduction`), a warp per column (`serialize_reduction`), 4 lanes
per column (`serialize_column_reduction`) and chunks of rows on grid y with a merge (`unsplit_reduction`). No GPU
here, so the gate is the real compile-only gate with a stand-in for the GPU's timing, scripted from what each
forward writes: 4 lanes are 2x the start kernel, a warp 4x, chunks of rows 10x, anything else (a block) as fast as
what it came from. The planner
(the catalog's order, after an empty library), the transforms and the budget are the real ones."""

from __future__ import annotations

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.optimize import AttemptStatus, OptimizationResult, Strategy, loop, optimize, strategies
from klineage.skills.library import Library
from klineage.transforms import catalog, get
from scripted_gate import script_gpu_timing

COLUMN_MAX = corpus.problem_path("column_max")
MARKS = (("blockIdx.y", 0.1), ("r += 32", 0.25), ("slice_mask", 0.5))  # unsplit, a warp, 4 lanes


def seconds(source: str) -> float:
    return next((time for mark, time in MARKS if mark in source), 1.0)


@pytest.fixture
def scripted_gpu(monkeypatch):
    script_gpu_timing(monkeypatch, seconds)
    return corpus.kernel_entry("column_max/naive").load()


def run(start, cache, budget: int, rivals: int = strategies.RIVALS) -> OptimizationResult:
    result = optimize(COLUMN_MAX, start, strategy=Strategy.LIBRARY_THEN_CATALOG, library=Library(()), budget=budget,
                      gate_mode=GateMode.GPU, cache=cache, rivals=rivals)
    assert OptimizationResult.from_json(result.to_json()) == result
    return result


def test_the_step_is_the_fastest_of_the_rewrites_the_first_improvement_rules_out(scripted_gpu, gate_cache):
    result = run(scripted_gpu, gate_cache, budget=6)
    first = [(a.transform, a.status) for a in result.attempts if a.round == 0]
    assert first == [("ldg_subscript", AttemptStatus.NOT_FASTER),
                     ("serialize_block_reduction", AttemptStatus.NOT_FASTER),
                     ("serialize_column_reduction", AttemptStatus.FASTER),  # the first improvement (2x) ...
                     ("serialize_reduction", AttemptStatus.FASTER),  # ... and the two rewrites it rules out
                     ("unsplit_reduction", AttemptStatus.FASTER)]
    assert result.steps[0].transform == "unsplit_reduction" and result.steps[0].ratio.overall == pytest.approx(10)
    rivals = [a for a in result.attempts if a.round == 0][3:]
    assert all(a.message.endswith("; a rival of attempt 2 (serialize_column_reduction), which rules it out")
               for a in rivals)
    assert result.speedup == pytest.approx(10) and result.stats.evaluations == 6 and result.rivals == 3

    # rivals cost gate calls like any candidate: when the budget ends among them, the fastest judged is taken
    short = run(scripted_gpu, gate_cache, budget=5)
    assert [s.transform for s in short.steps] == ["serialize_reduction"] and short.stop.value == "budget"

    plain = run(scripted_gpu, gate_cache, budget=5, rivals=0)  # without rivals: the round's first improvement
    assert [s.transform for s in plain.steps] == ["serialize_column_reduction"] and plain.speedup == 2
    assert plain.rivals == 0 and OptimizationResult.from_dict({**plain.to_dict(), "rivals": 1}).rivals == 1


def test_only_transforms_that_lose_their_sites_are_rivals(scripted_gpu):
    plan = strategies.planner(Strategy.UNCONDITIONED_GREEDY, strategies.RewriterKind.RULES, cards=(), problem=None,
                              statuses=(), transforms=list(catalog().values()), seed=0)

    def child(name):
        transform = get(name)
        return transform.forward(scripted_gpu, transform.forward_sites(scripted_gpu)[0]).state

    def rivals(name):
        return [c.transform for c in loop.ruled_out(plan(scripted_gpu), scripted_gpu, child(name), name, set())]

    assert rivals("serialize_column_reduction") == ["serialize_block_reduction", "serialize_reduction",
                                                    "unsplit_reduction"]
    assert rivals("unsplit_reduction") == ["serialize_block_reduction", "serialize_column_reduction",
                                           "serialize_reduction"]
    # __ldg and __restrict__ leave the loop's forwards their site; a step's own transform is no rival of it
    assert rivals("ldg_subscript") == [] and rivals("restrict") == []
    # a composite step is each of its transforms: none of them is its rival
    assert [c.transform for c in loop.ruled_out(plan(scripted_gpu), scripted_gpu, child("unsplit_reduction"),
                                                "restrict+unsplit_reduction+serialize_reduction", set())] \
        == ["serialize_block_reduction", "serialize_column_reduction"]
