"""LIBRARY_THEN_CATALOG: the library's candidates first, then the catalog's analysis forwards with the
budget its cards leave.

No GPU here, so the gate is the real compile-only gate with a stand-in for the GPU's timing: a kernel is
faster by 20% for each `__expf` it adds to the start kernel (fast_math's forward), and as fast as the start
otherwise. The planner, the transforms, the library and the budget are the real ones."""

from __future__ import annotations

import pytest

from klineage import config, corpus
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.kernel import load_kernel
from klineage.optimize import AttemptStatus, CodeCheck, OptimizationResult, Stop, Strategy, optimize, strategies
from klineage.optimize.strategies import Candidate, Ordering
from klineage.skills.library import Library, bundled_library, load_library
from klineage.transforms.base import Anchor, Direction, Rewrite
from scripted_gate import script_gpu_timing

SOFTMAX = corpus.problem_path("row_softmax")


@pytest.fixture
def scripted_gpu(monkeypatch, gate_cache):
    start = corpus.kernel_entry("row_softmax/naive").load()
    script_gpu_timing(monkeypatch, lambda source: 0.8 ** (source.count("__expf(") - start.source.count("__expf(")))
    return start


def run(start, cache, strategy: Strategy, library: Library, budget: int) -> OptimizationResult:
    result = optimize(SOFTMAX, start, strategy=strategy, library=library, budget=budget, gate_mode=GateMode.GPU,
                      cache=cache)
    assert OptimizationResult.from_json(result.to_json()) == result
    return result


def test_a_library_with_no_card_for_the_kernel_goes_on_with_the_catalog(scripted_gpu, gate_cache):
    empty = Library(())
    alone = run(scripted_gpu, gate_cache, Strategy.LIBRARY, empty, budget=12)
    assert alone.stop is Stop.NO_CANDIDATE and not alone.steps
    assert alone.message.endswith("none of the library's 0 card(s) has an allowed status (admitted); allow more "
                                  "statuses (e.g. admitted,candidate)")
    then = run(scripted_gpu, gate_cache, Strategy.LIBRARY_THEN_CATALOG, empty, budget=6)
    # one step per site: the naive kernel's two expf calls take two of the gate calls after the start's (the
    # read-only cache, the block's trees through shuffles and its row kept in registers, as fast as the start under
    # this stand-in, the others)
    assert [step.transform for step in then.steps] == ["fast_math", "fast_math"]
    assert then.speedup == pytest.approx(1 / 0.8 ** len(then.steps))
    assert all(not a.card for a in then.attempts)


def test_the_cards_come_first_and_the_catalog_never_gates_a_kernel_a_card_gated(scripted_gpu, gate_cache):
    library = load_library(bundled_library())
    # the start, the first round's card kernel and fast_math, the second round's fast_math: what the assertions
    # read (later rounds take no step)
    result = run(scripted_gpu, gate_cache, Strategy.LIBRARY_THEN_CATALOG, library, budget=4)
    first_round = [a for a in result.attempts if a.round == 0 and a.parent == scripted_gpu.fingerprint]
    from_cards = [i for i, a in enumerate(first_round) if a.card]
    from_catalog = [i for i, a in enumerate(first_round) if not a.card]
    assert from_cards and from_catalog and max(from_cards) < min(from_catalog)
    card_kernels = {a.candidate for a in first_round if a.card and a.status.gated}
    catalog_kernels = [a.candidate for a in first_round if not a.card and a.candidate]
    assert catalog_kernels and not card_kernels & set(catalog_kernels), "the catalog gated a card's kernel again"
    # the catalog's fast_math is what pays here; no admitted card of the bundled library teaches it
    assert "fast_math" in [step.transform for step in result.steps]
    assert {a.status for a in first_round if a.card and a.status.gated} <= {AttemptStatus.NOT_FASTER,
                                                                             AttemptStatus.REJECTED}


