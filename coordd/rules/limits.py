"""Fleet-wide limits (issue 17): named caps that hold across every worker.

A limit has a `concurrency` (units held by running jobs), a `rate` (units claimed in any
rolling window, consumed at claim and never returned), a `reserve` per priority (units
kept free for better priorities: a P3 job may not take what would leave fewer than
reserve.p0 + reserve.p1 + reserve.p2 free) and `budget`s over reported usage per window.
A job names the limits it consumes; the claim admits it only if every one has room
(coordd.store.limits runs the check inside the claim transaction).

Pure: settings in, verdicts out (no I/O). The rule not to break: the effective limit is
the config's `[limits.NAME]` with the runtime override's keys (`limits_set`, kept in the
database) on top; `LimitBook` is the one place that merges them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from coordd import errors
from coordd.rules.names import check_name
from coordd.wire.limits import LimitHolder, LimitUse, LimitView

WINDOWS_S = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "hour": 3600.0,
             "day": 86400.0, "d": 86400.0}
"""Window names a rate or budget may use, in seconds."""
UNITS_MAX = 1_000_000
RESERVE_KEYS = ("p0", "p1", "p2")  # reserve.pN: usable only by P0..PN
SETTING_KEYS = ("concurrency", "rate", "reserve", "budget", "budget_reserve")
LIMIT_REFUSED = "limit"  # the claim refusal code


class LimitSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A `[limits.NAME]` table of coordd's config (every key optional)."""

    concurrency: int | None = None  # units running jobs may hold at once
    rate: str | None = None  # "N/s", "N/min", "N/h", "N/day"
    reserve: dict[str, int] = {}  # p0..p2 -> units kept for P0..PN
    budget: dict[str, str] = {}  # usage metric -> "N/window", e.g. tokens = "2000000/day"
    budget_reserve: dict[str, float] = {}  # p0..p2 -> share (0..1) of each budget kept


_RATE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*/\s*([0-9]*)\s*([a-z]+)\s*$")


def parse_window(what: str, text: str) -> tuple[float, float]:
    """"120/min" -> (120.0, 60.0); "5/10s" -> (5.0, 10.0).

    Raises:
        ValueError: not `N/window` with N > 0 and a known window (s, min, h, day).
    """
    m = _RATE.match(text) if isinstance(text, str) else None
    if m is None or m.group(3) not in WINDOWS_S:
        raise ValueError(f"{what} must look like 120/min (windows: s, min, h, day), "
                         f"got {text!r}")
    n = float(m.group(1).replace("_", ""))
    window = WINDOWS_S[m.group(3)] * (int(m.group(2)) if m.group(2) else 1)
    if not (n > 0 and math.isfinite(n)) or window <= 0:
        raise ValueError(f"{what} must be > 0 per a window > 0, got {text!r}")
    return n, window


class Limit(msgspec.Struct, frozen=True, kw_only=True):
    """One effective limit (config plus runtime override); None = no cap of that kind."""

    name: str
    source: str = "config"
    concurrency: int | None = None
    rate: str | None = None
    rate_n: int = 0
    rate_window_s: float = 0.0
    reserve: tuple[int, int, int] = (0, 0, 0)  # p0, p1, p2
    budget: dict[str, tuple[float, float, str]] = {}  # metric -> (amount, window_s, text)
    budget_reserve: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def held_back(self, priority: int) -> int:
        """Units a job of `priority` must leave free (the reserves of better priorities)."""
        return sum(self.reserve[:priority])

    def kept_for(self, priority: int) -> str:
        """Who the units a job of `priority` leaves free are kept for: "P0" or "P0..P1"."""
        best = max((k for k in range(min(priority, 3)) if self.reserve[k]
                    or self.budget_reserve[k]), default=0)
        return "P0" if best == 0 else f"P0..P{best}"

    def budget_held_back(self, priority: int) -> float:
        """Share (0..1) of each budget a job of `priority` must leave unused."""
        return min(1.0, sum(self.budget_reserve[:priority]))

    def settings(self) -> dict[str, Any]:
        """The settings as `limits` shows them and `limits_set` takes them."""
        return {"concurrency": self.concurrency, "rate": self.rate,
                "reserve": {k: v for k, v in zip(RESERVE_KEYS, self.reserve) if v},
                "budget": {m: b[2] for m, b in self.budget.items()},
                "budget_reserve": {k: v for k, v in zip(RESERVE_KEYS, self.budget_reserve)
                                   if v}}


