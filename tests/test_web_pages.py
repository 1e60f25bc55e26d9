"""The site's pages through Django's test client."""

import json

import pytest
from django.test import Client

import klineage

pytestmark = pytest.mark.django_db


def test_home(client):
    response = client.get("/")
    assert response.status_code == 200
    assert b"KLineage" in response.content
    for name in (b"Library", b"Lineages", b"Kernels", b"Jobs", b"API"):
        assert name in response.content


@pytest.mark.parametrize("url", ["/library/", "/lineages/", "/kernels/", "/jobs/", "/api/docs/"])
def test_sections_render(client, url):
    assert client.get(url).status_code == 200


def test_read_closed_sends_visitors_to_login(client, settings):
    settings.KLINEAGE_READ_OPEN = False
    response = client.get("/kernels/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.django_db
def test_read_closed_lets_users_in(client, settings, django_user_model):
    settings.KLINEAGE_READ_OPEN = False
    client.force_login(django_user_model.objects.create_user("ada"))  # no password: force_login needs none
    assert client.get("/kernels/").status_code == 200


@pytest.mark.django_db
def test_healthz(client, settings):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"] is True
    assert body["version"] == klineage.__version__
    assert body["channel_layer"] == settings.KLINEAGE_CHANNEL_LAYER


def test_schema(client):
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    document = json.loads(response.content)
    assert document["openapi"].startswith("3.")
    assert document["info"]["title"] == "KLineage API"
    assert document["info"]["version"] == klineage.__version__
    assert client.get("/api/schema/").content.startswith(b"openapi:")


def test_login_page(client):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b'name="csrfmiddlewaretoken"' in response.content
    assert b'name="password"' in response.content


def test_logout_needs_post(client):
    assert client.get("/accounts/logout/").status_code == 405


def test_admin_redirects_to_login(client):
    response = client.get("/admin/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_security_headers(client):
    response = client.get("/")
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"


@pytest.mark.django_db
def test_login_sets_http_only_session_cookie(client, django_user_model):
    django_user_model.objects.create_user("ada", password="correct horse battery")
    credentials = {"username": "ada", "password": "correct horse battery"}
    response = client.post("/accounts/login/", credentials)
    assert response.status_code == 302
    assert response.cookies["sessionid"]["httponly"] is True


@pytest.mark.django_db
def test_posts_need_a_csrf_token():
    response = Client(enforce_csrf_checks=True).post("/accounts/login/", {"username": "ada"})
    assert response.status_code == 403