def test_what_optimize_runs_unless_told_otherwise_is_the_cards_then_the_catalog(db):
    """The command line, the dashboard's form and a job submitted without a strategy all default to it."""
    from gate_app import forms, submit
    from klineage.cli import parser

    args = parser().parse_args(["optimize", "p", "--from", "k"])
    assert args.strategy == Strategy.LIBRARY_THEN_CATALOG.value
    assert forms.OptimizeForm().get_initial_for_field(forms.OptimizeForm.base_fields["strategy"], "strategy") == \
        "library_then_catalog"
    assert submit.optimize_params("row_softmax/naive", mode="compile")["strategy"] == "library_then_catalog"
    assert submit.optimize_params("row_softmax/naive", mode="compile", strategy="library")["strategy"] == "library"


def _candidate(state, suffix: str, card: str = "", **why) -> Candidate:
    kernel = state.with_source(state.source + f"\n// {suffix}\n")
    return Candidate("ldg", card, rewrite=Rewrite("ldg", Direction.FORWARD, Anchor("k", "function", suffix), kernel),
                     **why)


def test_the_catalog_gates_a_kernel_a_card_passed_over_last_and_one_a_precondition_kept_out_never():
    start = corpus.kernel_entry("row_softmax/naive").load()
    card = "c" * 64
    from_cards = [_candidate(start, "gated", card),
                  _candidate(start, "passed", card, passed_over="alone: never a step"),
                  _candidate(start, "kept", card, precondition_failed="cols <= 64 fails on headline")]
    from_catalog = [_candidate(start, suffix) for suffix in ("passed", "kept", "gated", "fresh")]
    plan = strategies._then(lambda state: iter(from_cards), lambda state: iter(from_catalog))
    order = [(c.card != "", c.state.source.rsplit("// ", 1)[1].strip()) for c in plan(start)]
    assert order == [(True, "gated"), (True, "passed"), (True, "kept"), (False, "fresh"), (False, "passed")]


def _transfer_replay(operator: str) -> OptimizationResult:
    """The default search of a bench/transfer operator, replayed off the H200's recorded verdicts: as it ran, before
    rivals, orderings and the code check existed (a rival it never gated, or a kernel it gated later, would be a
    replay miss)."""
    transfer = config.REPO_ROOT / "bench" / "transfer" / operator
    return optimize(transfer / "problem.py", load_kernel(transfer / "naive"), strategy=Strategy.LIBRARY_THEN_CATALOG,
                    library=load_library(bundled_library()), budget=8, gate_mode=GateMode.REPLAY, jobs=6,
                    cache=GateCache(None, config.recorded_dir()), rivals=0, ordering=Ordering.AS_PLANNED,
                    code_check=CodeCheck.NONE)


def test_a_kernel_the_unroll_cards_passed_over_is_gated_last_by_the_catalog_on_cumsum():
    """After the warp scan, three unroll cards propose one kernel and pass it over (alone they never reached a
    step's ratio on the walks' kernels); the catalog's unroll gates that kernel last in the round (here it does
    not pay: the run ends with it)."""
    result = _transfer_replay("cumsum")
    passed_over = [a for a in result.attempts if a.status is AttemptStatus.PASSED_OVER]
    assert len(passed_over) == 3 and all(a.card and a.transform == "unroll" for a in passed_over)
    assert len({a.candidate for a in passed_over}) == 1
    gated = [a for a in result.attempts if a.candidate == passed_over[0].candidate and a not in passed_over]
    assert len(gated) == 1 and not gated[0].card and gated[0].status is AttemptStatus.NOT_FASTER
    assert gated[0] is [a for a in result.attempts if a.parent == gated[0].parent][-1]


def test_the_devectorize_cards_propose_the_16_byte_row_cache_on_l2_normalize():
    """Once the catalog has put the register row cache in, a devectorize card (16-byte vectors) proposes filling
    and writing it as float4 (scalarize_row_cache's analysis site), and it is taken."""
    result = _transfer_replay("l2_normalize")
    assert [s.transform for s in result.steps][-2:] == ["uncache_row", "devectorize"]
    last = result.steps[-1]
    assert last.card and "const bool row_vec4 = cols % 4 == 0" in last.state.source
    assert result.speedup > 10
