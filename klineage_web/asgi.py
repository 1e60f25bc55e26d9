"""ASGI entry point: Django for HTTP, Channels for WebSockets.

Serve with `daphne klineage_web.asgi:application`.
"""

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "klineage_web.settings")

# Set Django up before importing anything that touches models (channels.auth, consumers).
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from klineage_web.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Local-first: serve the dashboard's CSS without a separate web server or collectstatic.
        "http": ASGIStaticFilesHandler(django_application),
        # Browsers send cookies cross-site on WebSocket upgrades and CSRF checks don't apply,
        # so only pages from our own hosts may open one.
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
