"""WebSocket URL patterns, mounted by asgi.py; consumers for live job progress will go here."""

websocket_urlpatterns: list = []
