"""`coordctl [--socket PATH] [--json] [--timeout S] COMMAND ...`: the coordd admin CLI.

Exit codes: 0 ok; 1 the operation was refused or failed (a coordd error code, coordd not
running, a failed check); 2 usage error. Every error is one stderr line:
`coordctl: <code>: <message>`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

import msgspec

from coordctl import ca, limits, logs, workflow
from coordctl.commands import COMMANDS, JOB_ID_HELP, Outcome, UsageError
from coordctl.msg import MSG_COMMANDS, add_parsers as add_msg_parsers
from coordd.rules import ranges
from coordd.client import CALL_TIMEOUT_DEFAULT
from coordd.errors import CoordError
from coordd.rules.names import check_name
from coordd.wire.protocol import JOB_STATUSES

SYSTEM_SOCKET = "/run/coordd/coordd.sock"
"""The socket of coordd installed as a system service (systemd/coordd.service)."""
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

EPILOG = """examples:
  coordctl status
  coordctl enqueue --kind keywords --role cpu --priority 1 --payload '{"module": "json"}'
  coordctl enqueue --batch jobs.jsonl
  coordctl list --status waiting --all
  coordctl show 3f9a0c1d2e4b5a69
  coordctl --json workers
  coordctl backup /var/backups/coordd-$(date +%F).db && coordctl check /var/backups/coordd-*.db
  coordctl workflow submit examples/workflow.toml && coordctl workflow show WORKFLOW_ID
  coordctl msg send --from lead --to coder 'review PR 7' && coordctl msg read --as coder
  coordctl agents
  coordctl limits && coordctl limits set openai concurrency=8 rate=120/min reserve.p0=3
"""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one stderr line and exit 2."""

    def error(self, message: str) -> NoReturn:
        """Print `coordctl: usage: MESSAGE (see PROG --help)` and exit 2."""
        fail("usage", f"{message} (see '{self.prog} --help')", EXIT_USAGE)


def fail(code: str, message: str, exit_code: int = EXIT_FAILED) -> NoReturn:
    """Print the one-line error to stderr (control characters escaped) and exit."""
    from coordctl.render import safe  # imports rich: only on the way out
    one_line = safe(" ".join(str(message).split()))
    print(f"coordctl: {code}: {one_line}", file=sys.stderr)
    raise SystemExit(exit_code)


def system_socket_hint(path: str, given: str | None) -> str:
    """When coordd was not reached at the per-user default and the system service's socket
    (SYSTEM_SOCKET) is there: how to reach it; else ""."""
    if given is not None or os.environ.get("COORDD_SOCKET") or path == SYSTEM_SOCKET:
        return ""
    if not (os.path.exists(SYSTEM_SOCKET) or os.path.isdir(os.path.dirname(SYSTEM_SOCKET))):
        return ""
    return (f"; coordd runs as a system service here: use --socket {SYSTEM_SOCKET} (or export "
            f"COORDD_SOCKET={SYSTEM_SOCKET}); a user other than root must be in the coordd "
            f"group to reach it (sudo usermod -aG coordd $USER, then log in again)")


def bad_input(exc: Exception) -> str:
    """Say what is wrong with input that could not be read or sent (no traceback)."""
    if isinstance(exc, UnicodeDecodeError):
        return f"input is not valid UTF-8 (byte {exc.object[exc.start:exc.start + 1]!r})"
    if isinstance(exc, UnicodeEncodeError):
        return f"an argument or input is not valid UTF-8 ({exc.object[exc.start:exc.end]!a})"
    if isinstance(exc, OverflowError):
        return "an integer is out of range (coordd takes -2**63 .. 2**64-1)"
    if isinstance(exc, RecursionError):
        return "input is nested too deep"
    return " ".join(str(exc).split())


def _number(kind: type, rule: ranges.Range, words: str = "") -> Any:
    """An argparse type: a `kind` (int or float) inside `rule` (coordd's range for that
    field, so what coordd takes is taken here), else a usage error saying the range."""
    def conv(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}:"
                                             f" {text!r}") from None
        if not rule.holds(value):
            what = words or ("a finite number " if kind is float else "") + rule.text()
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    conv.__name__ = kind.__name__
    return conv


def _positive(kind: type) -> Any:
    return _number(kind, ranges.Range(0, low_open=True))


PRIORITY = _number(int, ranges.Range(0, 3), "0..3 (P0 a user waiting .. P3 idle)")


