"""`coordctl limits [NAME]`, `coordctl limits set NAME KEY=VALUE...`, `coordctl limits
reset NAME`: fleet-wide limits, their use now, reserves and who holds units.

`set` takes `concurrency=N`, `rate=N/min`, `reserve.p0=N`, `budget.tokens=N/day`,
`budget_reserve.p0=0.25`; `KEY=none` removes that setting. The change is stored in
coordd's database (a restart keeps it) and wins over the config file's keys it names;
`reset` drops it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from coordctl.commands import Outcome, UsageError
from coordctl.render import safe
from coordd.wire.limits import LimitView
from coordd.rules.times import fmt_time

AddCommand = Callable[[str, str], argparse.ArgumentParser]
TABLES = ("reserve", "budget", "budget_reserve")


def add_parsers(cmd: AddCommand) -> None:
    """Register `limits` with coordctl's parser."""
    lm = cmd("limits", "fleet-wide limits: use, reserves, who holds units; set or reset one")
    lm.add_argument("action", nargs="?", metavar="NAME | set NAME KEY=VALUE... | reset NAME",
                    help="one limit, or `set` / `reset`")
    lm.add_argument("words", nargs="*", metavar="ARG", help=argparse.SUPPRESS)


def parse_settings(words: list[str]) -> dict[str, Any]:
    """`concurrency=8 rate=120/min reserve.p0=3 rate=none` -> settings for `limits_set`
    (`none` -> None: the setting goes). Raises: UsageError."""
    out: dict[str, Any] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not key or not value:
            raise UsageError(f"expected KEY=VALUE, got {word!r}")
        top, dot, sub = key.partition(".")
        parsed: Any = None if value.lower() == "none" else _value(top, value)
        if top in TABLES and dot:
            table = out.setdefault(top, {})
            if not isinstance(table, dict):
                raise UsageError(f"{top} given as a whole and by key")
            table[sub] = parsed
            if parsed is None:
                raise UsageError(f"{key}=none: give {key}=0, or {top}=none for the whole table")
        elif top in TABLES and parsed is not None:
            raise UsageError(f"{top} is a table: give {top}.p0=N (or {top}=none)")
        else:
            out[top] = parsed
    if not out:
        raise UsageError("limits set NAME needs KEY=VALUE (concurrency, rate, reserve.pN, "
                         "budget.METRIC, budget_reserve.pN)")
    return out


def _value(key: str, text: str) -> Any:
    if key in ("rate", "budget"):
        return text
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise UsageError(f"{key}: not a number: {text!r}") from None


def limits(client: Any, args: argparse.Namespace) -> Outcome:
    """`limits [NAME]`, `limits set NAME KEY=VALUE...`, `limits reset NAME`."""
    action, words = args.action, list(args.words)
    if action == "set":
        if not words:
            raise UsageError("limits set NAME KEY=VALUE...")
        view = client.limits_set(words[0], parse_settings(words[1:]))
        return Outcome(view, lambda con: render(con, [view]))
    if action == "reset":
        if len(words) != 1:
            raise UsageError("limits reset NAME")
        res = client.limits_reset(words[0])
        return Outcome(res, lambda con: render(con, res.limits) if res.limits
                       else con.print(f"limit {safe(words[0])} removed (it had no config)"))
    if words:
        raise UsageError(f"unexpected {' '.join(words)!r} (limits [NAME] | set | reset)")
    res = client.limits(action)
    return Outcome(res, lambda con: render(con, res.limits))


def _cap(n: int | None) -> str:
    return "-" if n is None else str(n)


def render(con: Any, views: list[LimitView]) -> None:
    """A table of limits, then who holds units of each."""
    from rich.table import Table
    if not views:
        con.print("no fleet-wide limits (add [limits.NAME] to coordd's config, or "
                  "`coordctl limits set NAME concurrency=N`)")
        return
    t = Table(title="limits", title_justify="left")
    for col in ("limit", "running", "rate (window)", "reserve", "usable p0/p1/p2/p3",
                "waiting", "budget", "source"):
        t.add_column(col)
    for v in views:
        running = f"{v.used}/{_cap(v.concurrency)}"
        rate = "-" if v.rate is None else f"{v.rate_used}/{v.rate}"
        if v.next_slot_s is not None:
            rate += f", next slot in {v.next_slot_s:.0f} s"
        reserve = " ".join(f"{k}={n}" for k, n in v.reserve.items()) or "-"
        usable = "/".join(_cap(v.usable.get(f"p{p}")) for p in range(4))
        budget = ", ".join(f"{m} {v.budget_used.get(m, 0):g}/{b}" for m, b in v.budget.items())
        if v.budget_reserve:
            budget += " (kept " + " ".join(f"{k}={s:.0%}" for k, s in
                                           v.budget_reserve.items()) + ")"
        t.add_row(safe(v.name), running, rate, reserve, usable, str(v.waiting), budget or "-",
                  v.source)
    con.print(t)
    for v in views:
        if not v.holders:
            continue
        h = Table(title=f"holding {safe(v.name)}", title_justify="left")
        for col in ("job", "worker", "priority", "units", "since"):
            h.add_column(col)
        for x in v.holders:
            h.add_row(x.job_id, safe(x.worker_id), f"P{x.priority}", str(x.units),
                      fmt_time(x.since))
        con.print(h)


COMMANDS = {"limits": limits}
