"""Refuse a request body larger than any page accepts before anything reads it.

The largest legitimate body is an upload of a problem file, a kernel source and a launch plan at
their limits (`gate_app.uploads.LIMITS`); without this, Django would spool a far larger body to a
temporary file (the CSRF check parses it) before the upload's own size check refused it.
"""

from __future__ import annotations

from django.http import HttpResponse

FORM_OVERHEAD = 64 * 1024  # multipart boundaries, headers and the small fields around the files


def largest_body() -> int:
    from gate_app.uploads import LIMITS

    return sum(LIMITS.values()) + FORM_OVERHEAD


class BodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.limit = largest_body()

    def __call__(self, request):
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return HttpResponse("Content-Length is not a number.\n", status=400, content_type="text/plain")
        if declared > self.limit:
            return HttpResponse(f"The request body is {declared} bytes; the most any page here accepts is "
                                f"{self.limit} bytes (an upload's files at their limits).\n",
                                status=413, content_type="text/plain")
        return self.get_response(request)
