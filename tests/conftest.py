from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import mainspring as ms


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mainspring.db'}"


@pytest.fixture
def app(db_url: str) -> Iterator[ms.App]:
    application = ms.App(db_url, inline_wait_s=0.5, poll_interval_s=0.02)
    yield application
    application.close()
