"""ASGI entry point: Django for HTTP, Channels for WebSockets.

Serve with `daphne klineage_web.asgi:application` (docs/deployment.md). Static files come from
WhiteNoise inside Django's middleware; request bodies over the limit are refused before they are
read (klineage_web/body_limit.py), in daphne itself and for servers that stream bodies.
"""

import os

from django.core.asgi import get_asgi_application

from klineage_web.body_limit import AsgiBodyLimit, install_in_daphne

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "klineage_web.settings")

# Set Django up before importing anything that touches models (channels.auth, consumers).
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from klineage_web.routing import websocket_urlpatterns  # noqa: E402

install_in_daphne()

application = ProtocolTypeRouter(
    {
        "http": AsgiBodyLimit(django_application),
        # Browsers send cookies cross-site on WebSocket upgrades and CSRF checks don't apply,
        # so only pages from our own hosts may open one.
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
