from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pg
import pytest

import mainspring as ms

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(scope="session")
def pg_session_dsn() -> Iterator[str]:
    """One fresh PostgreSQL database for the whole test session."""
    dsn, name = pg.create_database()
    yield dsn
    pg.drop_database(name)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database on each backend (PostgreSQL skips without a server)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'mainspring.db'}"
    if not os.environ.get(pg.DSN_VAR):
        pytest.skip(f"{pg.DSN_VAR} is not set: PostgreSQL tests need a server")
    dsn: str = request.getfixturevalue("pg_session_dsn")
    pg.reset(dsn)
    return dsn


@pytest.fixture
def app(db_url: str) -> Iterator[ms.App]:
    application = ms.App(db_url, inline_wait_s=0.5, poll_interval_s=0.02)
    yield application
    application.close()


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Any]:
    """`mainspring serve` and worker processes of tests/apps/hitl_app.py on ``db_url``."""
    from _stack import Stack

    s = Stack(tmp_path, db_url)
    yield s
    s.close()
