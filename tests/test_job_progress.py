"""Job progress to pages: the WebSocket consumer (full state on connect, then events) over the
in-memory layer and over Redis, events from a real worker process reaching it through Redis,
and the JSON state that pages poll when there is no cross-process layer."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator

from gate_app import progress, queue
from gate_app.models import Job
from job_kinds import ENV
from klineage_web.asgi import application
from services import REPO, redis_url, sqlite_job_database, sqlite_template  # noqa: F401  (fixtures)

ORIGIN = [(b"origin", b"http://localhost")]


pytestmark = pytest.mark.usefixtures("sleep_kind")  # tests/job_kinds.py


@pytest.fixture(params=["in-memory", "redis"])
def layer(request, settings):
    """The channel layer as the web server would have it: in-memory, or Redis (cross-process)."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                               "CONFIG": {"hosts": [url]}}}
        settings.KLINEAGE_CROSS_PROCESS_PROGRESS = True
    else:
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
        settings.KLINEAGE_CROSS_PROCESS_PROGRESS = False
    channel_layers.backends = {}
    yield request.param
    channel_layers.backends = {}


def _run(coroutine):
    return asyncio.run(coroutine)


def _publish_from_another_process(redis: str, data_dir, job_id: int, event: dict) -> None:
    script = ("import django, json, os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'klineage_web.settings'; "
              "django.setup(); from gate_app import progress; "
              "sys.exit(0 if progress.publish(int(sys.argv[1]), json.loads(sys.argv[2])) else 1)")
    env = {**os.environ, "REDIS_URL": redis, "KLINEAGE_DATA_DIR": str(data_dir)}
    done = subprocess.run([sys.executable, "-c", script, str(job_id), json.dumps(event)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_full_state_on_connect_then_events(sqlite_job_database, layer, tmp_path, request):
    job = queue.enqueue("sleep", {"seconds": 1})
    event = {"type": "progress", "job": job.pk, "progress": {"fraction": 0.5, "stage": "sleep", "message": "half"},
             "log": "sleep: half"}

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/", headers=ORIGIN)
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        first = await communicator.receive_json_from(timeout=10)
        assert first["type"] == "state"
        assert first["job"]["id"] == job.pk
        assert first["job"]["status"] == "queued"
        assert first["job"]["kind"] == "sleep"
        assert "log" in first["job"]
        # Pages poll exactly when events cannot come from worker processes.
        assert first["job"]["poll"] is (layer == "in-memory")
        if layer == "redis":
            await sync_to_async(_publish_from_another_process)(request.getfixturevalue("redis_url"), tmp_path,
                                                               job.pk, event)
        else:
            await sync_to_async(progress.publish)(job.pk, event)  # as synchronous code in this process does
        assert await communicator.receive_json_from(timeout=10) == event
        # Events for other jobs do not arrive here.
        await progress.apublish(job.pk + 1000, {"type": "progress", "job": job.pk + 1000})
        assert await communicator.receive_nothing(timeout=0.3)
        # A status change publishes the whole state.
        await sync_to_async(queue.cancel)(job.pk)
        changed = await communicator.receive_json_from(timeout=10)
        assert changed["type"] == "state" and changed["job"]["status"] == "cancelled"
        await communicator.send_json_to({"type": "state"})
        again = await communicator.receive_json_from(timeout=10)
        assert again["job"]["status"] == "cancelled"
        await communicator.disconnect()

    _run(scenario())


def test_unknown_job_is_refused(sqlite_job_database, layer):
    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/jobs/999999/", headers=ORIGIN)
        connected, code = await communicator.connect(timeout=10)
        assert not connected and code == 4404

    _run(scenario())


def test_read_closed_refuses_anonymous_visitors(sqlite_job_database, settings):
    settings.KLINEAGE_READ_OPEN = False
    job = queue.enqueue("sleep", {})

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/", headers=ORIGIN)
        connected, code = await communicator.connect(timeout=10)
        assert not connected and code == 4401

    _run(scenario())


def test_events_from_a_worker_process_reach_the_page_through_redis(sqlite_job_database, redis_url, settings,
                                                                   tmp_path):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [redis_url]}}}
    settings.KLINEAGE_CROSS_PROCESS_PROGRESS = True
    channel_layers.backends = {}
    job = queue.enqueue("sleep", {"seconds": 1.0, "steps": 4})
    env = {**os.environ, "DATABASE_URL": sqlite_job_database.url, "REDIS_URL": redis_url,
           "KLINEAGE_DATA_DIR": str(tmp_path / "data"), **ENV}

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/", headers=ORIGIN)
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        assert (await communicator.receive_json_from(timeout=10))["job"]["status"] == "queued"
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "manage.py", "gate_worker", "--lease-seconds", "5", cwd=REPO, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        try:
            seen = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                message = await communicator.receive_json_from(timeout=30)
                seen.append(message)
                if message["type"] == "state" and message["job"]["status"] == "succeeded":
                    break
            fractions = [m["progress"]["fraction"] for m in seen if m["type"] == "progress"]
            assert fractions and fractions == sorted(fractions) and fractions[-1] == 1.0, seen
            assert any(m["type"] == "progress" and m["progress"]["stage"] == "sleep" for m in seen)
            final = seen[-1]
            assert final["type"] == "state" and final["job"]["status"] == "succeeded"
            assert final["job"]["result"]["slept"] == 1.0
        finally:
            worker.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(worker.wait(), 20) == 0
        await communicator.disconnect()

    _run(scenario())


def test_polled_state(sqlite_job_database, client, settings):
    job = queue.enqueue("sleep", {"seconds": 1}, needs="gpu")
    response = client.get(f"/jobs/{job.pk}/state")
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0")
    state = response.json()
    assert state["id"] == job.pk and state["status"] == "queued" and state["needs"] == "gpu"
    assert state["waiting"].startswith("waits for a GPU worker: none is running")
    assert state["poll"] is (not settings.KLINEAGE_CROSS_PROCESS_PROGRESS)
    assert client.get("/jobs/999999/state").status_code == 404
    settings.KLINEAGE_READ_OPEN = False
    assert client.get(f"/jobs/{job.pk}/state").status_code == 403
    assert Job.objects.get(pk=job.pk).status == "queued"


def test_job_page_says_how_it_stays_current(sqlite_job_database, client, settings):
    from django.contrib.staticfiles import finders

    job = queue.enqueue("sleep", {"seconds": 1})
    page = client.get(f"/jobs/{job.pk}/")
    assert page.status_code == 200
    body = page.content.decode()
    assert f'data-state-url="/jobs/{job.pk}/state"' in body
    assert 'id="job-state"' in body and "gate_app/job.js" in body
    assert "Updated by polling" in body  # the default in-memory layer: no worker events reach pages
    assert finders.find("gate_app/job.js")
    settings.KLINEAGE_CROSS_PROCESS_PROGRESS = True
    assert "Updated live." in client.get(f"/jobs/{job.pk}/").content.decode()
    assert client.get("/jobs/999999/").status_code == 404
