"""Throw-away services for tests, and databases to run the job queue against.

- A PostgreSQL cluster (initdb + postgres from the system packages) in a temporary folder, on a
  free localhost port, trusting local connections. PostgreSQL refuses to run as root, so under
  root the cluster belongs to the `postgres` user (or `nobody`) and its processes run as that user.
- A Redis server on a free localhost port that saves nothing.
- `job_database`: a fresh, migrated database for one test, SQLite (a file, as deployed) or
  PostgreSQL, swapped in as Django's "default" for the test's duration, so the code under test
  runs unchanged. Worker subprocesses reach the same database through its DATABASE_URL.

Tests that need PostgreSQL or Redis are skipped only when the binaries are absent; CI installs
them (apt-get install postgresql redis-server). Test modules import the fixtures they use, with
the ones those depend on: `from services import DATABASE_FIXTURES` names them.
bench/jobs_load.py uses the context managers.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PG_MISSING = "PostgreSQL server binaries (initdb, postgres) not found: apt-get install postgresql"
REDIS_MISSING = "redis-server not found: apt-get install redis-server"
PG_USER = "klineage"
# job_database needs all of these in the test module's namespace.
DATABASE_FIXTURES = ("job_database", "sqlite_job_database", "postgres_server", "postgres_template", "sqlite_template")


class ServiceError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _version(path: Path) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in path.parent.name.split("."))
    except ValueError:
        return (0,)


def postgres_bin_dir() -> Path | None:
    candidates = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version, reverse=True)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "postgres").is_file():
            return folder
    return None


def redis_binary() -> str | None:
    return shutil.which("redis-server")


@dataclass(frozen=True)
class PostgresServer:
    port: int
    user: str = PG_USER
    host: str = "127.0.0.1"

    def url(self, name: str) -> str:
        return f"postgres://{self.user}@{self.host}:{self.port}/{name}"

    def admin(self):
        import psycopg

        return psycopg.connect(host=self.host, port=self.port, user=self.user, dbname="postgres", autocommit=True)

    def create_database(self, name: str, template: str | None = None) -> None:
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _service_account() -> pwd.struct_passwd | None:
    """Who runs PostgreSQL: ourselves, unless we are root (which initdb refuses)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise ServiceError("running as root and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL")


@contextmanager
def postgres_cluster() -> Iterator[PostgresServer]:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise ServiceError(PG_MISSING)
    account = _service_account()
    as_user: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="klineage-pg-"))
    if account is not None:
        os.chown(root, account.pw_uid, account.pw_gid)
        as_user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    data = root / "data"
    log_path = root / "server.log"
    proc = None
    try:
        done = subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust",
                               "--encoding=UTF8", "--no-locale", "--no-sync"], cwd=root, capture_output=True,
                              text=True, timeout=120, **as_user)
        if done.returncode != 0:
            raise ServiceError(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")
        for _ in range(3):  # the free port may be taken between choosing it and binding it
            port = free_port()
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1",
                     "-c", f"unix_socket_directories={root}", "-c", "fsync=off", "-c", "synchronous_commit=off",
                     "-c", "full_page_writes=off", "-c", "max_connections=300"],
                    cwd=root, stdout=log, stderr=subprocess.STDOUT, **as_user)
            server = PostgresServer(port)
            if _wait_for(lambda: _pg_ready(server), proc, timeout_s=30):
                break
            _stop(proc, signal.SIGINT)
            proc = None
        if proc is None:
            raise ServiceError(f"PostgreSQL did not start: {log_path.read_text(errors='replace')[-2000:]}")
        yield server
    finally:
        if proc is not None:
            _stop(proc, signal.SIGINT)  # fast shutdown
        shutil.rmtree(root, ignore_errors=True)


def _pg_ready(server: PostgresServer) -> bool:
    import psycopg

    try:
        with server.admin():
            return True
    except psycopg.OperationalError:
        return False


