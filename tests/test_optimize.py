"""The forward loop end to end without a GPU: real compile-only gates (real nvcc), cards induced from
the bundled dry lineage, the real catalog's forward rewrites, and the LLM rewriter over real HTTP
against the scripted local server. One test needs a GPU (paired timing) and skips elsewhere."""

from __future__ import annotations

import dataclasses
import json

import pytest

from klineage import config, corpus
from klineage.cli import main
from klineage.config import GateMode
from klineage.errors import DocumentError, KLineageError
from klineage.gate.cache import GateCache
from klineage.gate.policy import GatePolicy
from klineage.gate.verdict import Status
from klineage.lineage import Lineage
from klineage.optimize import (
    COMPILE_ONLY_NOTE,
    AttemptStatus,
    CodeCheck,
    EventKind,
    OptimizationResult,
    RewriterKind,
    Stop,
    Strategy,
    optimize,
)
from klineage.rewriters.llm import LLMRewriter
from klineage.rewriters.llm_budget import Budget, Prices
from klineage.skills import induce
from klineage.skills.card import CardStatus, Precondition
from klineage.skills.library import Library, save_library
from llm_server import ScriptedLLMServer

SOFTMAX = corpus.problem_path("row_softmax")
DRY_LINEAGE = config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.dry.json"
COMPILE = GateMode.COMPILE_ONLY
CANDIDATES = (CardStatus.CANDIDATE,)


@pytest.fixture(scope="module")
def library() -> Library:
    cards = induce([Lineage.load(DRY_LINEAGE)])
    assert cards and all(c.status is CardStatus.CANDIDATE for c in cards), "a dry walk gives candidate cards only"
    return Library(tuple(cards), {"lineages": ["row_softmax_warp_vec4 (dry)"]})


@pytest.fixture(scope="module")
def naive():
    return corpus.kernel_entry("row_softmax/naive").load()


def run(naive, cache, strategy, budget, library=None, **kwargs) -> OptimizationResult:
    kwargs.setdefault("statuses", CANDIDATES)
    # These tests follow gated attempts; the dry walk's unroll cards give kernels that run the naive kernel's own
    # machine code, which the code check keeps from the gate (test_optimize_code_check).
    kwargs.setdefault("code_check", CodeCheck.NONE)
    result = optimize(SOFTMAX, naive, strategy=strategy, library=library, budget=budget, gate_mode=COMPILE,
                      cache=cache, **kwargs)
    assert OptimizationResult.from_json(result.to_json()) == result, "every run gives a valid, round-tripping document"
    return result


def gated(result: OptimizationResult):
    return [a for a in result.attempts if a.status.gated]


@pytest.mark.parametrize("budget", [1, 2, 4])
def test_the_budget_counts_every_gate_call_and_is_spent_exactly(naive, gate_cache, budget):
    result = run(naive, gate_cache, Strategy.UNCONDITIONED_RANDOM, budget)
    assert result.stop is Stop.BUDGET and result.stats.evaluations == budget
    assert len(gated(result)) == budget - 1, "the start kernel's gate is call 1"
    assert [a.evaluation for a in gated(result)] == list(range(2, budget + 1))


def test_compile_only_accepts_nothing_and_says_why(naive, gate_cache, library):
    result = run(naive, gate_cache, Strategy.LIBRARY, 8, library)
    assert result.start_verdict.status is Status.COMPILED
    assert gated(result) and all(a.status is AttemptStatus.UNTIMED for a in gated(result))
    assert result.steps == () and result.best == naive and result.speedup is None
    assert result.note == COMPILE_ONLY_NOTE and "unknown fails" in result.note
    assert result.stats.wasted == len(gated(result)) and result.stats.accepted == 0
    assert result.to_dict()["assurance"] == "unverified_compile_only"


