"""SIGHUP re-reads the TCP deny-lists through coordd.config, the loader coordd starts with:
the same types and errors. A file that does not validate changes no deny-list and logs one
error line; a valid one applies at once. Real coordd, real mutual TLS on loopback."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from coordd import errors
from coordd.net import pki
from coordd.client import Client, Disconnected
from tests.integration.fleet_certs import Fleet, make_fleet

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fleet(tmp_path) -> Fleet:
    return make_fleet(tmp_path, time.time())


def _until(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _sighup(d, text: str) -> list[str]:
    """Write `text` as coordd's config, SIGHUP it, wait for the reload's line; return the
    ERROR lines it logged."""
    before = d.log().count("SIGHUP:")
    start = len(d.log())
    Path(d.config).write_text(text)
    d.proc.send_signal(signal.SIGHUP)
    assert _until(lambda: d.log().count("SIGHUP:") > before), d.log()
    time.sleep(0.1)  # any other line of the same reload
    return [ln for ln in d.log()[start:].splitlines() if " ERROR " in ln]


async def _refused(d, fleet: Fleet, stem: str) -> bool:
    """True if a fresh connection with `stem`'s certificate is refused as denied: the
    `permission_denied` reply, or (when the close outruns it) the connection reset and
    coordd's log line of the refusal."""
    before = d.log().count("refused a TCP peer")
    try:
        async with Client(connector=fleet.connector(stem), timeout=3) as c:
            await c.status()
    except errors.PermissionDenied as exc:
        assert "deny-list" in str(exc)
        return True
    except Disconnected:
        if not _until(lambda: d.log().count("refused a TCP peer") > before, 3):
            raise
        return True
    return False


@pytest.mark.parametrize("bad,why", [
    ('tls_deny_workers = "wb"\n', "tls_deny_workers"),           # a string: not ["w", "b"]
    ('tls_deny_workers = ["wa", 3]\n', "tls_deny_workers"),      # a non-string in the list
    ('tls_deny_workers = ["wa"]\ntls_deny_serials = ["zz"]\n', "tls_deny_serials"),
    ('tls_deny_workers = ["wa"]\ntls_deny_serials = [""]\n', "tls_deny_serials"),
    ('tls_deny_workers = ["wa"\n', "not valid TOML"),
], ids=["string", "non_string", "bad_serial", "empty_serial", "not_toml"])
async def test_a_bad_deny_list_on_sighup_changes_nothing(daemon_factory, fleet, bad, why):
    d = daemon_factory(fleet.config('tls_deny_workers = ["wb"]\n'))
    d.start()
    assert await _refused(d, fleet, "worker-wb") and not await _refused(d, fleet, "worker-wa")
    errs = _sighup(d, fleet.config(bad))
    assert len(errs) == 1 and why in errs[0] and d.config in errs[0], errs
    assert "deny-lists" in errs[0] and "unchanged" in errs[0], errs
    assert await _refused(d, fleet, "worker-wb"), d.log()  # the old deny-list stays
    assert not await _refused(d, fleet, "worker-wa"), d.log()
    assert d.proc.poll() is None


async def test_a_valid_deny_list_on_sighup_applies_to_the_next_connection(daemon_factory,
                                                                          fleet):
    d = daemon_factory(fleet.config('tls_deny_workers = ["wb"]\n'))
    d.start()
    serial = pki.serial_of((fleet.ca_dir / "worker-wa.pem").read_bytes())
    colons = ":".join(serial.upper().zfill(len(serial) + len(serial) % 2)[i:i + 2]
                      for i in range(0, len(serial) + len(serial) % 2, 2))
    assert _sighup(d, fleet.config(f'tls_deny_serials = ["{colons}"]\n')) == []
    assert await _refused(d, fleet, "worker-wa"), d.log()   # by its serial, as openssl prints it
    assert not await _refused(d, fleet, "worker-wb"), d.log()  # no longer on the list
    assert _sighup(d, fleet.config('tls_deny_workers = ["wb"]\n')) == []
    assert await _refused(d, fleet, "worker-wb") and not await _refused(d, fleet, "worker-wa")


@pytest.mark.parametrize("bad", ['tls_deny_workers = "wb"\n', 'tls_deny_serials = ["0x1g"]\n'])
def test_coordd_refuses_to_start_with_a_bad_deny_list(daemon_factory, fleet, bad):
    d = daemon_factory(fleet.config(bad))
    proc = d.start(wait=False)
    assert proc.wait(10) == 2
    assert "tls_deny_" in d.log(), d.log()
