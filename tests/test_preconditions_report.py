"""bench/preconditions_report.py on the committed evidence: the library built with the per-case
re-timings recorded on the H200 (bench/results/percase/library.json), read with no GPU."""

from __future__ import annotations

import dataclasses
import gzip
import json

from bench_tools import BENCH, bench_script
from klineage.cli import main
from klineage.skills.admission_rule import card_digest
from klineage.skills.card import CardStatus
from klineage.skills.library import load_library
from klineage.skills.when import MIN_LOO, MIN_PRECISION, WhenKind, card_when

PERCASE = BENCH / "results" / "percase" / "library.json"


def test_the_report_counts_every_admitted_cards_when_and_lists_the_pending_ones():
    library = load_library(PERCASE)
    result = bench_script("preconditions_report").report(library)
    admitted = [c for c in library.cards if c.status is CardStatus.ADMITTED]
    assert result["admitted"] == len(admitted) and sum(result["whens"].values()) == len(admitted)
    assert result["provenance"]["gpu"] == "NVIDIA H200"  # the per-case verdicts it read name their GPU
    assert result["provenance"]["library"]["per_case"] == "use"
    # a card with a timing precondition is counted once admitted on it, and listed as pending until then
    admitted_rows = {row["card"]: row for row in result["rows"]}
    pending = {row["card"]: row for row in result["pending"]}
    gained = [c for c in library.cards if any(p.source == "timing" for p in c.preconditions)]
    assert gained
    for card in gained:
        row, when = (admitted_rows if card.status is CardStatus.ADMITTED else pending)[card.short_id], card_when(card)
        assert when.kind is WhenKind.PRECONDITION and row["precondition"] == when.precondition.expression
        assert row["paid_where_held"] >= MIN_PRECISION and row["fails_on"] and row["loo_accuracy"] >= 0.8
    assert result["with_preconditions"] == sum(c.status is CardStatus.ADMITTED for c in gained)
    assert result["loo_accuracy_every_card"] >= 0.8 and result["loo_accuracy"] >= 0.8


def test_the_committed_report_is_what_the_script_writes_now(tmp_path):
    out = tmp_path / "preconditions.json"
    assert bench_script("preconditions_report").main(["--library", str(PERCASE), "--out", str(out)]) == 0
    written, committed = (json.loads(p.read_text()) for p in (out, BENCH / "results" / "preconditions.json"))
    assert written == committed


def test_the_untried_cards_say_where_they_pay_and_no_trial_has_judged_them():
    report = bench_script("preconditions_report")
    library = load_library(PERCASE)
    fresh = dataclasses.replace(library, cards=tuple(
        dataclasses.replace(c, verification_log=(), status=CardStatus.CANDIDATE) for c in library.cards))
    listed = report.untried(fresh)
    whens = {c.short_id: card_when(c) for c in fresh.cards}
    assert listed and all(whens[i].kind in (WhenKind.PRECONDITION, WhenKind.UNIFORM) and len(whens[i].cases) > 1
                          for i in listed)
    assert {"a4ed55765512", "70f2dab87f0c"} <= set(listed)  # the spill precondition; scalarize_mma on 33 cases
    headline_only = [i for i, w in whens.items() if len(w.cases) == 1]
    assert headline_only and not set(headline_only) & set(listed)
    assert report.untried(library) == [i for i in listed if not report._trials(library.by_id(i))
                                       and library.by_id(i).status is not CardStatus.ADMITTED]
    # a trial of an earlier content judged another claim: unroll's, before its intensity rule, does not
    # count; the trials of its rule (1.000x on column_max's wide_short, where the rule holds) do
    unroll = library.by_id("c60c9c0bff90")
    assert report.untried(dataclasses.replace(library, cards=(dataclasses.replace(unroll, verification_log=tuple(
        t for t in unroll.verification_log if t.basis.card != card_digest(unroll))),))) == ["c60c9c0bff90"]
    assert unroll.short_id not in report.untried(library)


