"""A real daphne server on loopback for tests of what only a running server shows (body limits,
HEAD, headers): its own data dir with a migrated SQLite database, stopped when the test ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from services import REPO, free_port


@contextmanager
def daphne_server(data_dir: Path, **env_extra: str) -> Iterator[str]:
    """The server's base URL, http://127.0.0.1:PORT."""
    env = {**os.environ, "KLINEAGE_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1", **env_extra}
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True, timeout=300)
    port = free_port()
    log = open(data_dir / "daphne.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "klineage_web.asgi:application"], cwd=REPO, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(base, server)
        yield base
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def wait_until_up(base: str, server: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            urllib.request.urlopen(base + "/healthz", timeout=2).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the server at {base} did not answer within {timeout_s} s")
