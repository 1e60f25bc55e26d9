"""Induction of when a card pays, from per-case effects (klineage.skills.when), on synthetic shapes."""

import pytest

from klineage.errors import DocumentError
from klineage.skills.card import Precondition
from klineage.skills.facts import case_facts, kernel_facts, work_facts
from klineage.skills.when import (
    MIN_LOO,
    CaseEffect,
    Outcome,
    WhenKind,
    induce_when,
    leave_one_out,
    outcome_of,
    paid_recall,
    per_case,
    search,
)

REQUIRED = 1.01


def rows(table: list[tuple[str, dict, float]]) -> list[CaseEffect]:
    return [CaseEffect(name, case_facts(params), ratio, outcome_of(ratio, REQUIRED)) for name, params, ratio in table]


def test_a_threshold_on_the_reduction_length():
    """A pipeline pays on long reductions only: K >= 1024 separates, at the paid cases' extreme."""
    table = [(f"gemm:k{k}", {"M": 2048, "N": 2048, "K": k}, 1.2 if k >= 1024 else 0.97)
             for k in (64, 128, 256, 512, 1024, 2048, 4096, 8192)]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.PRECONDITION
    p = when.precondition
    assert p.expression == "K >= 1024" and p.source == "timing"
    assert set(p.holds) == {"gemm:k1024", "gemm:k2048", "gemm:k4096", "gemm:k8192"}
    assert set(p.fails) == {"gemm:k64", "gemm:k128", "gemm:k256", "gemm:k512"}
    assert p.loo_accuracy >= MIN_LOO and "K is at least 1024" in p.sentence and "paid on all 4" in p.sentence
    assert Precondition.from_dict(p.to_dict()) == p


def test_divisibility_beats_a_threshold():
    """Vector loads pay where the row is a multiple of 4 floats, whatever its length."""
    table = [(f"softmax:c{c}", {"rows": 4096, "cols": c}, 1.08 if c % 4 == 0 else 0.99)
             for c in (64, 129, 1540, 3001, 4095, 4096, 8192, 9973)]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.PRECONDITION
    assert when.precondition.expression == "cols % 4 == 0"
    assert set(when.precondition.fails) == {"softmax:c129", "softmax:c3001", "softmax:c4095", "softmax:c9973"}


def test_a_measured_count_that_divides_by_chance_is_not_a_rule():
    """Registers a thread are what ptxas made of the kernel, not a size anyone chose: where the paid cases'
    counts happen to share a divisor and no threshold separates them, nothing is written; the same
    numbers as a case's own size give the divisibility rule."""
    counts = (30, 31, 33, 34, 36, 37, 39, 40, 42, 43)
    measured = [CaseEffect(f"op:r{r}", case_facts({}, compiled={"registers": r}), 1.1 if r % 3 == 0 else 0.99,
                           outcome_of(1.1 if r % 3 == 0 else 0.99, REQUIRED)) for r in counts]
    when = induce_when(measured)
    assert when.kind is WhenKind.MIXED and not any("%" in c for c in when.candidates)
    sized = induce_when(rows([(f"op:n{r}", {"n": r}, 1.1 if r % 3 == 0 else 0.99) for r in counts]))
    assert sized.kind is WhenKind.PRECONDITION and sized.precondition.expression == "n % 3 == 0"


def test_an_alignment_threshold_between_two_powers_of_two_is_the_upper_one():
    """Row alignments are powers of two: between 16 and 32 the rule reads "at least 32", not "at least 20"."""
    aligns = (4, 8, 16, 16, 32, 64, 128, 32)
    when = induce_when([CaseEffect(f"op:c{i}", {"row_align": a}, 1.2 if a >= 32 else 1.0,
                                   outcome_of(1.2 if a >= 32 else 1.0, REQUIRED)) for i, a in enumerate(aligns)])
    assert when.kind is WhenKind.PRECONDITION and when.precondition.expression == "row_align >= 32"


