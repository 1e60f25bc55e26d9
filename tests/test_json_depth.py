"""JSON nested 100,000 deep is a clear 400 from the API, not a 500."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from accounts import make_user

pytestmark = pytest.mark.django_db
DEPTH = 100_000


@pytest.fixture
def token_client() -> Client:
    token = Token.objects.create(user=make_user("olga", operator=True))
    return Client(HTTP_AUTHORIZATION=f"Token {token.key}", raise_request_exception=False)


@pytest.mark.parametrize("opening, closing", [("[", "]"), ('{"a":', "}")])
def test_deep_nesting_is_a_400_that_says_so(token_client, opening, closing):
    body = opening * DEPTH + "1" + closing * DEPTH
    response = token_client.post("/api/jobs/", body, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert "nested too deeply" in response.json()["detail"]


def test_shallow_json_still_reaches_the_view(token_client):
    response = token_client.post("/api/jobs/", {"kind": "no-such-kind"}, content_type="application/json")
    assert response.status_code == 400
    assert "nested" not in response.content.decode()
