"""The pages a kernel engineer reaches for next: two kernel states side by side, a problem's
leaderboard against the vendor, and the library and a lineage's steps exported as CSV and JSON, on
the bundled corpus and its recorded verdicts."""

from __future__ import annotations

import csv
import io
import re
from urllib.parse import quote

import pytest

from dashboard_data import corpus  # noqa: F401
from library_data import corpus_cards
from skills_app.card_import import import_library_files
from skills_app.leaderboard_views import leaderboard_rows, timed_gpus
from skills_app.models import Lineage, Verdict
from skills_app.views import current_problem_or_404

pytestmark = pytest.mark.django_db


@pytest.fixture
def softmax(corpus) -> Lineage:
    return Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.gpu.json")


def test_compare_two_states_source_and_sass(client, softmax):
    simplest = softmax.steps.filter(kind="accepted").order_by("-index").first().child_state
    expert = softmax.expert_state
    page = client.get(f"/compare/?a={simplest.fingerprint[:12]}&b={expert.fingerprint}").content.decode()
    sass = page[page.index('id="sass-compare"'):page.index("</table>", page.index('id="sass-compare"'))]
    # the expert's 128-bit loads and shuffles are there, the simplest state's are not
    row = re.search(r'<td class="mono">ldg_128</td><td class="num">(\d+)</td><td class="num">(\d+)</td>', sass)
    assert row and int(row.group(1)) == 0 and int(row.group(2)) > 0
    assert '<tr class="diff-add">' in page and "__restrict__" in page  # the expert's qualifiers come back
    lineage_page = client.get(f"/lineages/{softmax.id}/").content.decode()
    assert f"/compare/?a={simplest.fingerprint}&amp;b={expert.fingerprint}" in lineage_page
    assert client.get("/compare/").status_code == 200
    assert client.get("/compare/?a=ffffffffffff&b=ffffffffffff").status_code == 404


def test_a_problems_leaderboard_ranks_timed_states_beside_the_vendor(client, corpus):
    page = client.get("/problems/row_softmax/leaderboard/").content.decode()
    headline = page[page.index("Case <code>headline</code>"):]
    headline = headline[:headline.index("</table>")]
    times = [float(t) for t in re.findall(r'<td class="num">([0-9.]+) µs</td>', headline)]
    assert len(times) > 3 and times == sorted(times)
    # one GPU a page, the one most states were timed on by default; the expert's row: its newest passed headline
    # verdict there that timed the vendor beside it
    timed = Verdict.objects.filter(kernel_name="row_softmax_warp_vec4", status=Verdict.StatusChoices.PASSED,
                                   document__profile__case="headline", document__profile__ratios__has_key="vs_vendor")
    gpus = timed_gpus(current_problem_or_404("row_softmax"))
    assert len(gpus) == len({gpu for gpu, _ in gpus}) and f"Timed on <strong>{gpus[0][0]}</strong>" in page
    expert = timed.filter(gpu=gpus[0][0]).order_by("-created", "-id").first()
    ratio = expert.document["profile"]["ratios"]["vs_vendor"]["overall"]
    assert f"{ratio:.3f}x" in headline and "compare with #1" in headline
    rows = [row for rows in leaderboard_rows(current_problem_or_404("row_softmax"), gpus[0][0]).values()
            for row in rows]
    assert {row["gpu"] for row in rows} == {gpus[0][0]}
    # each row says whether its timing settled, as its verdict does (an earlier gate's verdict: not checked)
    words = {"settled": ">settled</td>", "unsettled": "<strong>unsettled</strong>", None: ">not checked</span>"}
    for row in rows:
        assert row["settlement"] == (Verdict.objects.get(key=row["key"]).document["profile"].get("settlement")
                                     or {}).get("state")
    shown = [word for state, word in words.items() if any(row["settlement"] == state for row in rows)]
    assert shown and all(word in page for word in shown)
    assert headline.count("<td class=\"small timing-settlement\">") == len(times)
    for other, _ in gpus[1:]:  # each other GPU its own page, linked from the default one
        assert f'href="?gpu={quote(other)}"' in page
        assert f"Timed on <strong>{other}</strong>" in client.get(
            "/problems/row_softmax/leaderboard/", {"gpu": other}).content.decode()
    assert client.get("/problems/row_softmax/leaderboard/", {"gpu": "No Such GPU"}).status_code == 404
    # every comparison offered opens; a kernel only recorded verdicts name (a roundtrip's composite, its
    # source stored nowhere here) is ranked but offers none, and says why
    links = re.findall(r'href="(/compare/\?a=[0-9a-f]{64}&amp;b=[0-9a-f]{64})"', headline)
    assert links and all(client.get(link.replace("&amp;", "&")).status_code == 200 for link in links)
    assert "source not stored: no comparison" in headline
    assert 'href="/problems/row_softmax/leaderboard/"' in client.get("/problems/row_softmax/").content.decode()
    assert client.get("/problems/no_such/leaderboard/").status_code == 404


def test_exports_of_the_library_and_of_a_lineages_steps(client, softmax):
    import_library_files()
    rows = list(csv.DictReader(io.StringIO(client.get("/library/export.csv").content.decode())))
    assert len(rows) == corpus_cards().count()
    unpipeline = next(r for r in rows if r["short_id"] == "535855ae6206")
    assert unpipeline["standing"] == "admitted · slower on 1 of 1 case, 2 of 3 trials slower"
    assert unpipeline["title"] == "pipeline copies through shared-memory stages in conv2d_implicit_gemm: kt#0"
    cards = client.get("/library/export.json").json()
    assert {c["short_id"] for c in cards} == set(corpus_cards().values_list("short_id", flat=True))
    steps = client.get(f"/lineages/{softmax.id[:12]}/steps.json").json()
    assert len(steps) == softmax.steps.count() == 23
    first = softmax.steps.get(kind="accepted", index=0)
    assert steps[0]["ratio_x"] == first.forward_timing["overall"] and steps[0]["forward"] == "vectorize global accesses"
    response = client.get(f"/lineages/{softmax.id}/steps.csv")
    assert response["Content-Type"].startswith("text/csv") and "attachment" in response["Content-Disposition"]
    assert client.get(f"/lineages/{softmax.id}/steps.xml").status_code == 404
