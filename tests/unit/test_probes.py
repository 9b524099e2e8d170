"""Probes with fake providers at the host boundary (CASES B28, B29)."""

from __future__ import annotations

import json
import logging
import os
from collections import namedtuple
from pathlib import Path

import pytest

from worker.override import ReadingsOverride
from worker.probes import READING_KEYS, Probes, SourceUnknown, tty_idle_source

Mem = namedtuple("Mem", "total available percent")
Temp = namedtuple("Temp", "label current high critical")
Battery = namedtuple("Battery", "percent secsleft power_plugged")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def idle_unknown() -> float:
    raise SourceUnknown("test: no source")


def make(**kw: object) -> Probes:
    defaults: dict[str, object] = {
        "virtual_memory": lambda: Mem(100, 40, 60.0),
        "sensors_temperatures": lambda: {"coretemp": [Temp("Package id 0", 50.0, 80.0, 100.0)]},
        "sensors_battery": lambda: None,
        "idle_sources": [("fake", lambda: 120.0)],
        "mono": FakeClock(),
    }
    defaults.update(kw)
    return Probes(**defaults)  # type: ignore[arg-type]


def test_read_returns_exactly_the_documented_keys() -> None:
    readings = make().read()
    assert tuple(sorted(readings)) == tuple(sorted(READING_KEYS))
    assert readings["memory_used_pct"] == 60.0
    assert readings["temperature_c"] == 50.0 and readings["temperature_reason"] is None
    assert readings["user_idle_s"] == 120.0 and readings["user_idle_reason"] is None


def test_b28_empty_dict_is_unavailable_with_reason() -> None:
    readings = make(sensors_temperatures=lambda: {}).read()
    assert readings["temperature_c"] is None
    assert readings["temperature_reason"] == "no sensors"


def test_b28_other_chip_names_use_max_over_all_sensors() -> None:
    chips = {
        "k10temp": [Temp("Tctl", 61.5, None, None), Temp("Tccd1", 58.0, None, None)],
        "acpitz": [Temp("", 27.8, 105.0, 105.0), Temp("", None, None, None)],
    }
    readings = make(sensors_temperatures=lambda: chips).read()
    assert readings["temperature_c"] == 61.5
    assert readings["temperature_reason"] is None


def test_b28_oserror_is_unavailable_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    def raising() -> dict[str, list[Temp]]:
        raise OSError(19, "No such device")

    clock = FakeClock()
    probes = make(sensors_temperatures=raising, mono=clock)
    with caplog.at_level(logging.WARNING, logger="worker.probes"):
        first = probes.read()
        probes.read()
        clock.now += 599
        probes.read()
    assert first["temperature_c"] is None
    assert first["temperature_reason"].startswith("sensors_temperatures raised OSError")
    assert "No such device" in first["temperature_reason"]
    assert len([r for r in caplog.records if "sensors_temperatures" in r.getMessage()]) == 1
    clock.now += 2
    with caplog.at_level(logging.WARNING, logger="worker.probes"):
        probes.read()
    assert len([r for r in caplog.records if "sensors_temperatures" in r.getMessage()]) == 2


def test_b28_missing_function_on_this_platform() -> None:
    readings = make(sensors_temperatures=None).read()
    assert readings["temperature_c"] is None
    assert readings["temperature_reason"] == "not supported on this platform"


def test_b29_no_battery_counts_as_mains() -> None:
    readings = make(sensors_battery=lambda: None).read()
    assert readings["on_battery"] is False
    assert readings["battery_pct"] is None
    assert readings["power_reason"] == "no battery"


def test_b29_power_plugged_none_is_unknown() -> None:
    readings = make(sensors_battery=lambda: Battery(100.0, -2, None)).read()
    assert readings["on_battery"] is None
    assert readings["power_reason"] == "power state unknown"
    assert readings["battery_pct"] == 100.0


