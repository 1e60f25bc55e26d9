"""A SQLite database whose write lock another process holds answers 503 with a message that says so
(and Retry-After), not a bare 500; other errors keep the usual 500 page."""

from __future__ import annotations

import sqlite3

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, RequestFactory

from klineage_web.errors import handler500
from services import sqlite_job_database, sqlite_template  # noqa: F401  (fixtures)


@pytest.fixture
def locked(sqlite_job_database):  # noqa: F811
    """The database with its write lock held by another connection; this process waits only briefly."""
    connection.close()
    connection.settings_dict["OPTIONS"]["timeout"] = 0.3  # the deployed 20 s would only slow the test
    User.objects.create_user("olga", password="the-right-password-1")
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_write_that_finds_the_database_locked_answers_503(locked):
    client = Client(raise_request_exception=False)
    response = client.post("/accounts/login/", {"username": "olga", "password": "wrong"})
    assert response.status_code == 503
    text = response.content.decode()
    assert "The database is busy: another process holds its write lock" in text
    assert "Try again in a few seconds" in text
    assert response["Retry-After"] == "5"


def test_reads_go_on_while_the_lock_is_held(locked):
    assert Client().get("/healthz").status_code == 200  # WAL: readers never wait for the writer


def test_other_errors_keep_the_500_page():
    request = RequestFactory().get("/")
    try:
        raise ValueError("something else")
    except ValueError:
        response = handler500(request)
    assert response.status_code == 500
