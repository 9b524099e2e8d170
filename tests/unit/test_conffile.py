"""A config file that is a FIFO, a directory, huge or not UTF-8 is a one-line config error
at once (coordd.conffile), for coordd's config and the worker's: never a hang (a SIGHUP
re-reads coordd's on its event loop) nor a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from coordd import conffile, config
from coordd.errors import ConfigError
from worker import config as wconfig

pytestmark = pytest.mark.timeout(20)


def _bad_files(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # nobody writes it: a blocking open would wait forever
    huge = tmp_path / "huge.toml"
    huge.write_text("reaper_interval_s = 5\n" + "#" * conffile.MAX_BYTES + "\n")
    latin = tmp_path / "latin1.toml"
    latin.write_bytes(b"# caf\xe9\nreaper_interval_s = 5\n")
    return [(fifo, "not a regular file"), (tmp_path, "not a regular file"),
            (huge, f"over {conffile.MAX_BYTES} bytes, too large for a config file"),
            (latin, "not UTF-8 text (invalid continuation byte at byte 5)"),
            (tmp_path / "missing.toml", "No such file or directory")]


def test_coordd_and_worker_refuse_unreadable_config_files_in_one_line(tmp_path):
    for path, why in _bad_files(tmp_path):
        with pytest.raises(ConfigError) as got:
            config.load(str(path))
        assert str(got.value) == f"config {path}: {why}"
        with pytest.raises(wconfig.WorkerConfigError) as wgot:
            wconfig.load(str(path))
        assert str(wgot.value) == f"cannot read config {path}: {why}"
    ok = tmp_path / "ok.toml"
    ok.write_text("reaper_interval_s = 5  # ünïcode is fine\n")
    assert config.load(str(ok)).reaper_interval_s == 5


def test_coordd_exits_2_with_one_line_for_a_config_that_is_not_utf8(tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes(b"reaper_interval_s = 5 # \xff\n")
    out = subprocess.run([sys.executable, "-m", "coordd", "--config", str(path), "--db",
                          str(tmp_path / "db"), "--socket", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (f"coordd: config {path}: not UTF-8 text (invalid start byte at "
                          f"byte 24)\n")
