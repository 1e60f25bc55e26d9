"""Settings that hold only when the site is served over HTTPS (KLINEAGE_HTTPS): secure cookies, HSTS,
a redirect from plain HTTP, and a Content-Security-Policy.

The policy allows what the pages use and nothing more: scripts only from our own static files (or
an inline script carrying the per-request nonce, `<script nonce="{{ request.csp_nonce }}">`), no
eval; styles from our CSS plus `style="..."` attributes (the templates set widths of bars that
way); images from ourselves and data: URLs (SVG charts); fetches and WebSockets to ourselves.
"""

from __future__ import annotations

from typing import Any

from csp.constants import NONCE, NONE, SELF, UNSAFE_INLINE

HSTS_SECONDS = 365 * 24 * 3600

POLICY = {
    "default-src": [SELF],
    "script-src": [SELF, NONCE],
    "style-src": [SELF, UNSAFE_INLINE],
    "img-src": [SELF, "data:"],
    "font-src": [SELF],
    "connect-src": [SELF],
    "object-src": [NONE],
    "base-uri": [SELF],
    "form-action": [SELF],
    "frame-ancestors": [NONE],
}


def https_settings(https: bool) -> dict[str, Any]:
    if not https:
        # A local-first tool is usually reached as http://localhost, where secure cookies would make
        # login impossible and HSTS would pin the browser to an HTTPS that is not there.
        return {"SESSION_COOKIE_SECURE": False, "CSRF_COOKIE_SECURE": False}
    return {
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": HSTS_SECONDS,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_REDIRECT_EXEMPT": [r"^healthz$"],  # load balancers probe over plain HTTP
        # The TLS-terminating proxy in front says so (docs/deployment.md: it must set this header).
        "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https"),
        "CONTENT_SECURITY_POLICY": {"DIRECTIVES": POLICY},
    }
