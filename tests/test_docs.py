"""Every ```python block in the README and the docs runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for i, match in enumerate(BLOCK.finditer(doc.read_text())):
            found.append((f"{doc.relative_to(ROOT)}#{i + 1}", match.group(1)))
    return found


BLOCKS = _blocks()


def test_the_readme_has_a_runnable_example() -> None:
    assert any(name.startswith("README.md") for name, _ in BLOCKS)


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[n for n, _ in BLOCKS])
def test_doc_example_runs(name: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"


def test_api_reference_is_generated_from_the_openapi_document() -> None:
    from mainspring.server._reference import _app_doc, render_reference

    expected = render_reference(_app_doc())
    committed = (ROOT / "docs" / "api-reference.md").read_text()
    assert committed == expected, (
        "docs/api-reference.md is stale: python -m mainspring.server._reference"
        " > docs/api-reference.md"
    )
