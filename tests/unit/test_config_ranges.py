"""Every numeric key of coordd's and the worker's config is range-checked in one place
(coordd.rules.ranges): 0, -1, NaN and infinity each either pass (where the key's range holds
them) or are a one-line config error naming the key; coordd exits 2, never a traceback."""

from __future__ import annotations

import math
import subprocess
import sys

import msgspec
import pytest

from coordd import config, config_defaults
from coordd.rules import ranges
from coordd.errors import ConfigError
from worker import config as wconfig

VALUES = {"0": 0, "-1": -1, "nan": math.nan, "inf": math.inf}
NUMERIC = {"int", "float", "list[int]"}


def _numeric_fields(struct: type[msgspec.Struct]) -> set[str]:
    return {f.name for f in msgspec.structs.fields(struct) if str(f.type) in NUMERIC
            or getattr(f.type, "__name__", "") in ("int", "float")}


def test_every_numeric_key_has_a_range():
    assert _numeric_fields(config.Config) == set(config_defaults.RANGES)
    assert _numeric_fields(wconfig.WorkerConfig) == set(wconfig.RANGES)
    assert _numeric_fields(wconfig.KindConfig) == set(wconfig.KIND_RANGES)
    assert {"max_memory_pct", "max_temperature_c", "min_battery_pct", "min_user_idle_s",
            "max_gpu_temperature_c"} == \
        set(config_defaults.GATE_RANGES)


def _toml(key: str, text: str, as_list: bool) -> str:
    return f"{key} = [{text}]\n" if as_list else f"{key} = {text}\n"


def _is_int(struct: type[msgspec.Struct], key: str) -> bool:
    return "int" in str({f.name: f.type for f in msgspec.structs.fields(struct)}[key])


@pytest.mark.parametrize("text", list(VALUES))
@pytest.mark.parametrize("key", sorted(config_defaults.RANGES))
def test_coordd_key_out_of_range_is_a_config_error_naming_it(tmp_path, key, text):
    path = tmp_path / "c.toml"
    path.write_text(_toml(key, text, key.startswith("admin_")))
    value = VALUES[text]
    in_range = config_defaults.RANGES[key].holds(value) and (
        value == int(value) or not _is_int(config.Config, key))
    try:
        config.load(path)  # in range: accepted (0 where the key means "off" or "none") ...
    except ConfigError as exc:  # ... unless a rule between keys refuses it, naming them
        assert key in str(exc) and str(path) in str(exc)
        assert in_range != (", got " in str(exc))  # a range error only out of range
    else:
        assert in_range


@pytest.mark.parametrize("text", list(VALUES))
@pytest.mark.parametrize("key", sorted(config_defaults.GATE_RANGES))
def test_gate_key_out_of_range_names_its_table(tmp_path, key, text):
    path = tmp_path / "c.toml"
    path.write_text(f"[gates.p2]\n{key} = {text}\n")
    if config_defaults.GATE_RANGES[key].holds(VALUES[text]):
        config.load(path)
        return
    with pytest.raises(ConfigError, match=f"gates.p2.{key} must be"):
        config.load(path)


def test_a_bad_gate_value_or_key_names_its_table(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[gates.p3]\nidle_unknown = "maybe"\n')
    with pytest.raises(ConfigError, match=r"`\$\.gates\.p3\.idle_unknown`"):
        config.load(path)
    path.write_text("[gates.p1]\nmin_idle = 5\n")
    with pytest.raises(ConfigError, match="gates.p1: .*unknown field `min_idle`"):
        config.load(path)


@pytest.mark.parametrize("text", list(VALUES))
@pytest.mark.parametrize("key", sorted(wconfig.RANGES))
def test_worker_key_out_of_range_is_a_config_error_naming_it(key, text):
    body = _toml(key, text, False) + ("stop_timeout_s = 1e6\n" if key == "grace_s" else "")
    try:
        wconfig.parse(body, "w.toml")
    except wconfig.WorkerConfigError as exc:  # out of range, or a rule between keys
        assert key in str(exc) and "w.toml" in str(exc)
    else:
        assert wconfig.RANGES[key].holds(VALUES[text])


@pytest.mark.parametrize("text", list(VALUES))
@pytest.mark.parametrize("key", sorted(wconfig.KIND_RANGES))
def test_worker_kind_key_out_of_range_names_the_kind(key, text):
    body = f'[kinds.echo]\nargv = ["echo"]\n{key} = {text}\n'
    if wconfig.KIND_RANGES[key].holds(VALUES[text]):
        wconfig.parse(body, "w.toml")
        return
    with pytest.raises(wconfig.WorkerConfigError) as info:
        wconfig.parse(body, "w.toml")
    assert key in str(info.value) and ("kinds.echo." in str(info.value) or "int" in str(info.value))


def test_range_words():
    assert ranges.POSITIVE_S.text() == "> 0 and <= 315360000"
    assert not ranges.FRACTION.holds(math.nan) and ranges.FRACTION.holds(1)
    assert not ranges.NON_NEGATIVE.holds(True)  # a TOML boolean is not a number


def test_coordd_exits_2_with_one_line_for_a_bad_interval(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("reaper_interval_s = 0\n")
    out = subprocess.run([sys.executable, "-m", "coordd", "--config", str(path), "--db",
                          str(tmp_path / "db"), "--socket", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr == (f"coordd: config {path}: reaper_interval_s must be a finite "
                          f"number > 0 and <= 315360000, got 0.0\n")