@contextmanager
def redis_server() -> Iterator[str]:
    """A Redis server on a free port; yields its redis:// URL."""
    exe = redis_binary()
    if exe is None:
        raise ServiceError(REDIS_MISSING)
    root = Path(tempfile.mkdtemp(prefix="klineage-redis-"))
    proc = None
    try:
        for _ in range(3):
            port = free_port()
            proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                     "no", "--dir", str(root), "--protected-mode", "yes"],
                                    cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            url = f"redis://127.0.0.1:{port}/0"
            if _wait_for(lambda: _redis_ready(url), proc, timeout_s=15):
                break
            _stop(proc, signal.SIGTERM)
            proc = None
        if proc is None:
            raise ServiceError("redis-server did not start")
        yield url
    finally:
        if proc is not None:
            _stop(proc, signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def _redis_ready(url: str) -> bool:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except redis.RedisError:
        return False


def _wait_for(ready, proc: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if ready():
            return True
        time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# Databases for Django --------------------------------------------------------------------------


@dataclass(frozen=True)
class JobDatabase:
    vendor: str  # "sqlite" or "postgresql"
    url: str  # DATABASE_URL for worker subprocesses
    config: dict[str, Any]  # the settings dict, as klineage_web.env builds it from the URL


def database_for(url: str) -> JobDatabase:
    from klineage_web import env

    config = env.database_config(url, Path(tempfile.gettempdir()))
    vendor = "postgresql" if "postgresql" in config["ENGINE"] else "sqlite"
    return JobDatabase(vendor, url, config)


def drop_thread_connections() -> None:
    """Close and forget this thread's connections: the next use builds them from the settings."""
    from django.db import connections

    for alias in list(connections.settings):
        current = getattr(connections._connections, alias, None)
        if current is not None:
            current.close()
            delattr(connections._connections, alias)


def _drop_async_thread_connections() -> None:
    """The same in the thread where async code runs its database work (database_sync_to_async):
    asgiref keeps that thread, and its connection, from one event loop to the next."""
    import asyncio

    from asgiref.sync import sync_to_async

    asyncio.run(sync_to_async(drop_thread_connections)())


@contextmanager
def use_database(config: dict[str, Any]) -> Iterator[None]:
    """Make `config` Django's "default" database in every thread until the block ends.

    Threads started inside the block connect to it; so does the thread asgiref runs database
    work of async code in, whose connection is dropped on the way in and out.
    """
    from django.db import connections

    _drop_async_thread_connections()
    filled = connections.configure_settings({"default": dict(config)})["default"]
    saved_settings = connections.settings["default"]
    saved_connection = getattr(connections._connections, "default", None)
    if saved_connection is not None:
        delattr(connections._connections, "default")
    connections.settings["default"] = filled
    try:
        yield
    finally:
        current = getattr(connections._connections, "default", None)
        if current is not None:
            current.close()
            delattr(connections._connections, "default")
        _drop_async_thread_connections()
        connections.settings["default"] = saved_settings
        if saved_connection is not None:
            connections["default"] = saved_connection


def migrate(config: dict[str, Any]) -> None:
    from django.core.management import call_command
    from django.db import connection

    with use_database(config):
        call_command("migrate", verbosity=0, interactive=False)
        connection.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    if postgres_bin_dir() is None:
        pytest.skip(PG_MISSING)
    with postgres_cluster() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if redis_binary() is None:
        pytest.skip(REDIS_MISSING)
    with redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory, django_db_blocker) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.sqlite3"
    with django_db_blocker.unblock():
        migrate(database_for(f"sqlite:///{path}").config)
    return path


@pytest.fixture(scope="session")
def postgres_template(postgres_server, django_db_blocker) -> str:
    name = "klineage_template"
    postgres_server.create_database(name)
    with django_db_blocker.unblock():
        migrate(database_for(postgres_server.url(name)).config)
    return name


@contextmanager
def _fresh_database(vendor: str, request, tmp_path: Path) -> Iterator[JobDatabase]:
    if vendor == "sqlite":
        template = request.getfixturevalue("sqlite_template")
        path = tmp_path / "jobs.sqlite3"
        shutil.copyfile(template, path)
        yield database_for(f"sqlite:///{path}")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    template = request.getfixturevalue("postgres_template")
    name = f"test_{uuid.uuid4().hex[:12]}"
    server.create_database(name, template=template)
    try:
        yield database_for(server.url(name))
    finally:
        server.drop_database(name)


@contextmanager
def _swapped(database: JobDatabase, blocker) -> Iterator[JobDatabase]:
    with blocker.unblock(), use_database(database.config):
        try:
            yield database
        finally:
            from django.db import connections

            connections.close_all()


@pytest.fixture(params=["sqlite", "postgresql"])
def job_database(request, tmp_path, django_db_blocker) -> Iterator[JobDatabase]:
    """A fresh migrated database as Django's default: SQLite, then PostgreSQL."""
    with _fresh_database(request.param, request, tmp_path) as database, _swapped(database, django_db_blocker):
        yield database


@pytest.fixture
def sqlite_job_database(request, tmp_path, django_db_blocker) -> Iterator[JobDatabase]:
    """The same, SQLite only: for tests about something other than the database."""
    with _fresh_database("sqlite", request, tmp_path) as database, _swapped(database, django_db_blocker):
        yield database
