"""Dead ends lead somewhere: styled 404/403 pages with the site's navigation (a 403 names the role and
who grants it), short ids shown on pages work in addresses, "Log in" comes back where it was, and a
flash message renders once."""

from __future__ import annotations

import pytest

from accounts import logged_in, make_user
from dashboard_data import corpus  # noqa: F401
from skills_app.models import Lineage, Verdict

pytestmark = pytest.mark.django_db


def test_a_missing_page_is_styled_and_navigable(client):
    response = client.get("/lineages/ffffffffffff/")
    page = response.content.decode()
    assert response.status_code == 404
    assert '<nav class="site-nav" aria-label="Main">' in page and "Nothing here" in page
    assert "/lineages/ffffffffffff/" in page and "short form (the first 12 hex digits)" in page


def test_a_forbidden_page_names_the_role_and_who_grants_it():
    plain = logged_in(make_user("bob"))
    response = plain.get("/optimize/")
    page = response.content.decode()
    assert response.status_code == 403 and '<nav class="site-nav"' in page
    assert "This needs the <strong>operator</strong> role" in page and "who is not in the operator group" in page
    assert "an administrator grants them" in page
    review = plain.post("/review/1/", {"verdict": "confirm"})
    assert review.status_code == 403 and "<strong>reviewer</strong> role" in review.content.decode()


def test_log_in_keeps_the_page_it_was_clicked_on(client):
    page = client.get("/library/?status=admitted").content.decode()
    assert 'href="/accounts/login/?next=/library/%3Fstatus%3Dadmitted">Log in</a>' in page
    make_user("ada")
    response = client.post("/accounts/login/?next=/library/%3Fstatus%3Dadmitted",
                           {"username": "ada", "password": "pw-ada-1", "next": "/library/?status=admitted"})
    assert response.status_code == 302 and response["Location"] == "/library/?status=admitted"


def test_short_verdict_ids_work_in_addresses(client, corpus):
    key = Verdict.objects.order_by("key").values_list("key", flat=True).first()
    response = client.get(f"/verdicts/{key[:12]}/")
    assert response.status_code == 302 and response["Location"] == f"/verdicts/{key}/"
    assert client.get(f"/verdicts/{key}/").status_code == 200
    assert client.get(f"/verdicts/{key[:6]}/").status_code == 404


def test_a_flash_message_renders_once(corpus):
    from django.contrib.auth.models import Group

    user = make_user("grace")
    user.groups.add(Group.objects.get(name="reviewer"))
    client = logged_in(user)
    lineage = Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.dry.json")
    step = lineage.steps.get(kind="accepted", index=0)
    page = client.post(f"/review/{step.id}/", {"verdict": "confirm"}, follow=True).content.decode()
    assert page.count("Recorded: confirm on step 0") == 1
