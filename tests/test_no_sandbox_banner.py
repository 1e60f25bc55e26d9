"""While KLINEAGE_UNSAFE_NO_SANDBOX is set, every dashboard page warns that untrusted code runs
without the sandbox; unset or explicitly off, no page does."""

from __future__ import annotations

import pytest
from django.test import Client

from klineage_web.env import unsafe_no_sandbox

pytestmark = pytest.mark.django_db
PAGES = ["/", "/problems/", "/kernels/", "/verdicts/", "/library/", "/lineages/", "/review/", "/jobs/", "/api/docs/",
         "/accounts/login/"]
BANNER = "uploaded problem files and kernels run without the sandbox"


@pytest.mark.parametrize("path", PAGES)
def test_every_page_warns_while_it_is_set(monkeypatch, path):
    monkeypatch.setenv("KLINEAGE_UNSAFE_NO_SANDBOX", "1")
    page = Client().get(path).content.decode()
    assert BANNER in page and "data-unsafe-banner" in page


@pytest.mark.parametrize("value", [None, "", "0", "off"])
def test_no_warning_when_unset_or_off(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("KLINEAGE_UNSAFE_NO_SANDBOX", raising=False)
    else:
        monkeypatch.setenv("KLINEAGE_UNSAFE_NO_SANDBOX", value)
    assert BANNER not in Client().get("/kernels/").content.decode()


@pytest.mark.parametrize("value, shown", [("1", True), ("yes", True), ("typo", True), ("0", False), ("", False)])
def test_the_reader_errs_toward_warning(value, shown):
    assert unsafe_no_sandbox({"KLINEAGE_UNSAFE_NO_SANDBOX": value}) is shown
