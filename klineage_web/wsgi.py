"""WSGI entry point, for servers without WebSockets (pages then poll for progress)."""

import os

from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "klineage_web.settings")

# Local-first: serve the dashboard's CSS without a separate web server or collectstatic.
application = StaticFilesHandler(get_wsgi_application())
