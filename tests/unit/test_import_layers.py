"""The import layers hold: every import-linter contract in pyproject.toml's
[tool.importlinter] is kept (issue 27 item 4; docs/decisions.md). Each contract is checked
on its own (`lint-imports --contract ID`), so a failure names the contract and prints the
import chains that break it."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"]
RUN = ("import sys; from importlinter.cli import lint_imports; "
       "sys.exit(lint_imports(limit_to_contracts=tuple(sys.argv[1:]), no_cache=True, "
       "no_logo=True))")


def test_the_layers_are_locked_in():
    ids = {c["id"] for c in CONTRACTS}
    assert {"layers", "rules-are-pure", "base-below-packages", "stores-below-coordinator",
            "postgres-not-sqlite", "service-over-the-interface", "service-no-driver",
            "wire-at-the-bottom", "net-layers", "clients", "no-circles"} <= ids


def test_each_package_says_what_lives_there_and_what_it_may_import():
    """Every package of coordd opens with a docstring of a few lines naming what lives
    there and what it may import (the layers contract keeps the second true)."""
    for init in sorted((ROOT / "coordd").rglob("__init__.py")):
        doc = (ast.get_docstring(ast.parse(init.read_text())) or "")
        assert "TODO" not in doc and "import" in doc.lower(), init.relative_to(ROOT)


@pytest.mark.parametrize("contract_id", [c["id"] for c in CONTRACTS])
def test_contract_is_kept(contract_id: str):
    res = subprocess.run([sys.executable, "-c", RUN, contract_id], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"contract {contract_id} is broken:\n{res.stdout}{res.stderr}"
    assert "1 kept, 0 broken" in res.stdout
