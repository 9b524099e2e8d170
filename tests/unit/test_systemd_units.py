"""The systemd units parse and reference real commands (systemd-analyze verify)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_units_verify_clean(tmp_path):
    bindir = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(bindir, "coordd")):
        pytest.skip("console scripts not installed beside this interpreter")
    names = ["coordd.service", "coordd.socket", "coord-worker@.service"]
    for name in names:
        text = (UNITS / name).read_text().replace("/opt/coordd/bin/", bindir + "/")
        (tmp_path / name).write_text(text)
    (tmp_path / "coord-worker@gpu1.service").symlink_to(tmp_path / "coord-worker@.service")
    out = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / n) for n in
                                        ["coordd.service", "coordd.socket",
                                         "coord-worker@gpu1.service"])],
        capture_output=True, text=True, timeout=60)
    problems = [line for line in (out.stdout + out.stderr).splitlines()
                if "coordd" in line or "coord-worker" in line]
    assert problems == [], problems


def test_service_contract():
    svc = (UNITS / "coordd.service").read_text()
    assert "Type=notify" in svc and "WatchdogSec=" in svc
    assert "RuntimeDirectoryPreserve=yes" in svc  # the activated socket must survive restarts
    sock = (UNITS / "coordd.socket").read_text()
    assert "SocketMode=0660" in sock
    worker = (UNITS / "coord-worker@.service").read_text()
    assert "--worker-id %i" in worker and "KillMode=mixed" in worker
