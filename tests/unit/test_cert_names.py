"""One name for a worker's certificate everywhere (issue 31 item 4): what `coordctl ca issue
--worker ID` writes, what `coord-worker enroll` writes (and its default folder as root),
and what systemd/coord-worker-fleet.conf loads."""

from __future__ import annotations

import re
import time
from pathlib import Path

from coordd.net import pki
from worker import enroll

ROOT = Path(__file__).resolve().parents[2]


def test_issue_enroll_and_the_fleet_drop_in_agree(tmp_path):
    pki.init_ca(tmp_path, now=time.time())
    issued = pki.issue(tmp_path, worker="gpu1", now=time.time())
    cert, key, ca = enroll.files(Path(enroll.SYSTEM_TLS_DIR), "gpu1")
    assert (cert.name, key.name, ca.name) == (issued.cert.name, issued.key.name, pki.CA_CERT)
    unit = (ROOT / "systemd" / "coord-worker-fleet.conf").read_text()
    loaded = {Path(p.replace("%i", "gpu1")) for p in
              re.findall(r"^LoadCredential=[^:]+:(\S+)$", unit, re.M)}
    assert loaded == {cert, key, ca}, loaded
