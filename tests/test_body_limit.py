"""A body over the limit is refused before it is read: by daphne itself as the headers (or the
chunks of a body without a length) arrive, and by the ASGI middleware for servers that stream."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.testing import ApplicationCommunicator

from klineage_web.body_limit import AsgiBodyLimit, largest_body
from web_server import daphne_server, send_until_answered

HUGE = 600 * 1024 * 1024
CAP = 64 * 1024 * 1024  # the test never sends more than this; the server must answer long before
CHUNK = 64 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with daphne_server(tmp_path_factory.mktemp("body_limit")) as base:
        yield base


def _send_until_answered(base: str, head: bytes, piece: bytes) -> tuple[int, bytes]:
    return send_until_answered(int(base.rsplit(":", 1)[1]), head, piece, cap=CAP)


def test_a_declared_600_mb_body_gets_413_before_the_body_is_read(server):
    head = (b"POST /upload/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % HUGE)
    started = time.monotonic()
    sent, answer = _send_until_answered(server, head, b"x" * CHUNK)
    took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"the most any page here accepts is %d bytes" % largest_body() in answer
    assert b"%d bytes" % HUGE in answer
    # What got out before the answer sits in socket buffers: a few MB, not 600.
    assert sent < CAP, f"sent {sent} bytes without an answer"
    assert took < 30
    print(f"413 after {sent / 1e6:.1f} MB sent of {HUGE / 1e6:.0f} MB, {took:.2f} s")


def test_a_chunked_body_without_a_length_is_cut_off_past_the_limit(server):
    head = (b"POST /upload/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    piece = b"%x\r\n%s\r\n" % (CHUNK, b"y" * CHUNK)
    sent, answer = _send_until_answered(server, head, piece)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"sent without a length" in answer
    assert largest_body() < sent < CAP


def test_over_tls_the_413_arrives_too(tmp_path):
    """Under TLS there is no half-close: the answer is flushed, then the connection closed."""
    with daphne_server(tmp_path, tls=True) as base:
        head = (b"POST /upload/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % HUGE)
        sent, answer = send_until_answered(int(base.rsplit(":", 1)[1]), head, b"x" * CHUNK, cap=CAP, tls=True)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < CAP


def test_a_body_within_the_limit_reaches_django(server):
    body = b"username=a&password=b"
    head = (b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    _, answer = _send_until_answered(server, head, b"")
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]  # Django's CSRF check read it


# The ASGI middleware, for servers that hand the body over as it arrives (uvicorn, hypercorn).


def _scope(headers):
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/upload/", "raw_path": b"/upload/", "query_string": b"", "root_path": "",
            "headers": [(b"host", b"127.0.0.1"), *headers], "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8000)}


async def _downstream(scope, messages):
    calls = []

    async def inner(scope, receive, send):
        while True:
            message = await receive()
            calls.append(message["type"])
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        if calls[-1] != "http.disconnect":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"read it all"})

    communicator = ApplicationCommunicator(AsgiBodyLimit(inner), scope)
    for message in messages:
        await communicator.send_input(message)
    start = await communicator.receive_output(timeout=5)
    body = await communicator.receive_output(timeout=5)
    await communicator.wait(timeout=5)
    return start, body, calls


def test_asgi_middleware_refuses_a_declared_length_without_receiving():
    start, body, calls = asyncio.run(_downstream(_scope([(b"content-length", str(HUGE).encode())]), []))
    assert start["status"] == 413 and b"%d bytes" % HUGE in body["body"]
    assert calls == [], "the application never ran"


def test_asgi_middleware_cuts_a_streamed_body_past_the_limit():
    pieces = [{"type": "http.request", "body": b"z" * CHUNK, "more_body": True}
              for _ in range(largest_body() // CHUNK + 2)]
    start, body, calls = asyncio.run(_downstream(_scope([]), pieces))
    assert start["status"] == 413 and b"sent without a length" in body["body"]
    # Every piece within the limit reached the application; the one past it became a disconnect.
    assert calls == ["http.request"] * (largest_body() // CHUNK) + ["http.disconnect"]
