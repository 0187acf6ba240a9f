from __future__ import annotations

from pathlib import Path

import pytest

from mainspring.storage import SQLiteStore, Store
from mainspring.testing.conformance import StoreConformance


class TestSQLiteConformance(StoreConformance):
    @pytest.fixture(autouse=True)
    def _path(self, tmp_path: Path) -> None:
        self.path = tmp_path / "conformance.db"

    def make_store(self) -> Store:
        return SQLiteStore(self.path)
