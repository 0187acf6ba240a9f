"""Set up the peer venv and run the peer step benchmarks (DBOS, LangGraph) in subprocesses.

Standard library only, so the main bench script can import it from the project's own venv.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PEERS_DIR = Path(__file__).resolve().parent
REQUIREMENTS = PEERS_DIR / "requirements.txt"
DEFAULT_VENV = PEERS_DIR.parent / ".venv-peers"
SCRIPTS = ("dbos_steps.py", "langgraph_steps.py")
_STAMP = ".requirements.sha256"


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def ensure_venv(
    path: Path = DEFAULT_VENV,
    requirements: Path = REQUIREMENTS,
    extra: Sequence[str] = (),
    fingerprint: str = "",
) -> Path:
    """Create the peer venv if needed, install ``requirements`` (then ``extra``, more
    ``pip install`` arguments), return its python. Nothing is installed again while
    the requirements, ``extra`` and ``fingerprint`` (e.g. a hash of a local package
    installed through ``extra``) are those of the last install.

    Two benches started at once (the horizon with and without faults) take turns: the
    second waits for the first's install instead of uninstalling under it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_venv(path, requirements, extra, fingerprint)


def _ensure_venv(path: Path, requirements: Path, extra: Sequence[str], fingerprint: str) -> Path:
    python = _venv_python(path)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    digest = hashlib.sha256(
        requirements.read_bytes() + "\0".join([*extra, fingerprint]).encode()
    ).hexdigest()
    stamp = path / _STAMP
    if stamp.exists() and stamp.read_text().strip() == digest:
        return python
    proc = _pip(python, "-r", str(requirements))
    if proc.returncode != 0:
        # pip's resolver errors rarely name the culprit clearly; retry one pin at a time.
        pins = [
            line.split("#")[0].strip()
            for line in requirements.read_text().splitlines()
            if line.split("#")[0].strip()
        ]
        for pin in pins:
            one = _pip(python, pin)
            if one.returncode != 0:
                raise RuntimeError(f"peer venv: pip install {pin!r} failed:\n{_tail(one.stderr)}")
        raise RuntimeError(
            f"peer venv: pip install -r {requirements} failed "
            f"(each pin installs alone; conflict between pins?):\n{_tail(proc.stderr)}"
        )
    if extra:
        more = _pip(python, *extra)
        if more.returncode != 0:
            raise RuntimeError(
                f"peer venv: pip install {' '.join(extra)} failed:\n{_tail(more.stderr)}"
            )
    stamp.write_text(digest + "\n")
    return python


def per_step_us(
    stamps: Sequence[float], cpu: Sequence[float], start: int, window: int
) -> dict[str, float]:
    """Wall (median gap) and CPU (mean) µs per step over ``window`` steps from ``start``,
    from the ``perf_counter`` and ``process_time`` noted at each step call (the long-run
    measure, shared by ``bench/long_run.py`` and the peer scripts)."""
    gaps = [
        b - a for a, b in zip(stamps[start : start + window], stamps[start + 1 :], strict=False)
    ]
    if not gaps:
        raise ValueError(f"no steps after step {start} (only {len(stamps)} were taken)")
    end = min(start + window, len(cpu) - 1)
    return {
        "wall": statistics.median(gaps[:window]) * 1e6,
        "cpu": (cpu[end] - cpu[start]) / max(1, end - start) * 1e6,
    }


def _run_json(cmd: Sequence[str], peer: str, timeout: float) -> dict[str, Any]:
    """Run a peer command in a fresh temp dir (``{tmp}`` in ``cmd`` names it); return its
    last stdout line as JSON, or ``{"peer", "error"}``: never raise."""
    try:
        with tempfile.TemporaryDirectory(prefix=f"peer-{peer}-") as tmp:
            argv = [arg.replace("{tmp}", tmp) for arg in cmd]
            proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            return {"peer": peer, "error": f"exit {proc.returncode}: {_tail(proc.stderr, 5)}"}
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        if not lines:
            return {"peer": peer, "error": f"no output: {_tail(proc.stderr, 5)}"}
        result = json.loads(lines[-1])
        return result if isinstance(result, dict) else {"peer": peer, "error": "non-object JSON"}
    except subprocess.TimeoutExpired:
        return {"peer": peer, "error": f"timed out after {timeout}s"}
    except Exception as e:  # the caller wants a result row, never a raise
        return {"peer": peer, "error": f"{type(e).__name__}: {e}"}


def run_long_peer(
    python: Path,
    script: str,
    marks: Sequence[int],
    window: int,
    sync: str,
    timeout: float = 900,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Run one long-run peer script (``*_long.py``) on a fresh file; its JSON or an error."""
    script_path = Path(script) if Path(script).is_absolute() else PEERS_DIR / script
    cmd = [
        str(python),
        str(script_path),
        "--db", str(Path("{tmp}") / "peer.sqlite"),
        "--marks", ",".join(str(m) for m in marks),
        "--window", str(window),
        "--sync", sync,
        *extra_args,
    ]  # fmt: skip
    return _run_json(cmd, script_path.stem.removesuffix("_long"), timeout)


def run_peer(
    python: Path,
    script: str,
    steps: int,
    sync: str,
    state_kb_per_step: int = 0,
    timeout: float = 600,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Run one peer script in a fresh temp dir; return its JSON or {"peer", "error"}."""
    script_path = Path(script) if Path(script).is_absolute() else PEERS_DIR / script
    cmd = [
        str(python),
        str(script_path),
        "--steps", str(steps),
        "--db", str(Path("{tmp}") / "peer.sqlite"),
        "--sync", sync,
        "--state-kb-per-step", str(state_kb_per_step),
        *extra_args,
    ]  # fmt: skip
    return _run_json(cmd, script_path.stem.removesuffix("_steps"), timeout)


def main() -> None:
    """Run both peers at FULL and NORMAL (plus DBOS forced to WAL); print JSON lines."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--state-kb-per-step", type=int, default=0)
    args = p.parse_args()
    python = ensure_venv()
    # DBOS leaves SQLite in rollback-journal mode; the WAL row matches LangGraph's setup.
    runs: list[tuple[str, tuple[str, ...]]] = [(script, ()) for script in SCRIPTS]
    runs.append(("dbos_steps.py", ("--wal",)))
    for sync in ("FULL", "NORMAL"):
        for script, extra in runs:
            row = run_peer(
                python, script, args.steps, sync, args.state_kb_per_step, extra_args=extra
            )
            print(json.dumps(row))


if __name__ == "__main__":
    main()
