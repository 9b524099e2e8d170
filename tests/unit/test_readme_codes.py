"""The docs document every error code coordctl prints: coordd's (`ERROR_CODES`) and
coordctl's own (usage, disconnected, ... found in its source), so scripts can branch on
them (docs match code)."""

from __future__ import annotations

import re
from pathlib import Path

from coordd.store.sqlite.backup import RestoreRefused
from coordd.client import CallTimeout, Disconnected
from coordd.wire.protocol import ERROR_CODES

ROOT = Path(__file__).resolve().parents[2]
OWN_CODE = re.compile(r'(?:fail\(|failure = \(|return \(|Outcome\([^\n]*\()"([a-z_]+)", ')


def _docs(*pages: str) -> str:
    """The text of these pages under docs/ (the site: README links there)."""
    return "\n".join((ROOT / "docs" / p).read_text() for p in pages)


def test_every_code_coordctl_prints_is_in_the_docs():
    readme = _docs("reference/signals.md", "troubleshooting.md")
    source = "\n".join(p.read_text() for p in sorted((ROOT / "coordctl").glob("*.py")))
    own = set(OWN_CODE.findall(source)) | {Disconnected.code, CallTimeout.code,
                                           RestoreRefused.code}
    own -= set(ERROR_CODES)  # coordd's codes coordctl also uses (not_found for check PATH)
    assert {"usage", "disconnected", "artifacts_missing", "check_failed", "output",
            "restore_refused", "timeout"} <= own
    table = set(re.findall(r"^\| `([a-z_]+)` \| [12] \|", readme, re.M))
    assert own - table == set()
    documented = set(re.findall(r"`([a-z_]+)`", readme))
    assert set(ERROR_CODES) - documented == set()


def test_every_backup_path_in_the_docs_is_in_the_units_backup_folder():
    """The systemd unit lets coordd write backups only to /var/backups/coordd/: every
    example (backup, restore, check) names a file there."""
    readme = "\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))) \
        + (ROOT / "README.md").read_text()
    paths = re.findall(r"/var/backups/[^\s`|)]*", readme)
    assert paths and [p for p in paths if not p.startswith("/var/backups/coordd")] == []
    assert "ReadWritePaths=-/var/backups/coordd" in (ROOT / "systemd" / "coordd.service").read_text()
