"""Card titles in the forward direction and words for ratios that agree with the numbers
(klineage.skills.titles, klineage.skills.standing), on the cases the dashboard's readers hit."""

from __future__ import annotations

import pytest

from klineage.skills.standing import Pace, change_text, forward_words, pace, ratio_text, standing
from klineage.skills.titles import FORWARD, anchor_where, card_title, forward_verb
from klineage.transforms import catalog


def test_every_transform_in_the_catalog_has_a_forward_title_drawn_from_its_intent():
    transforms = catalog()
    assert set(FORWARD) == set(transforms)
    for name, (verb, term) in FORWARD.items():
        assert term in transforms[name].intent, f"{name}: {term!r} is not in its intent"
        assert verb and verb != name


def test_titles_read_forward_and_anchors_tell_same_transform_cards_apart():
    assert str(card_title("scalarize_mma", {"function": "mma_f16_16816", "key": "mma_f16_16816"})) == \
        "use mma.sync in mma_f16_16816"
    store = card_title("restrict", {"function": "store_tile", "key": "y", "kind": "parameter"})
    load = card_title("restrict", {"function": "row_softmax_warp_vec4", "key": "x", "kind": "parameter"})
    assert str(store) == "restrict-qualify pointers in store_tile: y" and store != load
    # JSON tails, kind suffixes and arguments of keys stay out of the short name
    assert anchor_where({"function": "softmax_row", "key": 'xv#0 {"dir":"load"}'}) == "softmax_row: xv#0"
    assert anchor_where({"function": "fmha_flash_mma", "key": "i#0:unroll"}) == "fmha_flash_mma: i#0"
    assert anchor_where({"function": "k", "key": "launch_bounds(THREADS, 2)"}) == "k: launch_bounds"
    assert anchor_where({"function": "<file>", "key": 'EPI_STRIDE {"from":"A"}'}) == "EPI_STRIDE"
    # a transform outside the table reads as its intent's first clause, not its backward name
    assert forward_verb("new_thing", "Overlap copies with compute: a ring.") == "overlap copies with compute"


def test_a_ratio_below_its_mark_never_prints_equal_to_it():
    assert ratio_text(0.98996, 0.99) == "0.98996x"
    assert ratio_text(1.0, 0.99) == "1.000x" and ratio_text(0.99, 0.99) == "0.990x"
    assert ratio_text(1.23456) == "1.235x"


@pytest.mark.parametrize("ratio, kind, text", [(1.2, Pace.FASTER, "faster by 20.0%"),
                                               (12.08, Pace.FASTER, "12.08x faster"),
                                               (1.004, Pace.WITHIN, "within 1% (1.004x)"),
                                               (0.77, Pace.SLOWER, "slower by 29.9%")])
def test_change_words(ratio, kind, text):
    assert pace(ratio) is kind and change_text(ratio) == text


def test_a_step_that_failed_on_one_trial_says_which_and_by_how_much():
    """The issue's case: median 1.000, trials 1.000, 1.002, 0.990 against 0.99 read as a pass."""
    words = forward_words("slower", 1.0, [1.0, 1.002, 0.98996], 0.99)
    assert words.badge == "below 0.99x on trial 3 of 3" and words.tone == "bad"
    assert "trial 3 of 3 at 0.98996x is below the required 0.99x" in words.sentence


def test_verified_is_not_called_faster_unless_it_is():
    within = forward_words("verified", 1.004, [1.0, 1.002, 0.995])
    assert within.badge == "not slower than 0.99x" and within.tone == "neutral"
    faster = forward_words("verified", 1.2, [1.19, 1.21, 1.2])
    assert faster.badge == "faster by 20.0%" and faster.tone == "ok"
    assert forward_words("untimed").badge == "forward untimed"
    assert forward_words("no_mechanical_forward").badge == "no mechanical forward"


def test_an_admitted_card_measured_slower_says_where_it_paid_and_where_not():
    """The unpipeline card: measured 0.77x where it was learned, two of three trials slower."""
    unpipeline = standing("admitted", [("conv2d/headline", 0.7701)],
                          [("slower", 0.939), ("slower", 0.939), ("passed", 1.025)])
    assert unpipeline.badge == "admitted · slower on 1 of 1 case, 2 of 3 trials slower"
    assert unpipeline.tone == "slower"
    assert unpipeline.sentence == "Slower on conv2d/headline (0.770x). 2 of 3 trials on other kernels slower " \
                                  "(0.939x, 0.939x)."
    mixed = standing("admitted", [("gemm/a", 1.997), ("conv2d/b", 0.802)], [("passed", 1.17)])
    assert mixed.badge == "admitted · slower on 1 of 2 cases" and mixed.tone == "mixed"
    assert "Faster on gemm/a (1.997x). Slower on conv2d/b (0.802x)." in mixed.sentence
    assert standing("admitted", [("a", 1.05)]).badge == "admitted · faster"
    assert standing("admitted", [("a", 1.0)]).badge == "admitted · no measured gain"
    assert standing("candidate", []).badge == "candidate"


def test_a_disputed_card_reads_as_the_candidate_it_is_treated_as():
    disputed = standing("admitted", [("a", 1.2)], readmission="gemm step 3 disputed by grace")
    assert disputed.status == "candidate" and disputed.badge == "candidate · back to admission"
    assert "gemm step 3 disputed by grace" in disputed.sentence


def test_a_card_slower_only_where_its_precondition_fails_reads_as_its_precondition_says():
    """rope's 16-byte store: faster on the aligned, long cases its precondition holds on; the 0.989x case
    is one it rules out, where an optimization does not apply it."""
    effects = [("rope/headline", 1.125), ("rope/long_seq", 1.241), ("rope/decode_batch", 0.989), ("rope/small", 1.0)]
    conditioned = standing("admitted", effects, ruled_out=[False, False, True, True])
    assert conditioned.badge == "admitted · faster where its precondition holds" and conditioned.tone == "ok"
    assert conditioned.sentence == ("Faster on rope/headline (1.125x), rope/long_seq (1.241x) where its precondition "
                                    "holds. Its precondition rules out 2 of the 4 cases, where an optimization does "
                                    "not apply it; it was slower on 1 of those.")
    # slower where it holds still counts, over the cases it holds on
    held_slower = standing("admitted", effects, ruled_out=[False, True, False, True])
    assert held_slower.badge == "admitted · slower on 1 of 2 cases where its precondition holds"
    assert held_slower.tone == "mixed"
    assert standing("admitted", effects).badge == "admitted · slower on 1 of 4 cases"  # no precondition
    with pytest.raises(ValueError, match="2 flags for 4 effects"):
        standing("admitted", effects, ruled_out=[True, False])


def test_the_flags_come_from_the_cards_timing_precondition_case_by_case():
    from klineage import config
    from klineage.skills.library import load_library
    from klineage.skills.when import kernel_rows, ruled_out, timing_precondition

    library = load_library(config.REPO_ROOT / "bench" / "results" / "percase" / "library.json")
    store = library.by_id("b9f2b940a428")  # rope's 16-byte store: row_align >= 32 and s >= 70
    timing = timing_precondition(store)
    keys = [key for key, _ in kernel_rows(store.effects)]
    flags = dict(zip(keys, ruled_out(store.effects, store.preconditions)))
    assert set(timing.fails) <= {key for key, out in flags.items() if out}
    assert not set(timing.holds) & {key for key, out in flags.items() if out}
    uniform = library.by_id("9845da347823")  # fast_math: paid on all 15 cases, no precondition
    assert ruled_out(uniform.effects, uniform.preconditions) == [False] * len(uniform.effects)
