"""Google-style docstrings: the description and the ``Args:`` section."""

from __future__ import annotations

import inspect
import re

__all__ = ["parse_docstring"]

_ARGS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments"}
_SECTIONS = _ARGS | {
    "attributes", "example", "examples", "note", "notes", "raises", "references", "return",
    "returns", "see also", "todo", "warning", "warnings", "yield", "yields",
}  # fmt: skip
_HEADER = re.compile(r"^([A-Za-z][A-Za-z ]*?)\s*:\s*$")
# "name (type): text", "name: text", "*name: text"; the type in parentheses is dropped
# because the type hint, not the docstring, decides the schema.
_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_][A-Za-z0-9_]*)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and per-argument texts.

    Returns:
        ``(description, {argument: text})``. The description is the prose before the
        first section (``Args:``, ``Returns:``, ...), paragraphs kept apart by a blank
        line and the lines of each paragraph joined.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    prose: list[str] = []
    args: dict[str, str] = {}
    i = 0
    while i < len(lines):
        header = _section(lines[i])
        if header is None:
            prose.append(lines[i])
            i += 1
            continue
        i += 1
        body: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
            body.append(lines[i])
            i += 1
        if header in _ARGS:
            args.update(_entries(body))
    return _paragraphs(prose), args


def _section(line: str) -> str | None:
    if line[:1].isspace():
        return None
    match = _HEADER.match(line)
    if match is None or match.group(1).lower() not in _SECTIONS:
        return None
    return match.group(1).lower()


def _entries(body: list[str]) -> dict[str, str]:
    indents = [len(line) - len(line.lstrip()) for line in body if line.strip()]
    if not indents:
        return {}
    base = min(indents)
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in body:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        match = _ENTRY.match(line.strip()) if indent == base else None
        if match is not None:
            current = out.setdefault(match.group(1), [])
            if match.group(2):
                current.append(match.group(2).strip())
        elif current is not None:
            current.append(line.strip())
    return {name: " ".join(parts) for name, parts in out.items() if parts}


def _paragraphs(lines: list[str]) -> str:
    paragraphs: list[str] = []
    current: list[str] = []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return "\n\n".join(paragraphs)
