"""PostgreSQL for tests: a fresh database per test session, tables dropped per test."""

from __future__ import annotations

import hashlib
import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

DSN_VAR = "MAINSPRING_TEST_POSTGRES_DSN"


def admin_dsn() -> str:
    """The server's DSN as a URL (postgresql://user@host:port/dbname)."""
    dsn = os.environ.get(DSN_VAR)
    if not dsn:
        pytest.skip(
            f"{DSN_VAR} is not set: PostgreSQL tests need a server "
            "(.ci/run sets it; e.g. postgresql://postgres@127.0.0.1:5432/postgres)"
        )
    return dsn


def create_database() -> tuple[str, str]:
    """Create a new empty database; returns (its DSN, its name)."""
    import psycopg

    admin = admin_dsn()
    name = f"mainspring_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(admin)
    return urlunsplit(parts._replace(path=f"/{name}")), name


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_MS_TABLES = (
    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    " AND tablename LIKE 'ms\\_%'"
)


def reset(dsn: str) -> None:
    """Drop mainspring's tables so the next store starts from an empty schema."""
    import psycopg

    _clean_schema.pop(dsn, None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Every ms_ table, whatever migrations have added since this was written.
        names = [row[0] for row in conn.execute(_MS_TABLES)]
        if names:
            conn.execute(f"DROP TABLE IF EXISTS {', '.join(names)} CASCADE")


# The schema a clean migration left in each database (by DSN), as _schema_print says it.
_clean_schema: dict[str, str] = {}

# Everything about mainspring's tables that a test could change: columns, indexes,
# constraints, triggers, and the schema version mainspring recorded.
_SCHEMA_PRINT = """
SELECT 'col', table_name || '.' || column_name || ':' || data_type || ':' || is_nullable
       || ':' || coalesce(column_default, '')
  FROM information_schema.columns
 WHERE table_schema = current_schema() AND table_name LIKE 'ms\\_%'
UNION ALL
SELECT 'idx', indexdef FROM pg_indexes
 WHERE schemaname = current_schema() AND tablename LIKE 'ms\\_%'
UNION ALL
SELECT 'con', conrelid::regclass::text || ':' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE conrelid::regclass::text LIKE 'ms\\_%'
UNION ALL
SELECT 'trg', tgrelid::regclass::text || ':' || tgname
  FROM pg_trigger WHERE tgrelid::regclass::text LIKE 'ms\\_%'
UNION ALL
SELECT 'ver', value FROM ms_meta WHERE key = 'schema_version'
ORDER BY 1, 2
"""


def _schema_print(conn: object) -> str | None:
    import psycopg

    assert isinstance(conn, psycopg.Connection)
    try:
        rows = conn.execute(_SCHEMA_PRINT).fetchall()
    except psycopg.errors.UndefinedTable:  # no ms_meta: not migrated
        return None
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def reset_migrated(dsn: str) -> None:
    """Leave mainspring's tables at the latest schema and without a row, as a store
    that has just migrated an empty database sees them.

    Cheaper than :func:`reset` followed by a migration (a migration is some hundred
    DDL statements): when the schema is exactly the one a clean migration left in
    this database earlier in the session, the tables are only emptied; otherwise
    (first use, or a test changed the schema) they are dropped and migrated again.
    """
    import psycopg

    from mainspring.storage.postgres import PostgresStore

    with psycopg.connect(dsn, autocommit=True) as conn:
        clean = _clean_schema.get(dsn)
        if clean is not None and _schema_print(conn) == clean:
            names = [row[0] for row in conn.execute(_MS_TABLES) if row[0] != "ms_meta"]
            with conn.transaction():
                if names:
                    conn.execute(f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE")
                conn.execute("DELETE FROM ms_meta WHERE key <> 'schema_version'")
            return
    reset(dsn)
    PostgresStore(dsn, min_size=1, max_size=1).close()  # migrates
    with psycopg.connect(dsn, autocommit=True) as conn:
        printed = _schema_print(conn)
    if printed is not None:
        _clean_schema[dsn] = printed
