"""HEAD answers 200 wherever GET does, with the GET's headers and no body: pages, the API, /healthz,
static files, under the test client and under daphne."""

from __future__ import annotations

import urllib.request

import pytest
from django.test import Client

from web_server import daphne_server

pytestmark = pytest.mark.django_db
PAGES = ["/", "/healthz", "/problems/", "/kernels/", "/verdicts/", "/library/", "/lineages/", "/review/", "/jobs/",
         "/api/docs/", "/api/", "/api/kernels/", "/accounts/login/", "/static/css/klineage.css"]


@pytest.mark.parametrize("path", PAGES)
def test_head_is_get_without_the_body(path):
    client = Client()
    got = client.get(path)
    assert got.status_code == 200, (path, got.status_code)
    head = client.head(path)
    assert head.status_code == 200, (path, head.status_code)
    assert _body(head) == b""
    body = _body(got)
    assert int(head["Content-Length"]) == len(body)
    assert head["Content-Type"] == got["Content-Type"]


def _body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_a_missing_page_stays_404_and_post_only_views_still_refuse_head():
    client = Client()
    assert client.head("/no-such-page/").status_code == 404
    assert client.head("/accounts/logout/").status_code == 405  # POST only; HEAD runs as its GET


def test_head_under_daphne(tmp_path):
    with daphne_server(tmp_path) as base:
        for path in ("/healthz", "/", "/kernels/"):
            request = urllib.request.Request(base + path, method="HEAD")
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200 and response.read() == b""
                assert int(response.headers["Content-Length"]) > 0
