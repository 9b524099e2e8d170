"""Architecture rules that a grep can hold (STYLE.md sections 1, 3 and 6)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIME_CALL = re.compile(r"time\.(time|monotonic|sleep)\(|datetime\.now")
SQL_WORD = re.compile(r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM)\b")


def _sources(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def test_only_clock_reads_time():
    """Time is injected: coordd and the worker supervisor read it only through coordd.clock
    (model processes under worker/models are separate programs and exempt)."""
    offenders = [
        f"{p.relative_to(ROOT)}:{n}" for p in _sources("coordd", "worker")
        if p.name != "clock.py" and "models" not in p.parts
        for n, line in enumerate(p.read_text().splitlines(), 1) if TIME_CALL.search(line)
    ]
    assert offenders == []


def test_sql_lives_in_store():
    """Every SQL statement of the daemon is in coordd/store.py."""
    offenders = [
        f"{p.relative_to(ROOT)}:{n}" for p in _sources("coordd")
        if p.name != "store.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if SQL_WORD.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []


def test_modules_stay_small():
    """One concern per module: none grows past 600 lines (STYLE asks for about 400)."""
    big = [f"{p.relative_to(ROOT)}: {n}" for p in _sources("coordd", "worker", "coordctl")
           if (n := len(p.read_text().splitlines())) > 600]
    assert big == []