def test_b29_unplugged_at_15_percent_is_on_battery() -> None:
    readings = make(sensors_battery=lambda: Battery(15, 3600, False)).read()
    assert readings["on_battery"] is True
    assert readings["battery_pct"] == 15.0
    assert readings["power_reason"] is None


def test_b29_plugged_in_is_mains() -> None:
    readings = make(sensors_battery=lambda: Battery(80.0, -2, True)).read()
    assert readings["on_battery"] is False and readings["power_reason"] is None


def test_b29_provider_raising_or_malformed_never_raises() -> None:
    def raising() -> Battery:
        raise AttributeError("'NoneType' object has no attribute 'percent'")

    for provider in (raising, lambda: object()):
        readings = make(sensors_battery=provider).read()
        assert readings["on_battery"] is None
        assert "sensors_battery raised AttributeError" in readings["power_reason"]


def test_memory_provider_failure_gives_none() -> None:
    def raising() -> Mem:
        raise OSError("no /proc")

    assert make(virtual_memory=raising).read()["memory_used_pct"] is None


def test_idle_unknown_when_no_source_answers() -> None:
    def broken() -> float:
        raise RuntimeError("boom")

    readings = make(idle_sources=[("logind", idle_unknown), ("tty", broken)]).read()
    assert readings["user_idle_s"] is None
    reason = readings["user_idle_reason"]
    assert reason.startswith("no idle source answered")
    assert "logind: test: no source" in reason and "tty: source raised RuntimeError: boom" in reason


def test_idle_is_minimum_over_answering_sources() -> None:
    readings = make(idle_sources=[("a", lambda: 300.0), ("b", idle_unknown), ("c", lambda: 42.0)]).read()
    assert readings["user_idle_s"] == 42.0 and readings["user_idle_reason"] is None


def test_tty_scan_skips_serial_and_uses_newest_atime(tmp_path: Path) -> None:
    (tmp_path / "pts").mkdir()
    for name, atime in (("tty1", 500), ("ttyS0", 990), ("ttyACM0", 990), ("pts/3", 700), ("pts/ptmx", 999)):
        (tmp_path / name).touch()
        os.utime(tmp_path / name, (atime, atime))
    assert tty_idle_source(wall=lambda: 1000.0, dev=str(tmp_path))() == 300.0


def test_tty_scan_without_devices_is_unknown(tmp_path: Path) -> None:
    with pytest.raises(SourceUnknown, match="no tty/pty device"):
        tty_idle_source(wall=lambda: 1000.0, dev=str(tmp_path))()


def test_override_file_replaces_keys(tmp_path: Path) -> None:
    path = tmp_path / "override.json"
    path.write_text(json.dumps({"on_battery": True, "temperature_c": 99.0, "extra": "x"}))
    probes = make(override_path=str(path))
    readings = probes.read()
    assert readings["on_battery"] is True and readings["temperature_c"] == 99.0 and readings["extra"] == "x"
    assert readings["memory_used_pct"] == 60.0
    path.write_text(json.dumps({"user_idle_s": None}))  # read again on every call
    readings = probes.read()
    assert readings["user_idle_s"] is None and readings["on_battery"] is False


def test_override_missing_or_bad_file_is_ignored(tmp_path: Path) -> None:
    readings = {"memory_used_pct": 10.0}
    assert make().read()["memory_used_pct"] == 60.0  # no override given
    assert ReadingsOverride(str(tmp_path / "missing.json"), READING_KEYS).apply(readings) \
        == readings
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert ReadingsOverride(str(bad), READING_KEYS).apply(readings) == readings
    bad.write_text("[1, 2]")
    assert ReadingsOverride(str(bad), READING_KEYS).apply(readings) == readings


def test_default_probes_read_this_host() -> None:
    readings = Probes().read()
    assert set(readings) == set(READING_KEYS)
    assert 0.0 <= readings["memory_used_pct"] <= 100.0
    assert (readings["temperature_c"] is None) == (readings["temperature_reason"] is not None)
    assert (readings["user_idle_s"] is None) == (readings["user_idle_reason"] is not None)
