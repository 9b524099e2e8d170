"""Run the real coordd daemon with read-only instrumentation of its writer (bench only).

`python -m bench.probe STATS_FILE -- <coordd args>` runs `coordd.__main__.main` in this
process after wrapping two Writer methods, so the writer's own figures can be read from
outside without changing coordd:

- every `Writer` is remembered, so its `stats` (batches, requests, commit seconds) can
  be dumped;
- `Writer.submit` wraps each op so the time from submit to the op starting on the
  database thread (queue wait, including earlier ops of the same batch) is recorded.

SIGUSR2 writes the current counters and the queue waits since the last dump to
STATS_FILE (atomically: tmp file + rename), then clears the waits. The wrapper adds one
closure call and one `perf_counter` per request.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

# The checkout's editable install would lend a snapshot (--rev) the modules it lacks:
# drop it, so a revision runs only its own and the fallbacks see their ImportError.
sys.meta_path[:] = [f for f in sys.meta_path if "Editable" not in getattr(
    f, "__name__", type(f).__name__)]

try:  # the packaged layout (issue 27 item 4)
    from coordd.daemon import server
    from coordd.store.sqlite.writer import Writer
except ImportError:  # revisions before it (`--rev 9727d64`): the flat layout
    from coordd import server  # type: ignore[no-redef]
    from coordd.writer import Writer  # type: ignore[no-redef]

_writers: list[Writer] = []
_waits: list[list[float]] = [[]]


def _patch() -> None:
    orig_init, orig_submit, orig_run = Writer.__init__, Writer.submit, server.Daemon.run

    def init(self, *args, **kw):  # type: ignore[no-untyped-def]
        orig_init(self, *args, **kw)
        _writers.append(self)

    def submit(self, op, *args, **kw):  # type: ignore[no-untyped-def]
        t = time.perf_counter()

        def timed(conn, now, _op=op, _t=t):  # type: ignore[no-untyped-def]
            _waits[0].append(time.perf_counter() - _t)
            return _op(conn, now)
        return orig_submit(self, timed, *args, **kw)

    async def run(self):  # type: ignore[no-untyped-def]
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _dump)
        return await orig_run(self)

    Writer.__init__ = init  # type: ignore[method-assign]
    Writer.submit = submit  # type: ignore[method-assign]
    server.Daemon.run = run  # type: ignore[method-assign]


def _dump() -> None:
    waits, _waits[0] = _waits[0], []
    st = _writers[0].stats if _writers else None
    out = {
        "pid": os.getpid(),
        "batches": st.batches if st else 0,
        "requests": st.requests if st else 0,
        "commit_s_total": st.commit_s_total if st else 0.0,
        "max_batch": st.max_batch if st else 0,
        "commit_times": list(st.commit_times) if st else [],
        "waits": waits,
    }
    tmp = STATS_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, STATS_FILE)


if __name__ == "__main__":
    STATS_FILE = sys.argv[1]
    assert sys.argv[2] == "--"
    _patch()
    from coordd.__main__ import main
    sys.exit(main(sys.argv[3:]))