def _name(text: str) -> str:
    """An argparse type: a kind or role name as coordd takes it (coordd.rules.names)."""
    try:
        check_name("a name", text)
    except CoordError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Global options, accepted before or after the subcommand."""
    d = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    parser.add_argument("--socket", metavar="PATH", default=d(None),
                        help="coordd socket (default: $COORDD_SOCKET, else the per-user path)")
    parser.add_argument("--json", action="store_true", default=d(False),
                        help="print a JSON document instead of tables")
    parser.add_argument("--timeout", metavar="S", type=_positive(float),
                        default=d(None),
                        help=f"seconds to wait for each reply (default {CALL_TIMEOUT_DEFAULT:g});"
                             " with `enqueue --wait`: for the job to end (default: no limit)")


def build_parser() -> Parser:
    """Build the argument parser with every subcommand."""
    p = Parser(prog="coordctl", description="Administer coordd: jobs, workers, backups.",
               epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, suppress=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        _common(sp, suppress=True)
        return sp

    cmd("status", "counts, sizes, warnings and the oldest waiting jobs")

    e = cmd("enqueue", "add a job (prints its id) or a batch from a JSON-lines file")
    e.epilog = "--kind, --role, --priority and --payload are required unless --batch is given."
    e.add_argument("--kind", type=_name, help="job kind (selects the model command on the worker)")
    e.add_argument("--role", type=_name, help="the worker role the job needs")
    e.add_argument("--priority", type=PRIORITY, metavar="P", help="0 (user waiting) .. 3 (idle); required")
    e.add_argument("--payload", metavar="JSON|@FILE", help="the payload: inline JSON, @FILE, @-")
    when = e.add_mutually_exclusive_group()
    when.add_argument("--run-at", metavar="TS", help="not before: Unix seconds or ISO-8601")
    when.add_argument("--delay", metavar="S", type=_number(float, ranges.NON_NEGATIVE),
                      help="not before now + S (0: now)")
    e.add_argument("--max-attempts", type=_number(int, ranges.AT_LEAST_ONE), metavar="N")
    e.add_argument("--key", metavar="IDEMPOTENCY_KEY",
                   help="a repeated key returns the existing job's id")
    e.add_argument("--max-runtime", type=_positive(float), metavar="S",
                   help="coordd refuses renewals past this many seconds of running")
    e.add_argument("--gates", metavar="JSON|@FILE", help="gate policy overrides for this job")
    e.add_argument("--resources", metavar="JSON|@FILE",
                   help='what the job needs, e.g. \'{"gpus": 1, "vram_mb": 8000, "ram_mb": 2000}\'')
    e.add_argument("--limit", action="append", metavar="NAME[:UNITS]",
                   help="a fleet-wide limit the job consumes (repeat for more; "
                        "`--limit none`: not its kind's default)")
    e.add_argument("--batch", metavar="FILE.jsonl",
                   help="one Enqueue object per line (kind, required_role, priority, payload,"
                        " ...); flags above fill fields a line omits; '-' = stdin")
    e.add_argument("--wait", action="store_true",
                   help="wait for the job to end (coordd's wait_job; --timeout S bounds it), "
                        "print its result; exit 1 unless it succeeded")

    ls = cmd("list", "a table of jobs")
    ls.add_argument("--status", choices=JOB_STATUSES)
    ls.add_argument("--kind", type=_name)
    ls.add_argument("--role", type=_name)
    ls.add_argument("--priority", type=PRIORITY, metavar="P")
    ls.add_argument("--limit", type=_positive(int), metavar="N",
                    help="rows (page size with --all)")
    ls.add_argument("--after", metavar="ID",
                    help="start after this job (its id or a unique start of one)")
    ls.add_argument("--all", action="store_true", help="page through every matching job")

    for name, help_ in (("show", "one job with its lease and event log"),
                        ("cancel", "cancel a job (a running one's worker stops it at once,"
                                   " else at its next renew or heartbeat)"),
                        ("retry", "put a failed, cancelled or skipped job back to waiting"
                                  " (a workflow node reopens its workflow)")):
        cmd(name, help_).add_argument("job_id", metavar="ID", help=JOB_ID_HELP)
    cmd("reap", "return jobs with expired leases to waiting now")
    wk = cmd("workers", "workers, their readings, kinds and gate verdicts per priority")
    wk.add_argument("--forget", metavar="ID",
                    help="drop a dead worker (refused while it is live or holds leases)")
    wk.add_argument("--force", action="store_true",
                    help="with --forget: drop it anyway; its leases end (worker_lost)")
    cmd("metrics", "every metric series in Prometheus text format")
    tp = cmd("top", "live view: queues, workers and gates, running jobs, recent failures")
    tp.add_argument("--interval", type=_positive(float), default=1.0, metavar="S",
                    help="seconds between refreshes (default 1)")
    tp.add_argument("--once", action="store_true", help="print one frame and exit")
    b = cmd("backup", "a consistent, verified copy of the database, written by coordd")
    b.add_argument("dest", metavar="DEST", help="a new file path on coordd's host")
    r = cmd("restore", "verify a backup and install it as the database (coordd stopped)")
    r.add_argument("src", metavar="SRC", help="a backup written by `coordctl backup`")
    r.add_argument("--db", metavar="PATH",
                   help="the database to replace (default: $COORDD_DB or the per-user path)")
    c = cmd("check", "integrity check of the live database, or of a copy at PATH")
    c.add_argument("path", metavar="PATH", nargs="?",
                   help="check this SQLite file read-only here instead of asking coordd")
    workflow.add_parsers(cmd, lambda sp: _common(sp, suppress=True))
    add_msg_parsers(cmd, _common)
    logs.add_parsers(cmd)
    limits.add_parsers(cmd)
    ca.add_parsers(cmd)
    return p


class OutputFailed(Exception):
    """Writing the command's output to stdout failed (disk full, closed pipe...)."""


