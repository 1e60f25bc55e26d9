"""`manage.py serve`, the README's main command: the dashboard and one local worker, stopped together."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from klineage_web.env import SQLITE_FILE
from services import REPO, sqlite_template  # noqa: F401  (fixture)


def _children(pid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(pid):
            found.append(int(status.parent.name))
    return found


def _gone(pid: int) -> bool:
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_serve_runs_the_dashboard_and_a_worker_and_stops_both(tmp_path, sqlite_template):  # noqa: F811
    env = {**os.environ, "KLINEAGE_DATA_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    # the default database, migrated: the run's migrated template (what `manage.py migrate` would make, less a start)
    shutil.copyfile(sqlite_template, tmp_path / SQLITE_FILE)
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert '"status": "ok"' in body
        workers = _children(server.pid)
        assert len(workers) == 1, "one local gate worker runs beside the server"
        assert "gate_worker" in Path(f"/proc/{workers[0]}/cmdline").read_text()
    finally:
        server.send_signal(signal.SIGTERM)
        output = server.communicate(timeout=60)[0]
    assert "gate worker started" in output
    deadline = time.monotonic() + 1  # the worker is gone (or a zombie) within a second of the server
    while not _gone(workers[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(workers[0])
