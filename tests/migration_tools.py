"""Moving the test database to a migration and back, for the tests of data migrations."""

from __future__ import annotations

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def latest() -> list[tuple[str, str]]:
    """Every app's newest migration: where the test database must be left for the tests after."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    return executor.loader.graph.leaf_nodes()


def migrate(targets):
    """Migrate the test database to `targets` ([(app, migration)]); the historical models there."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps
