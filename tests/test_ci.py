"""CI runs what a new user runs: the README's two set-up commands, exactly as written, in a
fresh virtualenv (``.ci/run``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_commands() -> list[str]:
    """The commands of the README's "## Set up" section: one per shell block."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, flags=re.M | re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_has_two_setup_commands_the_demo_then_the_tests() -> None:
    demo, tests = _setup_commands()
    assert "pip install" in demo and "mainspring demo" in demo, demo
    assert "pip install" in tests and "pytest" in tests, tests


def test_ci_runs_the_readme_commands_in_a_fresh_virtualenv() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    # The function CI reads the commands with, run on the README as it is.
    function = re.search(r"^readme_commands\(\) \{\n.*?^\}\n", script, flags=re.M | re.S)
    assert function is not None, "no readme_commands() in .ci/run"
    done = subprocess.run(
        ["bash", "-c", f"{function.group(0)}\nreadme_commands"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines() == _setup_commands()
    assert 'python3 -m venv "$venv"' in script and 'source "$venv/bin/activate"' in script
    assert "--system-site-packages" not in script
    for n in (0, 1):
        assert f'eval "${{commands[{n}]}}"' in script
    # Nothing else is installed by hand: the README's commands bring what the tests need.
    installs = [line for line in script.splitlines() if "pip install" in line]
    assert installs == ["python -m pip install --quiet --upgrade pip"], installs
