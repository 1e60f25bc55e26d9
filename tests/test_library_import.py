"""Importing skill library documents: idempotent, updating by card id, refusing malformed documents whole."""

from __future__ import annotations

import copy
import io
import json
import statistics

import pytest
from django.core.management import call_command

from klineage.skills.card import CardStatus, Trial
from library_data import corpus_cards, library_document, real_cards
from skills_app.card_import import STALE, import_library, import_library_files
from skills_app.importer import CREATED, UNCHANGED, UPDATED, ImportRefused
from skills_app.models import CardTrial

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def cards():
    return real_cards()


def test_import_lifts_what_the_library_filters_on(cards):
    assert import_library(library_document(cards)) == {CREATED: len(cards)}
    assert corpus_cards().count() == len(cards) == 4
    for card in cards:
        row = corpus_cards().get(card_id=card.id)
        assert row.short_id == card.short_id and row.transform == card.transform
        assert row.status == "candidate" and row.surface == card.anchor.kind and row.platform == "sm90"
        assert row.operators == ["row_softmax"]
        assert row.provides == [f"{f.locus}/{f.name}" for f in sorted(card.provides)]
        expected = statistics.median(e.ratio for e in card.effects) if card.effects else None
        assert row.median_gain == expected
        assert (row.precondition_count, row.risk_count) == (len(card.preconditions), len(card.risks))
        assert row.to_document() == card.to_dict()
        assert type(card).from_dict(row.to_document()) == card
    gains = sorted(g for g in corpus_cards().values_list("median_gain", flat=True) if g is not None)
    assert gains == [0.97, 1.02, 1.08]


def test_importing_twice_creates_no_duplicates(cards):
    document = library_document(cards)
    import_library(document)
    assert import_library(copy.deepcopy(document)) == {UNCHANGED: len(cards)}
    assert corpus_cards().count() == len(cards)


def test_a_newer_document_of_a_card_updates_it_and_its_trials(cards):
    import_library(library_document(cards))
    first = cards[0]
    admitted = type(first).from_dict({**first.to_dict(), "status": "admitted", "verification_log": [
        Trial("f" * 64, True, 1.05, "gemm/mma_sync headline").to_dict(), Trial("e" * 64, False).to_dict()]})
    assert admitted.id == first.id  # status and trials do not change who the card is
    counts = import_library(library_document([admitted, *cards[1:]], date="2026-11-30T08:00:00+00:00"))
    assert counts == {UPDATED: 1, UNCHANGED: len(cards) - 1}
    row = corpus_cards().get(card_id=first.id)
    assert row.status == CardStatus.ADMITTED.value and corpus_cards().count() == len(cards)
    # a trial logged with no outcome in its message: what it did is unknown
    assert list(row.trials.order_by("id").values_list("outcome", "ratio")) == [("passed", 1.05), ("inconclusive", None)]
    # The older library's copy does not overwrite it.
    assert import_library(library_document(cards[:1], date="2026-11-29T00:00:00+00:00")) == {STALE: 1}
    assert corpus_cards().get(card_id=first.id).status == "admitted"
    assert CardTrial.objects.filter(card=row).count() == 2


def _refused(document) -> str:
    with pytest.raises(ImportRefused) as info:
        import_library(document, where="library.json")
    assert corpus_cards().count() == 0 and CardTrial.objects.count() == 0
    return str(info.value)


def test_malformed_documents_are_refused_whole(cards):
    good = library_document(cards)
    bad_status = copy.deepcopy(good)
    bad_status["cards"][2]["status"] = "famous"
    assert "cards[2]" in (msg := _refused(bad_status)) and "status" in msg and "famous" in msg
    tampered = copy.deepcopy(good)
    tampered["cards"][3]["transform"] = "vectorize"  # the id no longer matches the content
    assert "cards[3]" in (msg := _refused(tampered)) and "does not match its content" in msg
    bad_predicate = copy.deepcopy(good)
    unroll = next(i for i, c in enumerate(good["cards"]) if c["preconditions"])
    bad_predicate["cards"][unroll]["preconditions"][0]["expression"] = "cols %% 4 =="
    assert f"cards[{unroll}]" in (msg := _refused(bad_predicate)) and "predicate" in msg
    duplicated = copy.deepcopy(good)
    duplicated["cards"].append(duplicated["cards"][0])
    assert "cards[4]" in (msg := _refused(duplicated)) and "is already cards[0]" in msg
    assert "unsupported version" in _refused({**good, "version": 2})
    assert "unknown keys ['extra']" in _refused({**good, "extra": 1})
    assert "missing ['cards']" in _refused({"version": 1, "provenance": {}})
    assert "must be an object, not list" in _refused([good])
    assert "ISO 8601" in _refused({**good, "provenance": {"date": "yesterday"}})


def test_a_refused_document_leaves_stored_cards_as_they_were(cards):
    import_library(library_document(cards[:2]))
    before = list(corpus_cards().order_by("id").values_list("card_id", "digest"))
    document = library_document(cards)
    document["cards"][3]["intent"] = " "
    with pytest.raises(ImportRefused, match=r"cards\[3\]: card.intent: a card needs an intent"):
        import_library(document)
    assert list(corpus_cards().order_by("id").values_list("card_id", "digest")) == before


def test_load_corpus_reads_the_corpus_library(cards, tmp_path, settings):
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "library.json").write_text(json.dumps(library_document(cards)), encoding="utf-8")
    assert import_library_files(tmp_path) == {CREATED: len(cards)}
    assert import_library_files(tmp_path) == {UNCHANGED: len(cards)}
    (tmp_path / "library" / "zz-broken.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ImportRefused, match="zz-broken.json: not JSON"):
        import_library_files(tmp_path)
    assert corpus_cards().count() == len(cards)


def test_load_corpus_command_imports_the_library(cards, tmp_path):
    """The real command over a corpus holding only a library (no problems, kernels or verdicts)."""
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "library.json").write_text(json.dumps(library_document(cards)), encoding="utf-8")
    (tmp_path / "recorded").mkdir()
    out = io.StringIO()
    call_command("load_corpus", corpus=tmp_path, recorded=tmp_path / "recorded", stdout=out)
    assert f"skill cards: {len(cards)} ({len(cards)} new, 0 updated" in out.getvalue()
    assert f"skill libraries: corpus ({len(cards)} cards, from " in out.getvalue()
    assert corpus_cards().count() == len(cards)


def test_the_bundled_librarys_trials_read_passed_slower_rejected_or_inconclusive():
    """Each trial is stored as what it says of the card: the pipeline card's pointwise conv2d trial
    passed the gate only slower (logged twice: the second admission run read the same verdict),
    its GEMM trial passed; a card whose source declares no effect has inconclusive trials. The
    pipeline card's effects were re-timed since (session 16): its trials judged its earlier content
    (they asked the same 0.990x of a trial, so it stays admitted until trialled as it is)."""
    import_library_files()
    pipeline = corpus_cards().get(card_id__startswith="535855ae6206")
    assert pipeline.status == "admitted"
    assert list(pipeline.trials.order_by("id").values_list("outcome", "judged")) == \
        [("slower", "earlier"), ("slower", "earlier"), ("passed", "earlier")]
    assert set(corpus_cards().get(card_id__startswith="38bb8e9bd28d").trials.values_list("judged", flat=True)) \
        == {"current"}
    assert set(corpus_cards().get(card_id__startswith="6567dea5216b").trials.values_list("outcome", flat=True)) \
        == {"inconclusive"}
    assert not CardTrial.objects.filter(outcome="failed").exists()
