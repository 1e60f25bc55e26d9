"""Compressed responses: pages gzip-compressed on request; static files served by WhiteNoise, under
hashed names with year-long caching and pre-compressed (brotli, gzip) once collected, under their
plain names before (a fresh checkout, the test suite)."""

from __future__ import annotations

import fcntl
import gzip
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import brotli
import pytest
from django.contrib.staticfiles import finders
from django.test import Client, override_settings

from services import REPO
from shared_cache import SHARED_ENV
from web_server import daphne_server

pytestmark = pytest.mark.django_db
YEAR = 315360000  # WhiteNoise's max-age for files whose names carry their hash


def test_pages_are_gzipped_when_the_client_accepts_it():
    plain = Client().get("/kernels/")
    packed = Client().get("/kernels/", HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert "Content-Encoding" not in plain
    assert packed["Content-Encoding"] == "gzip" and "Accept-Encoding" in packed["Vary"]
    assert gzip.decompress(packed.content) == plain.content
    assert len(packed.content) < len(plain.content) / 2


def _fetch(url: str, encoding: str = "") -> tuple[dict, bytes]:
    request = urllib.request.Request(url, headers={"Accept-Encoding": encoding} if encoding else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(response.headers), response.read()


def _collectstatic(data: Path) -> None:
    env = {**os.environ, "KLINEAGE_DATA_DIR": str(data)}
    env.pop("DATABASE_URL", None)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=REPO, env=env, check=True,
                   timeout=600)


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """A data dir after `collectstatic` (as `make run` leaves it), made once a run in the run's shared folder
    (tests/shared_cache.py): xdist's work stealing splits this module over both workers, and each ran
    collectstatic (about 5 s) for the same files. A worker that finds it under way waits for it; the one
    test that serves it (a daphne server, its database and log in the folder) runs once."""
    shared = os.environ.get(SHARED_ENV)
    if not shared:
        data = tmp_path_factory.mktemp("collected")
        _collectstatic(data)
        return data
    data = Path(shared) / "collected"
    with open(Path(shared) / "collected.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not data.is_dir():
            partial = Path(shared) / f"collected.{os.getpid()}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            _collectstatic(partial)
            partial.rename(data)  # whole, or not there
    return data


def test_collected_static_files_are_hashed_cached_and_precompressed(collected):
    source = (REPO / "static/css/klineage.css").read_bytes()
    with daphne_server(collected) as base:
        _, page = _fetch(base + "/")
        css = re.search(rb'href="(/static/css/klineage\.[0-9a-f]{12}\.css)"', page)
        assert css, "the page links the hashed name"
        headers, body = _fetch(base + css.group(1).decode(), "br")
        assert headers["Content-Encoding"] == "br" and brotli.decompress(body) == source
        assert f"max-age={YEAR}" in headers["Cache-Control"] and "immutable" in headers["Cache-Control"]
        headers, body = _fetch(base + css.group(1).decode(), "gzip")
        assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == source
        script = re.search(rb'src="(/static/js/anchors\.[0-9a-f]{12}\.js)"', page)
        assert script and _fetch(base + script.group(1).decode())[1] == (REPO / "static/js/anchors.js").read_bytes()


def test_hashed_names_are_found_where_static_files_come_from_the_finders(collected, live_server):
    """The test suite's live server (and DEBUG's runserver) serve static files through the finders,
    not WhiteNoise: the collected copies under hashed names must be found there too."""
    with override_settings(STATIC_ROOT=collected / "static"):
        page = Client().get("/").content.decode()
        css = re.search(r'href="/static/(css/klineage\.[0-9a-f]{12}\.css)"', page)
        assert css, "the page links the hashed name"
        assert finders.find(css.group(1)) == str(collected / "static" / css.group(1))
        assert finders.find("css/klineage.css") == str(REPO / "static/css/klineage.css")  # the source first
        headers, body = _fetch(live_server.url + "/static/" + css.group(1))
        assert body == (REPO / "static/css/klineage.css").read_bytes()


def test_without_collectstatic_pages_link_plain_names_that_are_served(tmp_path):
    with daphne_server(tmp_path) as base:
        _, page = _fetch(base + "/")
        assert b'href="/static/css/klineage.css"' in page
        headers, body = _fetch(base + "/static/css/klineage.css", "gzip")
        assert headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(body) == (REPO / "static/css/klineage.css").read_bytes()
