"""The run's state machine has one home: no module of the package but
``storage/_transitions.py`` writes a run's status or epoch (the walk of its table on
both stores is in the conformance suite, ``mainspring.testing``)."""

from __future__ import annotations

import re
from pathlib import Path

import mainspring

HOME = Path(mainspring.__file__).parent / "storage" / "_transitions.py"

# An UPDATE of ms_runs, up to where its SET list ends (its WHERE, FROM or the end of
# the string literal it sits in, which may be split across lines).
_UPDATE = re.compile(r'UPDATE\s+ms_runs\b(?P<set>.*?)(?:\bWHERE\b|\bFROM\b|"|$)', re.S)
_WRITES = re.compile(r"\b(status|epoch)\s*=(?!=)")


def status_writers(source: str) -> list[str]:
    """The ``UPDATE ms_runs`` statements in ``source`` whose SET writes status or epoch
    (Python's implicit concatenation of adjacent literals joined first)."""
    joined = re.sub(r"\"\s*\n\s*f?\"", "", source)
    found = []
    for m in _UPDATE.finditer(joined):
        if _WRITES.search(m.group("set")):
            found.append(" ".join(m.group(0).split())[:120])
    return found


def test_only_the_state_machine_writes_a_runs_status_or_epoch() -> None:
    root = Path(mainspring.__file__).parent
    offenders = {
        str(path.relative_to(root)): found
        for path in sorted(root.rglob("*.py"))
        if path != HOME and "_migrations" not in path.name
        if (found := status_writers(path.read_text()))
    }
    assert offenders == {}


def test_the_scan_finds_what_it_looks_for() -> None:
    """The scan is not blind: it finds the edges' statements in their home, and a
    status write planted in a split literal, but not a lease's or a session's."""
    planted = (
        'cur.execute(\n    "UPDATE ms_runs SET owner = NULL,"\n'
        "    \" status = 'queued' WHERE id = ?\",\n)"
    )
    assert status_writers(planted)
    assert status_writers('x = "UPDATE ms_runs r SET epoch = r.epoch + 1 FROM p"')
    assert not status_writers('"UPDATE ms_runs SET lease_until = ? WHERE id = ? AND epoch = ?"')
    assert not status_writers("\"UPDATE ms_runs SET recoveries = 0 WHERE status = 'running'\"")
    assert HOME.exists()
    # The home builds its statements from its table rather than spelling them out.
    assert "UPDATE ms_runs SET {" in HOME.read_text()
