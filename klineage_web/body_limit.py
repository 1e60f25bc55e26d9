"""Refuse a request body larger than any page accepts before anything reads it.

The largest legitimate body is an upload of a problem file, a kernel source and a launch plan at
their limits (`gate_app.uploads.LIMITS`). Django reads the whole body before any middleware runs
under ASGI, and daphne (Twisted) even before the application is called, so the refusal sits at
three depths, each acting before the next would read:

- `install_in_daphne()`: daphne's request object, as the headers arrive (Content-Length) and as
  chunks of a body without one arrive; the connection is answered 413 and the rest is discarded.
- `AsgiBodyLimit`: ASGI servers that stream the body to the application (uvicorn, hypercorn).
- `BodyLimitMiddleware`: the WSGI entry point, where Django reads the body lazily.
"""

from __future__ import annotations

import functools

from django.http import HttpResponse

FORM_OVERHEAD = 64 * 1024  # multipart boundaries, headers and the small fields around the files
LINGER_SECONDS = 2.0  # how long a refused upload's remaining bytes are drained so the client sees the 413


@functools.cache
def largest_body() -> int:
    from gate_app.uploads import LIMITS

    return sum(LIMITS.values()) + FORM_OVERHEAD


def refusal(size: int | None) -> str:
    """The 413 message: the size declared, or how far a body without a length got."""
    said = f"The request body is {size} bytes" if size is not None else "The request body (sent without a length) " \
        "grew past the limit"
    return f"{said}; the most any page here accepts is {largest_body()} bytes (an upload's files at their limits).\n"


def declared_length(value: str | bytes | None) -> int | None:
    """Content-Length as a number; None when absent; ValueError when it is not a number."""
    if value is None or value in ("", b""):
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if not text.strip().isdigit():
        raise ValueError(text)
    return int(text)


class BodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            declared = declared_length(request.META.get("CONTENT_LENGTH"))
        except ValueError:
            return HttpResponse("Content-Length is not a number.\n", status=400, content_type="text/plain")
        if declared is not None and declared > largest_body():
            return HttpResponse(refusal(declared), status=413, content_type="text/plain")
        return self.get_response(request)


class AsgiBodyLimit:
    """ASGI middleware: 413 on a declared length over the limit before receiving anything; a body
    streamed without one is counted as it arrives and cut off (the application sees a disconnect)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", []))
        try:
            declared = declared_length(headers.get(b"content-length"))
        except ValueError:
            return await _answer(send, 400, "Content-Length is not a number.\n")
        if declared is not None and declared > largest_body():
            return await _answer(send, 413, refusal(declared))
        received = 0
        refused = False

        async def counted():
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > largest_body():
                    refused = True
                    await _answer(send, 413, refusal(None))
                    return {"type": "http.disconnect"}  # Django stops reading and sends nothing
            return message

        return await self.app(scope, counted, send)


async def _answer(send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"%d" % len(body)),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_in_daphne() -> None:
    """Make daphne build its requests from `LimitedWebRequest`; a no-op where daphne is not installed.

    Daphne names its request class in `HTTPFactory.buildProtocol` by a module-level lookup, and
    offers no setting for a body limit: replacing that name is the one hook there is. The
    application module is imported before the server listens, so every connection gets it.
    """
    try:
        from daphne import http_protocol
    except ImportError:
        return
    if not issubclass(http_protocol.WebRequest, _LimitMixin):
        http_protocol.WebRequest = type("LimitedWebRequest", (_LimitMixin, http_protocol.WebRequest), {})


class _LimitMixin:
    """Twisted request callbacks that refuse an oversize body as it arrives, not after."""

    refused = False
    body_seen = 0

    def gotLength(self, length):  # noqa: N802 - Twisted's name
        if length is not None and length > largest_body():
            self._refuse(length)
            return
        super().gotLength(length)

    def handleContentChunk(self, data):  # noqa: N802 - Twisted's name
        if self.refused:
            return  # drained, never stored
        self.body_seen += len(data)
        if self.body_seen > largest_body():
            self._refuse(None)
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version):  # noqa: N802 - Twisted's name
        if not self.refused:  # a refused body that did finish must not reach the application
            super().requestReceived(command, path, version)

    def _refuse(self, size: int | None) -> None:
        from twisted.internet import reactor
        from twisted.internet.interfaces import ISSLTransport

        self.refused = True
        if getattr(self, "content", None) is not None:
            self.content.close()
        body = refusal(size).encode()
        transport = self.channel.transport
        transport.write(b"HTTP/1.1 413 Content Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        if ISSLTransport.providedBy(transport):
            transport.loseConnection()  # TLS: flushes the answer, then close_notify (no half-close in TLS)
        else:
            # Half-close: the client reads the answer and an end of stream while its remaining bytes
            # are drained (closing outright could reset the connection before it reads the 413).
            transport.loseWriteConnection()
        reactor.callLater(LINGER_SECONDS, transport.abortConnection)
