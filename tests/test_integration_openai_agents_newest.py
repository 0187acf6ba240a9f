"""The OpenAI Agents SDK integration against the newest ``openai-agents`` release, in
a throwaway virtualenv: a break shows the day a release ships, not the day a user
upgrades. Installs from the package index, so it runs only when asked::

    python -m pytest tests/test_integration_openai_agents_newest.py -m newest -n 0 -s
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_integration_openai_agents.py"]


@pytest.mark.newest
@pytest.mark.timeout(1800)  # a virtualenv, an install, then the integration tests
def test_the_integration_passes_on_the_newest_release(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if "newest" not in (request.config.getoption("-m") or ""):
        pytest.skip("installs from the package index: run with -m newest")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = [python, "-m", "pip", "install", "--quiet", "--upgrade"]
    # mainspring without the pinned extra, then whatever release is newest.
    subprocess.run([*pip, "-e", f"{ROOT}[postgres,openai,mcp]"], check=True, env=env)
    subprocess.run(
        [*pip, "openai-agents", "pytest", "pytest-asyncio", "pytest-timeout", "pytest-xdist"],
        check=True,
        env=env,
    )
    version = subprocess.run(
        [python, "-c", "import agents; print(agents.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"openai-agents {version} (the extra pins >=0.25,<0.26)")
    done = subprocess.run(
        [python, "-m", "pytest", *TESTS, "-q", "-n", "0", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, f"the integration tests fail on openai-agents {version}"
