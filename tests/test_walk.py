"""The walk end to end without a GPU: real gate (compile-only), real nvcc, real audit.

Most tests inject a test-only catalog (tests/test_audit.py's transforms and the saboteur below),
so they do not depend on which transforms the catalog holds today; one walks warp_vec4 with the
catalog as it is at run time."""

from __future__ import annotations

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.errors import KLineageError, ReplayMiss
from klineage.gate.cache import GateCache
from klineage.gate.policy import GatePolicy
from klineage.gate.verdict import Reason, Status
from klineage.kernel import KernelState
from klineage.lineage import Assurance, ForwardStatus, Lineage, RejectionCategory, Termination
from klineage.rewriters.base import Attempt, AttemptOutcome, History, Proposal
from klineage.rewriters.rules import RulesRewriter, ordered
from klineage.transforms import catalog
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform
from klineage.walk.walker import walk
from shared_cache import share
from tests.test_audit import PragmaUnroll, RestrictRemover, probe_state

SOFTMAX = corpus.problem_path("row_softmax")
COMPILE = GateMode.COMPILE_ONLY


class Saboteur(Transform):
    """Test-only: five sites in `probe`, each failing in its own way."""

    name = "test_saboteur"
    intent = "fail in every way a proposal can"
    removes = ("unroll_pragma",)
    SITES = ("not_applicable", "no_change", "compile", "static", "audit")

    def find(self, state: KernelState) -> list[Anchor]:
        return [Anchor("probe", "test", key) for key in self.SITES]

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        if anchor.key == "not_applicable":
            raise NotApplicable("needs a loop bound known at compile time")
        if anchor.key == "no_change":
            return Rewrite(self.name, Direction.BACKWARD, anchor, state, removes=self.removes)
        if anchor.key == "compile":
            source = state.source.replace("float acc = 0.0f;", "float acc = 0.0f;\n    undefined_symbol_xyz = 1;")
        elif anchor.key == "static":
            source = '#pragma GCC optimize("O0")\n' + state.source
        else:  # compiles and passes the gate, but removes nothing it declares
            source = "// simplified\n" + state.source
        return self.rewrite(state, anchor, Direction.BACKWARD, source)


class Carrier(PragmaUnroll):
    """Test-only: tuning, never proposed."""

    name = "test_carrier"
    role = Role.CARRIER


def dry_walk(expert: KernelState, transforms: list[Transform], cache: GateCache, **kwargs) -> Lineage:
    priority = kwargs.pop("priority", None)
    rewriter = RulesRewriter(transforms, priority) if priority else None
    lineage = walk(SOFTMAX, expert, rewriter, gate_mode=COMPILE, cache=cache, transforms=transforms, **kwargs)
    assert Lineage.from_json(lineage.to_json()) == lineage, "every walk gives a valid, round-tripping document"
    return lineage


def test_complete_walk_removes_every_site_in_dependency_order(gate_cache):
    # restrict first by priority, but it must wait until no unroll pragma is left
    transforms = [RestrictRemover(after=("test_unroll",)), PragmaUnroll()]
    lineage = dry_walk(probe_state(), transforms, gate_cache, priority=("test_restrict", "test_unroll"))
    assert lineage.termination.kind is Termination.COMPLETE
    assert [t.transform for t in lineage.transitions] == ["test_unroll"] * 2 + ["test_restrict"] * 2
    assert not lineage.rejections
    assert lineage.gate is GateMode.COMPILE_ONLY and lineage.assurance is Assurance.UNVERIFIED
    assert lineage.rewriter == "rules"
    # the mechanical forward gives back each parent; compile-only times nothing
    assert [t.forward.status for t in lineage.transitions] == [ForwardStatus.UNTIMED] * 2 + \
        [ForwardStatus.NO_MECHANICAL_FORWARD] * 2
    assert all(t.forward.timing is None for t in lineage.transitions)
    # the chain, the states and what the audit saw
    assert lineage.chain[0] == probe_state().fingerprint
    assert [s.fingerprint for s in lineage.states] == list(lineage.chain)
    assert all(s.verdict.status is Status.COMPILED for s in lineage.states)
    last = lineage.states[-1].kernel
    assert "__restrict__" not in last.source and "#pragma" not in last.source
    removed = {(c.locus, c.name) for t in lineage.transitions for c in t.features_removed if c.level.value == "source"}
    assert {("probe", "unroll_pragma"), ("probe", "restrict_ptr")} <= removed
    assert "+#pragma unroll" in lineage.transitions[0].forward_diff
    assert "-#pragma unroll" in lineage.transitions[0].backward_diff
    assert lineage.stats.accepted == 4 and lineage.stats.gate_evaluations == 5


