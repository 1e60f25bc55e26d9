"""Login throttling (django-axes) on every password login: the login page and the admin's. A
username is locked from one address after five failures in a row, with a page that says so and how
long; another address is not locked out; the reset command lifts the lock."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db
PASSWORD = "the-right-password-1"
LIMIT = settings.AXES_FAILURE_LIMIT


@pytest.fixture
def user():
    return User.objects.create_user("olga", password=PASSWORD, is_staff=True, is_superuser=True)


def _login(client: Client, password: str, url: str = "/accounts/login/", **extra):
    return client.post(url, {"username": "olga", "password": password}, **extra)


def test_forty_wrong_passwords_lock_the_account_after_the_limit(user):
    client = Client(REMOTE_ADDR="10.0.0.7")
    codes = [_login(client, f"wrong-{i}").status_code for i in range(40)]
    assert codes[:LIMIT - 1] == [200] * (LIMIT - 1)  # the form again, with its error
    assert set(codes[LIMIT:]) == {429}, codes
    locked = _login(client, PASSWORD)  # even the right password, while locked
    assert locked.status_code == 429
    page = locked.content.decode()
    assert "Too many failed logins for “olga” from your address" in page
    assert "manage.py axes_reset_username NAME" in page and "0:15:00" in page
    assert "_auth_user_id" not in client.session


def test_another_address_is_not_locked_out(user):
    for i in range(LIMIT):
        _login(Client(REMOTE_ADDR="10.0.0.7"), f"wrong-{i}")
    assert _login(Client(REMOTE_ADDR="10.0.0.7"), PASSWORD).status_code == 429
    assert _login(Client(REMOTE_ADDR="10.0.0.8"), PASSWORD).status_code == 302


def test_the_admin_login_is_throttled_too(user):
    client = Client(REMOTE_ADDR="10.0.0.9")
    for i in range(LIMIT):
        _login(client, f"wrong-{i}", url="/admin/login/")
    assert _login(client, PASSWORD, url="/admin/login/").status_code == 429
    assert _login(client, PASSWORD).status_code == 429  # the same lock on the other form


def test_the_reset_command_lifts_the_lock(user):
    client = Client(REMOTE_ADDR="10.0.0.7")
    for i in range(LIMIT):
        _login(client, f"wrong-{i}")
    assert _login(client, PASSWORD).status_code == 429
    call_command("axes_reset_username", "olga")
    assert _login(client, PASSWORD).status_code == 302


def test_a_success_resets_the_count(user):
    client = Client(REMOTE_ADDR="10.0.0.7")
    for i in range(LIMIT - 1):
        _login(client, f"wrong-{i}")
    assert _login(client, PASSWORD).status_code == 302
    for i in range(LIMIT - 1):
        assert _login(Client(REMOTE_ADDR="10.0.0.7"), f"again-{i}").status_code == 200
