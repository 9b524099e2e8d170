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
    """Every SQL statement of the daemon is in the coordd/store package (one module per
    area: jobs and leases in jobs.py, the others beside it)."""
    offenders = [
        f"{p.relative_to(ROOT)}:{n}" for p in _sources("coordd")
        if "store" not in p.relative_to(ROOT / "coordd").parts[:-1]
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if SQL_WORD.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []


def test_modules_stay_small():
    """One concern per module: none grows past 400 lines."""
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for p in _sources("coordd", "worker", "coordctl", "coordd_web", "coordd_mcp")}
    big = [f"{m}: {n}" for m, n in sorted(sizes.items())
           if n > 400]
    assert big == []


CASES = ROOT.parent / "shared" / "cases" / "CASES.md"


def test_every_failure_case_has_a_test_named_after_its_id():
    """Each case in shared/cases/CASES.md ends with a test named test_bNN_... (issue 7)."""
    if not CASES.exists():
        import pytest
        pytest.skip(f"{CASES} is not beside this checkout")
    ids = sorted(set(re.findall(r"^### (B\d+)", CASES.read_text(), re.M)))
    prefixes = re.findall(r"def test_((?:b\d+_)+)", "\n".join(
        p.read_text() for p in sorted((ROOT / "tests").rglob("test_*.py"))))
    covered = {c.upper() for prefix in prefixes for c in prefix.split("_") if c}
    assert ids and [c for c in ids if c not in covered] == []


def test_docs_config_example_is_accepted(tmp_path):
    """Every key of the docs' annotated coordd TOML example is a real, valid setting (docs
    match code)."""
    from coordd import config
    text = (ROOT / "docs" / "reference" / "example-config.md").read_text()
    block = re.search(r"## coordd .*?```toml\n(.*?)```", text, re.S)
    assert block is not None
    path = tmp_path / "readme.toml"
    path.write_text(block.group(1))
    cfg = config.load(path)
    assert cfg.policies()[3].require_mains is True
