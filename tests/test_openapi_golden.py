"""The OpenAPI document is pinned: a refactor of the server cannot change the API.

tests/golden/openapi.json is the document ``create_app`` produced before the HTTP
API was split into routers. The comparison is on the serialised text, so the order of
paths, methods, parameters, responses and schemas counts as much as their content
(clients generated from the document, and docs/api-reference.md, follow that order).

When the API changes on purpose, write the file again and review its diff:
``python tests/test_openapi_golden.py > tests/golden/openapi.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

import mainspring as ms
from mainspring.server import create_app

GOLDEN = Path(__file__).parent / "golden" / "openapi.json"


def _app(path: Path) -> ms.App:
    """An app with workflows, a schedule and a queue: whatever the app holds must not
    leak into the document."""
    app = ms.App(f"sqlite:///{path}")

    @app.workflow
    async def plain(ctx: ms.RunContext) -> int:
        return await ctx.step(lambda: 2, name="two")

    @app.workflow
    async def deploy(ctx: ms.RunContext) -> bool:
        return (await ctx.approval("deploy")).approved

    app.schedules.add("nightly", "0 3 * * *", plain)
    app.queues.add("slow", concurrency=1)
    return app


def _document(path: Path, **options: Any) -> str:
    app = _app(path)
    try:
        doc = create_app(app, **options).openapi()
    finally:
        app.close()
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


@pytest.mark.parametrize(
    "options",
    [{"webhooks": False}, {"docs": True, "worker": True, "max_streams_per_key": 1}],
    ids=["plain", "with-options"],
)
def test_the_openapi_document_is_the_golden_one(tmp_path: Path, options: dict[str, Any]) -> None:
    produced = _document(tmp_path / "doc.db", **options)
    golden = GOLDEN.read_text()
    if produced != golden:
        # Name the first place they part, not a 95 kB diff.
        lines = zip(produced.splitlines(), golden.splitlines(), strict=False)
        at = next((i for i, (a, b) in enumerate(lines) if a != b), None)
        where = "in length" if at is None else f"at line {at + 1}"
        pytest.fail(
            f"the OpenAPI document differs from tests/golden/openapi.json {where}; if the "
            "change is meant: python tests/test_openapi_golden.py > tests/golden/openapi.json"
        )


def test_the_golden_document_has_every_route() -> None:
    # A guard on the guard: an empty or truncated golden file would pin nothing.
    doc = json.loads(GOLDEN.read_text())
    operations = [f"{m.upper()} {p}" for p, item in doc["paths"].items() for m in item]
    assert len(operations) == 22
    assert operations[:2] == ["GET /healthz", "POST /runs"]
    assert "GET /schedules" in operations and "GET /queues" in operations


if __name__ == "__main__":
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sys.stdout.write(_document(Path(tmp) / "doc.db", webhooks=False))
