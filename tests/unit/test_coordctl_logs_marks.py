"""coordctl logs' marks: each run of a job gets its own mark, and a run whose attempt
number repeats (a hand-back or vacate spends no attempt; a retry starts the count again)
is numbered as another run of it."""

from __future__ import annotations

from coordctl.logs import _Printer
from coordd.wire.logs import LogChunk


def chunk(seq: int, attempt: int, token: int, data: bytes, pos: int = 0) -> LogChunk:
    return LogChunk(seq=seq, attempt=attempt, token=token, worker_id="w1", stream="stdout",
                    pos=pos, data=data, at=0.0)


def test_a_repeated_attempt_number_is_marked_as_another_run(capsys):
    p = _Printer(None, raw=False)
    for c in [chunk(1, 1, 10, b"a\n"), chunk(2, 1, 10, b"b\n", pos=2), chunk(3, 2, 11, b"c\n"),
              chunk(4, 1, 12, b"d\n")]:
        p.chunk(c)
    out, err = capsys.readouterr()
    assert out == "a\nb\nc\nd\n"
    marks = [line for line in err.splitlines() if line.startswith("---")]
    assert marks == [
        "--- attempt 1 (worker w1, lease token 10) ---",
        "--- attempt 2 (worker w1, lease token 11) ---",
        "--- attempt 1, run 2 (worker w1, lease token 12) ---",
    ]
