"""Every ```python block in the README and the docs runs as written, and so does every
```sh block of the README (against a live ``mainspring serve``).

A shell block preceded by ``<!-- not run by tests/test_docs.py: REASON -->`` is skipped:
those install packages or run the whole suite.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SHELL = re.compile(
    r"(<!-- not run by tests/test_docs.py: [^>]+ -->\n)?^```sh\n(.*?)^```", re.S | re.M
)


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
    # A bound against a hang, not a duration under test: the lab's examples take ~20 s of
    # CPU, and a loaded 2-core machine stretches that past a minute.
    # An example that uses a deprecated spelling of mainspring's fails: the warning is
    # attributed to the example's own line (``__main__``), third parties' are not.
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning:__main__", str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"


def test_api_reference_is_generated_from_the_openapi_document() -> None:
    from mainspring.server._reference import _app_doc, render_reference

    expected = render_reference(_app_doc())
    committed = (ROOT / "docs" / "api-reference.md").read_text()
    assert committed == expected, (
        "docs/api-reference.md is stale: python -m mainspring.server._reference"
        " > docs/api-reference.md"
    )


def _readme_shell_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    return [
        (f"README.md#sh{i + 1}", m.group(2))
        for i, m in enumerate(SHELL.finditer(text))
        if not m.group(1)
    ]


SHELL_BLOCKS = _readme_shell_blocks()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_readme_has_a_runnable_shell_block() -> None:
    assert any("curl" in code for _, code in SHELL_BLOCKS)


@pytest.mark.parametrize(("name", "code"), SHELL_BLOCKS, ids=[n for n, _ in SHELL_BLOCKS])
def test_readme_shell_block_runs(name: str, code: str, tmp_path: Path) -> None:
    """The block runs under bash, as written, in a folder holding the README's twenty
    lines as ``app.py``; only the port changes (8000 may be taken on a shared machine)."""
    [(_, twenty)] = [b for b in BLOCKS if b[0] == "README.md#1"]
    (tmp_path / "app.py").write_text(twenty)
    # `mainspring` and `python` on PATH are this interpreter, with this checkout.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, command in (("mainspring", "-m mainspring"), ("python", "")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} {command} "$@"\n')
        shim.chmod(0o755)
    port = _free_port()
    script = code.replace("localhost:8000", f"localhost:{port}").replace(
        "serve app:app --worker", f"serve app:app --worker --port {port}"
    )
    (tmp_path / "block.sh").write_text(
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\n" + script
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    done = subprocess.run(
        ["bash", str(tmp_path / "block.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    if "/events" in code:
        # The event stream followed the run to its end, and the run succeeded.
        assert "event: end" in done.stdout and '"status":"succeeded"' in done.stdout, done.stdout