def test_every_attempt_is_recorded_with_its_card_anchor_and_verdict(naive, gate_cache, library):
    result = run(naive, gate_cache, Strategy.LIBRARY, 8, library)
    ids = {c.id for c in library.cards}
    assert result.attempts and all(a.card in ids for a in result.attempts)
    assert result.library.cards == len(library.cards) and result.library.statuses == CANDIDATES
    for attempt in result.attempts:
        assert attempt.transform == next(c.transform for c in library.cards if c.id == attempt.card)
        assert attempt.anchor is not None and attempt.parent == naive.fingerprint and attempt.round == 0
        if attempt.status.gated:
            assert len(attempt.key) == 64 and attempt.verdict.status is Status.COMPILED and attempt.ratio is None
        else:  # two unroll cards give the same kernels: judged once, then recognised
            assert attempt.status is AttemptStatus.DUPLICATE and "already judged" in attempt.message
    fingerprints = [a.candidate for a in gated(result)]
    assert len(set(fingerprints)) == len(fingerprints), "no kernel is gated twice"
    # the library strategy ran out of candidates before its budget: nothing improved
    assert result.stop is Stop.NO_IMPROVEMENT and result.stats.evaluations < result.budget


def test_events_and_progress_follow_every_attempt(naive, gate_cache, library):
    events, fractions = [], []
    result = run(naive, gate_cache, Strategy.LIBRARY, 8, library, on_event=events.append,
                 progress=lambda stage, message, fraction: fractions.append(fraction))
    assert [e.kind for e in events] == [EventKind.ATTEMPT] * len(result.attempts)
    assert [e.attempt for e in events] == list(result.attempts)
    assert all(e.speedup is None and e.budget == 8 and e.best == naive.fingerprint for e in events)
    assert [e.evaluations for e in events] == sorted(e.evaluations for e in events)
    assert json.loads(json.dumps(events[0].to_dict()))["attempt"]["status"] == "untimed"
    known = [f for f in fractions if f is not None]
    assert known and known == sorted(known) and 0 <= known[0] and known[-1] <= 1


def test_strategies_differ_in_what_they_try(naive, gate_cache, library):
    def tried(result):
        return [(a.transform, a.anchor.key) for a in result.attempts]

    ranked = run(naive, gate_cache, Strategy.LIBRARY, 6, library)
    shuffled = run(naive, gate_cache, Strategy.UNCONDITIONED_RANDOM, 6)
    reshuffled = run(naive, gate_cache, Strategy.UNCONDITIONED_RANDOM, 6, seed=7)
    greedy = run(naive, gate_cache, Strategy.UNCONDITIONED_GREEDY, 6)
    assert {t for t, _ in tried(ranked)} == {"unroll"}, "the cards of this lineage only teach unroll here"
    assert {t for t, _ in tried(shuffled)} - {"unroll"}, "the unconditioned pool holds every forward transform"
    assert tried(shuffled) != tried(greedy) != tried(reshuffled) and tried(shuffled) != tried(reshuffled)
    assert run(naive, gate_cache, Strategy.UNCONDITIONED_RANDOM, 6).attempts == shuffled.attempts, "seeded: repeatable"
    assert all(a.card == "" for a in shuffled.attempts + greedy.attempts)

    # a precondition that fails on this problem hides a card from LIBRARY, not from GENERATED_ONLY
    guarded = Library(tuple(dataclasses.replace(c, preconditions=(Precondition("cols < 0", "never holds"),))
                            for c in library.cards))
    assert run(naive, gate_cache, Strategy.LIBRARY, 6, guarded).stop is Stop.NO_CANDIDATE
    stripped = run(naive, gate_cache, Strategy.GENERATED_ONLY, 6, guarded)
    assert gated(stripped) and {a.card for a in stripped.attempts} <= {c.id for c in library.cards}


def test_only_allowed_card_statuses_are_retrieved(naive, gate_cache, library):
    result = run(naive, gate_cache, Strategy.LIBRARY, 4, library, statuses=(CardStatus.ADMITTED,))
    assert result.stop is Stop.NO_CANDIDATE and result.attempts == () and result.library.eligible == 0
    assert result.stats.evaluations == 1
    assert f"none of the library's {len(library.cards)} card(s) has an allowed status" in result.message