def test_step_limit_is_respected(gate_cache):
    lineage = dry_walk(probe_state(), [PragmaUnroll()], gate_cache, max_steps=1)
    assert lineage.termination.kind is Termination.STEP_LIMIT
    assert len(lineage.transitions) == 1 and lineage.limits.max_steps == 1
    zero = dry_walk(probe_state(), [PragmaUnroll()], gate_cache, max_steps=0)
    assert zero.termination.kind is Termination.STEP_LIMIT and not zero.transitions


def test_rejections_are_recorded_with_categories_and_evidence(gate_cache):
    lineage = dry_walk(probe_state(), [Saboteur()], gate_cache, max_rejections=3)
    assert lineage.termination.kind is Termination.REJECTION_LIMIT
    assert not lineage.transitions
    categories = [r.category for r in lineage.rejections]
    assert categories == [RejectionCategory.NOT_APPLICABLE, RejectionCategory.NO_CHANGE,
                          RejectionCategory.COMPILE_ERROR, RejectionCategory.STATIC_CHECK,
                          RejectionCategory.AUDIT_MISMATCH]
    by = {r.category: r for r in lineage.rejections}
    assert all(r.step == 0 and r.parent == probe_state().fingerprint for r in lineage.rejections)
    assert by[RejectionCategory.NOT_APPLICABLE].evidence.message == "needs a loop bound known at compile time"
    assert by[RejectionCategory.NOT_APPLICABLE].reason is None
    assert "gives back its parent" in by[RejectionCategory.NO_CHANGE].evidence.message
    compile_error = by[RejectionCategory.COMPILE_ERROR]
    assert compile_error.reason is Reason.COMPILE_ERROR and "undefined_symbol_xyz" in compile_error.evidence.log
    assert by[RejectionCategory.STATIC_CHECK].reason is Reason.STATIC_CHECK
    audit = by[RejectionCategory.AUDIT_MISMATCH]
    assert audit.reason is None and audit.evidence.stage == "audit" and audit.evidence.audit["failures"]
    # three gated refusals reached the limit; the two free ones did not count
    assert lineage.stats.rejected == 5 and lineage.stats.gate_evaluations == 4


def test_free_rejections_do_not_count(gate_cache):
    lineage = dry_walk(probe_state(), [Saboteur(), PragmaUnroll()], gate_cache, max_rejections=10)
    assert lineage.termination.kind is Termination.COMPLETE
    # the saboteur comes first (by name: neither is in the priority list) and fails at every state
    assert [t.transform for t in lineage.transitions] == ["test_unroll", "test_unroll"]
    assert [r.step for r in lineage.rejections] == [0] * 5 + [1] * 5 + [2] * 5
    # The compile, static and audit refusals are the same edits at every state: gated once, then
    # recorded as repeats of step 0 without a gate evaluation, and free like the other two.
    later = [r.category for r in lineage.rejections if r.step > 0]
    assert later == [RejectionCategory.NOT_APPLICABLE, RejectionCategory.NO_CHANGE] + [RejectionCategory.REPEATED] * 3 \
        + [RejectionCategory.NOT_APPLICABLE, RejectionCategory.NO_CHANGE] + [RejectionCategory.REPEATED] * 3
    assert all("refused at step 0" in r.evidence.message for r in lineage.rejections
               if r.category is RejectionCategory.REPEATED)
    assert sum(r.category.counts for r in lineage.rejections) == 3, "not_applicable, no_change and repeats are free"
    assert lineage.stats.gate_evaluations == 1 + 3 + 2, "the expert, three refusals at step 0, two accepted steps"
    assert "15 proposal(s)" not in lineage.termination.message and "5 proposal(s)" in lineage.termination.message


