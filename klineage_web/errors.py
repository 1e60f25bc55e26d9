"""Server-error pages: a SQLite database locked by another writer answers 503 with a message.

Django hands every unhandled exception of a request (a view's, a middleware's, the session
save's) to `handler500` inside its `except` block, so the exception is at hand there. SQLite waits
for the lock for the connection's timeout (settings: 20 s) before it gives up; what remains is
contention a retry a moment later resolves, which 503 with Retry-After says.
"""

from __future__ import annotations

import sys

from django.db import OperationalError
from django.http import HttpResponse

from klineage_web.error_views import server_error

RETRY_AFTER_SECONDS = 5


def database_locked(exc: BaseException | None) -> bool:
    return isinstance(exc, OperationalError) and "database is locked" in str(exc).lower()


def handler500(request):
    if database_locked(sys.exc_info()[1]):
        response = HttpResponse(
            "The database is busy: another process holds its write lock (SQLite allows one writer at a time), "
            "so this request could not finish. Try again in a few seconds; if this persists, a job or command "
            "is holding the lock, or the instance has outgrown SQLite (PostgreSQL: docs/deployment.md).\n",
            status=503, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    return server_error(request)
