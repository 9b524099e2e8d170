"""`coordctl logs JOB [--follow]`: a job's model output (stdout, stderr) as coordd kept it.

The model's stdout goes to stdout and its stderr to stderr, as the model wrote them;
coordctl's own marks (which attempt, bytes not kept) go to stderr as `--- ... ---` lines.
Control characters are shown escaped unless `--raw` (a carriage return, as progress bars
write it, as a new line). `--follow` polls gently
(FOLLOW_POLL_S) until the job has ended and its last output is printed.
"""

from __future__ import annotations

import argparse
import codecs
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from coordctl.commands import JOB_ID_HELP, Outcome, UsageError, resolve_job_id
from coordctl.render import safe
from coordd.wire.protocol import TERMINAL_STATUSES
from coordd.wire.logs import LOG_STREAMS, JobLogs

FOLLOW_POLL_S = 1.0
READ_BYTES = 1 << 20

AddCommand = Callable[[str, str], argparse.ArgumentParser]


def add_parsers(cmd: AddCommand) -> None:
    """Register `logs` with coordctl's parser."""
    lg = cmd("logs", "a job's model output (stdout and stderr, per attempt)")
    lg.add_argument("job_id", metavar="ID", help=JOB_ID_HELP)
    lg.add_argument("--follow", "-f", action="store_true",
                    help="keep printing new output until the job has ended")
    lg.add_argument("--attempt", type=int, metavar="N", help="only attempt N")
    lg.add_argument("--stream", choices=LOG_STREAMS, help="only stdout or only stderr")
    lg.add_argument("--raw", action="store_true",
                    help="the bytes exactly as written (no escaping of control characters)")


class _Printer:
    """Writes chunks to stdout/stderr in order, with attempt and gap marks."""

    def __init__(self, stream: str | None, raw: bool) -> None:
        self.only, self.raw = stream, raw
        self.token: int | None = None
        self.runs: dict[int, int] = {}  # attempt number -> runs seen with it
        self.ends: dict[tuple[int, str], int] = {}
        self.decoders: dict[tuple[int, str], Any] = {}
        self.chunks = 0

    def _out(self, stream: str) -> TextIO:
        return sys.stdout if stream == "stdout" else sys.stderr

    def chunk(self, c: Any) -> None:
        if self.only is not None and c.stream != self.only:
            return
        self.chunks += 1
        if c.token != self.token:
            self.token = c.token
            sys.stdout.flush()
            seen = self.runs[c.attempt] = self.runs.get(c.attempt, 0) + 1
            again = "" if seen == 1 else f", run {seen}"  # handed back, vacated or retried
            print(f"--- attempt {c.attempt}{again} (worker {safe(c.worker_id)}, lease token "
                  f"{c.token}) ---", file=sys.stderr, flush=True)
        key = (c.token, c.stream)
        out = self._out(c.stream)
        gap = c.pos - self.ends.get(key, 0)
        if gap > 0:
            print(f"--- {c.stream}: {gap} earlier bytes not kept ---", file=sys.stderr,
                  flush=True)
        self.ends[key] = c.pos + len(c.data)
        if self.raw:
            out.flush()
            out.buffer.write(c.data)
            out.buffer.flush()
            return
        dec = self.decoders.setdefault(key, codecs.getincrementaldecoder("utf-8")("replace"))
        text = dec.decode(c.data).replace("\r\n", "\n").replace("\r", "\n")  # progress bars
        out.write(safe(text))
        out.flush()


def _json_chunk(c: Any) -> dict[str, Any]:
    return {"seq": c.seq, "attempt": c.attempt, "token": c.token, "worker_id": c.worker_id,
            "stream": c.stream, "pos": c.pos, "bytes": len(c.data),
            "text": c.data.decode("utf-8", "replace"), "at": c.at}


def logs(client: Any, args: argparse.Namespace) -> Outcome:
    """`logs ID [--follow] [--attempt N] [--stream S] [--raw]`."""
    if args.follow and args.json:
        raise UsageError("--follow prints as it goes; --json takes one read")
    job_id = resolve_job_id(client, args.job_id)  # a unique prefix, as `show` takes it
    after, chunks, status = 0, [], ""
    printer = _Printer(args.stream, args.raw)
    while True:
        res: JobLogs = client.job_logs(job_id, after=after, attempt=args.attempt,
                                       limit_bytes=READ_BYTES)
        status, after = res.status, res.next_after
        for c in res.chunks:
            if args.json:
                if args.stream is None or c.stream == args.stream:
                    chunks.append(_json_chunk(c))
            else:
                printer.chunk(c)
        if res.more:
            continue
        if not args.follow or status in TERMINAL_STATUSES:
            break
        time.sleep(FOLLOW_POLL_S)
    if not args.json and printer.chunks == 0:
        print(f"--- no output kept for job {safe(job_id)} ({status}) ---", file=sys.stderr)
    return Outcome({"job_id": job_id, "status": status, "chunks": chunks}, "")


COMMANDS = {"logs": logs}
