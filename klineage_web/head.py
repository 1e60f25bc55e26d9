"""HEAD answers as GET would, without the body, on every page.

Function views guarded by `require_GET` (and views that only define `get`) refuse HEAD with 405,
which breaks uptime probes and link checkers. HEAD is as safe as GET, so the request runs as a GET
and only the body is dropped; Content-Length stays that of the body a GET would carry.
"""

from __future__ import annotations


class HeadAsGetMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method != "HEAD":
            return self.get_response(request)
        request.method = "GET"
        response = self.get_response(request)
        if response.streaming:
            response.close()  # a file response's file, or a generator's resources
            response.streaming_content = []
        else:
            response["Content-Length"] = str(len(response.content))
            response.content = b""
        return response
