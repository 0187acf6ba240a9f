"""The Pydantic AI integration against the newest Pydantic AI release, in a throwaway
virtualenv (the extra pins the tested range; this says whether the next release still
works). Needs the package index: not in the default suite; `make newest-pydantic-ai`,
or `python -m pytest -m newest tests/test_integration_pydantic_ai_newest.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.newest
@pytest.mark.timeout(1800)
def test_the_integration_passes_on_the_newest_pydantic_ai(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")

    def pip(*args: str) -> None:
        subprocess.run([python, "-m", "pip", "install", "-q", *args], check=True, timeout=1200)

    # mainspring from this tree, its test tools, then the newest Pydantic AI, unpinned.
    pip("-e", f"{ROOT}[postgres,openai]", "pytest", "pytest-asyncio", "pytest-timeout")
    pip("pytest-xdist", "--upgrade", "pydantic-ai-slim[openai]")
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('pydantic-ai-slim'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    done = subprocess.run(
        [python, "-m", "pytest", "tests/test_integration_pydantic_ai.py", "-q", "-n", "0",
         "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    print(f"pydantic-ai-slim {version}:\n{done.stdout[-3000:]}")
    assert done.returncode == 0, f"pydantic-ai-slim {version}:\n{done.stdout}\n{done.stderr}"