def test_the_document_round_trips_and_refuses_contradictions(naive, gate_cache, library, tmp_path):
    result = run(naive, gate_cache, Strategy.UNCONDITIONED_GREEDY, 3)
    path = result.save(tmp_path / "run.json")
    assert OptimizationResult.load(path) == result and path.read_text() == result.to_json()
    data = result.to_dict()

    def refused(change, needle):
        broken = json.loads(json.dumps(data))
        change(broken)
        with pytest.raises(DocumentError, match=needle):
            OptimizationResult.from_dict(broken)

    refused(lambda d: d["stats"].update(evaluations=2), "disagree")
    refused(lambda d: d.update(budget=2), "exceed the budget")
    refused(lambda d: d["attempts"][0].update(status="faster", ratio={"overall": 1.5, "per_trial": [1.5]}),
            "compile-only run times nothing")
    refused(lambda d: d["attempts"][1].update(evaluation=9), "every gate call is counted")
    refused(lambda d: d.update(strategy="clever"), "unknown value 'clever'")
    refused(lambda d: d.update(speedup=2.0), "disagrees")
    refused(lambda d: d.update(extra=1), "unknown keys")
    with pytest.raises(DocumentError, match="no such optimization file"):
        OptimizationResult.load(tmp_path / "missing.json")


def test_wrong_arguments_fail_clearly(naive, gate_cache, library):
    with pytest.raises(KLineageError, match="draws on a skill library"):
        run(naive, gate_cache, Strategy.LIBRARY, 4)
    with pytest.raises(KLineageError, match="rule rewriter has no forward plan"):
        run(naive, gate_cache, Strategy.NO_LIBRARY, 4)
    with pytest.raises(KLineageError, match="unknown strategy 'best'"):
        run(naive, gate_cache, "best", 4)
    with pytest.raises(KLineageError, match="unknown card status 'approved'"):
        run(naive, gate_cache, Strategy.LIBRARY, 4, library, statuses=("approved",))
    with pytest.raises(KLineageError, match="budget"):
        run(naive, gate_cache, Strategy.UNCONDITIONED_RANDOM, 0)
    with pytest.raises(KLineageError, match="unknown gate mode 'cpu'"):
        optimize(SOFTMAX, naive, strategy="library", library=library, budget=2, gate_mode="cpu")


def test_replay_serves_recorded_verdicts_and_a_miss_stops_the_run(naive, tmp_path):
    # the start kernel's H200 verdict is recorded (bench/gate_suite.py, default policy); no candidate is
    replayed = GateCache(tmp_path / "cache", config.recorded_dir())
    result = optimize(SOFTMAX, naive, strategy=Strategy.UNCONDITIONED_RANDOM, budget=3, gate_mode=GateMode.REPLAY,
                      policy=GatePolicy(), cache=replayed)
    assert result.start_verdict.status is Status.PASSED and result.assurance.value == "gpu_verified"
    *unjudged, attempt = result.attempts  # a candidate that runs its parent's machine code is never gated
    assert all(earlier.status is AttemptStatus.SAME_CODE for earlier in unjudged)
    assert attempt.status is AttemptStatus.GATE_ERROR and "no recorded verdict" in attempt.message
    assert result.stop is Stop.GATE_ERROR and result.stats.evaluations == 2 and result.speedup == 1.0
    assert OptimizationResult.from_json(result.to_json()) == result
    with pytest.raises(KLineageError, match="could not judge the start kernel"):
        optimize(SOFTMAX, naive, strategy=Strategy.UNCONDITIONED_RANDOM, budget=3, gate_mode=GateMode.REPLAY,
                 cache=GateCache(tmp_path / "cache", tmp_path / "nothing_recorded"))


# the LLM rewriter, over real HTTP


def llm(server, **budget) -> LLMRewriter:
    return LLMRewriter(model="test-model", base_url=server.base_url, api_key="sk-test-optimize",
                       budget=Budget(**{"usd": 10.0, "tokens": 1_000_000, **budget}), prices=Prices(), max_retries=0)


def test_the_llm_rewriter_applies_a_card_to_the_kernel(naive, gate_cache, library):
    loop = "    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {"
    assert naive.source.count(loop) == 2
    source = naive.source.replace(loop, "#pragma unroll\n" + loop, 1)
    with ScriptedLLMServer() as server:
        server.answer({"transform": "unroll", "anchor": {"function": "row_softmax_naive", "kind": "loop",
                                                         "key": "stride#0:unroll"},
                       "rationale": "unroll the max reduction", "source": source, "plan_changes": None})
        result = run(naive, gate_cache, Strategy.LIBRARY, 2, library, rewriter=RewriterKind.LLM, llm=llm(server))
        prompt = server.requests[0].prompt
    assert len(server.requests) == 1, "the loop stops asking once the gate budget is spent"
    card = next(c for c in library.cards if c.id == result.attempts[0].card)
    assert card.intent in prompt and "apply one verified optimization skill" in prompt
    (attempt,) = result.attempts
    assert attempt.status is AttemptStatus.UNTIMED and attempt.transform == "unroll"
    assert attempt.anchor.key == "stride#0:unroll" and result.stop is Stop.BUDGET
    assert result.rewriter is RewriterKind.LLM and result.llm_usage["calls"] == 1


