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


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_coordd_service_exposure_at_most_2(tmp_path):
    """`systemd-analyze security --offline=yes` rates coordd.service 2.0 or better (issue 5)."""
    import re
    unit = tmp_path / "coordd.service"
    unit.write_text((UNITS / "coordd.service").read_text())
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                         capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for coordd\.service: ([0-9.]+)", out.stdout)
    if m is None:
        pytest.skip(f"this systemd-analyze cannot rate units offline: {out.stderr[-200:]}")
    assert float(m.group(1)) <= 2.0, out.stdout[-2000:]
