"""A hostile problem file and the instance it attacks (issue 28), shared by tests/test_sandbox_isolation.py
and bench/security_report.py.

The problem file tries every attack at import and raises an exception whose message carries a JSON report
of what it saw (REPORT...TROPER): that message is the one channel every path (probe_problem, the CLI) shows.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import textwrap
import threading
from pathlib import Path
from typing import Self

# The tables an attacker wants from the dashboard's database: login sessions, API tokens and the users.
_SCHEMA = """
create table django_session (session_key text, session_data text);
create table authtoken_token (key text, user_id integer);
create table auth_user (id integer primary key, username text, is_superuser integer);
"""


def plant_instance(root: Path, secret: str) -> dict[str, Path]:
    """A data dir holding a secret key and a SQLite database whose session and token rows hold `secret`
    (and an ordinary user 'mallory'), and an empty cache dir; for KLINEAGE_DATA_DIR and KLINEAGE_CACHE_DIR."""
    data = root / "data"
    data.mkdir()
    (data / "secret_key").write_text(secret)
    database = data / "klineage.sqlite3"
    with sqlite3.connect(database) as db:
        db.executescript(_SCHEMA)
        db.execute("insert into django_session values (?, ?)", (secret, "{}"))
        db.execute("insert into authtoken_token values (?, 1)", (secret,))
        db.execute("insert into auth_user values (1, 'mallory', 0)")
    db.close()
    cache = root / "cache"
    cache.mkdir()
    return {"data": data, "database": database, "cache": cache}


def is_superuser(database: Path, username: str = "mallory") -> bool:
    with sqlite3.connect(database) as db:
        (flag,) = db.execute("select is_superuser from auth_user where username = ?", (username,)).fetchone()
    db.close()
    return bool(flag)


class Listener:
    """A TCP server on this host's loopback that records every connection it accepts (a context manager)."""

    def __init__(self) -> None:
        self.accepted: list[bool] = []
        self._server = socket.socket()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def port(self) -> int:
        return self._server.getsockname()[1]

    def __enter__(self) -> Self:
        self._server.bind(("127.0.0.1", 0))
        self._server.listen()
        self._server.settimeout(0.2)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._server.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            self.accepted.append(True)
            conn.close()


def hostile_problem(path: Path, targets: dict) -> Path:
    """A problem file that tries everything at import and raises a report of what worked.

    targets: secret, port, marker (the grandchild's command-line mark), read {name: path}, write
    {name: folder}; optional superuser (a SQLite path: make 'mallory' superuser) and tmp_marker (a path
    under /tmp to write)."""
    code = f"""
    import json, os, socket, sqlite3, subprocess, sys
    targets = json.loads({json.dumps(json.dumps(targets))})
    seen = {{"uid": os.getuid(), "read": {{}}, "wrote": {{}}, "environ_secrets": [], "pids": []}}
    for name, path in targets["read"].items():
        try:
            with open(path, "rb") as handle:
                seen["read"][name] = targets["secret"] in handle.read().decode("latin-1")
        except OSError as exc:
            seen["read"][name] = type(exc).__name__
    for name, folder in targets["write"].items():
        try:
            with open(os.path.join(folder, "forged.json"), "w") as handle:
                handle.write("{{}}")
            seen["wrote"][name] = True
        except OSError as exc:
            seen["wrote"][name] = type(exc).__name__
    if "superuser" in targets:
        try:  # mode=rw: open the dashboard's database, never create an empty one
            db = sqlite3.connect("file:" + targets["superuser"] + "?mode=rw", uri=True)
            db.execute("update auth_user set is_superuser = 1 where username = 'mallory'")
            db.commit()
            seen["superuser"] = True
        except sqlite3.Error as exc:
            seen["superuser"] = type(exc).__name__ + ": " + str(exc)
    if "tmp_marker" in targets:
        try:
            with open(targets["tmp_marker"], "w") as handle:
                handle.write("here")
            seen["tmp_marker"] = True
        except OSError as exc:
            seen["tmp_marker"] = type(exc).__name__
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            seen["pids"].append(int(pid))
            try:
                with open(f"/proc/{{pid}}/environ", "rb") as handle:
                    if targets["secret"].encode() in handle.read():
                        seen["environ_secrets"].append(int(pid))
            except OSError:
                pass
    try:
        socket.create_connection(("127.0.0.1", targets["port"]), timeout=3).close()
        seen["loopback"] = "connected"
    except OSError as exc:
        seen["loopback"] = type(exc).__name__
    # A grandchild in a session of its own, whose parent exits at once: it must still end with the job.
    subprocess.Popen([sys.executable, "-c", "import os, time; pid = os.fork(); pid and os._exit(0); os.setsid(); time.sleep(600)",
                      targets["marker"]], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raise RuntimeError("REPORT" + json.dumps(seen) + "TROPER")
    """  # noqa: E501  (the hostile code is kept as it runs, one statement a line)
    path.write_text(textwrap.dedent(code), encoding="utf-8")
    return path


def report(text: str) -> dict | None:
    """The hostile problem's report from an error message, or None when the message carries none."""
    start, end = text.find("REPORT"), text.rfind("TROPER")
    if start < 0 or end < start:
        return None
    return json.loads(text[start + len("REPORT"):end])


def processes_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids
