"""The built wheel: installed into a fresh virtualenv, ``mainspring demo`` runs from it.

A user who runs ``pip install mainspring`` has no source checkout: the demo's workflow must
ship inside the package, and the workers it starts must import it from the installed copy.
The venv is isolated (no system or outer site-packages): pip installs the wheel *with* its
dependencies from the package index, as a user's ``pip install`` does, so a dependency
missing from ``pyproject.toml`` fails here. mainspring itself comes from the wheel, and the
test checks that it did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import hatchling  # noqa: F401
    except ImportError:
        pytest.fail("building the wheel needs hatchling: pip install -e '.[dev]'")
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # No build isolation: the build backend is already installed, so no network is needed.
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(ROOT)],
        cwd=out,
        env=env,
    )  # fmt: skip
    [built] = out.glob("mainspring-*.whl")
    return built


def test_the_wheel_holds_the_demo_workflow(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mainspring/examples/migration/worker_app.py" in names
    assert "mainspring/cli/_demo.py" in names


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; its ``bin`` directory."""
    root = tmp_path_factory.mktemp("wheel-venv")
    venv = root / "venv"
    env = _env()
    # Isolated: nothing borrowed from the interpreter that runs the tests (a virtualenv of
    # its own, a conda env or a --user install would each lend different packages).
    _run([sys.executable, "-m", "venv", str(venv)], cwd=root, env=env)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], cwd=root, env=env)
    where = _run(
        [str(python), "-c", "import mainspring; print(mainspring.__file__)"], cwd=root, env=env
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the wheel's copy, not the checkout
    # Nothing borrowed: the server extra's FastAPI, present where the tests run, is not here.
    borrowed = subprocess.run(
        [str(python), "-c", "import fastapi"], cwd=root, env=env, capture_output=True, check=False
    )
    assert borrowed.returncode != 0, "the wheel's venv sees the test interpreter's packages"
    return venv / "bin"


def _env() -> dict[str, str]:
    # Nothing that points an interpreter at other packages (a user site, a path, the
    # virtualenv the tests run in).
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "VIRTUAL_ENV"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_demo_runs_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    done = _run(
        [str(installed / "mainspring"), "demo", "--yes", "--no-lab", "--customers", "12",
         "--dir", str(demo)],
        cwd=tmp_path,
        env=_env(),
    )  # fmt: skip
    assert "all 9 checks passed" in done.stdout, done.stdout
    assert f"({installed.parent}" in done.stdout  # the workflow line names the installed package
    # The workers imported the same installed copy (their logs would show a traceback).
    for log in ("worker-1.log", "worker-2.log"):
        assert "Traceback" not in (demo / log).read_text()


def test_the_horizon_suite_without_its_extra_says_which_to_install(
    installed: Path, tmp_path: Path
) -> None:
    """The core install has no ``openai`` SDK: the suite says so once, up front, instead of
    failing every run with the same error."""
    done = subprocess.run(
        [str(installed / "mainspring"), "lab", "suite", "--quick"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "pip install 'mainspring[lab]'" in done.stdout + done.stderr, (done.stdout, done.stderr)


@pytest.fixture(scope="module")
def installed_lab(installed: Path, wheel: Path) -> Path:
    """The same venv with the ``lab`` extra, as the README's demo command installs it."""
    _run([str(installed / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[lab]"],
         cwd=installed, env=_env())  # fmt: skip
    return installed


def test_the_horizon_suite_runs_from_the_installed_wheel(
    installed_lab: Path, tmp_path: Path
) -> None:
    """``mainspring lab suite --quick``: its worker processes import the suite's App from the
    installed package (no checkout on the path), and every run passes its audit."""
    done = _run(
        [str(installed_lab / "mainspring"), "lab", "suite", "--quick", "--json"],
        cwd=tmp_path,
        env=_env(),
    )
    report = json.loads(done.stdout)
    cells = report["cells"]
    assert cells and all(c["succeeded"] == c["runs"] for c in cells), done.stdout
    assert all(c["duplicate_effects"] == 0 for c in cells), done.stdout
