"""`mkdocs build --strict` passes: no broken link or anchor, no page left out of the nav
(mkdocs.yml's `validation` turns those into warnings, and --strict fails on a warning)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.docs.runnable import ROOT


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    assert (tmp_path / "site" / "reference" / "client" / "index.html").exists()
    client = (tmp_path / "site" / "reference" / "client" / "index.html").read_text()
    assert 'id="coordd.client.SyncClient"' in client  # mkdocstrings rendered the module