def build(name: str, spec: Mapping[str, Any], source: str = "config") -> Limit:
    """Check one limit's settings (a LimitSpec's keys) and make its Limit.

    Raises:
        ValueError: an unknown key or a bad value; the message names `limits.NAME.key`.
    """
    where = f"limits.{name}"
    unknown = sorted(set(spec) - set(SETTING_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {list(SETTING_KEYS)}")
    conc = spec.get("concurrency")
    if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int)
                             or not 1 <= conc <= UNITS_MAX):
        raise ValueError(f"{where}.concurrency must be an integer 1..{UNITS_MAX}, got {conc!r}")
    rate, rate_n, window = spec.get("rate"), 0, 0.0
    if rate is not None:
        n, window = parse_window(f"{where}.rate", rate)
        if n != int(n) or n > UNITS_MAX:
            raise ValueError(f"{where}.rate must count whole claims (1..{UNITS_MAX}), "
                             f"got {rate!r}")
        rate_n, rate = int(n), rate.strip().replace(" ", "")
    reserve = _per_priority(f"{where}.reserve", spec.get("reserve") or {}, int)
    for cap, what in ((conc, "concurrency"), (rate_n or None, "rate")):
        if cap is not None and sum(reserve) > cap:
            raise ValueError(f"{where}.reserve adds up to {sum(reserve)}, more than its "
                             f"{what} {cap}")
    budget: dict[str, tuple[float, float, str]] = {}
    for metric, text in (spec.get("budget") or {}).items():
        check_metric(f"{where}.budget", metric)
        amount, win = parse_window(f"{where}.budget.{metric}", text)
        budget[metric] = (amount, win, text.strip().replace(" ", ""))
    shares = _per_priority(f"{where}.budget_reserve", spec.get("budget_reserve") or {}, float)
    if sum(shares) > 1:
        raise ValueError(f"{where}.budget_reserve shares add up to more than 1")
    return Limit(name=name, source=source, concurrency=conc, rate=rate, rate_n=rate_n,
                 rate_window_s=window, reserve=reserve, budget=budget,  # type: ignore[arg-type]
                 budget_reserve=shares)  # type: ignore[arg-type]


