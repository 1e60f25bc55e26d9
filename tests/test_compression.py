"""Compressed responses: pages gzip-compressed on request; static files served by WhiteNoise, under
hashed names with year-long caching and pre-compressed (brotli, gzip) once collected, under their
plain names before (a fresh checkout, the test suite)."""

from __future__ import annotations

import brotli
import gzip
import os
import re
import subprocess
import sys
import urllib.request

import pytest
from django.test import Client

from services import REPO
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


def test_collected_static_files_are_hashed_cached_and_precompressed(tmp_path):
    env = {**os.environ, "KLINEAGE_DATA_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=REPO, env=env, check=True,
                   timeout=600)
    source = (REPO / "static/css/klineage.css").read_bytes()
    with daphne_server(tmp_path) as base:
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


def test_without_collectstatic_pages_link_plain_names_that_are_served(tmp_path):
    with daphne_server(tmp_path) as base:
        _, page = _fetch(base + "/")
        assert b'href="/static/css/klineage.css"' in page
        headers, body = _fetch(base + "/static/css/klineage.css", "gzip")
        assert headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(body) == (REPO / "static/css/klineage.css").read_bytes()
