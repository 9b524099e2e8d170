"""What a daemon's entry point does first (coordd.__main__, worker.__main__): ignore SIGHUP
until its event loop handles it, and log to stderr one line per event (JSON lines when
asked), with no input able to forge a line.
"""

from __future__ import annotations

import json
import logging
import signal
import sys

from coordd.rules import names


def ignore_sighup_until_handled() -> None:
    """Ignore SIGHUP from the very start of a daemon's main until its event loop installs
    its own handler (coordd.daemon.server, worker.__main__), so a SIGHUP during start-up (the
    imports, the config, the database) does not end it by the default action. Children
    started while it is ignored inherit that (exec keeps SIG_IGN): call it only in the
    daemons' entry points."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any `extra` fields."""

    _skip = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname,
               "logger": record.name, "msg": record.getMessage()}
        out.update({k: v for k, v in record.__dict__.items() if k not in self._skip})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class LineFormatter(logging.Formatter):
    """One line per event: control and bidi characters in the message (user data, such as
    a refused name) are written as escapes, so no input can forge a log line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = names.escape(record.message)
        return super().formatMessage(record)


def setup_logging(as_json: bool, level: int = logging.INFO) -> None:
    """Log to stderr, one line per event (JSON lines when `as_json`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else LineFormatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
