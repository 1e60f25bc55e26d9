"""The library and card pages on cards induced from a real lineage (stored here too, so risks link to
its rejected attempt), plus varied cards for filters, sorting and pagination."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from dashboard_data import corpus  # noqa: F401
from klineage.skills.skillmd import parse
from library_data import corpus_cards, library_document, many_cards, real_cards, store_real_library, timed_lineage
from skills_app.card_import import import_library, import_library_files
from skills_app.importer import import_lineage
from skills_app.models import LineageStep, Review, SkillCard

pytestmark = pytest.mark.django_db


@pytest.fixture
def library():
    cards, lineage = store_real_library()
    return {"cards": {c.short_id: c for c in cards}, "lineage": lineage}


def _short_ids(client, query: str = "") -> list[str]:
    response = client.get(f"/library/?{query}")
    assert response.status_code == 200
    return re.findall(r'href="/library/([0-9a-f]{12})/"', response.content.decode())


def _by(library, transform: str, provides: bool | None = None):
    return [c for c in library["cards"].values() if c.transform == transform
            and (provides is None or bool(c.provides) == provides)][0]


def test_library_lists_cards_by_measured_gain(client, library):
    ids = _short_ids(client)
    assert len(ids) == 4
    gains = [corpus_cards().get(short_id=i).median_gain for i in ids]
    assert gains[:3] == [1.08, 1.02, 0.97] and gains[3] is None  # untimed cards last
    page = client.get("/library/").content.decode()
    assert "1.08×" in page and 'data-count="candidate">4<' in page and 'data-count="admitted">0<' in page


def test_filters_and_search(client, library):
    bounds = _by(library, "launch_bounds")
    pragma = _by(library, "unroll", provides=True)
    assert _short_ids(client, "surface=function") == [bounds.short_id]
    assert set(_short_ids(client, "surface=loop")) == {c.short_id for c in library["cards"].values()
                                                       if c.transform == "unroll"}
    assert _short_ids(client, "feature=kernel/launch_bounds") == [bounds.short_id]
    assert _short_ids(client, "feature=device/unroll_pragma") == [pragma.short_id]
    assert _short_ids(client, "feature=kernel/launch") == []  # a feature matches whole
    assert len(_short_ids(client, "operator=row_softmax")) == 4
    assert _short_ids(client, "operator=row_soft") == [] and _short_ids(client, "operator=gemm") == []
    assert _short_ids(client, "platform=sm90a") == []
    assert _short_ids(client, "status=admitted") == [] and len(_short_ids(client, "status=candidate")) == 4
    assert _short_ids(client, "intent=block+size") == [bounds.short_id]
    # Full-text search: every word, over intent, anchor snippet and transform, any case.
    assert _short_ids(client, "q=LAUNCH_BOUNDS") == [bounds.short_id]
    assert set(_short_ids(client, "q=pragma+unroll")) == {c.short_id for c in library["cards"].values()
                                                        if c.transform == "unroll"}
    assert _short_ids(client, "q=pragma+bound") == []
    page = client.get("/library/?q=nothing-like-this").content.decode()
    assert "No card matches these filters." in page
    assert "not understood" in client.get("/library/?status=famous").content.decode()


def test_sort_and_pagination(client, library):
    import_library(library_document(many_cards(130)))
    total = corpus_cards().count()
    assert total == 134
    first = _short_ids(client)
    second = _short_ids(client, "page=2")
    third = _short_ids(client, "page=3")
    assert (len(first), len(second), len(third)) == (50, 50, total - 100)
    assert not set(first) & set(second)
    gains = [corpus_cards().get(short_id=i).median_gain for i in first + second + third]
    timed = [g for g in gains if g is not None]
    assert timed == sorted(timed, reverse=True) and gains.index(None) == len(timed)
    by_transform = _short_ids(client, "sort=transform")
    rows = [corpus_cards().get(short_id=i) for i in by_transform]
    assert [(r.transform, r.card_id) for r in rows] == sorted((r.transform, r.card_id) for r in rows)
    by_id = [corpus_cards().get(short_id=i).card_id for i in _short_ids(client, "sort=id")]
    assert by_id == sorted(corpus_cards().values_list("card_id", flat=True))[:50]
    # Filters survive paging; the status counts follow the other filters.
    gemm = corpus_cards().filter(operators__icontains='"gemm"')
    assert len(_short_ids(client, "operator=gemm&page=1")) == min(50, gemm.count())
    page = client.get("/library/?operator=gemm").content.decode()
    for status in ("candidate", "admitted", "retired"):
        assert f'data-count="{status}">{gemm.filter(status=status).count()}<' in page
    assert "?sort=transform&amp;page=2" in client.get("/library/?sort=transform").content.decode()


def test_card_page(client, library):
    unroll = _by(library, "unroll", provides=False)
    response = client.get(f"/library/{unroll.short_id}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert unroll.intent.replace("'", "&#x27;") in page
    assert page.count('<tr class="diff-add">') == 1  # the vector as a highlighted diff
    assert '<span class="tok-pp">#pragma unroll</span>' in page
    (pre,) = unroll.preconditions
    assert "Cols must be a multiple of 4" in page and "<code>cols % 4 == 0</code>" in page
    assert "sound on 2 cases (headline, mid_aligned), refused on 2 (narrow, ragged)" in page
    assert "<svg" in page and "1.020×" in page  # effects chart
    lineage = library["lineage"]
    assert f'href="/lineages/{lineage.id}/#step-rejected-0"' in page  # risk -> the rejected attempt
    assert f'href="/lineages/{lineage.id}/#step-accepted-1"' in page  # evidence -> accepted steps
    assert lineage.steps.filter(kind="rejected", index=0).exists()
    assert "max abs err 0.3" in page and "Nobody has reviewed" in page
    assert f'href="/library/{unroll.short_id}/SKILL.md"' in page
    side = client.get(f"/library/{unroll.short_id}/?diff=split").content.decode()
    assert '<table class="diff diff-split"' in side and side.count('<td class="diff-code diff-add">') == 1


def test_card_without_effects_or_risks(client, library):
    pragma = _by(library, "unroll", provides=True)
    bounds = _by(library, "launch_bounds")
    page = client.get(f"/library/{bounds.short_id}/").content.decode()
    assert "provides kernel/launch_bounds" in page and "None recorded." in page
    assert "Not tried outside its own lineages yet." in page
    assert "No measured effect yet" in client.get(f"/library/{pragma.short_id}/").content.decode()


def test_reviews_of_the_steps_behind_a_card(client, library):
    bounds = _by(library, "launch_bounds")
    step = LineageStep.objects.get(lineage=library["lineage"], kind="accepted", index=bounds.evidence[0].index)
    reviewer = User.objects.create_user("grace", password="pw-grace-2026")
    Review.objects.create(step=step, reviewer=reviewer, verdict="dispute", comment="the bound hides spills")
    page = client.get(f"/library/{bounds.short_id}/").content.decode()
    assert "the bound hides spills" in page and "grace" in page and "badge-disputed" in page


def test_unknown_card_is_404(client, library):
    assert client.get("/library/000000000000/").status_code == 404
    assert client.get("/library/000000000000/SKILL.md").status_code == 404


def test_skillmd_download_is_the_cards_skill_file(client, library):
    card = _by(library, "unroll", provides=False)
    response = client.get(f"/library/{card.short_id}/SKILL.md")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    assert f'filename="unroll-{card.short_id}-SKILL.md"' in response["Content-Disposition"]
    assert parse(response.content.decode()) == card  # lossless: the engine reads it back


def test_risk_refs_to_lineages_not_stored_here_are_plain_text(client):
    cards = real_cards()
    import_library(library_document(cards))  # no lineage imported
    unroll = next(c for c in cards if c.risks)
    page = client.get(f"/library/{unroll.short_id}/").content.decode()
    assert "rejected attempt 0" in page and "#step-rejected-0" not in page


def test_read_closed_library(client, settings, library):
    settings.KLINEAGE_READ_OPEN = False
    card = next(iter(library["cards"]))
    for url in ("/library/", f"/library/{card}/", f"/library/{card}/SKILL.md"):
        assert client.get(url).status_code == 302


def test_home_shows_library_numbers(client, library):
    page = client.get("/").content.decode()
    assert 'data-stat="cards">4<' in page and 'data-stat="admitted">0<' in page
    assert "No card has been through admission yet" in page and 'href="/library/?operator=row_softmax"' in page
    assert "Recent jobs" not in page


def test_home_shows_the_admission_rate_and_recent_jobs(client, library, django_user_model):
    from gate_app.models import Job
    from skills_app.models import CardTrial

    card = corpus_cards().order_by("card_id").first()
    card.status = SkillCard.Status.ADMITTED
    card.save()
    CardTrial.objects.create(card=card, outcome=CardTrial.Outcome.PASSED, target="f" * 64, ratio=1.02,
                             message="passed: a held-out state")
    owner = django_user_model.objects.create_user("ada", password="pw-for-tests")
    job = Job.objects.create(kind=Job.Kind.WALK, owner=owner, params={})
    page = client.get("/").content.decode()
    assert 'data-stat="admission-rate">25%<' in page and "1 went through a held-out roundtrip" in page
    assert f'href="/jobs/{job.id}/">#{job.id} backward walk</a>' in page and "ada" in page


def test_refs_resolve_to_the_longest_walk_of_an_expert(client, library):
    """A shorter walk of the same expert under the same gate mode, imported later, is not the one
    the card's refs mean (a library keeps the longest walk per lineage id)."""
    import dataclasses

    full = timed_lineage()
    short = dataclasses.replace(full, states=full.states[:4], transitions=full.transitions[:3], rejections=(),
                                limits=dataclasses.replace(full.limits, max_steps=3),
                                stats=dataclasses.replace(full.stats, accepted=3, rejected=0))
    shorter, _ = import_lineage(short.to_dict())
    assert shorter.id != library["lineage"].id and shorter.accepted_count == 3
    bounds = _by(library, "launch_bounds")
    page = client.get(f"/library/{bounds.short_id}/").content.decode()
    assert f'href="/lineages/{library["lineage"].id}/#step-accepted-0"' in page
    assert f"/lineages/{shorter.id}/" not in page


