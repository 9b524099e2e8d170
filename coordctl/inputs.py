"""coordctl's parsing of user input: JSON payloads (strict: no NaN), files and stdin,
times, the enqueue flags and JSON-lines batches. Everything here raises `UsageError`
(exit 2) before anything is sent to coordd.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from coordd.errors import CoordError
from coordd.wire.protocol import Enqueue
from coordd.rules.times import DELAY_MAX_S, check_duration, check_time


class UsageError(Exception):
    """Bad command-line input (exit 2)."""



def read_text_arg(value: str, what: str) -> str:
    """Return `value`, or the contents of FILE for `@FILE` (`@-` = stdin).

    Raises:
        UsageError: the file cannot be read.
    """
    if not value.startswith("@"):
        return value
    path = value[1:]
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what}: {path} is not UTF-8 text: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number (JSON has no NaN or Infinity)")


def loads_strict(text: str) -> Any:
    """`json.loads`, but NaN, Infinity and -Infinity (which Python's json accepts) are
    refused, as is a number too large to be finite (`1e999`).

    Raises:
        json.JSONDecodeError: invalid JSON.
        ValueError: a non-finite number (the message says which).
    """
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large to be a finite number")
    return value


def parse_json_arg(value: str, what: str) -> Any:
    """Parse `value` (inline JSON or `@FILE`) as JSON (no NaN or Infinity).

    Raises:
        UsageError: unreadable file, invalid JSON (with line and column), or a
            non-finite number.
    """
    text = read_text_arg(value, what)
    src = value if value.startswith("@") else "inline value"
    try:
        return loads_strict(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON ({src}): {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}") from None
    except ValueError as exc:
        raise UsageError(f"{what} ({src}): {exc}") from None


def parse_time_arg(value: str) -> float:
    """Parse `--run-at`: Unix seconds, or ISO-8601 (no zone = local time).

    Raises:
        UsageError: neither form, or outside coordd.rules.times' range.
    """
    try:
        ts = float(value)
    except ValueError:
        try:
            ts = datetime.fromisoformat(value).timestamp()
        except (ValueError, OverflowError, OSError):
            raise UsageError(f"--run-at: {value!r} is neither Unix seconds nor ISO-8601") from None
    try:
        check_time("--run-at", ts)
    except CoordError as exc:
        raise UsageError(exc.message) from None
    return ts


def job_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The Enqueue fields given on the command line (only those given)."""
    fields: dict[str, Any] = {}
    for attr, key in (("kind", "kind"), ("role", "required_role"), ("priority", "priority"),
                      ("max_attempts", "max_attempts"), ("key", "idempotency_key"),
                      ("max_runtime", "max_runtime_s")):
        if getattr(args, attr) is not None:
            fields[key] = getattr(args, attr)
    if args.payload is not None:
        fields["payload"] = parse_json_arg(args.payload, "--payload")
    if args.gates is not None:
        gates = parse_json_arg(args.gates, "--gates")
        if not isinstance(gates, dict):
            raise UsageError("--gates must be a JSON object, e.g. '{\"max_memory_pct\": 70}'")
        fields["gates"] = gates
    if args.resources is not None:
        fields["resources"] = parse_json_arg(args.resources, "--resources")
    if getattr(args, "limit", None):
        fields["limits"] = _limit_uses(args.limit)
    if args.run_at is not None:
        fields["run_at"] = parse_time_arg(args.run_at)
    elif args.delay is not None:  # coordd adds it to its own clock
        try:
            check_duration("--delay", args.delay, DELAY_MAX_S, zero=True)
        except CoordError as exc:
            raise UsageError(exc.message) from None
        fields["delay_s"] = args.delay
    return fields


def _limit_uses(words: list[str]) -> list[dict[str, Any]]:
    """`--limit openai --limit nas:2` -> [{name, units}]; `--limit none` -> []."""
    if words == ["none"]:
        return []
    out = []
    for word in words:
        name, _, units = word.partition(":")
        try:
            out.append({"name": name, "units": int(units) if units else 1})
        except ValueError:
            raise UsageError(f"--limit NAME[:UNITS], got {word!r}") from None
    return out


def to_enqueue(obj: Any, where: str) -> Enqueue:
    try:
        return msgspec.convert(obj, Enqueue)
    except msgspec.ValidationError as exc:
        raise UsageError(f"{where}: {exc}") from None


def read_batch(path: str, defaults: dict[str, Any]) -> list[Enqueue]:
    """Read a JSON-lines file of Enqueue objects (`-` = stdin); `defaults` fill missing fields.

    Raises:
        UsageError: unreadable file, a line that is not a JSON object, missing fields.
    """
    return [job for _n, job in read_batch_lines(path, defaults)]


def read_batch_lines(path: str, defaults: dict[str, Any]) -> list[tuple[int, Enqueue]]:
    """`read_batch`, each job with its line number in the file (for coordd's errors)."""
    text = read_text_arg("@" + path, "--batch")
    jobs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = loads_strict(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--batch {path} line {n}: not valid JSON: {exc.msg}") from None
        except ValueError as exc:
            raise UsageError(f"--batch {path} line {n}: {exc}") from None
        if not isinstance(obj, dict):
            raise UsageError(f"--batch {path} line {n}: expected a JSON object")
        jobs.append((n, to_enqueue({**defaults, **obj}, f"--batch {path} line {n}")))
    if not jobs:
        raise UsageError(f"--batch {path}: no jobs in the file")
    return jobs
