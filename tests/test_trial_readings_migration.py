"""Migration 0008: trials stored as 'failed' before are read again as what they were, from their
message and ratio, on a real database migrated from 0007."""

from __future__ import annotations

import pytest

from migration_tools import migrate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("back_to_the_latest_migration")]

BEFORE, AFTER = [("skills_app", "0007_uploaded_by")], [("skills_app", "0008_trial_readings")]


def test_the_stored_outcomes_are_the_engines_readings():
    from klineage.skills.trial_reading import Reading
    from skills_app.models import CardTrial

    assert [c.value for c in CardTrial.Outcome] == [r.value for r in Reading]


def test_failed_trials_become_slower_rejected_or_inconclusive():
    apps = migrate(BEFORE)
    card = apps.get_model("skills_app", "SkillCard").objects.create(
        card_id="a" * 64, short_id="a" * 12, transform="unpipeline", intent="overlap copies with compute",
        status="admitted", surface="loop", platform="sm90", search_text="unpipeline", document={}, digest="b" * 64)
    trials = apps.get_model("skills_app", "CardTrial").objects
    rows = [("passed", 1.025, "passed: gemm skinny; 1.025x"),
            ("failed", 0.939, "failed: conv2d pointwise; passed at 0.939x, below the 0.990x"),
            ("failed", None, "failed: topk@3; rejected (incorrect): 12 elements differ"),
            ("failed", None, "inconclusive: the card declares no measured effect to reproduce"),
            ("failed", 0.9, "a trial logged by hand, with no outcome in its message")]
    for outcome, ratio, message in rows:
        trials.create(card=card, outcome=outcome, target="f" * 64, ratio=ratio, message=message)
    apps = migrate(AFTER)
    read = apps.get_model("skills_app", "CardTrial").objects.order_by("id").values_list("outcome", flat=True)
    assert list(read) == ["passed", "slower", "rejected", "inconclusive", "inconclusive"]
    apps = migrate(BEFORE)  # and back: every trial that did not pass is 'failed' again
    read = apps.get_model("skills_app", "CardTrial").objects.order_by("id").values_list("outcome", flat=True)
    assert list(read) == ["passed", "failed", "failed", "failed", "failed"]
    migrate(AFTER)