def test_a_dtype():
    table = [(f"op:{d}{n}", {"n": n, "dtype": d}, 1.3 if d == "float16" else 1.0)
             for d in ("float16", "float32") for n in (256, 1024, 4096)]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.PRECONDITION and when.precondition.expression == "dtype_is_float16"
    assert when.precondition.check({**case_facts({"dtype": "float16"})})


def test_waves_from_the_launch():
    """A fact of the launch, not of the parameters: the step pays once the grid fills the SMs."""
    facts = [({"M": m}, {"blocks": m // 16, "waves": m / 16 / 132}) for m in (256, 1024, 2048, 4096, 8192, 16384)]
    effects = [CaseEffect(f"g:{p['M']}", case_facts(p, launch), r, outcome_of(r, REQUIRED))
               for (p, launch), r in zip(facts, (0.95, 0.98, 1.0, 1.1, 1.2, 1.3))]
    when = induce_when(effects)
    assert when.kind is WhenKind.PRECONDITION
    assert when.precondition.names <= {"M", "blocks", "waves"}
    assert all(when.precondition.check(e.facts) == e.paid for e in effects)


def test_gains_within_the_gate_spread_force_nothing():
    """Two cases a shade over 1.01x (what a re-run can move) and the rest at or under 1.00x, as the
    padding step measured on conv2d and GEMM: not a precondition fitted to the two, but "did not pay"
    with the two counted as undecided."""
    table = [(f"op:c{n}", {"n": n, "blocks": n * 4}, r) for n, r in
             zip((1, 2, 3, 4, 8, 16, 32, 64), (0.997, 0.998, 1.0, 1.015, 1.017, 0.85, 0.91, 0.99))]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.NEVER and when.precondition is None
    assert "did not pay on any of the 8 cases measured (6 below 1.01x; 2 at 1.01x but by under 1.5%" in when.sentence
    assert [r.outcome for r in when.cases].count(Outcome.UNDECIDED) == 2
    # the same shape with real gains where it paid: the threshold is written
    table = [(case, facts, 1.08 if ratio > 1.01 else ratio) for case, facts, ratio in table]
    assert induce_when(rows(table)).precondition is not None


def test_an_undecided_case_is_left_out_of_the_search():
    """Paid where n >= 64; one case under it reached 1.01x by a hair: it neither blocks the threshold
    nor counts as support, and the sentence says so."""
    table = [(f"op:c{n}", {"n": n}, r) for n, r in
             zip((4, 8, 16, 32, 64, 128, 256, 512), (0.97, 0.98, 1.012, 0.99, 1.1, 1.2, 1.15, 1.1))]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.PRECONDITION and when.precondition.expression == "n >= 64"
    assert "op:c16" not in when.precondition.holds + when.precondition.fails
    assert when.sentence.endswith("; 1 more reached 1.01x by under 1.5%, undecided")


def test_uniform_is_a_result():
    table = [(f"op:c{i}", {"n": 2 ** i}, 1.05 + i / 100) for i in range(9)]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.UNIFORM and when.precondition is None
    assert when.sentence.startswith("paid on all 9 cases measured")


def test_never_paid_is_a_result():
    when = induce_when(rows([(f"op:c{i}", {"n": i + 1}, 0.99) for i in range(8)]))
    assert when.kind is WhenKind.NEVER and "any of the 8 cases" in when.sentence


def test_noise_forces_nothing():
    """Paid and unpaid cases interleaved along every fact: no predicate is written, and the summary
    says how many paid and why nothing was written."""
    table = [(f"op:c{n}", {"n": n, "m": 7 * n % 11 + 1}, r) for n, r in
             zip((3, 5, 6, 9, 10, 12, 15, 17), (1.03, 0.99, 1.04, 0.98, 1.03, 0.99, 1.05, 0.98))]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.MIXED and when.precondition is None
    assert when.sentence.startswith("paid on 4 of 8 cases measured")


def test_one_case_does_not_force_a_predicate():
    """A single unpaid case: any threshold would be fitted to it, so none is written."""
    table = [(f"op:c{n}", {"n": n}, 0.9 if n == 8 else 1.1) for n in (8, 16, 32, 64, 128, 256, 512, 1024)]
    when = induce_when(rows(table))
    assert search(rows(table)) is not None
    assert when.kind is WhenKind.MIXED and "not forced" in when.sentence


def test_leave_one_out_counts_each_case():
    table = [(f"op:c{n}", {"n": n}, 1.2 if n >= 100 else 0.9) for n in (10, 20, 30, 100, 200, 300)]
    assert leave_one_out(rows(table)) == 1.0
    crossed = [(f"op:c{n}", {"n": n}, r) for n, r in zip((10, 20, 30, 100, 200, 300), (1.2, 0.9, 1.2, 0.9, 1.2, 0.9))]
    assert leave_one_out(rows(crossed)) < MIN_LOO


def test_facts_only_where_every_case_has_them():
    """A card measured on GEMM and on softmax is not split by K, which softmax has not."""
    effects = [CaseEffect("gemm:a", case_facts({"K": 4096}, {"waves": 4.0}), 1.2, Outcome.PAID),
               CaseEffect("gemm:b", case_facts({"K": 64}, {"waves": 3.0}), 1.2, Outcome.PAID),
               CaseEffect("softmax:a", case_facts({"cols": 30}, {"waves": 0.5}), 0.9, Outcome.DID_NOT_PAY),
               CaseEffect("softmax:b", case_facts({"cols": 4096}, {"waves": 0.25}), 0.9, Outcome.DID_NOT_PAY)]
    atom = search(effects)
    assert atom is not None and atom.expression == "waves >= 1"


def test_per_case_merges_steps():
    merged = per_case([("g:a", 1.2, {"n": 1, "registers": 90}), ("g:a", 1.0, {"n": 1, "registers": 128}),
                       ("g:a", 1.1, {"n": 1, "registers": 90}), ("g:b", 0.9, {"n": 2})])
    assert [(r.case, round(r.ratio, 3), r.paid) for r in merged] == [("g:a", 1.1, True), ("g:b", 0.9, False)]
    assert merged[0].facts == {"n": 1}  # registers differ between its steps
    with pytest.raises(DocumentError, match="one row per case"):
        induce_when(merged + merged[:1])


def test_paid_wherever_decided_is_uniform_and_says_how_many_cases_were_decided():
    """Every decided case paid and the rest reached 1.01x by under the spread: nothing fell below it, so
    there is nothing to separate; the effect is uniform, and the sentence counts the decided cases apart."""
    table = [(f"op:c{n}", {"n": n}, r) for n, r in zip((1, 2, 3, 4, 5, 6), (1.05, 1.06, 1.012, 1.015, 1.04, 1.02))]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.UNIFORM and when.precondition is None and len(when.paid) == 3
    assert when.sentence == ("paid on all 3 decided cases of 6 measured (each beyond 1.01x by more than 1.5%); the "
                             "other 3 reached 1.01x by under 1.5%, the gate's run-to-run spread, and none fell "
                             "below it")
    slipped = table[:-1] + [("op:c6", {"n": 6}, 0.99)]
    assert induce_when(rows(slipped)).kind is not WhenKind.UNIFORM


def test_work_per_thread_from_the_roofline_separates_cards_measured_on_two_operators():
    """Across operators the parameters are left out; the traffic a thread has to hide its latency behind is
    comparable, and says where the step paid (a softmax row of 64 floats on 256 threads pays nothing)."""
    def effect(case, moved, blocks, ratio):
        launch = {"blocks": blocks, "threads": 256}
        return CaseEffect(case, case_facts({}, launch, roofline={"bytes": moved, "flops": moved / 4}), ratio,
                          outcome_of(ratio, REQUIRED))

    effects = [effect("softmax:narrow", 4099 * 240, 4099, 0.98), effect("softmax:short", 16384 * 512, 16384, 1.0),
               effect("softmax:small", 33 * 2056, 33, 0.99), effect("softmax:long", 512 * 262144, 512, 1.25),
               effect("softmax:mid", 4096 * 16384, 4096, 1.2), effect("norm:wide", 1024 * 65536, 1024, 1.15),
               effect("norm:rows", 8192 * 32768, 8192, 1.1), effect("norm:tiny", 2048 * 128, 2048, 1.0)]
    when = induce_when(effects)
    assert when.kind is WhenKind.PRECONDITION
    assert when.precondition.expression.startswith("bytes_per_thread >= ")
    assert set(when.precondition.fails) == {"softmax:narrow", "softmax:short", "softmax:small", "norm:tiny"}


def test_work_facts_need_the_roofline_and_the_launch_for_work_per_thread():
    assert work_facts(None, {"blocks": 4, "threads": 128}) == {}
    assert work_facts({"bytes": 2e6, "flops": 1e6}, {}) == {"megabytes": 2.0, "intensity": 0.5}
    assert work_facts({"bytes": 2e6, "flops": 0.0}, {"blocks": 4, "threads": 125})["bytes_per_thread"] == 4000.0


def test_two_paid_cases_among_many_unpaid_are_not_a_precondition_when_the_search_loses_them_left_out():
    """Leave-one-case-out accuracy is high whatever is said of two paid cases among ten unpaid ones; a
    predicate fitted to the two (each paid case, left out, called unpaid) is not written."""
    facts = [(256, 13), (48, 5), (16, 1), (32, 8), (96, 13), (48, 1), (16, 3), (16, 2), (16, 13), (128, 8),
             (16, 1), (96, 5)]
    table = [(f"op:c{i}", {"a": a, "b": b}, 1.2 if i in (3, 8) else 0.98) for i, (a, b) in enumerate(facts)]
    assert search(rows(table)).expression == "a <= 40 and b >= 4"
    assert leave_one_out(rows(table)) >= MIN_LOO and paid_recall(rows(table)) == 0.0
    when = induce_when(rows(table))
    assert when.kind is WhenKind.MIXED and "paid cases kept 0.00" in when.sentence
    clean = [(f"op:c{n}", {"n": n}, 1.2 if n >= 100 else 0.9) for n in (10, 20, 30, 100, 200, 300)]
    assert paid_recall(rows(clean)) == 1.0


def test_a_case_measured_on_two_kernels_is_left_out_with_both_its_rows():
    """Each kernel's row of a case is its own row, but leaving the case out leaves out both: the twin would
    otherwise tell the search the answer. Two cases, each on two kernels: nothing is left to predict from."""
    table = [("op:a@k1", {"n": 10}, 1.2), ("op:a@k2", {"n": 10}, 1.2),
             ("op:b@k1", {"n": 1}, 0.9), ("op:b@k2", {"n": 1}, 0.9)]
    assert search(rows(table)).expression == "n >= 4"
    assert leave_one_out(rows(table)) == 0.0
    assert leave_one_out(rows([(c.replace("@", "_"), p, r) for c, p, r in table])) == 1.0


def test_a_precondition_holds_on_a_case_where_it_holds_on_every_kernels_row_of_it():
    facts = {"op:a@k1": {"n": 10}, "op:a@k2": {"n": 12}, "op:b@k1": {"n": 1}, "op:b@k2": {"n": 10}}
    p = Precondition("n >= 4", "n is at least 4", ("op:a@k1", "op:a@k2"), ("op:b@k1",), "timing", 1.0, facts)
    assert p.holds_on("op:a") is True and p.holds_on("op:a@k2") is True
    assert p.holds_on("op:b") is None and p.holds_on("op:c") is None
    assert p.held("op:a") and not p.held("op:b")


def test_a_predicate_with_an_exception_is_written_with_the_exception_counted():
    """A pipeline pays on long reductions, one long case measured a shade under 1.01x: K >= 1024 still
    predicts every case but that one, left out in turn, and the sentence counts the exception."""
    ks = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
    table = [(f"gemm:k{k}", {"K": k}, 0.99 if k == 4096 else 1.2 if k >= 1024 else 0.97) for k in ks]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.PRECONDITION and when.precondition.expression == "K >= 1024"
    assert "paid on 6 of the 7 decided cases where it holds, on none of the 5 where it does not" in when.sentence
    assert "gemm:k4096" in when.precondition.holds and when.loo_accuracy >= MIN_LOO


def test_a_fact_a_few_rows_lack_fails_there_and_one_most_rows_lack_is_not_searched():
    """Spills separate; two rows were timed on their headline alone and have no ptxas facts: the predicate
    fails on them (unknown fails) and says so as exceptions. A fact only two rows of eight give is not used."""
    table = [(f"op:c{i}", {"n": 100 + i, **({"spill_bytes": s} if s is not None else {}),
                           **({"only_here": i} if i < 2 else {})}, r)
             for i, (s, r) in enumerate([(0, 1.2), (0, 1.2), (128, 1.2), (0, 1.2), (9000, 0.97), (12000, 0.96),
                                         (None, 1.2), (8000, 0.98), (0, 1.2), (None, 0.97)])]
    effects = [CaseEffect(c, p, r, outcome_of(r, REQUIRED)) for c, p, r in table]
    when = induce_when(effects)
    assert when.kind is WhenKind.PRECONDITION and when.precondition.expression.startswith("spill_bytes <= ")
    assert "op:c6" in when.precondition.fails and "op:c9" in when.precondition.fails
    assert "on 1 of the 5 where it does not" in when.sentence
    assert "only_here" not in search(effects).expression


def test_a_split_wrong_on_too_many_cases_is_not_written():
    """Paid on two thirds of the cases where the best split holds: below the precision a precondition needs."""
    table = [(f"op:c{n}", {"n": n}, r) for n, r in
             zip(range(1, 13), (0.97, 0.98, 0.96, 0.99, 1.2, 0.98, 1.2, 1.2, 0.97, 1.2, 0.98, 1.2))]
    when = induce_when(rows(table))
    assert when.kind is WhenKind.MIXED and "is not forced" in when.sentence


def test_a_case_that_lacks_the_predicates_fact_reads_where_induction_put_it():
    """A row timed on its headline alone has no ptxas facts: induction counted the predicate failing there
    (unknown fails), and the card says so rather than valuing the missing fact as 0 or false."""
    p = Precondition("spill_bytes <= 10000", "pays where spill_bytes is at most 10000", ("op:a",), ("op:b", "op:c"),
                     "timing", 1.0, {"op:a": {"spill_bytes": 0}, "op:b": {"spill_bytes": 13164}, "op:c": {}})
    assert p.holds_on("op:a") is True and p.holds_on("op:b") is False and p.holds_on("op:c") is False
    effects = [CaseEffect(f"op:c{i}", {"spill_bytes": s} if s is not None else {}, r, outcome_of(r, REQUIRED))
               for i, (s, r) in enumerate([(0, 1.2), (64, 1.2), (0, 1.2), (13000, 0.95), (14000, 0.96), (None, 1.2),
                                           (12000, 0.97), (0, 1.3)])]
    when = induce_when(effects)
    assert when.kind is WhenKind.PRECONDITION and "op:c5" in when.precondition.fails


def sass(**counts: int) -> dict:
    """A state's `features` with these SASS feature counts, split over two functions of the kernel."""
    return {"sass": {"counts": [{"name": name, "locus": f"k{i % 2}", "count": n}
                                for i, (name, n) in enumerate(counts.items())]}}


def test_kernel_facts_sum_sass_counts_into_names_every_operator_shares():
    facts = kernel_facts(sass(ldg_32=6, ldg_128=2, ldg_const=4, lds=3, ldsm=1, bar_sync=2, shfl=5, hmma=8))
    assert facts["global_loads"] == 8 and facts["vector_load_share"] == 0.25 and facts["readonly_load_share"] == 0.5
    assert facts["shared_accesses"] == 4 and facts["barriers"] == 2 and facts["shuffles"] == 5
    assert facts["tensor_ops"] == 8 and facts["atomics"] == 0
    assert "vector_load_share" not in kernel_facts(sass(stg_128=1))  # no global load: no share of them
    assert kernel_facts({"source": []}) == {}  # SASS not read: nothing, not zeros


def kernel_rows_table(kernels: dict[str, tuple[int, float]], sizes=(1024, 4096, 16384)) -> list[CaseEffect]:
    """One operator measured on several kernels ("op:case@kernel"): each kernel's barrier count and the
    ratio the step paid there on every case."""
    return [CaseEffect(f"op:n{n}@{k}", case_facts({"n": n}, kernel=kernel_facts(sass(bar_sync=b, ldg_32=4))),
                       ratio, outcome_of(ratio, REQUIRED))
            for k, (b, ratio) in kernels.items() for n in sizes]


def test_a_kernel_fact_that_only_names_the_kernels_measured_is_not_written():
    """Two kernels, one paid on every case and one on none: `barriers` separates them with every case left
    out in turn, but with a kernel left out the other alone says nothing of it."""
    when = induce_when(kernel_rows_table({"k1": (1, 1.2), "k2": (6, 0.98)}), REQUIRED)
    assert when.kind is WhenKind.MIXED and when.precondition is None
    assert when.candidates and "barriers" in when.candidates[0]
    assert "leave-one-kernel-out 0.00 over 2 kernels" in when.sentence


def test_a_kernel_fact_that_carries_to_kernels_left_out_is_written_with_both_measures():
    """Six kernels: those with at most one barrier paid, those with more did not. With a kernel left out the
    others place the threshold between their own values: without the 2-barrier kernel it falls at 2 and
    calls that kernel paid, so 15 of the 18 rows are predicted right."""
    table = {"a": (0, 1.2), "b": (1, 1.15), "c": (1, 1.3), "d": (2, 0.97), "e": (4, 0.99), "f": (8, 0.95)}
    when = induce_when(kernel_rows_table(table), REQUIRED)
    assert when.kind is WhenKind.PRECONDITION
    p = when.precondition
    assert p.expression == "barriers <= 1"  # a count's threshold is a whole number
    assert p.loo_accuracy == 1.0 and p.kernel_loo_accuracy == round(15 / 18, 4)
    assert "leave-one-kernel-out 0.83 over 6 kernels" in p.sentence
    assert Precondition.from_dict(p.to_dict()) == p


def test_a_case_rule_is_found_where_a_kernel_fact_fails_with_kernels_left_out():
    """The step paid on long rows on both kernels, and a little more on one: the kernel fact that names that
    kernel fails with it left out, and the search without kernel facts finds the case rule."""
    table = [CaseEffect(f"op:n{n}@{k}", case_facts({"n": n}, kernel=kernel_facts(sass(bar_sync=b))),
                        ratio, outcome_of(ratio, REQUIRED))
             for k, b in (("k1", 1), ("k2", 6)) for n in (256, 512, 1024, 4096, 8192, 16384)
             for ratio in [1.2 if n >= 4096 else 0.97]]
    when = induce_when(table, REQUIRED)
    assert when.kind is WhenKind.PRECONDITION and when.precondition.expression == "n >= 2048"
    assert when.precondition.kernel_loo_accuracy == 1.0
