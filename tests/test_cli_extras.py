"""A missing extra is one line naming the ``pip install`` to run, never a traceback.

The extras are installed here, so each case hides a module the way a machine without the
extra would lack it: ``sys.modules[name] = None`` makes every import of it fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mainspring as ms

APP = "import mainspring as ms\napp = ms.App('sqlite:///app.db')\n"


def _cli(hidden: list[str], args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        f"for name in {hidden!r}:\n"
        "    sys.modules[name] = None\n"
        "from mainspring.cli import main\n"
        f"sys.argv = ['mainspring', *{args!r}]\n"
        "main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("hidden", "args", "line"),
    [
        (
            ["uvicorn"],
            ["serve", "app:app"],
            "error: mainspring serve needs the server extra (uvicorn is missing): "
            "pip install 'mainspring[server]'",
        ),
        (
            ["fastapi"],
            ["serve", "app:app"],
            "error: mainspring serve needs the server extra (fastapi is missing): "
            "pip install 'mainspring[server]'",
        ),
        (
            ["psycopg", "psycopg_pool"],
            ["runs", "--db", "postgresql://nobody@127.0.0.1:1/none"],
            "error: the PostgreSQL store needs the postgres extra (psycopg is missing): "
            "pip install 'mainspring[postgres]'",
        ),
    ],
)
def test_a_missing_extra_is_one_line_with_the_pip_install(
    hidden: list[str], args: list[str], line: str, tmp_path: Path
) -> None:
    (tmp_path / "app.py").write_text(APP)
    done = _cli(hidden, args, tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [line]


def test_missing_extra_is_an_import_error_and_a_config_error() -> None:
    exc = ms.MissingExtra("the PostgreSQL store", "postgres", "psycopg")
    assert isinstance(exc, ImportError) and isinstance(exc, ms.ConfigError)
    assert exc.name == "psycopg" and exc.extra == "postgres"
    assert str(exc).endswith("pip install 'mainspring[postgres]'")


def test_no_help_page_shows_raw_markup() -> None:
    """Every command's --help, groups and subcommands included, reads as plain text: no
    reStructuredText double backticks (docstrings are written for the API docs)."""
    import typer
    from typer.testing import CliRunner

    from mainspring.cli import cli

    root = typer.main.get_command(cli)
    pages: list[tuple[str, ...]] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        pages.append(path)
        for name, sub in getattr(command, "commands", {}).items():  # a group's commands
            walk(sub, (*path, name))

    walk(root, ())
    runner = CliRunner()
    assert len(pages) > 20
    for path in pages:
        done = runner.invoke(cli, [*path, "--help"], env={"COLUMNS": "200"})
        assert done.exit_code == 0, (path, done.output)
        assert "``" not in done.output, (path, done.output)