def test_home_lists_the_web_perf_measurement(client, settings, tmp_path):
    import json

    (tmp_path / "web_perf.json").write_text(json.dumps({
        "provenance": {"written_by": "bench/web_perf.py", "date": "2026-11-29T19:00:00+00:00",
                       "machine": {"cpu": "AMD EPYC", "cpus": 2}},
        "summary": {"cards": 10000, "library_p95_ms": 126.7, "lineage_p95_ms": 118.8},
        "rows": [{"page": "card page", "p50_ms": 13.9, "p95_ms": 26.5}]}), encoding="utf-8")
    settings.KLINEAGE_EVIDENCE_DIR = tmp_path
    page = client.get("/").content.decode()
    assert "Dashboard page times" in page
    assert "library p95 127 ms over 10,000 cards; 119 ms for a 40-step lineage" in page


def test_a_card_page_tells_a_slower_trial_from_a_rejected_one(client):
    """The bundled pipeline card: its pointwise conv2d trial passed the gate only slower (amber),
    its GEMM trial passed; each badge says what the trial means."""
    from skills_app.card_import import import_library_files

    import_library_files()
    page = client.get("/library/535855ae6206/").content.decode()
    badges = re.findall(r'<span class="badge badge-trial-(\w+)" title="([^"]+)">(\w+)</span>', page)
    assert badges == [("slower", "slower: the mechanism did not pay there", "slower")] * 2 + \
        [("passed", "passed", "passed")]
    assert "passed at 0.939x, below the 0.990x" in page and "1.025x (required 0.990x)" in page
    # its effects were re-timed since (session 16): each trial judged the earlier content, and says so
    assert page.count('class="badge badge-judged-earlier"') == 3 and "Trials marked <em>earlier content</em>" in page
    assert "only its measured effects changed and they ask a trial for the same ratio" in page
    unchanged = client.get("/library/38bb8e9bd28d/").content.decode()
    assert "badge-judged-" not in unchanged and "earlier content" not in unchanged


