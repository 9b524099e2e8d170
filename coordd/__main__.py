"""`coordd [--db PATH | --store DSN] [--socket PATH] [--config FILE] [--log-json]`: run the daemon."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

import msgspec

from coordd import config as config_mod
from coordd import names
from coordd.errors import ConfigError

logger = logging.getLogger("coordd")


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (also read by docgen for the configuration reference)."""
    p = argparse.ArgumentParser(prog="coordd", description="Local coordinator for AI jobs.")
    p.add_argument("--db", help="SQLite file (env COORDD_DB; default ~/.local/state/coordd/coordd.db)")
    p.add_argument("--socket", help="Unix socket (env COORDD_SOCKET; default "
                                    "$XDG_RUNTIME_DIR/coordd/coordd.sock)")
    p.add_argument("--store", metavar="DSN",
                   help="postgresql://... : serve the core over PostgreSQL (config `store`; "
                        "a second coordd with the same DSN is its standby)")
    p.add_argument("--config", help="TOML config file")
    p.add_argument("--log-json", action="store_true", help="log JSON lines")
    return p


def ignore_sighup_until_handled() -> None:
    """Ignore SIGHUP from the very start of a daemon's main until its event loop installs
    its own handler (coordd.server, worker.__main__), so a SIGHUP during start-up (the
    imports, the config, the database) does not end it by the default action. Children
    started while it is ignored inherit that (exec keeps SIG_IGN): call it only in the
    daemons' entry points."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `coordd` command. Exit codes: 0 clean stop, 1 cannot start, 2 usage."""
    ignore_sighup_until_handled()
    from coordd.server import Daemon, StartupError  # after the line above: ~0.3 s of imports
    import uvloop
    args = parse_args(argv)
    try:
        cfg = config_mod.load(args.config, store=args.store)
    except ConfigError as exc:
        print(f"coordd: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_json or cfg.log_json)
    db = args.db or cfg.db or str(config_mod.default_db_path())
    sock = args.socket or cfg.socket or str(config_mod.default_socket_path())
    for path, given in ((db, args.db or cfg.db or cfg.store), (sock, args.socket or cfg.socket)):
        if not given:  # a default location: create our own folder; a given one must exist
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    cfg = msgspec.structs.replace(cfg, db=db, socket=sock)
    try:
        uvloop.run(Daemon(cfg, config_path=args.config).run())  # over SQLite or PostgreSQL
    except StartupError as exc:  # one line on stderr (the journal under systemd), no log twin
        print(f"coordd: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
