"""Every deployment setting, read from the environment in one place.

The defaults suit one person on localhost: debug off, SQLite in the data dir, no Redis, and a
secret key generated on first start and kept in the data dir. An empty variable counts as unset.

- KLINEAGE_DEBUG                 boolean, default off
- KLINEAGE_SECRET_KEY            default: generated once into <data dir>/secret_key (mode 0600)
- KLINEAGE_ALLOWED_HOSTS         comma-separated, default localhost,127.0.0.1,[::1]
- KLINEAGE_DATA_DIR              default <repo>/var
- DATABASE_URL                   postgres://user:pass@host:port/name[?sslmode=...],
                                 sqlite:////absolute/path or sqlite:///path-in-data-dir;
                                 default <data dir>/klineage.sqlite3
- REDIS_URL                      redis:// or rediss://; set: Redis channel layer, else in-memory
- KLINEAGE_READ_OPEN             boolean, default on: reading needs no login
- KLINEAGE_CSRF_TRUSTED_ORIGINS  comma-separated origins, e.g. https://klineage.example.org
- KLINEAGE_HTTPS                 boolean, default off: served over HTTPS, so cookies are secure
- KLINEAGE_JOB_KINDS_MODULE      a module adding job kinds (the test suite's tests.job_kinds); read by
                                 gate_app.kinds itself, since the jobs' children run without settings
- KLINEAGE_GPU_JOB_QUOTA         integer >= 1, default 4: GPU jobs one user may have queued or running
- KLINEAGE_UNSAFE_NO_SANDBOX     read per request (unsafe_no_sandbox): while set, every page warns that
                                 untrusted code runs without the sandbox
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

REPO_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY_FILE = "secret_key"
SQLITE_FILE = "klineage.sqlite3"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class WebEnv:
    debug: bool
    secret_key: str
    allowed_hosts: list[str]
    data_dir: Path
    database: dict[str, Any]
    channel_layer_kind: str  # "redis" or "in-memory"
    channel_layers: dict[str, Any]
    read_open: bool
    csrf_trusted_origins: list[str]
    https: bool
    gpu_job_quota: int = 4


def load(environ: Mapping[str, str] = os.environ) -> WebEnv:
    data = data_dir(environ)
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    layer_kind, layers = channel_layers(_get(environ, "REDIS_URL"))
    return WebEnv(
        debug=env_bool(environ, "KLINEAGE_DEBUG", False),
        secret_key=_get(environ, "KLINEAGE_SECRET_KEY") or persisted_secret_key(data),
        allowed_hosts=env_list(environ, "KLINEAGE_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]"),
        data_dir=data,
        database=database_config(_get(environ, "DATABASE_URL"), data),
        channel_layer_kind=layer_kind,
        channel_layers=layers,
        read_open=env_bool(environ, "KLINEAGE_READ_OPEN", True),
        csrf_trusted_origins=env_list(environ, "KLINEAGE_CSRF_TRUSTED_ORIGINS", ""),
        https=env_bool(environ, "KLINEAGE_HTTPS", False),
        gpu_job_quota=env_positive_int(environ, "KLINEAGE_GPU_JOB_QUOTA", 4),
    )


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(environ, name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    # A typo must not silently flip a security setting to its default.
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a boolean: use 1/true/yes/on or 0/false/no/off"
    )


def unsafe_no_sandbox(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether untrusted code may run unsandboxed. Any value but an explicit off counts: the warning
    errs toward showing, and a typo here must not take every page down."""
    raw = _get(environ, "KLINEAGE_UNSAFE_NO_SANDBOX")
    return raw is not None and raw.lower() not in _FALSE


def env_positive_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = _get(environ, name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number of at least 1")
    return int(raw)


def env_list(environ: Mapping[str, str], name: str, default: str) -> list[str]:
    raw = _get(environ, name) or default
    return [item.strip() for item in raw.split(",") if item.strip()]


def data_dir(environ: Mapping[str, str]) -> Path:
    raw = _get(environ, "KLINEAGE_DATA_DIR")
    return Path(raw).expanduser().resolve() if raw else REPO_DIR / "var"


def persisted_secret_key(directory: Path) -> str:
    """The key kept in `directory`, generated on first use, so restarts keep sessions valid."""
    path = directory / SECRET_KEY_FILE
    if not path.exists():
        # mkstemp creates the file 0600; link() refuses to overwrite, so when two processes
        # start together both end up with whichever key was linked first.
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".secret_key.")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(50))
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    key = path.read_text().strip()
    if not key:
        raise ImproperlyConfigured(f"{path} is empty: delete it or set KLINEAGE_SECRET_KEY")
    return key


def database_config(url: str | None, directory: Path) -> dict[str, Any]:
    if url is None:
        return _sqlite(directory / SQLITE_FILE)
    parts = urlsplit(url)
    # Messages name the variable but never echo the URL: it may hold a password.
    if parts.scheme == "sqlite":
        # As in dj-database-url: sqlite:////abs/path is absolute, sqlite:///name is relative,
        # here to the data dir rather than to whatever directory the server started in.
        relative = parts.path[1:] if parts.path.startswith("/") else parts.path
        if parts.netloc or not relative:
            raise ImproperlyConfigured(
                "DATABASE_URL: write sqlite:////absolute/path or sqlite:///name"
            )
        return _sqlite(directory / unquote(relative))
    if parts.scheme in ("postgres", "postgresql"):
        try:
            port = parts.port
        except ValueError as error:
            raise ImproperlyConfigured(f"DATABASE_URL: bad port ({error})") from None
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured("DATABASE_URL: the database name is missing")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": unquote(parts.hostname or ""),
            "PORT": str(port or ""),
            "OPTIONS": dict(parse_qsl(parts.query)),
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL: unsupported scheme {parts.scheme!r}; use postgres:// or sqlite:///"
    )


def _sqlite(path: Path) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        "OPTIONS": {
            # Web requests and job workers write concurrently: WAL lets readers proceed during a
            # write, IMMEDIATE takes the write lock up front (no mid-transaction "database is
            # locked"), and the timeout waits for it instead of failing at once.
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL",
        },
    }


def channel_layers(redis_url: str | None) -> tuple[str, dict[str, Any]]:
    """The channel layer's kind and CHANNEL_LAYERS; in-memory reaches only its own process."""
    if redis_url is None:
        return "in-memory", {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    if urlsplit(redis_url).scheme not in ("redis", "rediss"):
        raise ImproperlyConfigured("REDIS_URL: use redis:// or rediss://")
    return "redis", {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [redis_url]},
        }
    }
