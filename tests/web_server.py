"""A real daphne server on loopback for tests of what only a running server shows (body limits,
HEAD, headers): its own data dir with a migrated SQLite database, stopped when the test ends."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services import REPO, free_port

# Only for the throw-away certificate of daphne_server(tls=True).
UNVERIFIED = ssl.create_default_context()
UNVERIFIED.check_hostname = False
UNVERIFIED.verify_mode = ssl.CERT_NONE


@contextmanager
def daphne_server(data_dir: Path, *, tls: bool = False, **env_extra: str) -> Iterator[str]:
    """The server's base URL, http://127.0.0.1:PORT (https:// with `tls`: a throw-away self-signed
    certificate, which clients must not verify)."""
    env = {**os.environ, "KLINEAGE_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1", **env_extra}
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True, timeout=300)
    port = free_port()
    if tls:
        key, cert = data_dir / "tls.key", data_dir / "tls.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
        listen = ["-e", f"ssl:{port}:interface=127.0.0.1:privateKey={key}:certKey={cert}"]
    else:
        listen = ["-b", "127.0.0.1", "-p", str(port)]
    log = open(data_dir / "daphne.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "daphne", *listen, "klineage_web.asgi:application"], cwd=REPO,
                              env=env, stdout=log, stderr=log)
    base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
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
            urllib.request.urlopen(base + "/healthz", timeout=2, context=UNVERIFIED).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the server at {base} did not answer within {timeout_s} s")


def send_until_answered(port: int, head: bytes, piece: bytes, *, cap: int, limit_s: float = 60,
                        tls: bool = False) -> tuple[int, bytes]:
    """Send `head`, then `piece` over and over until the server answers (or `cap` bytes of body went
    out, or the time ran out): the bytes of body sent, and the start of the answer."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with UNVERIFIED.wrap_socket(raw) if tls else raw as sock:
        sock.sendall(head)
        sock.setblocking(False)
        sent, answer = 0, b""
        deadline = time.monotonic() + limit_s
        while sent < cap and time.monotonic() < deadline:
            try:
                answer = sock.recv(65536)
                break  # an answer, or the end of the stream
            except (BlockingIOError, ssl.SSLWantReadError):
                pass
            try:
                sent += sock.send(piece)
            except (BlockingIOError, ssl.SSLWantWriteError):
                time.sleep(0.005)  # the server stopped reading: its answer is on the way
            except OSError:
                break
        sock.settimeout(10)
        try:
            while b"\r\n\r\n" not in answer:
                more = sock.recv(65536)
                if not more:
                    break
                answer += more
        except OSError:
            pass
    return sent, answer


def gate_workers(parent: int) -> list[int]:
    """The live `gate_worker` processes whose parent is `parent` (a `manage.py serve`)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            cmdline = (status.parent / "cmdline").read_text()
        except OSError:
            continue
        if f"PPid:\t{parent}\n" in text and "gate_worker" in cmdline and "zombie" not in text:
            found.append(int(status.parent.name))
    return found


def wait_for(until, timeout_s: float):
    """`until()`'s first truthy value within the time, polled every 0.1 s; None if none came."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = until()
        if value:
            return value
        time.sleep(0.1)
    return None
