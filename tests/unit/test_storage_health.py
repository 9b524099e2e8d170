"""Storage refusals (issue 21, finding 5): SQLite's disk-full / I/O errors become the
retryable `unavailable`, and an episode of them is logged once, then summed up."""

from __future__ import annotations

import logging
import sqlite3

from coordd import errors
from coordd.wire import protocol
from coordd.store.sqlite.storage_health import LOG_EVERY_S, StorageHealth, storage_reason


def _sqlite_error(code: int, text: str) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(text)
    exc.sqlite_errorcode = code
    return exc


def test_storage_errors_are_told_apart_from_bugs():
    assert storage_reason(_sqlite_error(13, "database or disk is full")) == "disk full"
    assert storage_reason(_sqlite_error(10 | (3 << 8), "disk I/O error")) == "I/O error"
    wrapped = errors.CoordError("rolled back")
    wrapped.__cause__ = _sqlite_error(13, "database or disk is full")
    assert storage_reason(wrapped) == "disk full"
    assert storage_reason(_sqlite_error(1, "no such table: x")) is None
    assert storage_reason(ValueError("x")) is None


def test_unavailable_is_a_stable_wire_code():
    assert "unavailable" in protocol.ERROR_CODES
    assert set(protocol.ERROR_CODES) == set(errors.ERROR_CODES)
    err = errors.error_for_code("unavailable", "disk full: ...")
    assert isinstance(err, errors.Unavailable)


def test_an_episode_is_logged_once_then_summed_up(caplog):
    h = StorageHealth()
    full = _sqlite_error(13, "database or disk is full")
    caplog.set_level(logging.INFO, logger="coordd.store.sqlite.storage_health")
    mono = 0.0
    for _ in range(200):  # 200 refused batches over 20 s
        err = h.refuse(full, "disk full", 3, 1000.0 + mono, mono)
        h.committed(mono)  # small writes still go through: the episode goes on
        mono += 0.1
    assert err.code == "unavailable" and err.message.startswith("disk full")
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    assert h.warning().startswith("disk full: writes refused (unavailable) since")
    h.refuse(full, "disk full", 1, 1000.0 + LOG_EVERY_S + 1, LOG_EVERY_S + 1)
    assert len(caplog.records) == 2 and "still refusing" in caplog.records[1].getMessage()
    h.committed(LOG_EVERY_S + 10)
    assert h.warning() is None
    assert "takes writes again" in caplog.records[-1].getMessage()
    assert f"({200 * 3 + 1} request(s) refused)" in caplog.records[-1].getMessage()
