"""Card titles and status badges on the library, card and home pages agree with the measurements, on
the bundled library (the unpipeline card measured 0.77x with two of three trials slower), and a card
sent back to admission reads as a candidate on its page, in the API and in its SKILL.md."""

from __future__ import annotations

import pytest

from klineage.skills.skillmd import parse
from library_data import corpus_cards
from skills_app.card_import import import_library_files

pytestmark = pytest.mark.django_db

UNPIPELINE = "535855ae6206"


@pytest.fixture
def bundled():
    import_library_files()


def test_the_unpipeline_card_says_where_it_did_not_pay(client, bundled):
    page = client.get(f"/library/{UNPIPELINE}/").content.decode()
    assert "Pipeline copies through shared-memory stages" in page and "<code>conv2d_implicit_gemm: kt#0</code>" in page
    assert ">admitted · slower on 1 of 1 case, 2 of 3 trials slower</span>" in page
    assert "Slower on conv2d/headline (0.770x). 2 of 3 trials on other kernels slower (0.939x, 0.939x)." in page
    assert "time without / time with it" in page  # the ratio says what it divides


def test_the_library_lists_forward_titles_with_their_sites(client, bundled):
    page = client.get("/library/?status=admitted").content.decode()
    assert ">use mma.sync</a>" in page and "scalarize_mma" in page
    restricts = corpus_cards().filter(transform="restrict")
    for card in restricts:  # same transform, told apart by the site
        anchor = card.document["anchor"]
        assert f'<code class="card-where">{anchor["function"]}: {anchor["key"]}</code>' in page or card.status != \
            "admitted"
    assert ">restrict</a>" not in page
    assert "admitted · slower on 1 of 1 case" in page


def test_the_home_page_says_what_its_best_gain_compares(client, bundled):
    page = client.get("/").content.decode()
    best = page[page.index('id="best-step"'):]
    best = best[:best.index("</p>")]
    assert "use mma.sync" in best and "35.94×" in best and "median over 2 cases" in best
    assert "the walk's simpler kernel without it" in best and "not a speedup over the vendor library" in best


def test_a_card_sent_back_to_admission_is_a_candidate_everywhere(client, bundled):
    card = corpus_cards().get(short_id="74abd4d35370")
    corpus_cards().filter(pk=card.pk).update(readmission="gemm_mma_sync step 3 disputed by grace")
    page = client.get(f"/library/{card.short_id}/").content.decode()
    assert ">candidate · back to admission</span>" in page and ">admitted" not in page
    api = client.get(f"/api/cards/{card.short_id}/").json()
    assert api["status"] == "admitted" and api["effective_status"] == "candidate"
    skill = parse(client.get(f"/library/{card.short_id}/SKILL.md").content.decode())
    assert skill.status.value == "candidate"


def test_cards_answer_to_their_full_id_too(client, bundled):
    card = corpus_cards().get(short_id=UNPIPELINE)
    assert client.get(f"/library/{card.card_id}/").status_code == 200
    assert client.get(f"/library/{card.card_id}/SKILL.md").status_code == 200
    assert client.get(f"/library/{'0' * 64}/").status_code == 404
