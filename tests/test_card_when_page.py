"""The card page's "when it pays" (per-case effects against the timing precondition), diagnostics kept
apart from risks, and the library filtered to cards with preconditions (page and API)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from klineage.skills.card import Effect, Precondition, Risk
from klineage.skills.skillmd import render
from klineage.skills.when import SOURCE
from library_data import library_document, real_cards
from skills_app.card_import import import_library

pytestmark = pytest.mark.django_db

COLS = {"c64": 64, "c256": 256, "c1024": 1024, "c4096": 4096, "c8192": 8192, "c16384": 16384}
RATIOS = {"c64": 0.97, "c256": 0.99, "c1024": 1.04, "c4096": 1.08, "c8192": 1.1, "c16384": 1.12}


def _cards():
    cards = real_cards()
    base = next(c for c in cards if c.effects and c.risks)
    source = base.effects[0].source
    effects = tuple(Effect(case, "row_softmax", ratio, (ratio, ratio), source) for case, ratio in RATIOS.items())
    holds = tuple(f"row_softmax:{c}" for c in COLS if COLS[c] >= 1024)
    fails = tuple(f"row_softmax:{c}" for c in COLS if COLS[c] < 1024)
    timing = Precondition("cols >= 512", "pays where cols is at least 512: paid on all 4 case(s) where it holds, on "
                          "none of the 2 where it does not (leave-one-case-out 0.83)", holds, fails, SOURCE, 0.8333,
                          {f"row_softmax:{c}": {"cols": v} for c, v in COLS.items()})
    diagnostic = Risk("not_applicable", "its transform did not apply here (not_applicable, no_site) 3 time(s)",
                      base.risks[0].evidence)
    paying = dataclasses.replace(base, effects=effects, preconditions=base.preconditions + (timing,),
                                 diagnostics=(diagnostic,))
    uniform = next(c for c in cards if c.id != base.id and c.effects)
    uniform = dataclasses.replace(uniform, effects=tuple(
        Effect(case, "row_softmax", 1.05, (1.05,), uniform.effects[0].source) for case in COLS), preconditions=())
    rest = [c for c in cards if c.id not in (base.id, uniform.id)]
    return paying, uniform, rest


@pytest.fixture
def imported():
    paying, uniform, rest = _cards()
    import_library(library_document([paying, uniform, *rest]))
    return paying, uniform, rest


def _section(page: str, name: str) -> str:
    return page.split(f'<h2 id="{name}">', 1)[1].split("</section>", 1)[0]


def test_the_card_page_draws_where_the_card_pays(client, imported):
    paying = imported[0]
    page = client.get(f"/library/{paying.short_id}/").content.decode()
    when = _section(page, "when")
    assert "badge-when-precondition" in when and "Pays where cols is at least 512" in when
    assert "<code>cols &gt;= 512</code>" in when and "leave-one-case-out accuracy 0.83" in when
    assert "holds on 4 decided cases, paid on 4 · fails on 2, paid on 0" in when
    assert "measured on one kernel: how it carries to another is not measured" in when
    # what the predicate names, in words: a reader need not know the fact's short name
    operators = ", ".join(paying.scope.operators)
    assert f"<dt><code>cols</code></dt><dd>A parameter of the {operators} cases</dd>" in when
    assert f"). Where cols: a parameter of the {operators} cases." in render(paying)
    assert len(re.findall(r"<circle ", when)) == 6
    assert len(re.findall(r'fill="#2a7"', when)) == 4  # the four paid cases filled
    assert "cols &gt;= 512</text>" in when  # the threshold drawn and named
    # faster is higher: the points' heights follow their ratios (SVG's y grows downwards)
    points = re.findall(r'<circle [^>]*cy="([0-9.]+)"[^>]*><title>row_softmax:\w+: ([0-9.]+)x', when)
    assert len(points) == 6
    by_ratio = sorted(points, key=lambda p: float(p[1]))
    assert [float(y) for y, _ in by_ratio] == sorted((float(y) for y, _ in points), reverse=True)
    assert ">1.12×</text>" in when and ">0.97×</text>" in when  # the extremes labelled on the y axis
    assert ">64</text>" in when and ">16384</text>" in when  # and on the x axis
    assert len(re.findall(r'opacity="0.4"><title>[^<]*ruled out by the precondition', when)) == 2  # the 2 it fails on
    rows = re.findall(r'<td class="mono">(row_softmax:\w+)</td><td class="num">(\d+)</td><td class="num">([0-9.]+)×'
                      r'</td><td>([a-z ]+)</td><td>(holds|fails)</td>', when)
    assert rows[0] == ("row_softmax:c64", "64", "0.970", "did not pay", "fails")
    assert rows[-1] == ("row_softmax:c16384", "16384", "1.120", "paid", "holds")
    # the diagnostic is listed under its own heading, not among the risks
    assert "Diagnostics, not risks: did not apply here" in when and "no_site" in when
    assert "no_site" not in _section(page, "risks")
    # the timing precondition is not shown as a soundness one ("sound on ..., refused on ...")
    assert "cols &gt;= 512" not in _section(page, "preconditions")


def test_a_uniform_effect_is_stated_as_a_result(client, imported):
    when = _section(client.get(f"/library/{imported[1].short_id}/").content.decode(), "when")
    assert "badge-when-uniform" in when and "Paid on all 6 cases measured" in when


def test_the_library_filters_to_cards_with_preconditions(client, imported):
    paying, uniform, rest = imported
    listed = set(re.findall(r'href="/library/([0-9a-f]{12})/"', client.get("/library/?preconditions=true")
                            .content.decode()))
    everyone = [paying, uniform, *rest]
    assert listed == {c.short_id for c in everyone if c.preconditions} and paying.short_id in listed
    without = set(re.findall(r'href="/library/([0-9a-f]{12})/"', client.get("/library/?preconditions=false")
                             .content.decode()))
    assert without == {c.short_id for c in everyone if not c.preconditions} and uniform.short_id in without
    api = client.get("/api/cards/?preconditions=true").json()
    names = {row["short_id"] for row in api.get("results", api)}
    assert names == listed


def test_an_undecided_case_shows_where_the_precondition_holds(client, db, tmp_path):
    """A case that gained under the gate's spread is in neither `holds` nor `fails` (it was no evidence),
    yet the precondition is true on it: the page and SKILL.md say "undecided" and "holds", never
    "fails" (what it said when it read only the two lists)."""

    paying, uniform, rest = _cards()
    timing = next(p for p in paying.preconditions if p.source == SOURCE)
    facts = {**timing.facts, "row_softmax:c512": {"cols": 512}}
    extra = Effect("c512", "row_softmax", 1.015, (1.015, 1.014), paying.effects[0].source)
    paying = dataclasses.replace(paying, effects=paying.effects + (extra,), preconditions=tuple(
        dataclasses.replace(p, facts=facts) if p is timing else p for p in paying.preconditions))
    import_library(library_document([paying, uniform, *rest]))
    when = _section(client.get(f"/library/{paying.short_id}/").content.decode(), "when")
    assert re.search(r'<td class="mono">row_softmax:c512</td><td class="num">512</td><td class="num">1.015×</td>'
                     r'<td>undecided</td><td>holds</td>', when)
    assert 'stroke="#888"' in when  # drawn grey, neither paid nor unpaid
    assert "- row_softmax:c512: 1.015x, undecided; the precondition holds" in render(paying)


def test_a_precondition_with_exceptions_counts_them_and_says_how_it_carries_to_other_kernels(client, db):
    """A predicate may hold where the step did not pay: the line under the sentence counts the decided cases
    on each side from the measurements, never "paid on all of them" by fiat, and gives the accuracy with
    each kernel left out where the card was measured on several."""
    paying, uniform, rest = _cards()
    timing = next(p for p in paying.preconditions if p.source == SOURCE)
    # c1024 holds but did not pay (0.99x): an exception on the holding side
    effects = tuple(dataclasses.replace(e, ratio=0.99, per_trial=(0.99, 0.99)) if e.case == "c1024" else e
                    for e in paying.effects)
    timing = dataclasses.replace(timing, kernel_loo_accuracy=0.6667)
    paying = dataclasses.replace(paying, effects=effects, preconditions=tuple(
        timing if p.source == SOURCE else p for p in paying.preconditions))
    import_library(library_document([paying, uniform, *rest]))
    when = _section(client.get(f"/library/{paying.short_id}/").content.decode(), "when")
    assert "holds on 4 decided cases, paid on 3 · fails on 2, paid on 0" in when
    assert "leave-one-kernel-out accuracy 0.67" in when