def test_the_gpu_session_rebuilds_a_library_from_the_walks_it_names_and_admits_only_what_is_untried(tmp_path):
    """The rebuild stage builds $OUT/library.json from REBUILD_LINEAGES (and the walks the call wrote), keeping
    REBUILD_TRIALS's trials; admit with ADMIT_CARDS=untried then trials nothing where nothing is untried."""
    from bench_tools import session_stage

    walked = tmp_path / "out" / "lineages" / "nchw_to_nhwc_smem_tile.gpu.json"  # as a walk of the call leaves it
    walked.parent.mkdir(parents=True)
    walked.write_bytes(gzip.decompress((BENCH / "walks" / "nchw_to_nhwc_smem_tile.gpu.json.gz").read_bytes()))
    done, argv = session_stage("rebuild", tmp_path, {
        "REBUILD_LINEAGES": "bench/walks/embedding_bag_*.gpu.json.gz", "REBUILD_TRIALS": str(PERCASE)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert argv[argv.index("--keep-trials") + 1] == str(PERCASE)
    built = load_library(tmp_path / "out" / "library.json")
    assert {o for c in built.cards for o in c.scope.operators} == {"nchw_to_nhwc", "embedding_bag"}
    done, argv = session_stage("admit", tmp_path, {"ADMIT_FROM": "corpus/library/library.json",
                                                   "ADMIT_CARDS": "untried"})
    assert "admit: no untried card says where it pays" in done.stdout
    assert "admit" not in argv  # no admission ran


def test_each_admitted_row_names_the_held_out_trials_that_decided_it():
    """A uniform card's cases are its own walks'; its trials say how it did beyond them (fast_math's __expf: paid
    on every logcumsumexp case, 1.042x on causal_softmax's naive kernel, 1.003x on fmha's)."""
    result = bench_script("preconditions_report").report(load_library(PERCASE))
    for row in result["rows"]:
        assert row["trials"] and any(t["outcome"] == "passed" for t in row["trials"])  # admitted on a passed trial
    [expf] = [row for row in result["rows"] if row["card"] == "d96b27d56dce"]
    # timed on three more logcumsumexp cases since (paid on each), it carries the status those trials gave it
    assert expf["trials"] == [{"target": "causal_softmax/naive", "ratio": 1.0421, "outcome": "passed",
                               "gpu": "NVIDIA H200", "this_content": False},
                              {"target": "fmha/naive", "ratio": 1.003, "outcome": "failed", "gpu": "NVIDIA H200",
                               "this_content": False}]
    # each trial names the GPU that judged it: the unroll card's first two ran on an H100, the next three on an
    # H200, two of those reaching the 1.010x asked by under the gate's spread (1.012x at most): inconclusive, so it
    # stays a candidate
    [unroll] = [row for row in result["pending"] if row["card"] == "c60c9c0bff90"]
    assert [(t["gpu"], t["ratio"], t["outcome"]) for t in unroll["trials"]] == [
        ("NVIDIA H100 80GB HBM3", 1.0, "failed"), ("NVIDIA H100 80GB HBM3", 1.0027, "failed"),
        ("NVIDIA H200", 1.0099, "failed"), ("NVIDIA H200", 1.0119, "inconclusive"),
        ("NVIDIA H200", 1.012, "inconclusive")]
    assert unroll["status"] == "candidate"
    assert any(t["this_content"] for row in result["rows"] for t in row["trials"])
    [replicated] = [row for row in result["rows"] if row["card"] == "9845da347823"]
    assert replicated["trials"][0]["target"].endswith("(measured per case already: a replication)")


def test_rope_walks_recorded_timings_rebuild_its_16_byte_store_rule(tmp_path):
    """The rope walk's card steps as recorded on the H200 on all 18 cases: rebuilt from them
    alone with no GPU, the 16-byte store's card pays where rows are 32-byte aligned and there are at least
    70 tokens, as the committed per-case library says; the six unaligned heads and the five packable
    cases with few tokens are where it did not pay."""
    out = tmp_path / "rope.json"
    assert main(["library", "build", str(BENCH / "walks" / "rope_pack8.gpu.json.gz"), "--per-case", "use",
                 "--out", str(out)]) == 0
    [card] = [c for c in load_library(out).cards if c.id.startswith("b9f2b940a428")]
    [committed] = [c for c in load_library(PERCASE).cards if c.id == card.id]
    assert card.preconditions == committed.preconditions
    [rule] = card.preconditions
    assert rule.expression == "row_align >= 32 and s >= 70" and rule.loo_accuracy >= MIN_LOO
    unaligned = {"unaligned", "small", "head_unaligned", "head_72", "head_120", "head_40"}
    few_tokens = {"decode", "decode_batch", "decode_small", "tokens_few", "tokens_tiny"}
    assert {case.split(":")[1] for case in rule.fails} == unaligned | few_tokens
    when = card_when(committed)
    assert all(row.paid for row in when.cases if row.case in rule.holds)
    assert not any(row.paid for row in when.cases if row.case in rule.fails)
