"""`coord-worker --readings-override FILE`: a JSON object whose keys replace the probes'
readings, read again on every heartbeat (docs/reference/configuration.md), for drills
and tests of the gates.

The rule not to break: reading it never blocks the heartbeat. It is read like a config
file (coordd.conffile: O_NONBLOCK, a regular file only, at most MAX_BYTES, UTF-8), so a
FIFO, a device or a huge file is refused at once. A file that cannot be used (those, or
not JSON, or not an object) keeps the last good override in force (none before the first)
so a write caught half-way does not flip the gates; no file at all ends the override (the
measured readings go out). Each change of state is one log line, not one per heartbeat.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Iterable
from typing import Any

from coordd import conffile

logger = logging.getLogger(__name__)

MAX_BYTES = 64 << 10
"""The largest override file read (bytes); real ones are a few hundred."""


class ReadingsOverride:
    """The override file at `path`, and the last good object read from it.

    Args:
        path: the `--readings-override` file.
        known_keys: the reading keys a probe or gate reads; others are warned about once.
    """

    def __init__(self, path: str, known_keys: Iterable[str]) -> None:
        self.path = path
        self._known = tuple(known_keys)
        self.good: dict[str, Any] | None = None
        """The override in force: the last object read, None while there is none."""
        self._state: str | None = None  # None: good; else why the file was not used
        self._unknown: frozenset[str] = frozenset()

    def apply(self, readings: dict[str, Any]) -> dict[str, Any]:
        """`readings` with the override's keys replacing theirs (a new dict); reads the
        file again first (see the module doc). Never raises."""
        self._read()
        return {**readings, **self.good} if self.good is not None else dict(readings)

    def _read(self) -> None:
        try:
            data = json.loads(conffile.read(self.path, MAX_BYTES, "a readings override"))
        except conffile.ConfigFileMissing:
            self.good = None
            return self._note("no such file; no override, the measured readings are sent")
        except conffile.ConfigFileError as exc:
            return self._note(str(exc), keeping=True)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError; nested too deep
            return self._note(f"not JSON ({exc})", keeping=True)
        if not isinstance(data, dict):
            return self._note(f"holds a JSON {type(data).__name__}, not an object",
                              keeping=True)
        if self._state is not None:
            logger.info("readings override %s: in force again (%d key(s))", self.path,
                        len(data), extra={"action": "readings_override"})
        self.good, self._state = data, None
        self._warn_unknown_keys(data)

    def _note(self, why: str, keeping: bool = False) -> None:
        """Log `why` the file was not used (`keeping`: and what stays in force), once while
        it stays the reason."""
        if why == self._state:
            return
        self._state = why
        if keeping:
            why += ("; keeping the last good override" if self.good is not None
                    else "; no override in force")
        logger.warning("readings override %s: %s", self.path, why,
                       extra={"action": "readings_override_unusable"})

    def _warn_unknown_keys(self, override: dict[str, Any]) -> None:
        """Warn once per set of keys about keys no probe or gate reads (a typo such as
        `memory_pct` would otherwise leave the real reading in force)."""
        unknown = frozenset(k for k in override if k not in self._known)
        if unknown == self._unknown:
            return
        self._unknown = unknown
        for key in sorted(unknown):
            close = difflib.get_close_matches(key, self._known, n=1)
            logger.warning("readings override %s: unknown key %r%s; sent as a free-form "
                           "extra, no gate reads it", self.path, key,
                           f" (did you mean {close[0]!r}?)" if close else "",
                           extra={"action": "readings_override_unknown_key", "key": key})
