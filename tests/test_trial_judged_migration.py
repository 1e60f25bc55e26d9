"""Migration 0011: each stored trial says which content of its card it judged, read from the
card's document on a real database migrated from 0010."""

from __future__ import annotations

import pytest

from klineage import config
from klineage.skills.library import load_library
from migration_tools import migrate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("back_to_the_latest_migration")]

BEFORE, AFTER = [("skills_app", "0010_step_retimed")], [("skills_app", "0011_trial_judged")]


def test_stored_trials_are_read_as_of_this_content_of_an_earlier_one_or_unknown():
    bundled = load_library(config.corpus_dir() / "library" / "library.json")
    # the unpipeline card's trials judged the card before its effects were re-timed (session 16)
    changed = bundled.by_id("535855ae6206")
    unchanged = bundled.by_id("38bb8e9bd28d")
    apps = migrate(BEFORE)
    cards, trials = apps.get_model("skills_app", "SkillCard").objects, apps.get_model("skills_app", "CardTrial").objects
    # a card whose document the engine cannot read: its trials' content is unknown
    for card_id, engine, document in ((changed.id, changed, changed.to_dict()),
                                      (unchanged.id, unchanged, unchanged.to_dict()), ("c" * 64, unchanged, {})):
        row = cards.create(card_id=card_id, short_id=card_id[:12], transform=engine.transform, intent="i",
                           status="admitted", surface="loop", platform="sm90", search_text="s", document=document,
                           digest="b" * 64)
        for trial in engine.verification_log:
            trials.create(card=row, outcome="passed", target=trial.state, ratio=trial.ratio, message=trial.message)
    apps = migrate(AFTER)
    judged = apps.get_model("skills_app", "CardTrial").objects.order_by("id").values_list("card__short_id", "judged")
    by_card = {}
    for short_id, value in judged:
        by_card.setdefault(short_id, []).append(value)
    assert by_card[changed.short_id] == ["earlier"] * len(changed.verification_log)
    assert by_card[unchanged.short_id] == ["current"] * len(unchanged.verification_log)
    assert by_card["c" * 12] == ["unknown"] * len(unchanged.verification_log)