def _print(outcome: Outcome, as_json: bool) -> None:
    """Write the outcome to stdout and flush it.

    Raises:
        BrokenPipeError: the reader went away (e.g. `| head`): quiet, exit 1.
        OutputFailed: any other write error.
    """
    try:
        if outcome.stream is not None:
            outcome.stream(as_json)
        elif as_json:
            doc = msgspec.json.format(msgspec.json.encode(outcome.data), indent=2)
            sys.stdout.buffer.write(doc + b"\n")
        elif isinstance(outcome.human, str):
            if outcome.human:
                from coordctl.render import safe
                print(safe(outcome.human))
        else:
            from coordctl.render import make_console
            outcome.human(make_console())
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputFailed(f"cannot write the output: {exc.strerror or exc}") from exc


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so Python's flush at exit does not fail a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def run(args: argparse.Namespace) -> int:
    """Run one parsed command; return the exit code (errors become one stderr line).

    The output is written and flushed before the command's `after` step (`msg read`'s
    ack): output that could not be written leaves the messages unacked.
    """
    from coordd.client import SyncClient, Unencodable
    from coordd.errors import CoordError

    # socket None: $COORDD_SOCKET or the default
    client = SyncClient(args.socket, timeout=args.timeout or CALL_TIMEOUT_DEFAULT)
    path = client.path
    try:
        outcome = {**COMMANDS, **MSG_COMMANDS, **workflow.COMMANDS,
                   **logs.COMMANDS, **limits.COMMANDS, **ca.COMMANDS}[args.command](client, args)
        _print(outcome, args.json)
        if outcome.after is not None:
            outcome.after()
    except UsageError as exc:
        fail("usage", str(exc), EXIT_USAGE)
    except Unencodable as exc:  # e.g. a non-UTF-8 argument: refused before it is sent
        fail("usage", exc.message, EXIT_USAGE)
    except (UnicodeError, OverflowError, RecursionError) as exc:
        fail("usage", bad_input(exc), EXIT_USAGE)
    except OutputFailed as exc:
        _drop_stdout()
        fail("output", str(exc))
    except CoordError as exc:
        message = exc.message
        if exc.code == "disconnected" and path not in message:
            message = f"coordd is not running at {path}? {message}"
        if exc.code == "disconnected":
            message += system_socket_hint(path, args.socket)
        fail(exc.code, message)
    except BrokenPipeError:
        raise
    except OSError as exc:  # e.g. permission denied on the socket, path too long
        fail("disconnected", f"cannot connect to coordd at {path}: {exc.strerror or exc}"
             + system_socket_hint(path, args.socket))
    finally:
        client.close()
    if outcome.failure is not None:
        fail(*outcome.failure)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `coordctl` console script."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("coordctl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
