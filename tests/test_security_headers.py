"""Under KLINEAGE_HTTPS: HSTS, a redirect from plain HTTP (but not for /healthz), secure cookies and a
Content-Security-Policy that the pages keep (no inline script without the nonce, no inline event
handler, no eval). Without it, none of these, so http://localhost keeps working."""

from __future__ import annotations

import re

import pytest
from django.test import Client, override_settings

from klineage_web.env import load
from klineage_web.security import HSTS_SECONDS, https_settings

pytestmark = pytest.mark.django_db
PAGES = ["/", "/problems/", "/kernels/", "/verdicts/", "/library/", "/lineages/", "/review/", "/jobs/", "/api/docs/",
         "/accounts/login/"]
PROXIED = {"HTTP_X_FORWARDED_PROTO": "https"}


@pytest.fixture
def https():
    with override_settings(**https_settings(True)):
        yield Client(**PROXIED)


def test_the_setting_comes_from_the_environment(tmp_path):
    assert load({"KLINEAGE_DATA_DIR": str(tmp_path), "KLINEAGE_HTTPS": "1"}).https
    assert not load({"KLINEAGE_DATA_DIR": str(tmp_path)}).https


def test_hsts_and_csp_over_https(https):
    response = https.get("/")
    assert response.status_code == 200
    assert response["Strict-Transport-Security"] == f"max-age={HSTS_SECONDS}"
    policy = dict(part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
    assert policy["default-src"] == "'self'" and policy["object-src"] == "'none'"
    # The nonce appears only when a page used it (django-csp makes it on first use).
    assert re.fullmatch(r"'self'( 'nonce-[A-Za-z0-9+/=_-]+')?", policy["script-src"]), policy["script-src"]
    assert policy["frame-ancestors"] == "'none'"
    assert "unsafe-eval" not in response["Content-Security-Policy"]


def test_plain_http_is_redirected_but_health_probes_are_not(https):
    plain = Client()
    response = plain.get("/kernels/")
    assert response.status_code == 301 and response["Location"] == "https://testserver/kernels/"
    assert plain.get("/healthz").status_code == 200


def test_cookies_are_secure_over_https(https):
    response = https.get("/accounts/login/")
    assert response.cookies["csrftoken"]["secure"] is True


def test_without_https_no_hsts_no_csp_no_redirect():
    response = Client().get("/")
    assert response.status_code == 200
    assert "Strict-Transport-Security" not in response and "Content-Security-Policy" not in response


@pytest.mark.parametrize("path", PAGES)
def test_pages_need_nothing_the_policy_forbids(https, path):
    """Every inline <script> carries this response's nonce; no on...= handlers, no javascript: URLs."""
    response = https.get(path)
    assert response.status_code == 200
    page = response.content.decode()
    found = re.search(r"'nonce-([^']+)'", response["Content-Security-Policy"])
    for tag in re.findall(r"<script\b[^>]*>", page):
        assert "src=" in tag or (found and f'nonce="{found.group(1)}"' in tag), \
            f"{path}: inline script without the nonce: {tag}"
    handlers = re.findall(r"<[^>]+\son[a-z]+\s*=", page)
    assert not handlers, f"{path}: inline event handlers {handlers[:3]}"
    assert "javascript:" not in page
