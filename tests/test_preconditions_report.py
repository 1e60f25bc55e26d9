"""bench/preconditions_report.py on the committed evidence: the library built with the per-case
re-timings recorded on the H200 (bench/results/percase/library.json), read with no GPU."""

from __future__ import annotations

import json

from bench_tools import BENCH, bench_script
from klineage.skills.card import CardStatus
from klineage.skills.library import load_library
from klineage.skills.when import WhenKind, card_when

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
        assert row["paid_where_held"] == 1.0 and row["fails_on"] and row["loo_accuracy"] >= 0.8
    assert result["with_preconditions"] == sum(c.status is CardStatus.ADMITTED for c in gained)


def test_the_committed_report_is_what_the_script_writes_now(tmp_path):
    out = tmp_path / "preconditions.json"
    assert bench_script("preconditions_report").main(["--library", str(PERCASE), "--out", str(out)]) == 0
    written, committed = (json.loads(p.read_text()) for p in (out, BENCH / "results" / "preconditions.json"))
    assert written == committed