def test_the_rewriter_alone_and_its_spent_budget(naive, gate_cache):
    with ScriptedLLMServer() as server:
        server.text("not json")  # one malformed answer: no candidate, no gate call
        result = run(naive, gate_cache, Strategy.NO_LIBRARY, 3, rewriter="llm", llm=llm(server))
    assert result.attempts[0].status is AttemptStatus.NOT_APPLICABLE and "not valid JSON" in result.attempts[0].message
    assert all(a.status is AttemptStatus.NOT_APPLICABLE for a in result.attempts) and result.stats.evaluations == 1
    assert result.stop is Stop.NO_CANDIDATE
    with ScriptedLLMServer() as server:
        spent = run(naive, gate_cache, Strategy.NO_LIBRARY, 3, rewriter="llm", llm=llm(server, tokens=10))
    assert spent.stop is Stop.LLM_BUDGET and "budget exhausted" in spent.message and not server.requests


# the command line


def test_cli_optimizes_and_writes_the_document(naive, gate_cache, library, tmp_path, capsys):
    path = save_library(library, tmp_path / "library.json")
    out = tmp_path / "run.json"
    code = main(["optimize", "row_softmax", "--from", "row_softmax/naive", "--library", str(path), "--statuses",
                 "admitted,candidate", "--gate", "compile", "--budget", "3", "--out", str(out), "--json"])
    assert code == 0
    result = OptimizationResult.from_json(capsys.readouterr().out)
    assert result == OptimizationResult.load(out) and result.stats.evaluations <= 3
    assert result.library.path == str(path) and result.library.statuses == (CardStatus.ADMITTED, CardStatus.CANDIDATE)


def test_cli_errors_are_clear(tmp_path, capsys):
    def error(*argv: str) -> str:
        assert main(["optimize", *argv, "--gate", "compile"]) == 2
        return capsys.readouterr().err

    assert "no such problem file or bundled problem" in error("no_such_problem", "--from", "row_softmax/naive")
    assert "no such kernel" in error("row_softmax", "--from", "row_softmax/nope")
    broken = tmp_path / "library.json"
    broken.write_text("{ not json")
    assert "library.json: not JSON" in error("row_softmax", "--from", "row_softmax/naive", "--library", str(broken))
    broken.write_text(json.dumps({"version": 1, "provenance": {}, "cards": [{"transform": "unroll"}]}))
    assert "cards[0]" in error("row_softmax", "--from", "row_softmax/naive", "--library", str(broken))
    assert "no such library file" in error("row_softmax", "--from", "row_softmax/naive", "--library",
                                           str(tmp_path / "missing.json"))
    assert "rule rewriter has no forward plan" in error("row_softmax", "--from", "row_softmax/naive", "--strategy",
                                                        "no_library")
    with pytest.raises(SystemExit) as refused:  # argparse refuses it before anything runs
        main(["optimize", "row_softmax", "--from", "row_softmax/naive", "--time-limit-s", "0"])
    assert refused.value.code == 2 and "a time limit is a number of seconds > 0" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_a_gpu_only_paired_improvements_are_taken(naive, tmp_path, monkeypatch):
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(tmp_path / "cache"))
    result = optimize(SOFTMAX, naive, strategy=Strategy.UNCONDITIONED_GREEDY, budget=6, gate_mode=GateMode.GPU)
    assert OptimizationResult.from_json(result.to_json()) == result
    assert result.speedup is not None and result.speedup >= 1.0
    for attempt in gated(result):
        if attempt.status is AttemptStatus.FASTER:
            assert attempt.ratio.accepts(result.required_ratio)
    taken = {s.attempt for s in result.steps}
    assert all(result.attempts[i].status is AttemptStatus.FASTER for i in taken)
