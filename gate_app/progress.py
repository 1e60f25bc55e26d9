"""Job progress over the channel layer: every event for job N goes to the group `job-N`, which
the WebSocket consumer of each open page joins. Only a cross-process layer (Redis) carries events
from a worker process to the web server; with the in-memory layer pages poll the job's state
instead. Publishing never fails a job: the database row is the truth, events are a courtesy. (A job's whole
state, after a change of status, is published by gate_app.queue.)
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

EVENT_TYPE = "job.event"  # the consumer's handler: JobConsumer.job_event
_warned = False


def group_name(job_id: int) -> str:
    return f"job-{int(job_id)}"


def _message(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": EVENT_TYPE, "event": event}


def publish(job_id: int, event: dict[str, Any]) -> bool:
    """Send `event` to the job's group from synchronous code; False if it could not be sent."""
    global _warned
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        async_to_sync(layer.group_send)(group_name(job_id), _message(event))
    except Exception as exc:  # a Redis outage must not fail the work it reports on
        if not _warned:
            log.warning("job progress not published (%s: %s); pages still see the job by polling",
                        type(exc).__name__, exc)
            _warned = True
        return False
    return True


async def apublish(job_id: int, event: dict[str, Any]) -> bool:
    """`publish` for async code."""
    layer = get_channel_layer()
    if layer is None:
        return False
    await layer.group_send(group_name(job_id), _message(event))
    return True

