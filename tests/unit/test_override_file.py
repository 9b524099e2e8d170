"""worker.override: the `--readings-override` file is read without blocking (a FIFO is
refused at once), within MAX_BYTES, as UTF-8 JSON; a bad file keeps the last good
override, no file ends it, and each change of state is one log line."""

from __future__ import annotations

import json
import logging
import os
import threading

import pytest

from worker import override as override_mod
from worker.override import ReadingsOverride
from worker.probes import READING_KEYS

MEASURED = {"memory_used_pct": 55.0, "temperature_c": 41.0}


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "worker.override"]


def _apply_in_thread(o: ReadingsOverride) -> dict:
    """apply() in a thread, as the heartbeat calls it; fails the test if it blocks."""
    out: list[dict] = []
    t = threading.Thread(target=lambda: out.append(o.apply(MEASURED)), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "apply() blocked"
    return out[0]


@pytest.mark.parametrize("make_bad,why", [
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.write_bytes(b"{" + b" " * override_mod.MAX_BYTES + b"}"),
     f"over {override_mod.MAX_BYTES} bytes, too large for a readings override"),
    (lambda p: p.write_bytes(b'{"temperature_c": 99, "x": "\xe9"}'), "not UTF-8"),
    (lambda p: p.write_text('{"temperature_c": '), "not JSON"),
    (lambda p: p.write_text("[" * 5_000 + "]" * 5_000), "not JSON"),
    (lambda p: p.write_text("[1, 2]"), "holds a JSON list, not an object"),
], ids=["fifo", "huge", "not_utf8", "half_written", "deep", "not_object"])
def test_a_bad_file_keeps_the_last_good_override_and_logs_once(tmp_path, caplog, make_bad,
                                                               why):
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"temperature_c": 90.0}))
    o = ReadingsOverride(str(path), READING_KEYS)
    with caplog.at_level(logging.INFO, logger="worker.override"):
        assert o.apply(MEASURED) == {**MEASURED, "temperature_c": 90.0}
        path.unlink()
        make_bad(path)
        for _ in range(3):
            assert _apply_in_thread(o) == {**MEASURED, "temperature_c": 90.0}
        path.unlink()
        path.write_text(json.dumps({"temperature_c": 20.0}))
        assert o.apply(MEASURED) == {**MEASURED, "temperature_c": 20.0}
    lines = _lines(caplog)
    assert len(lines) == 2, lines  # the bad file once, its recovery once
    assert why in lines[0] and "keeping the last good override" in lines[0], lines
    assert "in force again" in lines[1], lines


def test_a_bad_file_before_any_good_one_means_no_override(tmp_path, caplog):
    path = tmp_path / "o.json"
    os.mkfifo(path)
    o = ReadingsOverride(str(path), READING_KEYS)
    with caplog.at_level(logging.INFO, logger="worker.override"):
        assert _apply_in_thread(o) == MEASURED
    assert ["no override in force" in ln for ln in _lines(caplog)] == [True]


def test_no_file_ends_the_override(tmp_path, caplog):
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"temperature_c": 90.0}))
    o = ReadingsOverride(str(path), READING_KEYS)
    with caplog.at_level(logging.INFO, logger="worker.override"):
        assert o.apply(MEASURED)["temperature_c"] == 90.0
        path.unlink()
        assert o.apply(MEASURED) == MEASURED and o.apply(MEASURED) == MEASURED
        path.write_text("{oops")  # nothing good since the file went: still none
        assert o.apply(MEASURED) == MEASURED
    lines = _lines(caplog)
    assert len(lines) == 2 and "no such file" in lines[0], lines
    assert "no override in force" in lines[1], lines
