"""The dashboard keeps each skill library apart: the bundled corpus library, the per-case library (the
cards with preconditions, bench/results/percase/library.json) and the transfer library, each with its
own copy of a card they share. Real files, real database, the pages and API a browser and a client
read; the optimize form and API name the library a job draws on."""

from __future__ import annotations

import json
import re

import pytest

from gate_app import queue, submit
from klineage.skills.library import load_library
from klineage.skills.when import ruled_out
from library_data import corpus_cards, library_document, real_cards
from skills_app.card_import import ImportRefused, import_library_files, library_name
from skills_app.models import SkillCard, SkillLibrary

pytestmark = pytest.mark.django_db

SHARED = "3b94a2d5fa95"  # unswizzle_shared: admitted in the corpus library, a candidate in the per-case one
CONDITIONED = "b9f2b940a428"  # devectorize: admitted in the per-case library only, with a precondition


@pytest.fixture
def bundled():
    import_library_files()


def _percase():
    from klineage import config

    return load_library(config.REPO_ROOT / "bench" / "results" / "percase" / "library.json")


def test_each_file_is_a_library_named_for_it_and_holds_its_own_copy_of_a_shared_card(bundled):
    assert list(SkillLibrary.objects.values_list("name", flat=True)) == ["corpus", "percase", "transfer-library"]
    percase = _percase()
    assert SkillCard.objects.filter(library__name="percase").count() == len(percase.cards)
    copies = {row.library.name: row for row in SkillCard.objects.filter(short_id=SHARED).select_related("library")}
    assert copies["corpus"].status == "admitted" and copies["percase"].status == "candidate"
    assert copies["percase"].document == percase.by_id(SHARED).to_dict()
    stored = SkillLibrary.objects.get(name="percase")
    assert stored.source == "bench/results/percase/library.json" and "per-case timings" in stored.note
    assert import_library_files() == {"unchanged": SkillCard.objects.count()}  # again: nothing changes


def test_names_come_from_files_and_two_files_of_one_name_refuse_the_import(tmp_path):
    assert library_name(tmp_path / "corpus" / "library" / "library.json", in_corpus=True) == "corpus"
    assert library_name(tmp_path / "bench" / "results" / "percase" / "library.json") == "percase"
    assert library_name(tmp_path / "transfer-library.json") == "transfer-library"
    (tmp_path / "library").mkdir()
    document = json.dumps(library_document(real_cards()))
    (tmp_path / "library" / "percase.json").write_text(document, encoding="utf-8")
    (tmp_path / "elsewhere" / "percase").mkdir(parents=True)
    (tmp_path / "elsewhere" / "percase" / "library.json").write_text(document, encoding="utf-8")
    with pytest.raises(ImportRefused, match="library name 'percase' is taken by"):
        import_library_files(tmp_path, extra=[tmp_path / "elsewhere" / "percase" / "library.json"])
    assert not SkillCard.objects.exists() and not SkillLibrary.objects.exists()


def test_the_library_page_switches_between_libraries_and_lists_only_the_one_shown(client, bundled):
    page = client.get("/library/").content.decode()
    assert 'href="/libraries/percase/"' in page and 'href="/library/" aria-current="page"' in page
    percase = SkillCard.objects.filter(library__name="percase")
    conditioned = percase.filter(when_kind="precondition").count()
    # two admitted; the ldg, unpad_shared and two unroll candidates, whose trials did not carry or found no fair target
    assert conditioned == 6
    admitted = percase.filter(status="admitted").count()
    # eight by trials on the H200, the three FlashAttention cards by trials on an H100; uncache_row's went back to
    # candidate once its per-case timings (H200, session 59) held two cases where it did not pay and no predicate
    assert admitted == 11
    assert f'data-library-counts="percase">{percase.count()} cards, {admitted} admitted, {conditioned} with a timing ' \
           f'precondition' in page
    assert f'href="/library/{SHARED}/"' in client.get("/library/?transform=unswizzle_shared").content.decode()
    listed = client.get("/libraries/percase/?transform=unswizzle_shared").content.decode()
    assert f'href="/libraries/percase/{SHARED}/"' in listed and 'aria-current="page"><span class="mono">percase' \
        in listed
    assert f'<span id="card-count">{percase.count()} of {percase.count()} cards' in \
        client.get("/libraries/percase/").content.decode()
    assert client.get("/libraries/no-such/").status_code == 404


def test_a_card_page_reads_its_librarys_copy_and_links_the_others(client, bundled):
    corpus_page = client.get(f"/library/{SHARED}/").content.decode()
    assert ">admitted" in corpus_page and f'href="/libraries/percase/{SHARED}/"' in corpus_page
    percase_page = client.get(f"/libraries/percase/{SHARED}/").content.decode()
    assert f'href="/library/{SHARED}/"><span class="mono">corpus</span> library</a>, admitted' in percase_page
    assert f'href="/libraries/percase/{SHARED}/SKILL.md"' in percase_page
    skillmd = client.get(f"/libraries/percase/{SHARED}/SKILL.md").content.decode()
    assert "status: candidate" in skillmd
    # a card only the per-case library holds answers at the short address too, with its precondition
    assert not corpus_cards().filter(short_id=CONDITIONED).exists()
    page = client.get(f"/library/{CONDITIONED}/").content.decode()
    assert "row_align" in page and 'href="/libraries/percase/"' in page
    # its badge and gain read where its precondition holds: the median over all 18 cases is about 1.00x
    card = _percase().by_id(CONDITIONED)
    held = sorted(e.ratio for e, out in zip(card.effects, ruled_out(card.effects, card.preconditions)) if not out)
    assert len(held) == 7 and f"<span data-held-gain>{held[3]:.2f}×</span>" in page
    assert "admitted · faster where its precondition holds" in page
    assert client.get(f"/libraries/corpus/{CONDITIONED}/").status_code == 404


