"""The systemd units parse and reference real commands (systemd-analyze verify)."""

from __future__ import annotations

import os
import re
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


README = UNITS.parent / "docs" / "guides" / "systemd.md"  # the systemd install guide


def _writable(unit: str) -> list[tuple[str, bool]]:
    """(path, must exist beforehand) for each place the unit lets its service write under
    ProtectSystem=strict: StateDirectory/RuntimeDirectory (systemd creates them) and
    ReadWritePaths (a `-` prefix: ignored when missing, so the README must create it)."""
    out = []
    for line in unit.splitlines():
        key, _, value = line.partition("=")
        for item in value.split():
            if key == "StateDirectory":
                out.append((f"/var/lib/{item}", False))
            elif key == "RuntimeDirectory":
                out.append((f"/run/{item}", False))
            elif key == "ReadWritePaths":
                out.append((item.lstrip("-+"), True))
    return out


def _systemd_section() -> str:
    return README.read_text()


def test_readme_backup_lands_where_the_unit_lets_coordd_write():
    """Issue 14, bug 7: the README's backup commands name a folder coordd.service can write
    (coordd writes the copy itself), never its private /tmp, and the folders the unit does
    not create are created in the README's install steps, before coordd starts."""
    svc = (UNITS / "coordd.service").read_text()
    assert "ProtectSystem=strict" in svc and "PrivateTmp=yes" in svc
    writable = _writable(svc)
    dests = re.findall(r"coordctl\b[^\n`|]*?\bbackup\s+(/[^\s`|]+)", README.read_text())
    assert dests, "the README shows no absolute backup path"
    section = _systemd_section()
    install = section[:section.index("systemctl enable --now coordd")]
    for dest in dests:
        folder = os.path.dirname(dest)
        assert not folder.startswith(("/tmp", "/var/tmp")), dest
        owners = [(w, pre) for w, pre in writable if folder == w or folder.startswith(w + "/")]
        assert owners, f"{dest}: not under the unit's writable paths {writable}"
        for path, must_exist in owners:
            if must_exist:
                assert re.search(rf"install -d [^\n]*{re.escape(path)}\b", install), path
    assert any(os.path.dirname(d) == "/var/backups/coordd" for d in
               re.findall(r"backup\s+(/\S+)", section))


def test_readme_systemd_section_matches_the_units():
    """The paths and names the units use are the ones the README sets up."""
    section = _systemd_section()
    svc = (UNITS / "coordd.service").read_text()
    worker = (UNITS / "coord-worker@.service").read_text()
    for unit in (svc, worker):
        for path in re.findall(r"--config (\S+)", unit):
            assert path in section, path
        for path in re.findall(r"--socket (\S+)", unit):
            assert path in section, path
    env = re.search(r"EnvironmentFile=-?(\S+)", worker).group(1)
    assert env.replace("%i", "gpu1") in section and "coord-worker@gpu1" in section
    assert re.search(r"WatchdogSec=(\d+)", svc).group(1) in section
    assert "User=coord-worker" in worker and "useradd --system --user-group --groups coordd " \
        "coord-worker" in section and "SupplementaryGroups=coordd" in worker
    state = re.search(r"StateDirectory=(\S+)", worker).group(1).replace("%i", "ID")
    assert f"/var/lib/{state}/work" in section
    assert "Environment=HOME=%S/coord-worker/%i" in worker  # a user without a home


def test_installed_worker_works_in_its_state_directory_without_a_home(tmp_path, monkeypatch):
    """The README copies examples/worker.toml to /etc/coordd/worker.toml; under the unit
    (STATE_DIRECTORY set, no home) its work_dir is the state directory's, not under ~."""
    from worker.config import load
    state = tmp_path / "var-lib-coord-worker-gpu1"
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    cfg = load(UNITS.parent / "examples" / "worker.toml")
    assert cfg.work_dir == str(state / "work")
    monkeypatch.delenv("STATE_DIRECTORY")
    assert load(None).work_dir == "/nonexistent/.local/state/coordd/work"
