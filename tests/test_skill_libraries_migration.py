"""Migration 0013: cards stored before libraries were told apart become the corpus library's, on a real
database migrated from 0012; an empty table makes no library."""

from __future__ import annotations

import datetime as dt

import pytest

from migration_tools import migrate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("back_to_the_latest_migration")]

BEFORE, AFTER = [("skills_app", "0012_card_imported")], [("skills_app", "0013_skill_libraries")]


def _card(cards, card_id: str, written: dt.datetime | None):
    return cards.create(card_id=card_id, short_id=card_id[:12], transform="unroll", intent="i", status="admitted",
                        surface="loop", platform="sm90", search_text="s", document={}, digest="b" * 64,
                        library_created=written)


def test_stored_cards_become_the_corpus_librarys():
    apps = migrate(BEFORE)
    cards = apps.get_model("skills_app", "SkillCard").objects
    older, newer = dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    _card(cards, "a" * 64, older)
    _card(cards, "b" * 64, newer)
    apps = migrate(AFTER)
    library = apps.get_model("skills_app", "SkillLibrary").objects.get()
    assert library.name == "corpus" and library.created == newer
    assert set(apps.get_model("skills_app", "SkillCard").objects.values_list("library__name", flat=True)) == {"corpus"}


def test_an_empty_table_makes_no_library():
    migrate(BEFORE)
    apps = migrate(AFTER)
    assert not apps.get_model("skills_app", "SkillLibrary").objects.exists()


def test_stored_cards_gain_their_when_from_their_documents():
    from klineage import config
    from klineage.skills.library import load_library

    percase = load_library(config.REPO_ROOT / "bench" / "results" / "percase" / "library.json")
    store, fast_math = percase.by_id("b9f2b940a428"), percase.by_id("9845da347823")
    apps = migrate(AFTER)
    library = apps.get_model("skills_app", "SkillLibrary").objects.create(name="percase", source="s")
    cards = apps.get_model("skills_app", "SkillCard").objects
    for card in (store, fast_math):
        cards.create(library=library, card_id=card.id, short_id=card.short_id, transform=card.transform, intent="i",
                     status="admitted", surface="loop", platform="sm90", search_text="s", document=card.to_dict(),
                     digest="b" * 64)
    cards.create(library=library, card_id="c" * 64, short_id="c" * 12, transform="unroll", intent="i",
                 status="candidate", surface="loop", platform="sm90", search_text="s", document={}, digest="b" * 64)
    apps = migrate([("skills_app", "0014_card_when")])
    whens = dict(apps.get_model("skills_app", "SkillCard").objects.values_list("short_id", "when_label"))
    kinds = dict(apps.get_model("skills_app", "SkillCard").objects.values_list("short_id", "when_kind"))
    assert (kinds[store.short_id], whens[store.short_id]) == ("precondition", "where row_align >= 32 and s >= 70")
    assert (kinds[fast_math.short_id], whens[fast_math.short_id]) == ("uniform", "paid on all 15 cases")
    assert (kinds["c" * 12], whens["c" * 12]) == ("unmeasured", "")  # a document the engine cannot read
