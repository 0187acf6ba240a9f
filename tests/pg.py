"""PostgreSQL for tests: a fresh database per test session, tables dropped per test."""

from __future__ import annotations

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


def reset(dsn: str) -> None:
    """Drop mainspring's tables so the next store starts from an empty schema."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS ms_steps, ms_signals, ms_runs, ms_meta, ms_api_keys,"
            " ms_webhooks, ms_outbox, ms_rate_limits, ms_rate_outputs CASCADE"
        )