def test_the_api_names_each_cards_library_and_filters_by_it(client, bundled):
    percase = SkillCard.objects.filter(library__name="percase").count()
    listed = client.get("/api/cards/?library=percase&page_size=100").json()
    assert listed["count"] == percase and {c["library"] for c in listed["results"]} == {"percase"}
    assert client.get(f"/api/cards/{SHARED}/").json()["status"] == "admitted"  # the default library's copy
    detail = client.get(f"/api/cards/{SHARED}/?library=percase").json()
    assert detail["status"] == "candidate" and detail["page"] == f"/libraries/percase/{SHARED}/"
    assert client.get(f"/api/cards/{CONDITIONED}/").json()["library"] == "percase"


def test_an_optimization_names_the_library_it_draws_on(bundled):
    params = submit.optimize_params("row_softmax/naive", strategy="library", mode="compile")
    assert params["library"] == "corpus"
    assert submit.optimize_params("row_softmax/naive", strategy="library", mode="compile",
                                  library="percase")["library"] == "percase"
    with pytest.raises(queue.QueueError, match="no skill library named 'nope' is stored"):
        submit.optimize_params("row_softmax/naive", strategy="library", library="nope")
    with pytest.raises(queue.QueueError, match="draws on no skill library"):
        submit.optimize_params("row_softmax/naive", strategy="unconditioned_random", library="percase")
    from gate_app.work import library_document

    sent = library_document("percase")
    assert len(sent["cards"]) == SkillCard.objects.filter(library__name="percase").count()
    assert sent["provenance"]["path"].startswith("the dashboard's library percase")


def test_the_library_lists_and_filters_each_cards_when(client, bundled):
    from klineage.skills.when import WhenKind, card_when

    percase = _percase()
    kinds = {card.id[:12]: card_when(card).kind for card in percase.cards}
    conditioned = sorted(short for short, kind in kinds.items() if kind is WhenKind.PRECONDITION)
    page = client.get("/libraries/percase/?when=precondition").content.decode()
    assert sorted(re.findall(r'href="/libraries/percase/([0-9a-f]{12})/"', page)) == conditioned
    assert "<code>where row_align &gt;= 32 and s &gt;= 70</code>" in page
    uniform = client.get("/libraries/percase/?when=uniform").content.decode()
    assert "paid on all 15 cases" in uniform and "paid on all 13 decided of 15 cases" in uniform
    assert client.get("/api/cards/?library=percase&when=mixed").json()["count"] == \
        sum(kind is WhenKind.MIXED for kind in kinds.values())
    assert "not understood" in client.get("/libraries/percase/?when=sometimes").content.decode()


def test_a_library_file_the_setting_names_must_be_there(monkeypatch, tmp_path):
    from klineage import config

    monkeypatch.setenv("KLINEAGE_BENCH_LIBRARIES", str(tmp_path / "gone.json"))
    assert config.bench_library_files() == [tmp_path / "gone.json"]
    with pytest.raises(ImportRefused, match="gone.json"):
        import_library_files()
    assert not SkillLibrary.objects.exists()  # nothing stored, the corpus's library neither


def test_a_librarys_export_names_it_and_each_cards_when(client, bundled):
    rows = client.get("/libraries/percase/export.json").json()
    assert len(rows) == SkillCard.objects.filter(library__name="percase").count()
    store = next(r for r in rows if r["short_id"] == CONDITIONED)
    assert (store["library"], store["when_kind"], store["when"]) == \
        ("percase", "precondition", "where row_align >= 32 and s >= 70")
    assert store["standing"] == "admitted · faster where its precondition holds"
    response = client.get("/libraries/percase/export.csv")
    assert 'filename="klineage-library-percase.csv"' in response["Content-Disposition"]


def test_an_optimizations_cards_link_to_the_library_it_drew_on(bundled):
    from gate_app.presenters import optimization

    attempt = {"index": 0, "round": 1, "transform": "devectorize", "card": _percase().by_id(CONDITIONED).id,
               "status": "untimed", "ratio": None, "message": ""}
    result = {"steps": [], "attempts": [attempt], "start": {"source": "__global__ void k() {}"}, "best": {},
              "speedup": None, "stop": "budget", "message": "", "note": "", "stats": {}, "strategy": "library",
              "gate": "compile", "budget": 2, "library": None}
    assert optimization(result, "percase")["attempts"][0]["card"] == {
        "short": CONDITIONED, "url": f"/libraries/percase/{CONDITIONED}/"}
    assert optimization(result)["attempts"][0]["card"]["url"] == ""  # the default library does not hold it


def test_the_api_lists_each_library_with_its_counts(client, bundled):
    listed = {row["name"]: row for row in client.get("/api/libraries/").json()["results"]}
    assert list(listed) == ["corpus", "percase", "transfer-library"]
    percase = listed["percase"]
    assert (percase["cards"], percase["admitted"], percase["with_timing_precondition"]) == (44, 11, 6)
    assert percase["source"] == "bench/results/percase/library.json" and percase["page"] == "/libraries/percase/"
    one = client.get("/api/libraries/percase/").json()
    assert one["name"] == "percase" and one["provenance"] == _percase().provenance
    assert client.get("/api/libraries/nope/").status_code == 404
