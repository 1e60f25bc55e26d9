"""The verdict page says whether the timing settled: a small labelled line under the timing bars."""

from __future__ import annotations

from dashboard_data import corpus  # noqa: F401
from skills_app.models import Verdict


def timed(before_settling: bool = False) -> Verdict:
    """The first timed verdict by key; `before_settling`: the first whose gate predates the settling check."""
    verdicts = Verdict.objects.filter(document__profile__has_key="contenders").order_by("key")
    return (verdicts.exclude(document__profile__has_key="settlement") if before_settling else verdicts).first()


def test_a_recorded_verdict_says_its_gate_did_not_check_settling(client, corpus, db):
    page = client.get(f"/verdicts/{timed(before_settling=True).key}/").content.decode()
    assert ('<strong>Timing:</strong> <span class="muted">not checked for settling (a verdict of an earlier gate)'
            in page)


def test_an_unsettled_timing_is_labelled_with_its_reasons(client, corpus, db):
    """The recorded document with an unsettled settlement written in (rolled back after the test)."""
    verdict = timed()
    verdict.document["profile"]["settlement"] = {"state": "unsettled", "trials": 6, "attempts": [],
                                                 "reasons": ["vendor spread 1.178 > 0.5"],
                                                 "limits": {"spread": 0.5, "agreement": 0.1}}
    verdict.save()
    page = " ".join(client.get(f"/verdicts/{verdict.key}/").content.decode().split())
    assert ("<strong>Timing:</strong> <strong>unsettled</strong>: vendor spread 1.178 &gt; 0.5. No speed decision "
            "was made from it; the next gate measures again.") in page


def test_a_settled_timing_says_what_settled_means(client, corpus, db):
    verdict = timed()
    verdict.document["profile"]["settlement"] = {"state": "settled", "trials": 3, "attempts": [], "reasons": [],
                                                 "limits": {"spread": 0.5, "agreement": 0.1}}
    verdict.save()
    page = " ".join(client.get(f"/verdicts/{verdict.key}/").content.decode().split())
    assert ("settled (3 trials; each contender's p10–p90 range at most 50% of its median, trial ratios within "
            "10%).") in page


def test_samples_the_host_may_be_in_are_counted_where_they_were_left_out(client, corpus, db):
    verdict = timed()
    verdict.document["profile"]["host_exposed"] = {"vendor": 7, "candidate": 1}
    verdict.save()
    page = " ".join(client.get(f"/verdicts/{verdict.key}/").content.decode().split())
    assert ("<strong>Left out:</strong> 7 vendor samples, 1 candidate sample: the host dispatched each of those calls "
            "later than the GPU work queued ahead of it could cover, so their events may have timed the host "
            "too.") in page
    del verdict.document["profile"]["host_exposed"]
    verdict.save()
    assert "Left out:" not in client.get(f"/verdicts/{verdict.key}/").content.decode()