def test_a_card_marks_the_effects_its_pairing_could_have_decided(client, corpus):
    """The bundled library's ldmatrix card: on gemm/mma_sync the walk measured 0.812, its states
    timed up to 1.41x apart in their two pairings; re-timed with the two kernels exchanging places it
    is 0.802, and that is the card's effect (on conv2d likewise, 1.903 walked, 1.997 re-timed). Each
    bar gets a grey tick at the walk's own ratio, listed. A library built before the re-timings
    (effects as the walk paired them) gets a blue tick at the re-timed ratio instead. Where a step is
    still biased, its bar is hollow and the medians listed; the other effect is drawn as before."""
    import_library_files()
    card = corpus_cards().get(short_id="367ea5337b52")

    def chart() -> str:
        page = client.get(f"/library/{card.short_id}/").content.decode()
        return page[page.index('class="effect-chart"'):page.index('aria-labelledby="risks"')]

    retimed = chart()
    assert retimed.count("effect-bar") == 2 and 'effect-biased"' not in retimed
    assert retimed.count('class="effect-walked"') == 2 and 'class="effect-retimed"' not in retimed
    assert "the walk's own pairing: 0.812" in retimed and "0.802×" in retimed
    assert "re-timed 0.802" in retimed and "the walk&#x27;s pairing gave 0.812" in retimed
    assert "A grey tick" in retimed and "A blue tick" not in retimed

    walked = [{key: value for key, value in e.items() if key != "placement"} for e in card.document["effects"]]
    gemm = next(e for e in walked if e["operator"] == "gemm")
    gemm["ratio"] = gemm["per_trial"][0] = 0.812
    card.document = {**card.document, "effects": walked}
    card.save()
    older = chart()
    assert older.count('class="effect-retimed"') == 2 and "re-timed with places exchanged: 0.802" in older
    assert "0.812×" in older and "A blue tick" in older and "A grey tick" not in older

    step = LineageStep.objects.get(lineage__source_path="corpus/lineages/gemm_mma_sync.gpu.json",
                                   kind=LineageStep.Kind.ACCEPTED, index=1)
    step.pairing, step.pairing_note, step.retimed_ratio = "biased", "state 2 timed 1.41x apart", None
    step.save()
    biased = chart()
    assert biased.count("effect-bar") == 2 and biased.count('effect-biased"') == 1
    assert biased.count('class="effect-retimed"') == 1  # conv2d's: its step is still re-timed
    assert "timing biased" in biased and "state 2 timed 1.41x apart" in biased
