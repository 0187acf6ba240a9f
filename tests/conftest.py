from __future__ import annotations

import fcntl
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
    """One fresh PostgreSQL database for the whole test session (under pytest-xdist:
    one per worker, each with a name of its own)."""
    dsn, name = pg.create_database()
    yield dsn
    pg.drop_database(name)


# Fixtures that open ``db_url`` in an App (which migrates) before the test sees it: for
# them a PostgreSQL database can be handed over already migrated and emptied of rows,
# which is much cheaper than dropping the tables and migrating again.
_MIGRATED_BY = ("app", "stack")


def _opens_an_app_first(request: pytest.FixtureRequest) -> bool:
    info = getattr(request.node, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {})
    # This conftest's fixture, not a test module's own of the same name.
    return any(
        name in request.fixturenames
        and name in defs
        and getattr(defs[name][-1].func, "__module__", None) == __name__
        for name in _MIGRATED_BY
    )


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database on each backend (PostgreSQL skips without a server)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'mainspring.db'}"
    if not os.environ.get(pg.DSN_VAR):
        pytest.skip(f"{pg.DSN_VAR} is not set: PostgreSQL tests need a server")
    dsn: str = request.getfixturevalue("pg_session_dsn")
    if _opens_an_app_first(request):
        pg.reset_migrated(dsn)  # the App would migrate it first thing anyway
    else:
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


# -- running beside other pytest-xdist workers ------------------------------------------

# An xdist worker starts with COLUMNS=80 and LINES=24 of its own, which narrows every
# Rich table the CLI tests read (the CLI widens piped output only when COLUMNS is
# unset): a worker gets the terminal variables of the pytest that started it.
_TERMINAL_VARS = ("COLUMNS", "LINES", "TERM")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput["mainspring_terminal"] = {k: os.environ.get(k) for k in _TERMINAL_VARS}


def pytest_configure(config: pytest.Config) -> None:
    terminal = getattr(config, "workerinput", {}).get("mainspring_terminal", {})
    for name, value in terminal.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# Under pytest-xdist (pyproject's addopts) every worker holds a shared lock on the
# services (the PostgreSQL server) while it runs a test module; a test marked
# ``exclusive`` (it stops or restarts the server) takes it exclusively, so that it
# runs while no other worker is inside a module (whose fixtures may hold connections).
# A turnstile lock taken before the main one keeps new modules from starving it.
# Without xdist the tests run one at a time and nothing is locked.


class _ServiceLock:
    def __init__(self, folder: Path) -> None:
        self._main = os.open(folder / "services.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._turnstile = os.open(folder / "services.turnstile", os.O_RDWR | os.O_CREAT, 0o600)
        self.held: int | None = None  # fcntl.LOCK_SH or LOCK_EX

    def hold(self, mode: int) -> None:
        if self.held == mode:
            return
        # Never an upgrade in place: two workers upgrading at once would wait for each other.
        self.release()
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._main, mode)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        self.held = mode

    def release(self) -> None:
        if self.held is not None:
            fcntl.flock(self._main, fcntl.LOCK_UN)
            self.held = None


@pytest.fixture(scope="session")
def _service_lock(tmp_path_factory: pytest.TempPathFactory) -> _ServiceLock | None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    # Each worker's base temp folder is popen-gwN inside the run's own folder.
    return _ServiceLock(tmp_path_factory.getbasetemp().parent)


@pytest.fixture(scope="module", autouse=True)
def _shared_services(_service_lock: _ServiceLock | None) -> Iterator[None]:
    if _service_lock is None:
        yield
        return
    _service_lock.hold(fcntl.LOCK_SH)
    try:
        yield
    finally:
        _service_lock.release()


_NEXT_ITEM = pytest.StashKey["pytest.Item | None"]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    item.stash[_NEXT_ITEM] = nextitem


@pytest.fixture(autouse=True)
def _exclusive_services(
    request: pytest.FixtureRequest, _service_lock: _ServiceLock | None
) -> Iterator[None]:
    if _service_lock is None or request.node.get_closest_marker("exclusive") is None:
        yield
        return
    _service_lock.hold(fcntl.LOCK_EX)
    try:
        yield
    finally:
        following = request.node.stash.get(_NEXT_ITEM, None)
        if following is None or following.get_closest_marker("exclusive") is None:
            _service_lock.hold(fcntl.LOCK_SH)  # else kept for the next exclusive test
