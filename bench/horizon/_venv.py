"""The horizon benchmark's peer venv: bench/.venv-horizon, with the pinned peers of
``requirements.txt`` and mainspring itself, installed (not editable) from this repository
so that the runners import ``mainspring.lab``'s world and faults.

Standard library only: the harness imports it from the project's own interpreter.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REQUIREMENTS = HERE / "requirements.txt"
VENV = ROOT / "bench" / ".venv-horizon"


def _run_peers():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("run_peers", ROOT / "bench/peers/run_peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source_fingerprint() -> str:
    """A hash of the mainspring package's sources: a change reinstalls it in the venv."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "mainspring").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def venv_python(venv: Path = VENV) -> Path:
    """The venv's python (it may not exist yet)."""
    return _run_peers()._venv_python(venv)  # type: ignore[no-any-return]


def ensure_horizon_venv(venv: Path = VENV) -> Path:
    """Create or update bench/.venv-horizon; return its python."""
    # pip rebuilds a local directory on every install; the fingerprint says when to.
    python = _run_peers().ensure_venv(
        venv, REQUIREMENTS, extra=(str(ROOT),), fingerprint=source_fingerprint()
    )
    return Path(python)


if __name__ == "__main__":
    print(ensure_horizon_venv(Path(sys.argv[1]) if len(sys.argv) > 1 else VENV))
