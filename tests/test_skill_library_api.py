"""/api/cards/: list and detail, the library's filters, explicit ordering, pagination, access, schema."""

from __future__ import annotations

import json

import pytest
from drf_spectacular.generators import SchemaGenerator

from klineage.skills.card import SkillCard as EngineCard
from klineage.skills.card import Trial
from library_data import library_document, many_cards, real_cards
from skills_app.card_import import import_library
from skills_app.models import SkillCard

pytestmark = pytest.mark.django_db


@pytest.fixture
def cards():
    cards = real_cards()
    first = cards[0]
    admitted = EngineCard.from_dict({**first.to_dict(), "status": "admitted",
                                     "verification_log": [Trial("a" * 64, True, 1.04, "gemm headline").to_dict()]})
    import_library(library_document([admitted, *cards[1:]]))
    return {c.short_id: c for c in [admitted, *cards[1:]]}


def _get(client, url: str) -> dict:
    response = client.get(url)
    assert response.status_code == 200, (url, response.content[:300])
    return response.json()


def _ids(client, query: str) -> list[str]:
    return [row["short_id"] for row in _get(client, f"/api/cards/?{query}")["results"]]


def test_list_and_detail(client, cards):
    body = _get(client, "/api/cards/")
    assert body["count"] == 4 and len(body["results"]) == 4
    row = body["results"][0]
    assert row["median_gain"] == 1.08 and row["transform"] == "launch_bounds"  # default: by gain, untimed last
    assert row["page"] == f"/library/{row['short_id']}/" and "document" not in row
    assert [r["median_gain"] for r in body["results"]][-1] is None
    detail = _get(client, f"/api/cards/{row['short_id']}/")
    card = cards[row["short_id"]]
    assert detail["id"] == card.id and detail["status"] == "admitted"
    assert EngineCard.from_dict(detail["document"]) == card  # the whole card, as the engine reads it
    assert detail["trials"] == [{"outcome": "passed", "target": "a" * 64, "verdict_key": "", "ratio": 1.04,
                                 "message": "gemm headline", "judged": "unknown",  # a trial logged without a basis
                                 "created": detail["trials"][0]["created"]}]
    assert detail["skillmd"] == f"/library/{row['short_id']}/SKILL.md"
    assert client.get("/api/cards/000000000000/").status_code == 404


def test_filters(client, cards):
    by_transform = {c.transform: s for s, c in cards.items() if c.transform != "unroll"}
    assert _ids(client, "status=admitted") == [next(iter(cards))]
    assert _ids(client, "surface=function") == [by_transform["launch_bounds"]]
    assert _ids(client, "feature=kernel/launch_bounds") == [by_transform["launch_bounds"]]
    assert _ids(client, "q=restrict") == [by_transform["restrict"]]
    assert len(_ids(client, "operator=row_softmax&platform=sm90")) == 4
    assert _ids(client, "operator=gemm") == []
    assert len(_ids(client, "intent=unroll")) == 2
    assert client.get("/api/cards/?status=famous").status_code == 400


def test_ordering_and_pagination(client, cards):
    import_library(library_document(many_cards(60)))
    by_transform = _get(client, "/api/cards/?ordering=transform&page_size=100")["results"]
    assert [(r["transform"], r["id"]) for r in by_transform] == sorted((r["transform"], r["id"]) for r in by_transform)
    first = _get(client, "/api/cards/?ordering=card_id&page_size=25")
    assert first["count"] == 64 and len(first["results"]) == 25 and first["next"]
    second = _get(client, "/api/cards/?ordering=card_id&page_size=25&page=2")
    ids = [r["id"] for r in first["results"] + second["results"]]
    assert ids == sorted(SkillCard.objects.values_list("card_id", flat=True))[:50]
    ascending = [r["median_gain"] for r in _get(client, "/api/cards/?ordering=median_gain&page_size=100&status="
                                                        "admitted")["results"] if r["median_gain"] is not None]
    assert ascending == sorted(ascending)


def test_read_only_and_access(client, cards, settings):
    short = next(iter(cards))
    assert client.post("/api/cards/", {}).status_code in (403, 405)
    assert client.delete(f"/api/cards/{short}/").status_code in (403, 405)
    settings.KLINEAGE_READ_OPEN = False
    assert client.get("/api/cards/").status_code in (401, 403)


def test_schema_lists_the_cards_endpoints():
    schema = json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True)))
    assert set(schema["paths"]["/api/cards/"]) - {"parameters"} == {"get"}
    assert set(schema["paths"]["/api/cards/{short_id}/"]) - {"parameters"} == {"get"}
    parameters = {p["name"] for p in schema["paths"]["/api/cards/"]["get"]["parameters"]}
    assert {"status", "operator", "surface", "platform", "intent", "feature", "q", "ordering", "page",
            "page_size"} <= parameters