def test_the_expert_must_pass(gate_cache):
    broken = probe_state(probe_state().source.replace("float acc = 0.0f;", "float acc = 0.0f; nonsense_here = 2;"))
    lineage = dry_walk(broken, [PragmaUnroll()], gate_cache)
    assert lineage.termination.kind is Termination.UNKNOWN
    assert "expert does not pass" in lineage.termination.message and "compile_error" in lineage.termination.message
    assert len(lineage.states) == 1 and lineage.states[0].verdict.reason is Reason.COMPILE_ERROR


def test_same_walk_twice_gives_the_same_bytes(gate_cache):
    expert = corpus.kernel_entry("row_softmax/warp_vec4").load()
    first = dry_walk(expert, [PragmaUnroll()], gate_cache, max_steps=2)
    second = dry_walk(expert, [PragmaUnroll()], gate_cache, max_steps=2)
    assert first.to_json() == second.to_json()
    assert [t.transform for t in first.transitions] == ["test_unroll", "test_unroll"]
    assert first.termination.kind is Termination.STEP_LIMIT


def test_replay_walk_without_recordings_names_the_kernel(tmp_path, monkeypatch, shared_cache):
    # no verdict of its own, none recorded; the problem's probe is the run's (tests/shared_cache.py)
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path / "cache", shared_cache)))
    empty = GateCache(tmp_path / "cache", tmp_path / "recorded")
    expert = corpus.kernel_entry("row_softmax/warp_vec4").load()
    with pytest.raises(ReplayMiss, match="row_softmax_warp_vec4") as raised:
        walk(SOFTMAX, expert, gate_mode=GateMode.REPLAY, cache=empty, transforms=[PragmaUnroll()])
    assert "the expert" in str(raised.value) and expert.fingerprint[:12] in str(raised.value)


def test_catalog_walk_of_warp_vec4(gate_cache):
    """Whatever the catalog holds today: the walk runs, and its document is valid."""
    expert = corpus.kernel_entry("row_softmax/warp_vec4").load()
    events: list[tuple[str, str]] = []
    lineage = walk(SOFTMAX, expert, gate_mode=COMPILE, cache=gate_cache, max_steps=3, max_rejections=2,
                   progress=lambda stage, message: events.append((stage, message)))
    assert Lineage.from_json(lineage.to_json()).to_json() == lineage.to_json()
    assert lineage.termination.kind in (Termination.COMPLETE, Termination.STEP_LIMIT, Termination.REJECTION_LIMIT)
    assert len(lineage.transitions) <= 3
    assert sum(r.category.counts for r in lineage.rejections) <= 2
    mechanisms = {t.name for t in catalog().values() if t.role is not Role.CARRIER}
    assert {t.transform for t in lineage.transitions} <= mechanisms
    assert all(t.forward.status in (ForwardStatus.UNTIMED, ForwardStatus.NO_MECHANICAL_FORWARD,
                                    ForwardStatus.FAILED) for t in lineage.transitions)
    assert any(stage == "walk" for stage, _ in events), "progress reports every proposal and step"
    if not mechanisms:
        assert lineage.termination.kind is Termination.COMPLETE and not lineage.transitions


