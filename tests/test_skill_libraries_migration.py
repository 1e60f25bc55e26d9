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