def check_metric(what: str, metric: Any) -> None:
    """Raise ValueError unless `metric` is a usage name (letters, digits, _ - .)."""
    if not isinstance(metric, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", metric):
        raise ValueError(f"{what}: a usage metric is 1..64 of A-Z a-z 0-9 _ . -, got {metric!r}")


def _per_priority(what: str, table: Any, kind: type) -> tuple[Any, Any, Any]:
    if not isinstance(table, Mapping):
        raise ValueError(f"{what} must be a table like {{p0 = 2}}")
    bad = sorted(set(table) - set(RESERVE_KEYS))
    if bad:
        raise ValueError(f"{what}: unknown key(s) {bad}; use p0..p2 (pN: kept for P0..PN)")
    out = []
    for key in RESERVE_KEYS:
        v = table.get(key, 0)
        ok = (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= UNITS_MAX) \
            if kind is int else (isinstance(v, (int, float)) and not isinstance(v, bool)
                                 and 0 <= v <= 1)
        if not ok:
            rng = f"an integer 0..{UNITS_MAX}" if kind is int else "a share 0..1"
            raise ValueError(f"{what}.{key} must be {rng}, got {v!r}")
        out.append(kind(v))
    return tuple(out)  # type: ignore[return-value]


def merged(spec: Mapping[str, Any] | None, override: Mapping[str, Any] | None
           ) -> dict[str, Any]:
    """The config's settings with the override's keys on top; a None value drops the key."""
    out = {k: v for k, v in (spec or {}).items() if v not in (None, {}, "")}
    for k, v in (override or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


class LimitBook:
    """The effective limits: config specs plus runtime overrides (from the database).

    Args:
        specs: the config's `[limits.NAME]` tables.
        kind_limits: kind -> the limits its jobs consume when enqueue names none.
    """

    def __init__(self, specs: Mapping[str, LimitSpec],
                 kind_limits: Mapping[str, list[str | LimitUse]] | None = None) -> None:
        self._specs = {n: msgspec.structs.asdict(s) for n, s in specs.items()}
        self._overrides: dict[str, dict[str, Any]] = {}
        self.defs: dict[str, Limit] = {}
        self._rebuild()
        self.kind_limits = {k: self.uses(f"kind_limits.{k}", v, ValueError)
                            for k, v in (kind_limits or {}).items()}

    @property
    def active(self) -> bool:
        """True when any limit is defined (claims do no limit work otherwise)."""
        return bool(self.defs)

    def load_overrides(self, rows: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Take the runtime overrides stored in the database; a stored override that no
        longer checks against the config (it changed) is skipped and returned.

        Returns: [(name, why)] of the overrides skipped."""
        skipped = []
        for name, settings in rows:
            try:
                build(name, merged(self._specs.get(name), settings))
            except ValueError as exc:
                skipped.append((name, str(exc)))
                continue
            self._overrides[name] = dict(settings)
        self._rebuild()
        return skipped

    def preview(self, name: str, settings: Mapping[str, Any]) -> tuple[dict[str, Any], Limit]:
        """The override `limits_set` would store (the old one with `settings` on top) and
        the limit it makes.

        Raises:
            errors.BadRequest: a bad name, key or value (nothing is changed).
        """
        check_name("limit name", name)
        override = {**self._overrides.get(name, {}), **settings}
        try:
            limit = build(name, merged(self._specs.get(name), override), "runtime")
        except ValueError as exc:
            raise errors.BadRequest(str(exc)) from exc
        return override, limit

    def set_override(self, name: str, override: dict[str, Any] | None) -> None:
        """Install (or with None drop) the runtime override of `name`."""
        if override is None:
            self._overrides.pop(name, None)
        else:
            self._overrides[name] = dict(override)
        self._rebuild()

    def has_override(self, name: str) -> bool:
        """True when `name` has a runtime override."""
        return name in self._overrides

    def _rebuild(self) -> None:
        defs = {}
        for name in sorted(set(self._specs) | set(self._overrides)):
            spec, over = self._specs.get(name), self._overrides.get(name)
            source = "+".join(s for s, x in (("config", spec), ("runtime", over)) if x is not None)
            defs[name] = build(name, merged(spec, over), source)
        self.defs = defs

    def uses(self, what: str, asked: Iterable[str | LimitUse] | None,
             error: type[Exception] = errors.BadRequest) -> list[tuple[str, int]]:
        """Check the limits a job names: [(name, units)], sorted by name.

        Raises:
            errors.BadRequest (or `error`): an unknown limit (the known ones are named),
                units outside 1..UNITS_MAX or above the limit's concurrency (it could never
                run), a limit named twice.
        """
        out: dict[str, int] = {}
        for item in asked or ():
            name, units = (item, 1) if isinstance(item, str) else (item.name, item.units)
            if name not in self.defs:
                known = ", ".join(self.defs) or "none are configured"
                raise error(f"{what}: unknown limit {name!r} (known: {known})")
            if isinstance(units, bool) or not 1 <= units <= UNITS_MAX:
                raise error(f"{what}: units of {name!r} must be 1..{UNITS_MAX}, got {units}")
            cap = self.defs[name].concurrency
            if cap is not None and units > cap:
                raise error(f"{what}: {units} units of {name!r} can never run "
                            f"(its concurrency is {cap})")
            if name in out:
                raise error(f"{what}: limit {name!r} named twice")
            out[name] = units
        return sorted(out.items())

    def for_job(self, what: str, kind: str, asked: list[str | LimitUse] | None
                ) -> list[tuple[str, int]]:
        """The limits a new job consumes: those it names, else its kind's default.

        Raises: errors.BadRequest (as `uses`)."""
        if asked is None:
            return [(n, u) for n, u in self.kind_limits.get(kind, []) if n in self.defs]
        return self.uses(what, asked)


# ---------------------------------------------------------------- verdicts (pure)


def concurrency_refusal(limit: Limit, used: int, units: int, priority: int) -> str | None:
    """Why `units` more of `limit` may not run for a job of `priority` (None: they may)."""
    cap = limit.concurrency
    if cap is None:
        return None
    kept = limit.held_back(priority)
    if used + units <= cap - kept:
        return None
    text = f"{used}/{cap} running"
    if kept and used + units <= cap:
        text += f" ({kept} kept for {limit.kept_for(priority)})"
    return text


def rate_excess(limit: Limit, used: int, units: int, priority: int) -> int:
    """Units of the rate window's claims that must leave it before `units` more may be
    claimed by a job of `priority` (0: they may now). `used`: units claimed in the
    window. A claim at `at` holds its units until `at + window` (then they are free)."""
    if not limit.rate_n:
        return 0
    allowed = limit.rate_n - limit.held_back(priority)
    if units > allowed:
        return max(1, used + units - allowed)  # never, for this priority: reported as full
    return max(0, used + units - allowed)


def rate_refusal_text(limit: Limit, priority: int, free_at: float | None, now: float) -> str:
    """`rate 120/min, next slot in 14 s` (with the units kept for better priorities)."""
    kept = limit.held_back(priority)
    text = f"rate {limit.rate}"
    if kept:
        text += f" ({kept} kept for {limit.kept_for(priority)})"
    if free_at is not None:
        text += f", next slot in {max(0, math.ceil(free_at - now - 1e-9)):d} s"
    return text


def budget_refusal(limit: Limit, metric: str, used: float, priority: int) -> str | None:
    """Why a job of `priority` may not start on `limit`'s budget for `metric` (None: it may):
    it starts only while usage in the window is under the budget less the shares kept."""
    amount, _window, text = limit.budget[metric]
    keep = limit.budget_held_back(priority)
    if used < amount * (1 - keep):
        return None
    why = f"budget {metric} {used:g}/{text} used"
    if keep:
        why += f" ({keep:.0%} kept for {limit.kept_for(priority)})"
    return why


def refusals(limit: Limit, priority: int, units: int, held: int, excess: int,
             free_at: float | None, budget_used: Mapping[str, float], now: float) -> list[str]:
    """Why `units` more of `limit` may not go to a job of `priority` ([]: they may), in
    the order concurrency, rate, budgets: the verdicts above over readings a store took
    (`held` units running, the rate's `excess` (rate_excess) and when it frees,
    `budget_used` per metric in its window)."""
    why = []
    c = concurrency_refusal(limit, held, units, priority)
    if c is not None:
        why.append(c)
    if excess:
        why.append(rate_refusal_text(limit, priority, free_at, now))
    for metric in limit.budget:
        b = budget_refusal(limit, metric, budget_used.get(metric, 0.0), priority)
        if b is not None:
            why.append(b)
    return why


def limit_view(limit: Any, now: float, used: int, rate_used: int, frees_at: float | None,
               budget_used: dict[str, float], waiting: int,
               holders: list[tuple[str, str, int, int, float]]) -> LimitView:
    """A limit's LimitView from what a store read (pure): `used` units held, `rate_used`
    in the window, `frees_at` (a full rate: when its oldest unit frees), usage per
    metric, waiting jobs naming it, holders (job, worker, priority, units, since)."""
    usable: dict[str, int | None] = {}
    for prio in range(4):
        room = [] if limit.concurrency is None else \
            [limit.concurrency - limit.held_back(prio) - used]
        if limit.rate_n:
            room.append(limit.rate_n - limit.held_back(prio) - rate_used)
        usable[f"p{prio}"] = max(0, min(room)) if room else None
    next_slot = None if frees_at is None else max(0.0, frees_at - now)
    settings = limit.settings()
    return LimitView(
        name=limit.name, source=limit.source, concurrency=limit.concurrency, rate=limit.rate,
        reserve=settings["reserve"], used=used, rate_used=rate_used, next_slot_s=next_slot,
        usable=usable, waiting=waiting,
        holders=[LimitHolder(job_id=j, worker_id=w, priority=pr, units=u, since=s)
                 for j, w, pr, u, s in holders],
        budget=settings["budget"], budget_used=budget_used,
        budget_reserve={k: v for k, v in zip(RESERVE_KEYS, limit.budget_reserve) if v})
