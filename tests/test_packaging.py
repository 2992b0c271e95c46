"""The two dependency lists (pyproject.toml for pip, environment.yml for conda/Binder) agree."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_norm(r) for r in project["dependencies"] + extras["test"] + extras["lab"]}
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    pip_deps = {
        _norm(line.strip()[2:]) for line in lines[start + 1 :] if line.strip().startswith("- ")
    }
    assert pip_deps == wanted


def test_console_script_and_ci():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["explorer"] == "explorer.cli:main"
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "torch==2.13.0" in makefile and "TORCH" in makefile
