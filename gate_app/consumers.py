"""Live job progress over a WebSocket: ws/jobs/<id>/.

On connect the consumer joins the job's group first, then sends the job's full state, so no event
published in between is missed (one may arrive twice; events carry whole values, not deltas).
After that it forwards every event the workers publish. Without a cross-process channel layer no
worker event arrives, and the state says so ("poll": true): the page polls /jobs/<id>/state.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from gate_app import progress

CLOSE_UNAUTHORISED = 4401
CLOSE_NOT_FOUND = 4404


@database_sync_to_async
def _state(job_id: int) -> dict | None:
    from gate_app.models import Job
    from gate_app.queue import describe

    job = Job.objects.select_related("owner").filter(pk=job_id).first()
    return describe(job) if job is not None else None


class JobConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        self.group = progress.group_name(self.job_id)
        user = self.scope.get("user")
        if not settings.KLINEAGE_READ_OPEN and not (user is not None and user.is_authenticated):
            await self.close(code=CLOSE_UNAUTHORISED)
            return
        await self.channel_layer.group_add(self.group, self.channel_name)
        state = await _state(self.job_id)
        if state is None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.accept()
        await self.send_json({"type": "state", "job": state})

    async def disconnect(self, code):
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        # Clients may ask for the whole state again (after a reconnect, say); nothing else.
        if isinstance(content, dict) and content.get("type") == "state":
            state = await _state(self.job_id)
            if state is not None:
                await self.send_json({"type": "state", "job": state})

    async def job_event(self, message):
        await self.send_json(message["event"])
