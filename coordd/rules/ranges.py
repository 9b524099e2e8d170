"""Ranges of numeric settings: one rule per key, checked in one place, one message shape.

coordd's and the worker's config Structs name a `Range` for every numeric key; `check`
refuses a value outside it (NaN and infinities always) with a ValueError naming the key,
which msgspec turns into the config's one-line validation error. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

SECONDS_MAX = 10 * 365 * 86400.0
"""The longest duration a setting may have (10 years): longer is a typo, and past ~1e9 s
asyncio timers and date arithmetic stop working."""


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: finite, within `low`..`high` (None: no
    bound on that side; `low_open` / `high_open` exclude the bound itself)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """True if `value` is a finite number inside the range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def text(self) -> str:
        """The range in words, e.g. `> 0 and <= 315360000`."""
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {_num(self.low)}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {_num(self.high)}")
        return " and ".join(parts) or "finite"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


POSITIVE_S = Range(0, SECONDS_MAX, low_open=True)
"""A duration that must pass: intervals, timeouts, staleness."""
NON_NEGATIVE_S = Range(0, SECONDS_MAX)
"""A duration where 0 means "none" or "off"."""
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
FRACTION = Range(0, 1)
PERCENT = Range(0, 100)


def check(values: object, rules: Mapping[str, Range], prefix: str = "") -> None:
    """Check each attribute of `values` named in `rules` (a list: each item).

    Raises:
        ValueError: `<prefix><key> must be [a finite number] <range>, got <value>` for the
            first bad one.
    """
    for key, rule in rules.items():
        value = getattr(values, key)
        if value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            if not rule.holds(item):
                kind = "a finite number " if isinstance(item, float) else ""
                raise ValueError(f"{prefix}{key} must be {kind}{rule.text()}, got {item!r}")
