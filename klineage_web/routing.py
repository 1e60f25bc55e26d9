"""WebSocket URL patterns, mounted by asgi.py: live job progress."""

from django.urls import path

from gate_app.consumers import JobConsumer

websocket_urlpatterns: list = [
    path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi()),
]
