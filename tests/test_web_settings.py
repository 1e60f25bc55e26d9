"""klineage_web.env: settings parsed from a given environment, never from the process's."""

import stat
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from klineage_web import env


def test_defaults(tmp_path):
    loaded = env.load({"KLINEAGE_DATA_DIR": str(tmp_path)})
    assert loaded.debug is False
    assert loaded.read_open is True
    assert loaded.https is False
    assert loaded.allowed_hosts == ["localhost", "127.0.0.1", "[::1]"]
    assert loaded.csrf_trusted_origins == []
    assert loaded.data_dir == tmp_path.resolve()
    assert loaded.database["ENGINE"] == "django.db.backends.sqlite3"
    assert loaded.database["NAME"] == tmp_path.resolve() / "klineage.sqlite3"
    assert loaded.channel_layer_kind == "in-memory"


def test_sqlite_waits_for_locks_and_uses_wal(tmp_path):
    options = env.database_config(None, tmp_path)["OPTIONS"]
    assert options["timeout"] == 20
    assert options["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in options["init_command"]


def test_sqlite_urls(tmp_path):
    absolute = env.database_config("sqlite:////srv/k/db.sqlite3", tmp_path)
    assert absolute["NAME"] == Path("/srv/k/db.sqlite3")
    relative = env.database_config("sqlite:///other.sqlite3", tmp_path)
    assert relative["NAME"] == tmp_path / "other.sqlite3"
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        env.database_config("sqlite://", tmp_path)


def test_postgres_url(tmp_path):
    url = "postgres://kl:p%40ss@db.internal:6543/klineage?sslmode=require"
    db = env.database_config(url, tmp_path)
    assert db == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "klineage",
        "USER": "kl",
        "PASSWORD": "p@ss",
        "HOST": "db.internal",
        "PORT": "6543",
        "OPTIONS": {"sslmode": "require"},
    }
    assert env.database_config("postgresql://localhost/k", tmp_path)["PORT"] == ""


@pytest.mark.parametrize(
    "url", ["mysql://u:secret@h/db", "postgres://u:secret@h/", "postgres://u:secret@h:port/db"]
)
def test_bad_database_urls_name_the_variable_not_the_password(url, tmp_path):
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL") as raised:
        env.database_config(url, tmp_path)
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize("raw", ["1", "true", "YES", " on "])
def test_booleans_true(raw):
    assert env.env_bool({"KLINEAGE_DEBUG": raw}, "KLINEAGE_DEBUG", False) is True


@pytest.mark.parametrize("raw", ["0", "False", "no", "off"])
def test_booleans_false(raw):
    assert env.env_bool({"KLINEAGE_READ_OPEN": raw}, "KLINEAGE_READ_OPEN", True) is False


def test_empty_boolean_is_unset():
    assert env.env_bool({"KLINEAGE_READ_OPEN": ""}, "KLINEAGE_READ_OPEN", True) is True


@pytest.mark.parametrize("raw", ["2", "enabled", "tru", "y"])
def test_booleans_strict_and_name_the_variable(raw, tmp_path):
    with pytest.raises(ImproperlyConfigured, match="KLINEAGE_DEBUG"):
        env.load({"KLINEAGE_DATA_DIR": str(tmp_path), "KLINEAGE_DEBUG": raw})


def test_lists():
    environ = {"KLINEAGE_ALLOWED_HOSTS": " klineage.lan, ,10.0.0.5 "}
    assert env.env_list(environ, "KLINEAGE_ALLOWED_HOSTS", "x") == ["klineage.lan", "10.0.0.5"]


def test_secret_key_generated_private_and_stable(tmp_path):
    first = env.load({"KLINEAGE_DATA_DIR": str(tmp_path)}).secret_key
    key_file = tmp_path / env.SECRET_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(first) >= 50
    assert env.load({"KLINEAGE_DATA_DIR": str(tmp_path)}).secret_key == first
    assert [p.name for p in tmp_path.iterdir()] == [env.SECRET_KEY_FILE]  # no temp file left


def test_secret_key_from_environment_writes_nothing(tmp_path):
    loaded = env.load({"KLINEAGE_DATA_DIR": str(tmp_path), "KLINEAGE_SECRET_KEY": "k" * 60})
    assert loaded.secret_key == "k" * 60
    assert not (tmp_path / env.SECRET_KEY_FILE).exists()


def test_redis_url_selects_redis_layer(tmp_path):
    kind, layers = env.channel_layers("redis://cache:6379/2")
    assert kind == "redis"
    assert layers["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert layers["default"]["CONFIG"]["hosts"] == ["redis://cache:6379/2"]
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL"):
        env.channel_layers("http://cache:6379")

