"""The same conformance suite as SQLite, against a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator

import pg
import pytest

from mainspring.storage import Store
from mainspring.testing.conformance import StoreConformance


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    dsn, name = pg.create_database()
    yield dsn
    pg.drop_database(name)


class TestPostgresConformance(StoreConformance):
    @pytest.fixture(autouse=True)
    def _db(self, pg_dsn: str) -> Iterator[None]:
        pg.reset(pg_dsn)
        self.dsn = pg_dsn
        self.opened: list[Store] = []
        yield
        for store in self.opened:
            store.close()

    def make_store(self) -> Store:
        from mainspring.storage.postgres import PostgresStore

        store = PostgresStore(self.dsn)
        self.opened.append(store)
        return store