def test_rules_rewriter_order_eligibility_and_history():
    state = probe_state()
    unroll, restrict = PragmaUnroll(), RestrictRemover(after=("test_unroll",))
    rewriter = RulesRewriter([restrict, unroll, Carrier()], priority=("test_restrict", "test_unroll"))
    assert [t.name for t in rewriter.transforms] == ["test_restrict", "test_unroll"], "carriers are never proposed"
    proposals = list(rewriter.propose(state, History()))
    assert [(p.transform, p.anchor.key) for p in proposals] == [("test_unroll", "loop#0"), ("test_unroll", "loop#1")]
    assert all(isinstance(p, Proposal) and p.rewrite is not None for p in proposals)
    # a pair already rejected at this state is skipped; at another state it is not
    history = History([Attempt(0, state.fingerprint, "test_unroll", Anchor("probe", "loop", "loop#0"),
                               AttemptOutcome.REJECTED, "incorrect")])
    assert [p.anchor.key for p in rewriter.propose(state, history)] == ["loop#1"]
    other = History([Attempt(0, "0" * 64, "test_unroll", Anchor("probe", "loop", "loop#0"), AttemptOutcome.REJECTED)])
    assert len(list(rewriter.propose(state, other))) == 2
    # no pragma left: restrict becomes eligible
    bare = probe_state(state.source.replace("#pragma unroll\n", ""))
    assert {p.transform for p in rewriter.propose(bare, History())} == {"test_restrict"}
    # names in `after` that the pool does not hold do not block
    alone = RulesRewriter([RestrictRemover(after=("devectorize_not_here",))])
    assert len(list(alone.propose(state, History()))) == 2
    assert [t.name for t in ordered([unroll, restrict])] == ["test_restrict", "test_unroll"]


def test_a_broken_transform_is_evidence_not_a_crash():
    class Broken(PragmaUnroll):
        name = "test_broken"

        def backward(self, state, anchor):
            raise IndexError("off by one")

    proposals = list(RulesRewriter([Broken()]).propose(probe_state(), History()))
    assert proposals and all(p.rewrite is None for p in proposals)
    assert "IndexError: off by one" in proposals[0].not_applicable_reason


class ForeignRewriter:
    """Test-only stand-in for a rewriter outside the catalog's Proposal type (as the LLM rewriter
    answers): objects with transform, anchor, state, failed, reason, rationale."""

    name = "foreign"

    class Answer:
        def __init__(self, transform, anchor, state, failed=False, reason="", rationale=""):
            self.transform, self.anchor, self.state = transform, anchor, state
            self.failed, self.reason, self.rationale = failed, reason, rationale

    def __init__(self):
        self.calls = 0

    def propose(self, state, history):
        self.calls += 1
        yield self.Answer("", None, None, failed=True, reason="malformed answer")
        unroll = PragmaUnroll()
        anchors = unroll.find(state)
        if anchors:
            rewrite = unroll.backward(state, anchors[0])
            yield self.Answer("test_unroll", anchors[0], rewrite.state, rationale="the loop is short")


def test_other_rewriters_answers_are_walked(gate_cache):
    rewriter = ForeignRewriter()
    lineage = walk(SOFTMAX, probe_state(), rewriter, gate_mode=COMPILE, cache=gate_cache, transforms=[PragmaUnroll()],
                   policy=GatePolicy(seeds=3, timing=False))
    assert lineage.rewriter == "foreign"
    assert [t.transform for t in lineage.transitions] == ["test_unroll", "test_unroll"]
    assert lineage.transitions[0].note == "the loop is short"
    assert lineage.rejections[0].category is RejectionCategory.NOT_APPLICABLE
    assert lineage.rejections[0].evidence.message == "malformed answer"
    assert lineage.termination.kind is Termination.COMPLETE


class SpendingRewriter(ForeignRewriter):
    """Test-only: one good proposal, then its budget is spent (the LLM rewriter raises so)."""

    name = "spending"

    def propose(self, state, history):
        self.calls += 1
        if self.calls > 1:
            raise KLineageError("the model budget is spent")
        unroll = PragmaUnroll()
        yield Proposal("test_unroll", None, unroll.backward(state, unroll.find(state)[0]))


def test_a_failing_rewriter_ends_the_walk_but_keeps_the_lineage(gate_cache):
    lineage = walk(SOFTMAX, probe_state(), SpendingRewriter(), gate_mode=COMPILE, cache=gate_cache,
                   transforms=[PragmaUnroll()])
    assert lineage.termination.kind is Termination.UNKNOWN
    assert "the model budget is spent" in lineage.termination.message
    assert len(lineage.transitions) == 1


def test_cli_dry_walk(tmp_path, monkeypatch, capsys, shared_cache):
    from klineage.cli import main

    # the walks' verdicts are the test's own, their probes and compiles the run's (tests/shared_cache.py)
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path / "cache", shared_cache)))
    out = tmp_path / "lineage.json"
    code = main(["walk", "row_softmax/warp_vec4", "--gate", "compile", "--max-steps", "1", "--out", str(out)])
    assert code == 0
    lineage = Lineage.load(out)
    assert lineage.gate is GateMode.COMPILE_ONLY and lineage.problem.operator == "row_softmax"
    printed = capsys.readouterr().out
    assert "DRY WALK" in printed and lineage.termination.kind.value in printed
    assert "placement" not in lineage.policy["forward_timing"]  # as loaded: the fingerprint of every recorded walk
    assert main(["walk", "row_softmax/warp_vec4", "--gate", "compile", "--max-rejections", "0"]) == 2
    # a walk timed with exchanged places; --as-in repeats that with the earlier walk's transforms and limits
    exchanged = tmp_path / "exchanged.json"
    assert main(["walk", "row_softmax/warp_vec4", "--gate", "compile", "--max-steps", "1", "--placement", "exchanged",
                 "--out", str(exchanged)]) == 0
    assert Lineage.load(exchanged).policy["forward_timing"]["placement"] == "exchanged"
    again = tmp_path / "again.json"
    assert (
        main(["walk", "row_softmax/warp_vec4", "--gate", "compile", "--as-in", str(exchanged), "--out", str(again)])
        == 0
    )
    assert Lineage.load(again).policy == Lineage.load(exchanged).policy


def test_catalog_order_puts_mechanisms_first_and_respects_after():
    from klineage.rewriters.rules import MICRO_OPTIMIZATIONS, PRIORITY

    pool = catalog()
    order = [t.name for t in ordered(pool.values())]
    for transform in pool.values():
        for before in transform.after:
            if before in order and transform.name in order:
                assert order.index(before) < order.index(transform.name), (before, transform.name)
    listed = [name for name in ("scalarize_mma", "scalarize_ldmatrix", "unpipeline", "sync_copies", "unswizzle_shared",
                                "unpad_shared", "unstage_shared", "uncache_row", "devectorize", "shuffle_to_shared")
              if name in order]
    assert listed == sorted(listed, key=order.index), \
        "tensor cores, pipeline, copies, layout, staging, register rows, vectors, shuffles"
    micro = [name for name in order if name in MICRO_OPTIMIZATIONS]
    assert order[len(order) - len(micro):] == micro, "micro-optimizations come last"
    assert len(set(PRIORITY)) == len(PRIORITY)
    # a transform the list does not name goes before the micro-optimizations
    new = Carrier()
    new.name, new.role = "test_new_mechanism", Role.MECHANISM
    placed = [t.name for t in ordered([*pool.values(), new])]
    assert placed.index("test_new_mechanism") < min(placed.index(m) for m in micro) if micro else True


def test_with_the_code_check_a_step_nvcc_had_done_is_same_code_and_untimed(gate_cache):
    """The naive softmax's `__launch_bounds__(THREADS)` (256 threads) changes no register allocation: removing it
    leaves the machine code as it was, so with the code check its forward is `same_code`, never timed, and
    induction gives its card no effect; without the check it is an ordinary untimed step."""
    from klineage.gate.machine_code import CodeCheck
    from klineage.skills.induction import induce
    from klineage.skills.when import SAME_CODE

    bounded = corpus.kernel_entry("row_softmax/naive").load()
    assert "__launch_bounds__(THREADS)" in bounded.source
    transforms = [catalog()["launch_bounds"]]
    checked = dry_walk(bounded, transforms, gate_cache, max_steps=1, code_check=CodeCheck.SASS)
    [step] = checked.transitions
    assert step.forward.status is ForwardStatus.SAME_CODE and step.forward.timing is None
    assert "runs the parent's machine code" in step.forward.message
    assert checked.policy["code_check"] == "sass"
    plain = dry_walk(bounded, transforms, gate_cache, max_steps=1)
    assert plain.transitions[0].forward.status is ForwardStatus.UNTIMED and "code_check" not in plain.policy
    [card] = induce([checked])
    assert not card.effects and [d.category for d in card.diagnostics if d.category == SAME_CODE] == [SAME_CODE]
